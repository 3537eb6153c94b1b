"""``kilo-rules verify``: every finding pinned at its policy location on the corpus, the
bundled policies clean on the whole catalog, and the cache-prefix stability report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog, model_from_data
from kilo_rules.engine.formats.load import load_yaml_file
from kilo_rules.engine.formats.session import Message, Session, TextPart, TokenUsage
from kilo_rules.engine.importers import read_session
from kilo_rules.tools.checking.verify import match_models, prefix_stability, verify_policy
from kilo_rules.tools.cli import main

from .conftest import SHARED

CORPUS = Path(__file__).parent / "corpus" / "verify"
TRAJECTORIES = SHARED / "data" / "trajectories"
BUNDLED = ("kilo-default", "long-run", "cache-max", "local-small")
SAMPLE = (
    "anthropic/claude-opus-4-1",
    "anthropic/claude-sonnet-4-5",
    "openai/gpt-5",
    "google/gemini-2.5-pro",
)


def _models(*ids: str) -> list[ModelInfo]:
    catalog = bundled_catalog()
    return [catalog.get(i) for i in ids]


def _o200k() -> ModelInfo:
    return model_from_data(load_yaml_file(CORPUS / "o200k-model.yaml").data)


# (corpus file, code, line, col, the models of SAMPLE it concerns)
CASES = [
    ("budget.yaml", "verify.breakpoint-budget", 6, 11, SAMPLE[:2]),
    ("automatic.yaml", "verify.breakpoint-budget", 6, 22, SAMPLE[:2]),
    ("short-prefix.yaml", "verify.short-prefix", 8, 18, SAMPLE[:2]),
    ("reserved.yaml", "verify.reserved", 6, 13, SAMPLE),
    ("no-window.yaml", "verify.no-window", 6, 11, SAMPLE),
    ("output-window.yaml", "verify.output-window", 6, 15, ("openai/gpt-5",)),
    ("tail.yaml", "verify.tail", 6, 27, SAMPLE[:3]),
    ("threshold.yaml", "verify.threshold", 6, 22, ("openai/gpt-5",)),
    ("limit.yaml", "verify.threshold", 6, 10, SAMPLE),
    ("output-limit.yaml", "verify.output-limit", 6, 15, ("anthropic/claude-opus-4-1",)),
    ("no-prompt.yaml", "verify.no-prompt", 9, 3, ("openai/gpt-5", "google/gemini-2.5-pro")),
    ("server-edit.yaml", "verify.server-edit", 6, 25, SAMPLE),
]


def _own(file: Path, diags: list) -> list:  # type: ignore[type-arg]
    """The findings located in ``file`` (not in the kilo-default it extends)."""
    return [d for d in diags if Path(d.location.file).resolve() == file.resolve()]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_corpus_finding_is_located(case: tuple[str, str, int, int, tuple[str, ...]]) -> None:
    name, code, line, col, models = case
    file = CORPUS / name
    found = _own(file, verify_policy(file, _models(*SAMPLE)))
    assert len(found) == 1, "\n".join(str(d) for d in found)
    d = found[0]
    assert (d.code, d.location.line, d.location.col) == (code, line, col), str(d)
    assert d.details["models"] == list(models)
    assert all(m in d.message for m in models)  # one diagnostic listing the models


def test_tokenizer_finding_names_the_model_file() -> None:
    file = CORPUS / "tokenizer.yaml"
    found = _own(file, verify_policy(file, [_o200k(), *_models(*SAMPLE)]))
    assert [(d.code, d.location.line, d.location.col) for d in found] == [
        ("verify.tokenizer", 6, 12)
    ]
    assert found[0].details["models"] == ["local/o200k-model"]
    assert found[0].details["per_model"] == {"local/o200k-model": "tiktoken:o200k_base"}


def test_a_typo_in_a_compared_value_is_a_located_warning() -> None:
    file = CORPUS / "unknown-value.yaml"
    found = _own(file, verify_policy(file, _models(*SAMPLE)))
    assert [(d.code, d.severity, d.location.line, d.location.col) for d in found] == [
        ("expr.unknown-value", "warning", 6, 28)
    ]
    assert found[0].message == "'gtp' is not a known value of model.family"
    assert found[0].hint == "did you mean 'gpt'?"


def test_corpus_covers_every_finding() -> None:
    covered = {c[1] for c in CASES} | {"verify.tokenizer"}
    assert covered == {
        "verify.breakpoint-budget",
        "verify.short-prefix",
        "verify.reserved",
        "verify.no-window",
        "verify.output-window",
        "verify.tail",
        "verify.threshold",
        "verify.output-limit",
        "verify.tokenizer",
        "verify.no-prompt",
        "verify.server-edit",
    }


@pytest.mark.slow
@pytest.mark.parametrize("policy", BUNDLED)
def test_bundled_policies_pass_on_the_whole_catalog(policy: str) -> None:
    diags = verify_policy(policy, bundled_catalog().models)
    # What remains is Kilo's own behaviour, restated by kilo-default: notes with the spec.
    for d in diags:
        assert d.severity == "warning", str(d)
        assert Path(d.location.file).name == "kilo-default.yaml", str(d)
        assert "§10.1" in d.details["kilo"]
        assert d.message.startswith("note: ")


def test_cache_max_no_longer_marks_a_short_prefix() -> None:
    diags = verify_policy("cache-max", _models("anthropic/claude-opus-4-6"))
    assert diags == []
    plan = compile_policy("cache-max", "anthropic/claude-opus-4-6")
    assert not plan.cache["last_system"] and not plan.cache["last_tool"]
    assert plan.cache["message_ttl"] == "1h"


def test_match_models_globs() -> None:
    chosen = match_models(bundled_catalog().models, ["anthropic/claude-opus-*"])
    assert chosen and all(m.id.startswith("anthropic/claude-opus-") for m in chosen)
    assert match_models(bundled_catalog().models, []) == list(bundled_catalog().models)


# ------------------------------------------------------------------- prefix stability


def _turns(n: int) -> Session:
    messages = []
    for i in range(1, n + 1):
        text = TextPart(id=f"u{i}p", type="text", text=f"Request {i}: " + "details " * 400)
        messages.append(Message(id=f"m{i:02d}a", role="user", created=i * 10, parts=[text]))
        answer = TextPart(id=f"a{i}p", type="text", text=f"Answer {i}. " + "words " * 300)
        usage = TokenUsage(input=1000 * i, output=300)
        messages.append(
            Message(
                id=f"m{i:02d}b",
                role="assistant",
                created=i * 10 + 5,
                parts=[answer],
                finish="stop",
                tokens=usage,
            )
        )
    return Session(id="stability", messages=messages)


PER_TURN_LAYER = """\
version: 1
name: per-turn
extends: cache-max
system:
  layers:
    - id: turn-note
      source: text
      text: "This conversation has gone on for more than one turn."
      when: "session.turns > 1"
"""


def test_a_per_turn_layer_is_reported_with_its_id(in_tmp: Path) -> None:
    (in_tmp / "per-turn.yaml").write_text(PER_TURN_LAYER, encoding="utf-8")
    plan = compile_policy(in_tmp / "per-turn.yaml", "anthropic/claude-sonnet-4-5")
    report = prefix_stability(plan, _turns(4))
    assert report.steps == 4
    assert len(report.changes) == 1, report.to_json()
    change = report.changes[0]
    assert (change.step, change.block, change.cause, change.layer) == (
        2,
        "system",
        "system layer",
        "turn-note",
    )
    assert not change.expected
    assert change.offset > 0
    assert change.location is not None and change.location.line == 6
    [d] = report.diagnostics()
    assert d.code == "verify.prefix-changed" and d.severity == "error"
    assert d.details["layer"] == "turn-note" and d.details["steps"] == [2]


def test_a_stable_policy_keeps_its_prefix() -> None:
    plan = compile_policy("cache-max", "anthropic/claude-sonnet-4-5")
    report = prefix_stability(plan, _turns(4))
    assert report.steps == 4 and report.changes == [] and report.diagnostics() == []


def test_a_compaction_is_an_expected_change() -> None:
    model = model_from_data(
        {
            "id": "local/tiny-claude",
            "provider": "anthropic",
            "family": "claude",
            "api_id": "claude-tiny",
            "api": "anthropic",
            "limits": {"context": 8000, "output": 2000},
            "cache": {"kind": "explicit", "max_breakpoints": 4, "min_cacheable_tokens": 1024},
        }
    )
    plan = compile_policy("cache-max", model)
    report = prefix_stability(plan, _turns(8))
    assert report.changes, report.to_json()
    assert all(c.expected and c.cause == "compaction" for c in report.changes)
    assert report.diagnostics() == []


@pytest.mark.skipif(not TRAJECTORIES.is_dir(), reason="shared trajectories absent")
@pytest.mark.parametrize("policy", ["kilo-default", "cache-max"])
def test_a_real_session_keeps_its_prefix(policy: str) -> None:
    session = read_session(str(TRAJECTORIES / "claude-code-sonnet45-subagent-a2898e3.jsonl"))
    plan = compile_policy(policy, "anthropic/claude-sonnet-4-5")
    report = prefix_stability(plan, session)
    assert report.steps == 12 and report.error is None
    assert report.unexpected == []


@pytest.mark.slow
@pytest.mark.skipif(not TRAJECTORIES.is_dir(), reason="shared trajectories absent")
def test_the_stability_replay_compacts_where_simulate_does() -> None:
    """Both replay through one engine, with the same usage fed back: on the Opus session
    run on Sonnet 4.5, kilo-default compacts once, at the same step, in both."""
    from kilo_rules.tools.simulation.simulate import simulate

    session = read_session(str(TRAJECTORIES / "claude-code-opus46-spotter-8463c716.jsonl"))
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    simulated = simulate(session, [plan])[0]
    compacted = [step.index for step in simulated.steps if step.compactions]
    report = prefix_stability(plan, session)
    assert compacted, "the session no longer needs a compaction on this model"
    assert report.steps == len(simulated.steps)
    assert [c.step for c in report.changes if c.cause == "compaction"] == compacted
    assert report.unexpected == []


# ------------------------------------------------------------------- the command


def test_cli_bundled_policy_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--policy", "cache-max", "--model", "anthropic/*"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "0 error(s)" in err


def test_cli_errors_exit_1_with_the_location(capsys: pytest.CaptureFixture[str]) -> None:
    file = CORPUS / "output-limit.yaml"
    assert main(["verify", "--policy", str(file), "--model", "anthropic/claude-opus-4-1"]) == 1
    out, _ = capsys.readouterr()
    assert "output-limit.yaml:6:15: error[verify.output-limit]" in out
    assert '  configured: "64_000"' in out  # the source line, with a caret under it


def test_cli_reports_a_finding_of_a_shared_base_once(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two policies extending kilo-default both find its note; the reader sees it once.
    for name in ("a", "b"):
        (in_tmp / f"{name}.yaml").write_text(
            f"version: 1\nname: {name}\nextends: kilo-default\n", encoding="utf-8"
        )
    args = ["verify", "--policy", "a.yaml", "--policy", "b.yaml", "--format", "json"]
    assert main([*args, "--model", "anthropic/claude-sonnet-4-5"]) == 0
    diags = json.loads(capsys.readouterr().out)["diagnostics"]
    assert [d["code"] for d in diags] == ["verify.short-prefix"]
    assert Path(diags[0]["location"]["file"]).name == "kilo-default.yaml"


def test_cli_unknown_model_glob_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--model", "nobody/*"]) == 2
    assert "matches no catalog model" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["json", "github", "sarif", "junit"])
def test_cli_formats(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    file = CORPUS / "budget.yaml"
    args = ["verify", "--policy", str(file), "--model", "anthropic/claude-sonnet-4-5"]
    assert main([*args, "--format", fmt]) == 0  # warnings and notes do not fail
    out = capsys.readouterr().out
    if fmt == "json":
        doc = json.loads(out)
        codes = {d["code"] for d in doc["diagnostics"]}
        assert codes == {"verify.breakpoint-budget", "verify.short-prefix"}
        assert doc["stability"] == [] and doc["models"] == 1
    elif fmt == "github":
        assert "title=verify.breakpoint-budget" in out and out.startswith("::warning ")
    elif fmt == "sarif":
        rules = {r["ruleId"] for r in json.loads(out)["runs"][0]["results"]}
        assert "verify.breakpoint-budget" in rules
    else:
        assert out.startswith("<?xml") and "verify.breakpoint-budget" in out


def test_cli_session_report(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_tmp / "per-turn.yaml").write_text(PER_TURN_LAYER, encoding="utf-8")
    (in_tmp / "s.json").write_text(_turns(3).model_dump_json(), encoding="utf-8")
    args = ["verify", "--policy", "per-turn.yaml", "--model", "anthropic/claude-sonnet-4-5"]
    assert main([*args, "--session", "s.json"]) == 1
    out = capsys.readouterr().out
    assert "per-turn.yaml:6:7: error[verify.prefix-changed]: system layer 'turn-note'" in out
    assert "step 2: byte" in out and "[UNEXPECTED]" in out
    assert main([*args, "--session", "s.json", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    [report] = doc["stability"]
    assert report["unexpected"] == 1 and report["changes"][0]["layer"] == "turn-note"
