"""`kilo-rules plan`, `build`, `demo`, `models` and `schema` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilo_rules.tools.cli import EXIT_OVER_WINDOW, main

ROOT = Path(__file__).resolve().parent.parent
SESSION = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
PLAN_JSON = ["plan", "--model", "openai/gpt-5", "--format", "json"]


def test_plan_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "openai/gpt-5"]) == 0
    out = capsys.readouterr().out
    assert "budget.usable" in out and "252000" in out
    assert "family prompt: gpt" in out
    assert main([*PLAN_JSON, "--config", "output_token_max=8000"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["values"]["output.configured"]["value"] == 8000
    assert data["values"]["budget.usable"]["at"].endswith("kilo-default.yaml:40:11")


def test_plan_with_an_inline_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "m.yaml"
    m.write_text(
        "id: local/qwen\nprovider: ollama\nfamily: qwen\napi_id: qwen2.5-coder:7b\n"
        "api: openai-compatible\nlimits: {context: 32768, output: 4096}\n",
        encoding="utf-8",
    )
    assert main(["plan", "--policy", "local-small", "--model", str(m), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["id"] == "local/qwen"
    assert (
        data["values"]["overflow.limit"]["value"] == 22_937
    )  # floor(32768 * 0.7), below usable 28672


def test_unknown_model_is_a_diagnostic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "openai/gpt5"]) == 1
    assert "did you mean 'openai/gpt-5'" in capsys.readouterr().err


def test_build_from_a_recorded_log(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--model", "anthropic/claude-sonnet-4-5", "--session", str(SESSION)]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["model"] == "claude-sonnet-4-5-20250929" or body["model"].startswith("claude")
    assert body["max_tokens"] == 32000
    assert main(["build", "--model", "openai/gpt-5", "--session", str(SESSION), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "cap.fits" in out and "request: openai wire format" in out
    assert (
        main(
            [
                "build",
                "--model",
                "openai/gpt-5",
                "--session",
                str(SESSION),
                "--explain",
                "--format",
                "json",
                "--provider",
                "bedrock",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["provider"] == "bedrock" and "toolConfig" in data["request"]


def test_build_from_a_session_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(SESSION), "-o", str(tmp_path / "s.json")]) == 0
    assert (
        main(
            [
                "build",
                "--model",
                "google/gemini-2.5-pro",
                "--session",
                str(tmp_path / "s.json"),
                "--format",
                "json",
            ]
        )
        == 0
    )
    assert "contents" in json.loads(capsys.readouterr().out)


def test_demo_runs_the_main_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "== check: bundled policies and catalog: 6 file(s), 0 error(s)" in out
    assert "== plan" in out and "== build" in out
    assert "mutations to persist" in out


def test_models_and_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    assert "anthropic/claude-sonnet-4-5" in capsys.readouterr().out
    assert main(["schema", "session"]) == 0
    assert json.loads(capsys.readouterr().out)["$id"].endswith("session.v1.json")
    assert main(["schema", "--check"]) == 0
    assert main(["schema", "nope"]) == 2


def test_environment_settings_become_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KILO_RULES_OUTPUT_TOKEN_MAX", "8000")
    monkeypatch.setenv("KILO_DISABLE_AUTOCOMPACT", "1")
    monkeypatch.setenv("KILO_RULES_THRESHOLD_PERCENT", "75")
    monkeypatch.setenv("KILO_RULES_POLICY", "local-small")
    assert main(["plan", "--model", "openai/gpt-5", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == "local-small"
    assert data["config"]["config.output_token_max"] == 8000
    assert data["config"]["config.compaction.auto"] is False
    # --config wins over the environment
    assert main([*PLAN_JSON, "--config", "output_token_max=4000"]) == 0
    assert json.loads(capsys.readouterr().out)["values"]["output.configured"]["value"] == 4000


def test_kilo_config_keys_reach_kilo_default() -> None:
    from kilo_rules.engine.compiler.compile import compile_policy

    plan = compile_policy(
        "kilo-default",
        "anthropic/claude-sonnet-4-5",
        config={"compaction.reserved": 10_000, "compaction.threshold_percent": 75},
    )
    assert plan.value("budget.reserved") == 10_000  # compaction.reserved ?? min(20000, max)
    assert plan.value("overflow.threshold_percent") == 75
    assert plan.value("overflow.limit") == min(plan.value("budget.usable"), 150_000)
    assert plan.value("overflow.preflight.enabled") is True


SMALL_MODEL = (
    "id: local/qwen\nprovider: ollama\nfamily: qwen\napi_id: qwen2.5-coder:7b\n"
    "api: openai-compatible\nlimits: {context: 32768, output: 4096}\n"
)


# every output of build: the body as sent, indented, the decisions, all as JSON
MODES = [[], ["--format", "json"], ["--explain"], ["--explain", "--format", "json"]]
MODE_IDS = ["body", "json", "explain", "explain-json"]


def _small_model(tmp_path: Path) -> str:
    path = tmp_path / "qwen.yaml"
    path.write_text(SMALL_MODEL, encoding="utf-8")
    return str(path)


def _where(policy: str, setting: str) -> str:
    """Where ``setting`` is written, as build shows it (relative to the working directory)."""
    from kilo_rules.engine.compiler.compile import compile_policy

    return str(compile_policy(policy, "anthropic/claude-sonnet-4-5").locate(setting).relative())


@pytest.mark.parametrize("strict", [[], ["--strict"]], ids=["default", "strict"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_request_that_fits_prints_nothing_extra(
    mode: list[str], strict: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["build", "--model", "anthropic/claude-sonnet-4-5", "--session", str(SESSION)]
    assert main([*argv, *mode, *strict]) == 0
    captured = capsys.readouterr()
    assert captured.out and captured.err == ""


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_request_over_the_window_is_reported_and_fails_with_strict(
    mode: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(ROOT)
    argv = ["build", "--model", _small_model(tmp_path), "--session", str(SESSION), *mode]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    # The last step of the log used 71,258 tokens, more than the request is estimated at.
    assert err == (
        "kilo-rules build: warning: the request does not fit the context window of "
        "local/qwen: 71,258 input tokens (usage reported for the last step) + 4,096 output "
        "cap = 75,354 > 32,768; the policy would compact first (last step used 71,258 >= "
        "limit 28,672 at "
        f"{_where('kilo-default', 'overflow.limit')})\n"
    )
    assert main([*argv, "--strict"]) == EXIT_OVER_WINDOW == 3
    strict_out, strict_err = capsys.readouterr()
    assert (strict_out, strict_err) == (out, err)  # the request is still printed
    if mode == MODES[-1]:
        assert json.loads(out)["compaction_needed"] == "overflow"


def test_the_preflight_estimate_is_what_is_measured_without_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    session = tmp_path / "big.json"
    text = "word " * 40_000
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "id": "p1", "text": text}]}
    session.write_text(json.dumps({"version": 1, "id": "s", "messages": [message]}))
    argv = ["build", "--model", _small_model(tmp_path), "--session", str(session), "--strict"]
    assert main([*argv, "--policy", "local-small"]) == EXIT_OVER_WINDOW
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "input tokens (counted with estimate*1.1)" in err
    assert "+ 4,096 output cap = " in err and "> 32,768;" in err
    assert "the policy would compact first (preflight estimate " in err
    assert f">= limit 22,937 at {_where('local-small', 'overflow.preflight.enabled')})" in err


def test_a_request_over_the_window_that_the_policy_would_not_compact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["build", "--model", _small_model(tmp_path), "--session", str(SESSION)]
    assert main([*argv, "--strict", "--config", "compaction.auto=false"]) == EXIT_OVER_WINDOW
    err = capsys.readouterr().err
    assert err.endswith(
        "; the policy would not compact first (automatic compaction is off): "
        "expect the provider to reject it\n"
    )
