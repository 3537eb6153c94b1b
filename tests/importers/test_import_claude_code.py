"""Claude Code session logs: merged responses, tool pairing, usage, compaction."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from importer_helpers import (
    SUBAGENT,
    check_session,
    jsonl_records,
    largest_result,
    shared_log,
    tool_parts,
)

from kilo_rules.engine.formats.session import CompactionPart, ReasoningPart, Session, TextPart
from kilo_rules.engine.importers import detect_format, import_file

MAIN = "claude-code-opus46-spotter-8463c716.jsonl"


@pytest.fixture(scope="module")
def subagent() -> Session:
    return import_file(SUBAGENT)


@pytest.fixture(scope="module")
def main_log() -> tuple[Session, list[tuple[int, Any]]]:
    path = shared_log(MAIN)
    return import_file(path), list(jsonl_records(path))


def test_detected() -> None:
    assert detect_format(SUBAGENT.read_text(encoding="utf-8")) == "claude_code"


def test_subagent_counts_match_sources(subagent: Session) -> None:
    # SOURCES.md: 144 lines; 74 user/assistant entries (12 API responses); 33 tool calls
    # (Read 16, Glob 10, Bash 5, Grep 2); largest tool result 32,254 bytes.
    check_session(subagent)
    records = list(jsonl_records(SUBAGENT))
    assert len(records) == 144
    assistants = [m for m in subagent.messages if m.role == "assistant"]
    users = [m for m in subagent.messages if m.role == "user"]
    assert len(assistants) == 12
    assert len(users) == 1
    merged_lines = sum(len(m.metadata["lines"]) for m in assistants)
    result_lines = {p.metadata["result_line"] for p in tool_parts(subagent)}
    assert merged_lines + len(result_lines) + len(users) == 74
    assert Counter(p.tool for p in tool_parts(subagent)) == {
        "Read": 16,
        "Glob": 10,
        "Bash": 5,
        "Grep": 2,
    }
    assert largest_result(subagent) == 32_254
    assert subagent.metadata["import"]["skipped"] == {"progress": 70}


def test_subagent_merges_responses_by_message_id(subagent: Session) -> None:
    raw_ids = [r["message"]["id"] for _, r in jsonl_records(SUBAGENT) if r["type"] == "assistant"]
    assert [m.metadata["message_id"] for m in subagent.messages if m.role == "assistant"] == list(
        dict.fromkeys(raw_ids)
    )
    first = subagent.messages[1]
    # One response, nine parallel calls, each answered by its own result line.
    assert [p.type for p in first.parts] == ["text"] + ["tool"] * 9
    assert first.finish == "tool-calls"
    assert first.parent_id == subagent.messages[0].id


def test_subagent_tool_results_and_errors(subagent: Session) -> None:
    raw: dict[str, dict[str, Any]] = {}
    for _, rec in jsonl_records(SUBAGENT):
        content = rec.get("message", {}).get("content")
        if rec["type"] == "user" and isinstance(content, list):
            raw.update({b["tool_use_id"]: b for b in content if b["type"] == "tool_result"})
    for part in tool_parts(subagent):
        block = raw[part.call_id]
        if block.get("is_error"):
            assert (part.status, part.error, part.output) == ("error", block["content"], "")
        else:
            assert (part.status, part.output) == ("completed", block["content"])
        assert part.time.start is not None and part.time.end is not None
        assert part.time.start <= part.time.end
    assert sum(p.status == "error" for p in tool_parts(subagent)) == 8


def test_subagent_usage_is_the_last_line_of_each_response(subagent: Session) -> None:
    usage: dict[str, dict[str, int]] = {}
    for _, rec in jsonl_records(SUBAGENT):
        if rec["type"] == "assistant":
            usage[rec["message"]["id"]] = rec["message"]["usage"]
    for m in subagent.messages:
        if m.role == "assistant":
            u = usage[m.metadata["message_id"]]
            assert m.tokens is not None
            assert (m.tokens.input, m.tokens.output) == (u["input_tokens"], u["output_tokens"])
            assert m.tokens.cache.read == u["cache_read_input_tokens"]
            assert m.tokens.cache.write == u["cache_creation_input_tokens"]
            assert m.model == "claude-sonnet-4-5-20250929"


def test_subagent_session_fields(subagent: Session) -> None:
    assert subagent.id == "4d5611e5-241a-462a-8d15-5122611a9569/agent-a2898e3"
    assert subagent.directory == "/home/USER/projects/spotter-worktrees/spotter-dov"
    assert [t.name for t in subagent.tools] == ["Read", "Glob", "Grep", "Bash"]
    assert subagent.tools[0].input_schema == {"type": "object", "properties": {}}
    # 2026-02-12T16:02:48.183Z
    assert subagent.messages[0].created == 1_770_912_168_183
    assert subagent.messages[0].parts[0].type == "text"


def test_main_counts_match_sources(main_log: tuple[Session, list[tuple[int, Any]]]) -> None:
    # SOURCES.md: 1,593 lines; 458 user/assistant entries (143 API responses); 177 tool
    # calls, all answered; largest result 39,598 bytes.
    session, records = main_log
    check_session(session)
    assert len(records) == 1593
    kinds = Counter(r["type"] for _, r in records)
    assert kinds["user"] + kinds["assistant"] == 458
    responses = [m for m in session.messages if m.role == "assistant" and not m.summary]
    assert len(responses) == 143
    tools = tool_parts(session)
    assert len(tools) == 177
    assert all(p.status in ("completed", "error") for p in tools)
    assert Counter(p.tool for p in tools) == {
        "Bash": 74,
        "Read": 40,
        "Edit": 22,
        "Grep": 20,
        "Glob": 9,
        "Write": 5,
        "TaskOutput": 3,
        "Task": 1,
        "Skill": 1,
        "EnterPlanMode": 1,
        "ExitPlanMode": 1,
    }
    assert largest_result(session) == 39_598
    assert session.metadata["import"]["skipped"] == {
        "progress": 1117,
        "file-history-snapshot": 13,
        "queue-operation": 1,
        "system:stop_hook_summary": 2,
        "system:turn_duration": 1,
    }


def test_main_thinking_keeps_signatures(main_log: tuple[Session, list[tuple[int, Any]]]) -> None:
    session, _ = main_log
    reasoning = [p for m in session.messages for p in m.parts if isinstance(p, ReasoningPart)]
    assert len(reasoning) == 19
    assert all(p.signature for p in reasoning)
    texts = [
        p
        for m in session.messages
        for p in m.parts
        if isinstance(p, TextPart) and m.role == "assistant" and not m.summary
    ]
    assert len(texts) == 82


def test_main_compaction(main_log: tuple[Session, list[tuple[int, Any]]]) -> None:
    session, records = main_log
    summary_text = dict(records)[715]["message"]["content"]
    (i,) = [
        i
        for i, m in enumerate(session.messages)
        if any(isinstance(p, CompactionPart) for p in m.parts)
    ]
    boundary, summary = session.messages[i], session.messages[i + 1]
    part = boundary.parts[0]
    assert isinstance(part, CompactionPart)
    assert (boundary.role, part.auto, part.overflow) == ("user", True, False)
    assert boundary.metadata["compact_boundary"]["preTokens"] == 167_731
    assert boundary.metadata["compact_boundary"]["line"] == 714
    assert (summary.role, summary.summary, summary.finish) == ("assistant", True, "stop")
    assert summary.parent_id == boundary.id
    assert [p.text for p in summary.parts if isinstance(p, TextPart)] == [summary_text]
    # Everything before the boundary is the pre-compaction history; the next response
    # answers the compaction turn.
    assert all(m.metadata.get("lines", [0])[0] < 714 for m in session.messages[:i])
    assert session.messages[i + 2].parent_id == boundary.id
