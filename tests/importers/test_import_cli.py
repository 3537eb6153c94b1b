"""The ``kilo-rules import`` subcommand, run as ``main(["import", ...])``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from importer_helpers import SUBAGENT, SWE_AGENT

from kilo_rules.engine.formats.session import session_from_data
from kilo_rules.engine.importers import import_file
from kilo_rules.tools.cli import EXIT_DIAGNOSTICS, EXIT_USAGE, main


def _run(argv: list[str]) -> int:
    return main(["import", *argv])


def test_writes_session_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([str(SWE_AGENT)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert session_from_data(json.loads(out)) == import_file(SWE_AGENT)


def test_writes_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "session.json"
    assert _run([str(SUBAGENT), "--from", "claude_code", "-o", str(target)]) == 0
    assert capsys.readouterr() == ("", "")
    session = session_from_data(json.loads(target.read_text(encoding="utf-8")))
    assert session == import_file(SUBAGENT)


def test_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(SWE_AGENT.read_bytes()))
    monkeypatch.setattr("sys.stdin", stdin)
    assert _run(["-"]) == 0
    session = json.loads(capsys.readouterr().out)
    assert (session["id"], len(session["messages"])) == ("swe-agent", 14)


def test_import_error_is_one_located_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "cut.jsonl"
    lines = SUBAGENT.read_text(encoding="utf-8").split("\n")
    bad.write_text("\n".join([*lines[:4], lines[4][:100]]), encoding="utf-8")
    assert _run([str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith(f"{bad}:5:")
    assert ": error[import.json]: not valid JSON: " in first


def test_short_source_lines_are_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "chat.json"
    bad.write_text(
        '[\n  {"role": "user", "content": "hi"},\n  {"role" "user"}\n]\n', encoding="utf-8"
    )
    assert _run([str(bad)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{bad}:3:11: error[import.json]: not valid JSON: Expecting ':' delimiter",
        '   3 |   {"role" "user"}',
        "     |           ^",
    ]


def test_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([str(tmp_path / "nope.jsonl")]) == EXIT_USAGE == 2
    assert (
        f"{tmp_path / 'nope.jsonl'}:1:1: error[io.read]: cannot read: " in capsys.readouterr().err
    )


def test_unwritable_output_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([str(SWE_AGENT), "-o", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    assert "error[io.write]" in capsys.readouterr().err


def test_run_out_of_range_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([str(SWE_AGENT), "--run", "3"]) == 2
    assert "error[import.run]: run 3 is out of range" in capsys.readouterr().err


def test_unknown_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([str(SWE_AGENT), "--from", "cline"]) == EXIT_USAGE
    assert "invalid choice: 'cline'" in capsys.readouterr().err


def test_a_session_v1_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "s.json"
    assert _run([str(SWE_AGENT), "-o", str(session)]) == 0
    assert _run([str(session)]) == EXIT_USAGE
    assert "error[import.session-v1]" in capsys.readouterr().err


def test_a_log_that_cannot_be_imported_exits_like_every_diagnostic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nothing": "to see"}', encoding="utf-8")
    assert _run([str(bad)]) == EXIT_DIAGNOSTICS == 1
    assert "error[import.format]" in capsys.readouterr().err


def test_a_log_over_the_cap_is_refused_without_reading_it_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kilo_rules.tools.cli.import_ as command

    class Stdin:
        def __init__(self) -> None:
            self.buffer = self
            self.asked: list[int] = []

        def read(self, size: int = -1) -> bytes:
            self.asked.append(size)
            return b"[" + b" " * (size if size > 0 else 10_000)

    stdin = Stdin()
    monkeypatch.setattr(command, "MAX_BYTES", 1_000)
    monkeypatch.setattr("sys.stdin", stdin)
    assert _run(["-"]) == EXIT_DIAGNOSTICS
    assert stdin.asked == [1_001]
    assert "import.size" in capsys.readouterr().err
