"""SWE-agent 0.x trajectories (the copy in examples/sessions)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from importer_helpers import SWE_AGENT, check_session, largest_result, result_text, tool_parts

from kilo_rules.engine.formats.session import Session, TextPart
from kilo_rules.engine.importers import detect_format, import_file


@pytest.fixture(scope="module")
def traj() -> tuple[Session, dict[str, Any]]:
    return import_file(SWE_AGENT), json.loads(SWE_AGENT.read_text(encoding="utf-8"))


def test_detected() -> None:
    assert detect_format(SWE_AGENT.read_text(encoding="utf-8")) == "swe_agent"


def test_counts_match_sources(traj: tuple[Session, dict[str, Any]]) -> None:
    # SOURCES.md: 26 history messages (1 system, 13 user, 12 assistant), 12 actions,
    # largest observation 5,158 bytes.
    session, raw = traj
    check_session(session)
    assert len(raw["history"]) == 26
    assert len([m for m in session.messages if m.role == "assistant"]) == 12
    tools = tool_parts(session)
    assert [p.input["command"] for p in tools] == [
        m["action"] for m in raw["history"] if m["role"] == "assistant"
    ]
    assert all(p.status == "completed" for p in tools)
    assert largest_result(session) == 5_158


def test_observations_are_the_following_user_messages(traj: tuple[Session, dict[str, Any]]) -> None:
    session, raw = traj
    history = raw["history"]
    replies = [
        history[i + 1]["content"]
        for i, m in enumerate(history)
        if m["role"] == "assistant" and i + 1 < len(history)
    ]
    tools = tool_parts(session)
    assert [result_text(p) for p in tools[:-1]] == replies
    # `submit` is the last message; its observation (the diff) comes from the trajectory.
    assert tools[-1].input["command"] == "submit\n"
    assert tools[-1].metadata["submission"] is True
    assert result_text(tools[-1]) == raw["trajectory"][-1]["observation"]


def test_system_demo_and_thoughts(traj: tuple[Session, dict[str, Any]]) -> None:
    session, raw = traj
    assert session.metadata["system_prompt"] == raw["history"][0]["content"]
    demo, task = session.messages[0], session.messages[1]
    assert demo.metadata == {"is_demo": True}
    assert "--- DEMONSTRATION ---" in demo.parts[0].text
    assert task.role == "user" and task.agent == "primary"
    assistant = session.messages[2]
    assert isinstance(assistant.parts[0], TextPart)
    assert assistant.parts[0].text == raw["history"][3]["thought"].strip()
    assert assistant.metadata["raw_content"] == raw["history"][3]["content"]
    assert assistant.finish == "tool-calls"
    stats = session.metadata["swe_agent"]["model_stats"]
    assert stats["tokens_sent"] == 122_612
    assert session.id == "swe-agent-gpt4-pydicom-1458"
