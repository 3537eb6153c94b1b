"""The engine's invariants (docs/architecture.md, "Invariants") on generated sessions, for
every provider: tool calls and results always paired; byte-identical output for identical
input; the bytes before the last cache breakpoint stay identical across the steps of one
user message; the marker budget is never exceeded; the session handed in is never
changed."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import (
    ApprovalPart,
    FilePart,
    Message,
    MessageError,
    ReasoningPart,
    Session,
    StepStartPart,
    TextPart,
    ToolDefinition,
    ToolPart,
    ToolTime,
)
from kilo_rules.engine.providers import count_markers
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput

from .helpers import model

PNG = "data:image/png;base64,iVBORw0KGgo="
MODELS = {
    "anthropic": model(),
    "bedrock": model(
        id="b/m", provider="amazon-bedrock", api="bedrock", api_id="anthropic.claude-x"
    ),
    "openai": model(
        id="o/m",
        provider="openai",
        api="openai",
        api_id="gpt-4.1",
        family="gpt",
        cache={"kind": "automatic", "max_breakpoints": 0, "min_cacheable_tokens": 1024},
    ),
    "gemini": model(
        id="g/m",
        provider="google",
        api="gemini",
        api_id="gemini-2.5-pro",
        family="gemini",
        cache={"kind": "automatic", "max_breakpoints": 0, "min_cacheable_tokens": 0},
    ),
    "openai-compatible": model(
        id="r/m",
        provider="openrouter",
        api="openai-compatible",
        api_id="anthropic/claude-sonnet-4.5",
    ),
}
PLANS = {api: compile_policy("kilo-default", m) for api, m in MODELS.items()}
CACHE_MAX = {api: compile_policy("cache-max", m) for api, m in MODELS.items()}

words = st.text(alphabet='abcdefgh xyz\n{}"é😀', min_size=0, max_size=30)


@st.composite
def tool_parts(draw: st.DrawFn, pid: str) -> ToolPart:
    status = draw(st.sampled_from(["completed", "completed", "completed", "error", "running"]))
    compacted = draw(st.booleans()) and status == "completed"
    attachments = [FilePart(id=f"{pid}f", mime="image/png", url=PNG)] if draw(st.booleans()) else []
    return ToolPart(
        id=pid,
        call_id=f"call-{pid}",
        tool=draw(st.sampled_from(["read", "bash", "skill"])),
        input={"arg": draw(words)},
        status=status,
        output=draw(words) if status == "completed" else "",
        error="boom" if status == "error" else None,
        time=ToolTime(compacted=1 if compacted else None),
        attachments=attachments,
    )


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    messages: list[Message] = []
    n_turns = draw(st.integers(1, 4))
    k = 0
    for t in range(n_turns):
        k += 1
        parts: list[Any] = [TextPart(id=f"p{k}", text=draw(words) or "hi")]
        if draw(st.integers(0, 5)) == 0:
            parts.append(FilePart(id=f"p{k}i", mime="image/png", url=PNG, filename="a.png"))
        messages.append(Message(id=f"m{k:03d}", role="user", created=1000 * k, parts=parts))
        for _ in range(draw(st.integers(0, 3))):
            k += 1
            aparts: list[Any] = []
            for j in range(draw(st.integers(1, 4))):
                kind = draw(st.sampled_from(["text", "tool", "tool", "reasoning", "step"]))
                pid = f"p{k}_{j}"
                if kind == "text":
                    aparts.append(TextPart(id=pid, text=draw(words)))
                elif kind == "tool":
                    call = draw(tool_parts(pid))
                    aparts.append(call)
                    if draw(st.integers(0, 4)) == 0:  # a call that needed the user's approval
                        answer = draw(st.sampled_from([None, True, False]))
                        aparts.append(
                            ApprovalPart(
                                id=f"{pid}a",
                                approval_id=f"ap-{pid}",
                                call_id=call.call_id,
                                approved=answer,
                            )
                        )
                elif kind == "reasoning":
                    aparts.append(ReasoningPart(id=pid, text=draw(words), signature="sig"))
                else:
                    aparts.append(StepStartPart(id=pid))
            error = (
                MessageError(name="MessageAbortedError") if draw(st.integers(0, 8)) == 0 else None
            )
            messages.append(
                Message(
                    id=f"m{k:03d}",
                    role="assistant",
                    created=1000 * k + 1,
                    parts=aparts,
                    finish="tool-calls",
                    error=error,
                )
            )
        del t
    tools = [ToolDefinition(name=n, description=f"{n} tool") for n in ("read", "bash", "skill")]
    return Session(id="gen", messages=messages, tools=tools)


def tool_ids(body: dict[str, Any], api: str) -> tuple[list[str], list[str]]:
    """(call ids in order, result ids in order) of a rendered body."""
    calls: list[str] = []
    results: list[str] = []
    if api == "anthropic":
        for m in body["messages"]:
            for b in m["content"] if isinstance(m["content"], list) else []:
                if b["type"] == "tool_use":
                    calls.append(b["id"])
                elif b["type"] == "tool_result":
                    results.append(b["tool_use_id"])
    elif api in ("openai", "openai-compatible"):
        for m in body["messages"]:
            calls.extend(c["id"] for c in m.get("tool_calls", []))
            if m["role"] == "tool":
                results.append(m["tool_call_id"])
    elif api == "bedrock":
        for m in body["messages"]:
            for b in m["content"]:
                if "toolUse" in b:
                    calls.append(b["toolUse"]["toolUseId"])
                elif "toolResult" in b:
                    results.append(b["toolResult"]["toolUseId"])
    else:
        for m in body["contents"]:
            for p in m["parts"]:
                if "functionCall" in p:
                    calls.append(p["functionCall"].get("id") or p["functionCall"]["name"])
                elif "functionResponse" in p:
                    results.append(p["functionResponse"].get("id") or p["functionResponse"]["name"])
    return calls, results


def _strip_marks(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _strip_marks(v) for k, v in node.items() if k not in ("cache_control", "cachePoint")
        }
    if isinstance(node, list):
        return [
            _strip_marks(v) for v in node if not (isinstance(v, dict) and set(v) == {"cachePoint"})
        ]
    return node


# KILO_RULES_PROPERTY_EXAMPLES raises the count for a deeper run on demand.
FAST = settings(
    max_examples=int(os.environ.get("KILO_RULES_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.slow
@FAST
@given(sessions())
def test_tool_calls_and_results_always_pair(s: Session) -> None:
    for api, plan in PLANS.items():
        body = apply_plan(plan, s, StepInput()).request
        calls, results = tool_ids(body, api)
        assert sorted(calls) == sorted(results), api
        assert len(set(calls)) == len(calls), api


@pytest.mark.slow
@FAST
@given(sessions())
def test_identical_input_gives_identical_bytes_and_session_is_untouched(s: Session) -> None:
    before = s.model_dump_json()
    for plan in [*PLANS.values(), *CACHE_MAX.values()]:
        a = apply_plan(plan, s, StepInput())
        b = apply_plan(plan, Session.model_validate_json(s.model_dump_json()), StepInput())
        assert a.body() == b.body()
    assert s.model_dump_json() == before


@pytest.mark.slow
@FAST
@given(sessions())
def test_marker_budget_never_exceeded(s: Session) -> None:
    for api in MODELS:
        for plan in (PLANS[api], CACHE_MAX[api]):
            result = apply_plan(plan, s, StepInput())
            assert count_markers(result.request, api) <= plan.cache["budget"] <= 4


def _blocks(messages: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Every content block as (role, block) text without marks, and the index of the last
    marked block (-1 if none). Providers cache by block prefix, so this is what must not
    change between steps."""
    flat: list[str] = []
    last = -1
    for m in messages:
        content = m.get("content")
        # A string is the same as one text part (OpenAI-compatible servers expand it).
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks = content if isinstance(content, list) else [content]
        for b in blocks:
            if isinstance(b, dict) and set(b) == {"cachePoint"}:
                last = len(flat) - 1
                continue
            if isinstance(b, dict) and "cache_control" in b:
                last = len(flat)
            flat.append(json.dumps([m["role"], _strip_marks(b)], sort_keys=True))
        for call in m.get("tool_calls", []):
            flat.append(json.dumps([m["role"], call], sort_keys=True))
    return flat, last


@FAST
@given(sessions(), st.integers(1, 3))
def test_prefix_before_last_breakpoint_is_stable_across_steps(s: Session, extra: int) -> None:
    """Steps of one user message only append: what was cached stays byte-identical."""
    for api in ("anthropic", "bedrock", "openai-compatible"):
        plan = PLANS[api]
        current = s
        previous = apply_plan(plan, current, StepInput(step=1))
        for k in range(extra):
            step_msg = Message(
                id=f"z{k:03d}",
                role="assistant",
                created=10**9 + k,
                finish="tool-calls",
                parts=[ToolPart(id=f"zt{k}", call_id=f"zc{k}", tool="read", output=f"out {k}")],
            )
            persisted = _persist(current, previous.mutations)
            current = persisted.model_copy(update={"messages": [*persisted.messages, step_msg]})
            nxt = apply_plan(plan, current, StepInput(step=k + 2))
            old, new = previous.request, nxt.request
            assert _strip_marks(old.get("system")) == _strip_marks(new.get("system"))
            assert _strip_marks(old.get("tools")) == _strip_marks(new.get("tools"))
            old_blocks, cut = _blocks(old["messages"])
            new_blocks, _ = _blocks(new["messages"])
            assert old_blocks[: cut + 1] == new_blocks[: cut + 1], api
            previous = nxt


def _persist(s: Session, mutations: list[dict[str, Any]]) -> Session:
    adds: dict[str, list[dict[str, Any]]] = {}
    for m in mutations:
        if m["op"] == "add_part":
            adds.setdefault(m["message_id"], []).append(m["part"])
    if not adds:
        return s
    msgs = [
        m.model_copy(update={"parts": [*m.parts, *(TextPart(**p) for p in adds[m.id])]})
        if m.id in adds
        else m
        for m in s.messages
    ]
    return s.model_copy(update={"messages": msgs})
