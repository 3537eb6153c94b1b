"""Helpers for the importer tests: where the logs are, and one check every import passes.

The two small logs live in ``examples/sessions`` (copied with their license), so the tests
that use them run from a fresh clone. The four larger ones are read from
``../shared/data/trajectories`` beside the checkout and skipped when it is absent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.formats.session import Session, ToolPart, dump_session, session_from_data

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "sessions"
TRAJECTORIES = REPO.parent / "shared" / "data" / "trajectories"

SUBAGENT = EXAMPLES / "claude-code-sonnet45-subagent-a2898e3.jsonl"
SWE_AGENT = EXAMPLES / "swe-agent-gpt4-pydicom-1458.traj"


def shared_log(name: str) -> Path:
    """A log from ``../shared/data/trajectories``; skips the test when it is not there."""
    path = TRAJECTORIES / name
    if not path.is_file():
        pytest.skip(
            f"{name} not found: the shared trajectories folder ({TRAJECTORIES}) is "
            "not beside this checkout"
        )
    return path


def tool_parts(session: Session) -> list[ToolPart]:
    """All tool parts, in order."""
    return [p for m in session.messages for p in m.parts if isinstance(p, ToolPart)]


def result_text(part: ToolPart) -> str:
    """What the model was given back: the output, or the error text."""
    return part.output if part.status == "completed" else part.error or ""


def largest_result(session: Session) -> int:
    """UTF-8 size of the largest tool result fed back to the model (the final submission,
    never shown to the model, is left out as SOURCES.md does)."""
    return max(
        len(result_text(p).encode())
        for p in tool_parts(session)
        if not p.metadata.get("submission")
    )


def check_session(session: Session) -> None:
    """Invariants of every import: unique ids, message ids in log order, every call answered
    unless listed as unanswered, and a lossless Session v1 round trip."""
    ids = [m.id for m in session.messages]
    assert ids == sorted(ids)
    part_ids = [p.id for m in session.messages for p in m.parts]
    attachment_ids = [a.id for p in tool_parts(session) for a in p.attachments]
    everything = ids + part_ids + attachment_ids
    assert len(everything) == len(set(everything))
    unanswered = session.metadata["import"].get("unanswered", [])
    for part in tool_parts(session):
        if part.call_id in unanswered:
            assert part.status == "pending"
        else:
            assert part.status in ("completed", "error"), part.call_id
    used = {p.tool for p in tool_parts(session)}
    assert used <= {t.name for t in session.tools}
    again = session_from_data(json.loads(dump_session(session)))
    assert again == session


def jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each line of a JSON Lines file."""
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if line.strip():
            yield n, json.loads(line)
