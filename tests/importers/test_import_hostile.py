"""Hostile logs: numbers no session can hold, FIFOs named as logs. Each is a typed,
located error (or, inside a model-written string, kept as text), never a bare ValueError
and never a reader that blocks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import ImportFormatError
from kilo_rules.engine.importers import import_file, import_text, read_session_text
from kilo_rules.tools.cli import main

HUGE = "8" * 5000


def _col(line: str, needle: str) -> int:
    return line.index(needle) + 1


@pytest.mark.parametrize(
    "text",
    [
        # one JSON document (a chat export), pretty-printed
        f'[\n {{"role": "user", "content": "hi"}},\n {{"role": "assistant", "n": {HUGE}}}\n]',
        # JSON Lines (Claude Code), the number on the second line
        '{"type": "user", "message": {"role": "user", "content": "hi"}}\n'
        f'{{"type": "assistant", "n": -{HUGE}}}\n',
        # a decimal that overflows to infinity
        f'[\n {{"role": "user", "content": "hi"}},\n {{"role": "assistant", "n": {HUGE}.5}}\n]',
    ],
)
def test_a_number_no_session_can_hold_is_located(text: str) -> None:
    for load in (import_text, read_session_text):
        with pytest.raises(ImportFormatError) as err:
            load(text, name="log.json")
        d = err.value.diagnostic
        assert d.code == "import.number", d
        line = next(n for n, ln in enumerate(text.split("\n"), 1) if HUGE in ln)
        src = text.split("\n")[line - 1]
        start = src.index(HUGE) - (1 if src[src.index(HUGE) - 1] == "-" else 0)
        assert (d.location.file, d.location.line, d.location.col) == ("log.json", line, start + 1)


def test_huge_numbers_in_tool_call_arguments_are_kept_as_text() -> None:
    # Arguments are text a model wrote; text that does not decode is kept as it is.
    args = f'{{"n": {HUGE}}}'
    log = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    session = import_text(json.dumps(log), fmt="openai_chat")
    (tool,) = [p for m in session.messages for p in m.parts if p.type == "tool"]
    assert HUGE in json.dumps(tool.input)


def test_a_huge_return_code_in_an_observation_is_no_return_code() -> None:
    from kilo_rules.engine.importers.mini_swe_agent import observation_meta

    assert observation_meta(f"<returncode>{HUGE}</returncode>") == {}
    assert observation_meta("<returncode>-2</returncode>") == {"returncode": -2}


def test_a_fifo_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    # No writer ever opens the FIFO: a blocking open would hang these calls for good.
    with pytest.raises(ImportFormatError) as err:
        import_file(fifo)
    assert err.value.diagnostic.code == "io.not-regular-file"
    assert main(["import", str(fifo)]) == 2
    assert f"{fifo}:1:1: error[io.not-regular-file]" in capsys.readouterr().err
