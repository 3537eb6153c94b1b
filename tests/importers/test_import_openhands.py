"""OpenHands evaluation output: three runs, actions paired with observations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from importer_helpers import check_session, largest_result, result_text, shared_log, tool_parts

from kilo_rules.engine.base.errors import ImportFormatError
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers import detect_format, import_file

LOG = "openhands-llama4-multiswebench-output.jsonl"


@pytest.fixture(scope="module")
def runs() -> list[tuple[Session, dict[str, Any]]]:
    path = shared_log(LOG)
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [(import_file(path, run=i), raw[i]) for i in range(3)]


def test_detected() -> None:
    assert detect_format(shared_log(LOG).read_text(encoding="utf-8")) == "openhands"


def test_counts_match_sources(runs: list[tuple[Session, dict[str, Any]]]) -> None:
    # SOURCES.md: 49 + 70 + 103 = 222 events, 114 actions / 108 observations, largest
    # observation 20,740 bytes.
    events = [len(raw["history"]) for _, raw in runs]
    assert events == [49, 70, 103]
    assert [s.metadata["import"]["events"] for s, _ in runs] == events
    actions = sum("action" in e for _, raw in runs for e in raw["history"])
    observations = sum("observation" in e for _, raw in runs for e in raw["history"])
    assert (actions, observations) == (114, 108)
    assert max(largest_result(s) for s, _ in runs) == 20_740
    for session, raw in runs:
        check_session(session)
        calls = [e for e in raw["history"] if "action" in e and "tool_call_metadata" in e]
        assert [p.call_id for p in tool_parts(session)] == [
            e["tool_call_metadata"]["tool_call_id"] for e in calls
        ]


def test_every_call_answered_except_the_final_finish(
    runs: list[tuple[Session, dict[str, Any]]],
) -> None:
    # Runs 0 and 1 end on a `finish` call, which OpenHands never answers: the log ends
    # there. Run 2 stopped at the iteration limit with every call answered.
    for session, raw in runs:
        unanswered = session.metadata["import"]["unanswered"]
        last = tool_parts(session)[-1]
        if raw["error"] is None:
            assert unanswered == [last.call_id]
            assert (last.tool, last.status) == ("finish", "pending")
        else:
            assert unanswered == []
            assert "maximum iteration" in session.metadata["openhands"]["error"]


def test_observation_text_is_the_tool_output(runs: list[tuple[Session, dict[str, Any]]]) -> None:
    session, raw = runs[0]
    by_call = {
        e["tool_call_metadata"]["tool_call_id"]: e
        for e in raw["history"]
        if "observation" in e and "tool_call_metadata" in e
    }
    for part in tool_parts(session):
        if part.call_id in by_call:
            assert result_text(part) == by_call[part.call_id]["content"]
            assert part.metadata["extras"] == by_call[part.call_id]["extras"]


def test_tool_input_is_what_the_model_sent(runs: list[tuple[Session, dict[str, Any]]]) -> None:
    session, _ = runs[0]
    first = tool_parts(session)[0]
    assert (first.tool, first.input) == (
        "execute_bash",
        {"command": "ls -l /workspace/ponylang__ponyc__0.1"},
    )


def test_session_fields(runs: list[tuple[Session, dict[str, Any]]]) -> None:
    session, raw = runs[0]
    assert session.id == "ponylang__ponyc-4595"
    assert session.model == "openai/openrouter-llama-4-maverick"
    assert session.agent == "CodeActAgent"
    assert [t.name for t in session.tools] == [
        "execute_bash",
        "think",
        "finish",
        "str_replace_editor",
    ]
    assert all(t.description and t.input_schema.get("properties") for t in session.tools)
    assert session.metadata["system_prompt"].startswith("You are OpenHands agent")
    first_user = session.messages[0]
    assert first_user.role == "user"
    assert first_user.parts[0].type == "text"
    assert first_user.parts[0].text == raw["history"][1]["args"]["content"]
    assistant = session.messages[2]
    assert assistant.tokens is not None and assistant.tokens.input == 5920
    assert assistant.tokens.output == 128


def test_error_observation_without_a_call_is_a_user_message(
    runs: list[tuple[Session, dict[str, Any]]],
) -> None:
    session, _ = runs[1]
    errors = [
        m
        for m in session.messages
        if m.role == "user"
        and m.parts[0].metadata.get("openhands", {}).get("observation") == "error"
    ]
    assert len(errors) == 1
    assert errors[0].parts[0].text.startswith("Parameter 'command' is expected")


def test_run_out_of_range() -> None:
    with pytest.raises(ImportFormatError) as info:
        import_file(shared_log(LOG), run=3)
    diag = info.value.diagnostic
    assert diag.code == "import.run"
    assert diag.message == "run 3 is out of range: the file holds 3 runs (0–2)"
    assert (diag.location.line, diag.location.col) == (1, 1)
