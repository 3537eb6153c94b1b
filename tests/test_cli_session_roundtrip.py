"""A Session v1 file written by ``kilo-rules import`` is read back as the same session.

For every importer format, ``build`` and ``simulate --format json`` on the imported file give what
they give on the original log: the same body, byte for byte, and the same replay. The CLI
tells Session v1 from a log by parsing the file, so a session whose ``"messages"`` key sits
past the first few kilobytes (tools first, as ``import`` writes them) is still a session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.importers import FORMATS, detect_format
from kilo_rules.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "sessions"
SHARED = ROOT.parent / "shared" / "data" / "trajectories"
OPENHANDS = "openhands-llama4-multiswebench-output.jsonl"

# (where, file or inline fixture name, --run, format the importers must detect)
LOGS: list[tuple[str, str, int | None, str]] = [
    ("examples", "claude-code-sonnet45-subagent-a2898e3.jsonl", None, "claude_code"),
    ("examples", "swe-agent-gpt4-pydicom-1458.traj", None, "swe_agent"),
    ("shared", "claude-code-opus46-spotter-8463c716.jsonl", None, "claude_code"),
    ("shared", OPENHANDS, 0, "openhands"),
    ("shared", OPENHANDS, 1, "openhands"),
    ("shared", OPENHANDS, 2, "openhands"),
    ("shared", "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json", None, "mini_swe_agent"),
    ("shared", "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json", None, "mini_swe_agent"),
    ("inline", "openai-chat.json", None, "openai_chat"),
    ("inline", "anthropic-messages.json", None, "anthropic_messages"),
    ("inline", "openai-responses.json", None, "openai_responses"),
]

# A 32k window: the big logs overflow it, so the replays compact (or give up) and the
# comparison covers more than one plain request per step, in a few seconds per log.
SMALL_MODEL = (
    "id: local/qwen\nprovider: ollama\nfamily: qwen\napi_id: qwen2.5-coder:7b\n"
    "api: openai-compatible\nlimits: {context: 32768, output: 4096}\n"
)


def _openai_chat() -> dict[str, Any]:
    """A short tool-using OpenAI chat export, with reasoning and an image."""
    return {
        "messages": [
            {"role": "system", "content": "You are a careful coding agent."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Why does test_parse fail? Screenshot attached."},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Let me read the parser first.",
                "reasoning_content": "The failure is probably in parse().",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path": "src/parse.py"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": "def parse(s):\n    return int(s.strip(','))\n",
            },
            {"role": "assistant", "content": "parse() strips commas only at the ends."},
            {"role": "user", "content": "Fix it."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "Read a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }
        ],
    }


def _anthropic_messages() -> dict[str, Any]:
    """A short tool-using Anthropic Messages document, with signed thinking and usage."""
    return {
        "model": "claude-sonnet-4-5-20250929",
        "system": "You are a careful coding agent.",
        "messages": [
            {"role": "user", "content": "Why does test_parse fail?"},
            {
                "role": "assistant",
                "stop_reason": "tool_use",
                "content": [
                    {"type": "thinking", "thinking": "Read parse().", "signature": "sig-1"},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "read",
                        "input": {"path": "src/parse.py"},
                    },
                ],
                "usage": {"input_tokens": 120, "output_tokens": 30},
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "def parse(s):\n    return int(s.strip(','))\n",
                    }
                ],
            },
            {
                "role": "assistant",
                "stop_reason": "end_turn",
                "content": [{"type": "text", "text": "parse() strips commas only at the ends."}],
                "usage": {"input_tokens": 40, "output_tokens": 12, "cache_read_input_tokens": 150},
            },
            {"role": "user", "content": "Fix it."},
        ],
    }


def _openai_responses() -> dict[str, Any]:
    """A short tool-using OpenAI Responses request body, with encrypted reasoning."""
    return {
        "model": "gpt-5",
        "instructions": "You are a careful coding agent.",
        "input": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "Why does test_parse fail? Screenshot attached.",
                    },
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [
                    {"type": "summary_text", "text": "The failure is probably in parse()."}
                ],
                "encrypted_content": "gAAAA-opaque",
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "read",
                "arguments": '{"path": "src/parse.py"}',
            },
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": "def parse(s):\n    return int(s.strip(','))\n",
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "content": [
                    {"type": "output_text", "text": "parse() strips commas only at the ends."}
                ],
            },
            {"role": "user", "content": "Fix it."},
        ],
        "tools": [
            {
                "type": "function",
                "name": "read",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
    }


_INLINE = {
    "openai-chat.json": _openai_chat,
    "anthropic-messages.json": _anthropic_messages,
    "openai-responses.json": _openai_responses,
}


def _log(where: str, name: str, tmp_path: Path) -> Path:
    if where == "inline":
        path = tmp_path / name
        path.write_text(json.dumps(_INLINE[name](), indent=2), encoding="utf-8")
        return path
    path = (EXAMPLES if where == "examples" else SHARED) / name
    if not path.is_file():
        pytest.skip(f"{name} not found: {SHARED} is not beside this checkout")
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cases_cover_every_importer_format() -> None:
    assert {fmt for *_, fmt in LOGS} == set(FORMATS)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "name", "run", "fmt"),
    LOGS,
    ids=[f"{name}" + (f"-run{run}" if run is not None else "") for _, name, run, _ in LOGS],
)
def test_an_imported_session_builds_and_replays_as_its_log(
    where: str,
    name: str,
    run: int | None,
    fmt: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = _log(where, name, tmp_path)
    assert detect_format(log.read_text(encoding="utf-8"), name=str(log)) == fmt
    runs = [] if run is None else ["--run", str(run)]
    session = tmp_path / "session.json"
    assert _run(["import", str(log), *runs, "-o", str(session)], capsys)[0] == 0
    small = tmp_path / "small.yaml"
    small.write_text(SMALL_MODEL, encoding="utf-8")

    for model in ("anthropic/claude-sonnet-4-5", str(small)):
        build = ["build", "--model", model, "--session"]
        from_log = _run([*build, str(log), *runs], capsys)
        from_session = _run([*build, str(session)], capsys)
        assert from_log[0] == 0, from_log[2]
        assert from_session == from_log  # exit code, body bytes and any warning

    simulate = ["simulate", "--format", "json", "--model", str(small), "--session"]
    code, out, err = _run([*simulate, str(log), *runs], capsys)
    replay = json.loads(out)
    code2, out2, err2 = _run([*simulate, str(session)], capsys)
    replay2 = json.loads(out2)
    # the one field that names the input file
    assert (replay.pop("session"), replay2.pop("session")) == (str(log), str(session))
    assert (code2, replay2, err2) == (code, replay, err)
    assert replay["session_messages"] > 0
    assert replay["reports"][0]["steps"]


def test_the_openhands_session_is_no_longer_read_as_a_chat_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 17: the imported session went to the importers, which took it for an OpenAI
    chat log and dropped every part: 3 messages and an empty user text."""
    log = _log("shared", OPENHANDS, tmp_path)
    session = tmp_path / "oh.json"
    assert main(["import", str(log), "--run", "0", "-o", str(session)]) == 0
    assert session.read_text(encoding="utf-8").find('"messages"') > 4000
    capsys.readouterr()
    model = ["--model", "anthropic/claude-sonnet-4-5", "--session", str(session)]
    assert main(["simulate", "--format", "json", *model]) == 0
    largest = json.loads(capsys.readouterr().out)["reports"][0]["max_request"]
    assert largest > 30_000


def _imported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    session = tmp_path / "session.json"
    log = EXAMPLES / "swe-agent-gpt4-pydicom-1458.traj"
    assert main(["import", str(log), "-o", str(session)]) == 0
    capsys.readouterr()
    return session


def test_a_bad_session_v1_file_is_a_located_session_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = _imported(tmp_path, capsys)
    data = json.loads(session.read_text(encoding="utf-8"))
    data["messages"][5]["parts"][0]["type"] = "txt"
    text = json.dumps(data, indent=2)
    session.write_text(text, encoding="utf-8")
    line = text.split("\n").index('          "type": "txt",') + 1
    for command in ("build", "simulate"):
        argv = [command, "--model", "anthropic/claude-sonnet-4-5", "--session", str(session)]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"{session}:{line - 1}:" in err  # the part that holds the bad tag
        assert "error[session.invalid]: messages[5].parts[0]: Input tag 'txt'" in err
        assert "import." not in err  # never handed to an importer


def test_a_session_v1_file_holds_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = _imported(tmp_path, capsys)
    argv = ["build", "--model", "openai/gpt-5", "--session", str(session), "--run", "1"]
    assert main(argv) == 2  # a bad --run is a usage error, for build as for import
    assert "run 1 is out of range: a Session v1 file holds 1 run (run 0)" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("fmt", [[], ["--from", "openai_chat"]], ids=["auto", "named"])
def test_import_refuses_a_session_v1_file(
    fmt: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = _imported(tmp_path, capsys)
    assert main(["import", str(session), *fmt]) == 2
    err = capsys.readouterr().err
    assert f"{session}:2:14: error[import.session-v1]: this is already a Session v1 file" in err
    assert "pass it as it is to build or simulate (--session FILE)" in err


@pytest.mark.parametrize(
    ("doc", "is_session"),
    [
        ({"version": 1, "messages": []}, True),
        ({"tools": [], "id": "s", "messages": [], "version": 1}, True),
        ({"version": 1, "messages": [{"role": "user", "content": "hi"}]}, True),
        ({"version": True, "messages": []}, False),
        ({"version": 2, "messages": []}, False),
        ({"version": 1, "messages": {}}, False),
        ({"messages": []}, False),
        ([{"version": 1, "messages": []}], False),
    ],
)
def test_session_v1_is_told_by_its_parsed_keys(doc: Any, is_session: bool) -> None:
    from kilo_rules.engine.formats.session import is_session_v1

    assert is_session_v1(doc) is is_session


def test_a_chat_log_shaped_like_session_v1_is_validated_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chat.json"
    path.write_text('{"version": 1, "messages": [{"role": "user", "content": "hi"}]}')
    assert main(["build", "--model", "openai/gpt-5", "--session", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:1:1: error[session.invalid]: id: Field required" in err
    assert f"{path}:1:57: error[session.invalid]: messages[0].content: Extra inputs" in err
