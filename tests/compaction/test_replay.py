"""Replays of recorded Claude Code sessions under kilo-default with a small window.

The recorded compaction of the original agent (Claude Code's own summary) is dropped
before the replay: the point is to see where *Kilo's* rule compacts, and a foreign summary
in the record would make the projection start from it. Everything else of the log must be
recoverable from the final session, which the mutations alone rebuild.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session, ToolPart
from kilo_rules.engine.importers import import_file
from kilo_rules.engine.runtime.mutations import missing, restore
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

from .helpers import model
from .replay import Replay, persisted, replay

ROOT = Path(__file__).resolve().parents[2]
LARGEST = ROOT.parent / "shared/data/trajectories/claude-code-opus46-spotter-8463c716.jsonl"
SMALL = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"


def _run(path: Path, context: int, output: int) -> tuple[Session, Session, Replay]:
    log = import_file(path)
    original = without_recorded_compactions(log)
    plan = compile_policy("kilo-default", model(limits={"context": context, "output": output}))
    report = replay(original, plan, ExtractiveSummarizer())
    return log, original, report


def _check_nothing_lost(log: Session, original: Session, report: Replay) -> None:
    final = report.session
    assert final is not None
    # every message as this run recorded it is still stored, unchanged but for marks
    as_recorded = original.model_copy(update={"messages": report.recorded})
    assert missing(as_recorded, final) == []
    # every tool output and text of the original log is still in the final session
    held = {p.id: p for m in final.messages for p in m.parts}
    for msg in original.messages:
        for part in msg.parts:
            kept = held[part.id]
            if isinstance(part, ToolPart):
                assert isinstance(kept, ToolPart) and kept.output == part.output
            else:
                assert kept == part
    # the mutations alone rebuild the final session, and restore() undoes them
    rebuilt = persisted(original, report)
    assert {m.id: m for m in rebuilt.messages} == {m.id: m for m in final.messages}
    assert [m.id for m in restore(final).messages] == [m.id for m in report.recorded]
    dropped = {m.id for m in log.messages} - {m.id for m in original.messages}
    assert len(dropped) in (0, 2)  # only the recorded compaction request and summary


def test_replay_small_example_session_compacts_on_provider_overflow() -> None:
    log, original, report = _run(SMALL, 30_000, 4_000)
    assert report.steps == 12
    assert report.mismatches == []  # usage-count compactions exactly where Kilo's rule says
    assert report.provider_overflows == 1 and report.compactions == 1
    assert report.max_request <= 30_000
    _check_nothing_lost(log, original, report)


@pytest.mark.slow
def test_replay_largest_claude_code_session_under_a_60k_window() -> None:
    if not LARGEST.exists():
        pytest.skip("../shared/data/trajectories is not available")
    log, original, report = _run(LARGEST, 60_000, 8_000)
    assert report.steps == 143
    assert report.mismatches == []
    # Three steps grow input plus the 8,000 output cap past the window; a provider refuses
    # those, so each is compacted in overflow mode before it is sent (overflow.unfit).
    assert report.compactions == 3 and report.provider_overflows == 3
    assert report.max_request <= 60_000
    _check_nothing_lost(log, original, report)
