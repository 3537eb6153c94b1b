"""Every importer on mutated logs: a session, or a located ImportFormatError (or another of
the package's typed errors); never a traceback, and never a session that does not load back
as Session v1."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.engine.formats.session import dump_session, session_from_json
from kilo_rules.engine.importers import import_text
from tests.fuzz.budget import FUZZ
from tests.fuzz.importer_samples import SAMPLES, log_text
from tests.fuzz.mutate import mutated

CASES = [(fmt, i) for fmt, samples in SAMPLES.items() for i in range(len(samples))]


def check_import(fmt: str, records: list[Any], auto: bool) -> None:
    """Import ``records`` as ``fmt`` (or detected); assert the outcome is typed and located."""
    check_text(fmt, log_text(fmt, records), auto)


def check_text(fmt: str, text: str, auto: bool) -> None:
    """Import ``text`` as ``fmt`` (or detected); assert the outcome is typed and located."""
    try:
        session = import_text(text, fmt="auto" if auto else fmt, name="log.json")
    except KiloRulesError as exc:
        for diag in exc.diagnostics:
            loc = diag.location
            assert loc.file == "log.json"
            assert 1 <= loc.line <= text.count("\n") + 1
            assert loc.col >= 1
            # Only a value the importer itself failed to check ends unlocated.
            assert diag.code != "import.invalid", diag
        return
    assert session_from_json(dump_session(session)) == session


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "index"), CASES)
@FUZZ
@given(data=st.data(), auto=st.booleans())
def test_mutated_logs(fmt: str, index: int, data: st.DataObject, auto: bool) -> None:
    records = data.draw(mutated(SAMPLES[fmt][index], min_path=1))
    check_import(fmt, records, auto)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "index"), CASES)
@FUZZ
@given(data=st.data(), auto=st.booleans())
def test_huge_integers(fmt: str, index: int, data: st.DataObject, auto: bool) -> None:
    """A run of digits anywhere in the log (a count, an id, inside tool-call arguments)
    made thousands of digits long: refused as ``import.number`` where it stands, or kept
    as text inside a string; never Python's untyped int-conversion ValueError."""
    text = log_text(fmt, SAMPLES[fmt][index])
    runs = [m.span() for m in re.finditer(r"\d+", text)] or [(0, 0)]
    start, end = data.draw(st.sampled_from(runs))
    digits = "7" * data.draw(st.sampled_from([1001, 4301, 5000, 20_000]))
    check_text(fmt, text[:start] + digits + text[end:], auto)
