"""Located errors: truncated and corrupted copies of each log, shape errors, detection."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from importer_helpers import EXAMPLES, SUBAGENT, SWE_AGENT, TRAJECTORIES, shared_log

from kilo_rules.errors import ImportFormatError
from kilo_rules.importers import FORMATS, detect_format, import_file, import_text

LOGS = [
    ("claude_code", SUBAGENT),
    ("swe_agent", SWE_AGENT),
    ("claude_code", TRAJECTORIES / "claude-code-opus46-spotter-8463c716.jsonl"),
    ("openhands", TRAJECTORIES / "openhands-llama4-multiswebench-output.jsonl"),
    ("mini_swe_agent", TRAJECTORIES / "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json"),
    ("mini_swe_agent", TRAJECTORIES / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json"),
]
IDS = [path.name for _, path in LOGS]


def _text(path: Path) -> str:
    if path.parent != EXAMPLES:
        path = shared_log(path.name)
    return path.read_text(encoding="utf-8")


def _error(tmp_path: Path, data: bytes, fmt: str = "auto") -> ImportFormatError:
    bad = tmp_path / "bad.log"
    bad.write_bytes(data)
    with pytest.raises(ImportFormatError) as info:
        import_file(bad, fmt=fmt)
    assert info.value.diagnostic.location.file == str(bad)
    return info.value


@pytest.mark.parametrize(("fmt", "path"), LOGS, ids=IDS)
@pytest.mark.parametrize("given", [False, True], ids=["auto", "named"])
def test_truncated_mid_line(tmp_path: Path, fmt: str, path: Path, given: bool) -> None:
    text = _text(path)
    lines = text.split("\n")
    # Cut in the middle of the line at 60 % of the file, as an interrupted copy would be.
    n = int(len(lines) * 0.6) or 1
    while len(lines[n - 1]) < 10:
        n += 1
    cut = "\n".join([*lines[: n - 1], lines[n - 1][: len(lines[n - 1]) // 2]])
    err = _error(tmp_path, cut.encode(), fmt if given else "auto")
    diag = err.diagnostic
    assert diag.code == "import.json"
    assert diag.location.line == n
    assert 1 <= diag.location.col <= len(lines[n - 1]) // 2 + 1


@pytest.mark.parametrize(("fmt", "path"), LOGS, ids=IDS)
def test_corrupted_line(tmp_path: Path, fmt: str, path: Path) -> None:
    lines = _text(path).split("\n")
    # Break the first key/value colon at or after the middle line.
    n = len(lines) // 2 + 1
    pattern = re.compile(r'"[^":\\]*"(:)')
    while not pattern.search(lines[n - 1]):
        n += 1
    found = pattern.search(lines[n - 1])
    assert found is not None
    col = found.start(1) + 1  # 1-based column of the colon
    lines[n - 1] = lines[n - 1][: col - 1] + ";" + lines[n - 1][col:]
    diag = _error(tmp_path, "\n".join(lines).encode(), fmt).diagnostic
    assert (diag.code, diag.message) == ("import.json", "not valid JSON: Expecting ':' delimiter")
    assert (diag.location.line, diag.location.col) == (n, col)


@pytest.mark.parametrize(("fmt", "path"), LOGS[:2], ids=IDS[:2])
def test_invalid_utf8(tmp_path: Path, fmt: str, path: Path) -> None:
    data = path.read_bytes()
    lines = data.split(b"\n")
    lines[9] = lines[9][:5] + b"\xff" + lines[9][6:]
    diag = _error(tmp_path, b"\n".join(lines)).diagnostic
    assert diag.code == "import.encoding"
    assert (diag.location.line, diag.location.col) == (10, 6)


def test_wrong_shape_in_a_jsonl_line_is_located(tmp_path: Path) -> None:
    lines = SUBAGENT.read_text(encoding="utf-8").split("\n")
    record = json.loads(lines[1])
    record["message"] = 42
    lines[1] = json.dumps(record)
    diag = _error(tmp_path, "\n".join(lines).encode()).diagnostic
    assert diag.code == "import.shape"
    assert diag.message == "message: expected an object, found a number"
    assert (diag.location.line, diag.location.col) == (2, lines[1].index("42") + 1)


def test_json_lines_given_to_a_document_format(tmp_path: Path) -> None:
    diag = _error(tmp_path, SUBAGENT.read_bytes(), "swe_agent").diagnostic
    assert diag.code == "import.json"
    assert (diag.location.line, diag.location.col) == (2, 1)
    assert diag.hint is not None and "JSON Lines" in diag.hint


def test_document_given_to_claude_code(tmp_path: Path) -> None:
    diag = _error(tmp_path, SWE_AGENT.read_bytes(), "claude_code").diagnostic
    assert diag.code == "import.shape"
    assert (diag.location.line, diag.location.col) == (1, 1)


def test_openhands_without_history(tmp_path: Path) -> None:
    data = b'{"instance_id": "x", "history": null}\n{"instance_id": "y"}\n'
    diag = _error(tmp_path, data, "openhands").diagnostic
    assert diag.message == "history: expected an array, found null"
    assert (diag.location.line, diag.location.col) == (1, data.index(b"null") + 1)


def test_unknown_format_names_the_formats_tried() -> None:
    with pytest.raises(ImportFormatError) as info:
        detect_format('{"hello": "world"}', name="x.json")
    diag = info.value.diagnostic
    assert diag.code == "import.format"
    assert diag.message == (
        "cannot tell the format of this JSON (tried mini_swe_agent, "
        "swe_agent, openhands, claude_code, anthropic_messages, "
        "openai_chat)"
    )
    assert str(diag.location) == "x.json:1:1"
    with pytest.raises(ImportFormatError, match="JSON Lines file"):
        detect_format('{"a": 1}\n{"b": 2}\n')


def test_empty_file(tmp_path: Path) -> None:
    assert _error(tmp_path, b"  \n\n").diagnostic.code == "import.empty"


def test_unknown_format_name() -> None:
    with pytest.raises(ImportFormatError) as info:
        import_text("[]", fmt="claude-code")
    diag = info.value.diagnostic
    assert diag.code == "import.unknown-format"
    assert diag.hint is not None and diag.hint.startswith("did you mean 'claude_code'?")
    assert set(FORMATS) == {
        "anthropic_messages",
        "claude_code",
        "mini_swe_agent",
        "openai_chat",
        "openhands",
        "swe_agent",
    }


def test_run_of_a_single_run_format() -> None:
    with pytest.raises(ImportFormatError) as info:
        import_file(SWE_AGENT, run=1)
    assert info.value.diagnostic.code == "import.run"
    assert info.value.diagnostic.message == (
        "run 1 is out of range: a swe_agent log holds 1 run (run 0)"
    )
    assert import_file(SWE_AGENT, run=0) == import_file(SWE_AGENT)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError) as info:
        import_file(tmp_path / "missing.jsonl")
    assert info.value.diagnostic.code == "io.read"
