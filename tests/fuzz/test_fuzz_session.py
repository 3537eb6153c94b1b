"""Session v1 loading on mutated documents: a valid Session that dumps and loads back, or
one of the package's typed errors with a location in the text; never a traceback."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.engine.formats.session import dump_session, session_from_json
from kilo_rules.engine.importers import read_session_text
from tests.fuzz.budget import FUZZ
from tests.fuzz.mutate import dumps, mutated

SESSION: dict[str, Any] = {
    "version": 1,
    "id": "s1",
    "title": "fix",
    "model": "claude-sonnet-4-5",
    "tools": [{"name": "read", "description": "Read", "input_schema": {"type": "object"}}],
    "metadata": {"origin": {"format": "test"}},
    "messages": [
        {
            "id": "m1",
            "role": "user",
            "created": 1,
            "parts": [
                {"type": "text", "id": "p1", "text": "hi", "metadata": {"cache_control": {}}},
                {"type": "file", "id": "p2", "mime": "image/png", "url": "data:,"},
            ],
        },
        {
            "id": "m2",
            "role": "assistant",
            "parent_id": "m1",
            "finish": "tool-calls",
            "tokens": {"input": 3, "output": 2, "cache": {"read": 1, "write": 0}},
            "cost": 0.5,
            "parts": [
                {"type": "step-start", "id": "p3"},
                {"type": "reasoning", "id": "p4", "text": "hm", "signature": "sig"},
                {
                    "type": "tool",
                    "id": "p5",
                    "call_id": "toolu_1",
                    "tool": "read",
                    "input": {"path": "a"},
                    "output": "x",
                    "time": {"start": 1, "end": 2},
                    "attachments": [{"type": "file", "id": "p6", "mime": "image/png", "url": "u"}],
                },
            ],
        },
        {
            "id": "m3",
            "role": "user",
            "parts": [{"type": "compaction", "id": "p7", "auto": True, "overflow": False}],
        },
    ],
}


def check_load(text: str) -> None:
    """Load ``text`` both ways a session is read; assert a typed, located outcome."""
    lines = text.count("\n") + 1
    for load in (session_from_json, read_session_text):
        try:
            session = load(text)
        except KiloRulesError as exc:
            for diag in exc.diagnostics:
                assert 1 <= diag.location.line <= lines
                assert diag.location.col >= 1
            continue
        assert session_from_json(dump_session(session)) == session


@pytest.mark.slow
@FUZZ
@given(doc=mutated(SESSION), indent=st.sampled_from([None, 1]))
def test_mutated_sessions(doc: Any, indent: int | None) -> None:
    check_load(dumps(doc, indent=indent))


@FUZZ
@given(text=st.text(alphabet='{}[]",:0 \\ud800tn', max_size=60))
def test_random_json_like_text(text: str) -> None:
    check_load('{"version": 1, "id": "s", "messages": [], "metadata": ' + text + "}")


def test_the_base_session_loads() -> None:
    assert len(session_from_json(dumps(SESSION)).messages) == 3


#: Digit counts around the session bound (1,000) and Python's conversion limit (4,300).
HUGE = st.sampled_from([999, 1000, 1001, 4300, 4301, 5000, 20_000])


@st.composite
def huge_int_text(draw: st.DrawFn, text: str) -> str:
    """``text`` with one run of digits (a number, or digits inside a string) made huge."""
    runs = [m.span() for m in re.finditer(r"\d+", text)] or [(0, 0)]
    start, end = draw(st.sampled_from(runs))
    digits = draw(st.sampled_from("123456789")) * draw(HUGE)
    return text[:start] + digits + text[end:]


@pytest.mark.slow
@FUZZ
@given(data=st.data(), indent=st.sampled_from([None, 1]))
def test_huge_integers(data: st.DataObject, indent: int | None) -> None:
    doc = data.draw(mutated(SESSION, max_mutations=1))
    check_load(data.draw(huge_int_text(dumps(doc, indent=indent))))
