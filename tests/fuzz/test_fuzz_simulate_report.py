"""The report surfaces of simulate take untrusted input: a simulation document read back
from JSON (``render_html``), and session specs from the command line
(``expand_sessions``). Any mutation of a real document renders an escaped page or raises
``ValueError``; any spec gives files inside what it names, or the package's typed error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.tools.simulation.fleet import expand_sessions
from kilo_rules.tools.simulation.htmlreport import render_html
from tests.fuzz.budget import FUZZ
from tests.fuzz.mutate import mutated

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/simulate/sonnet45-subagent.json"
DOC = json.loads(FIXTURE.read_text(encoding="utf-8"))
_TAG = re.compile(r"<(script|iframe|object|embed|img|link)\b", re.IGNORECASE)


@pytest.mark.slow
@FUZZ
@given(mutated(DOC, max_mutations=4))
def test_any_document_renders_escaped_or_is_refused(doc: object) -> None:
    try:
        page = render_html(doc)  # type: ignore[arg-type]  # anything JSON can hold
    except ValueError as exc:
        assert str(exc)
        return
    assert page.startswith("<!DOCTYPE html>") or page.startswith("<!doctype html>")
    assert _TAG.search(page) is None
    assert "https://" not in page


_HOSTILE = st.sampled_from(
    ["<script>alert(1)</script>", "a&b", '"quoted"', "\u202e", "x" * 300, "", "\x00"]
)


@pytest.mark.slow
@FUZZ
@given(st.lists(_HOSTILE, min_size=1, max_size=4))
def test_hostile_strings_in_names_are_text(names: list[str]) -> None:
    doc = json.loads(json.dumps(DOC))
    doc["session"] = names[0]
    for i, report in enumerate(doc["reports"]):
        report["policy"] = names[i % len(names)]
        report["error"] = names[-1] or None
    try:
        page = render_html(doc)
    except ValueError:
        return
    assert _TAG.search(page) is None


_PIECES = st.sampled_from(
    ["a", "*", "**", "?", "[", "]", "/", "..", ".", "~", "s.jsonl", "x.json", "-", " ", "\\"]
)


@pytest.mark.slow
@FUZZ
@given(st.lists(st.lists(_PIECES, max_size=6).map("".join), min_size=1, max_size=3))
def test_any_session_spec_gives_files_or_a_typed_error(specs: list[str]) -> None:
    root = Path(__file__).resolve().parents[1] / "fixtures/simulate"
    rooted = [str(root / s) for s in specs]
    try:
        found = expand_sessions(rooted, limit=50)
    except KiloRulesError as exc:
        assert exc.diagnostics and exc.diagnostics[0].code.startswith("simulate.")
        return
    assert found and len(found) <= 50
    assert all(p.is_file() for p in found)
