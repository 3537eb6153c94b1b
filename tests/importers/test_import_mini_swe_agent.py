"""mini-swe-agent trajectories: v1 text actions and v2 tool calls."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from importer_helpers import check_session, largest_result, result_text, shared_log, tool_parts

from kilo_rules.engine.formats.session import Session, TextPart, ToolPart
from kilo_rules.engine.importers import detect_format, import_file

V1 = "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json"
V2 = "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json"


def _load(name: str) -> tuple[Session, dict[str, Any]]:
    path = shared_log(name)
    return import_file(path), json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def v1() -> tuple[Session, dict[str, Any]]:
    return _load(V1)


@pytest.fixture(scope="module")
def v2() -> tuple[Session, dict[str, Any]]:
    return _load(V2)


def test_detected() -> None:
    for name in (V1, V2):
        assert detect_format(shared_log(name).read_text(encoding="utf-8")) == "mini_swe_agent"


def test_v1_counts_match_sources(v1: tuple[Session, dict[str, Any]]) -> None:
    # SOURCES.md: 196 messages (1 system, 98 user, 97 assistant); "97 commands and 96
    # observations"; largest observation 41,623 bytes. Two of the 97 assistant turns held
    # two bash blocks and were rejected by the agent (its regex needs exactly one), so they
    # ran nothing: 95 tool calls, and the 96 replies are 94 command outputs plus the two
    # format-error messages. The 95th call's output is the submitted diff.
    session, raw = v1
    check_session(session)
    assert Counter(m["role"] for m in raw["messages"]) == {"system": 1, "user": 98, "assistant": 97}
    assistants = [m for m in session.messages if m.role == "assistant"]
    assert len(assistants) == 97
    tools = tool_parts(session)
    assert len(tools) == 95
    assert all(p.status == "completed" for p in tools)
    format_errors = [
        m
        for m in session.messages
        if m.role == "user" and m.parts[0].metadata.get("mini_swe_agent")
    ]
    assert len(format_errors) == 2
    assert all(
        m.parts[0].text.startswith("Please always provide EXACTLY ONE action")
        for m in format_errors
    )
    fed_back = [p for p in tools if not p.metadata.get("submission")]
    assert len(fed_back) + len(format_errors) == 96
    assert largest_result(session) == 41_623
    assert tools[-1].metadata == {"submission": True}
    assert result_text(tools[-1]) == raw["messages"][-1]["content"]


def test_v1_actions_and_thoughts(v1: tuple[Session, dict[str, Any]]) -> None:
    session, raw = v1
    action = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
    for m in session.messages:
        if m.role == "assistant" and "raw_content" in m.metadata:
            (command,) = action.findall(m.metadata["raw_content"])
            (tool,) = [p for p in m.parts if isinstance(p, ToolPart)]
            assert tool.input == {"command": command}
            thought = [p.text for p in m.parts if isinstance(p, TextPart)]
            assert all("```bash" not in t for t in thought)
    assert session.metadata["system_prompt"] == raw["messages"][0]["content"]
    timeouts = [p for p in tool_parts(session) if p.metadata.get("timeout")]
    assert len(timeouts) == 4
    assert max(len(result_text(p).encode()) for p in timeouts) == 41_623


def test_v1_usage_and_cost(v1: tuple[Session, dict[str, Any]]) -> None:
    session, raw = v1
    total = sum(m.cost or 0 for m in session.messages)
    assert total == pytest.approx(raw["info"]["model_stats"]["instance_cost"])
    first = next(m for m in session.messages if m.role == "assistant")
    usage = raw["messages"][2]["extra"]["response"]["usage"]
    assert first.tokens is not None
    assert first.tokens.total == usage["total_tokens"]
    assert first.tokens.reasoning == usage["completion_tokens_details"]["reasoning_tokens"]
    assert first.tokens.output + first.tokens.reasoning == usage["completion_tokens"]
    assert first.parts[0].type == "reasoning"  # Gemini's reasoning text, from the response


def test_v2_counts_match_sources(v2: tuple[Session, dict[str, Any]]) -> None:
    # SOURCES.md: 316 messages (1 system, 1 user, 157 assistant, 156 tool, 1 exit),
    # 157 tool calls, largest output 10,620 bytes. The exit message (the submitted diff)
    # answers the 157th call.
    session, raw = v2
    check_session(session)
    assert len(raw["messages"]) == 316
    tools = tool_parts(session)
    assert len(tools) == 157
    assert all(p.status == "completed" for p in tools)
    assert [p.call_id for p in tools] == [
        tc["id"] for m in raw["messages"] if m["role"] == "assistant" for tc in m["tool_calls"]
    ]
    assert largest_result(session) == 10_620
    assert tools[-1].metadata == {"submission": True, "exit_status": "Submitted"}
    assert sum(bool(p.metadata.get("truncated")) for p in tools) == 2
    assert all(isinstance(p.metadata.get("returncode"), int) for p in tools[:-1])


def test_v2_usage_cost_and_times(v2: tuple[Session, dict[str, Any]]) -> None:
    session, raw = v2
    total = sum(m.cost or 0 for m in session.messages)
    assert total == pytest.approx(raw["info"]["model_stats"]["instance_cost"])
    first = next(m for m in session.messages if m.role == "assistant")
    usage = raw["messages"][2]["extra"]["response"]["usage"]
    assert first.tokens is not None
    assert first.tokens.cache.read == usage["prompt_tokens_details"]["cached_tokens"]
    assert first.tokens.input + first.tokens.cache.read == usage["prompt_tokens"]
    assert session.model == "deepseek/deepseek-chat"
    assert first.model == "deepseek-chat"
    tool = tool_parts(session)[0]
    assert tool.time.end is not None and first.created <= tool.time.end
