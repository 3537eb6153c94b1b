"""Properties over generated requests, for every wire API (docs/architecture.md, "Invariants").

* every tool call in the body has its result and no result lacks its call;
* the same request renders to the same bytes;
* cache markers never exceed the budget or the provider's limit;
* Anthropic and Bedrock turns alternate;
* every body validates (SDK request types, documented schemas).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_checks import check

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.request import (
    CacheMark,
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from kilo_rules.engine.providers import APIS, PROVIDER_BREAKPOINT_LIMITS, count_markers, render
from kilo_rules.engine.runtime.cache import place_markers

ENV = "<environment_details>\nnow\n</environment_details>"
texts = st.sampled_from(["", "hello", "fix it", ENV, "résumé ✓"])
marks = st.one_of(st.none(), st.none(), st.just(CacheMark(client=True)))
media = st.builds(
    Media,
    mime=st.sampled_from(["image/png", "image/jpeg", "application/pdf", "text/plain", "audio/wav"]),
    data=st.just("aGk="),
    filename=st.sampled_from([None, "notes.txt", "a b.pdf"]),
)
url_media = st.builds(
    Media, mime=st.just("image/png"), url=st.sampled_from(["https://x.test/a.png", "s3://b/k"])
)
text_parts = st.builds(Text, texts, synthetic=st.booleans(), cache=marks)
user_parts = st.lists(st.one_of(text_parts, media, url_media), min_size=1, max_size=3)
reasoning = st.builds(
    Reasoning,
    text=st.sampled_from(["", "thinking"]),
    signature=st.sampled_from([None, "sig"]),
    encrypted=st.sampled_from([None, "ZW5j"]),
    cache=marks,
)
# Ids with characters Anthropic and Bedrock refuse, and pairs that differ only in them.
id_stems = st.sampled_from(["call", "call.1", "call:1", "toolu_1", "a b", "x-y"])


@st.composite
def requests(draw: st.DrawFn) -> ModelRequest:
    messages = [
        ModelMessage("system", (draw(text_parts),), cache=draw(marks))
        for _ in range(draw(st.integers(0, 2)))
    ]
    counter = 0
    for _ in range(draw(st.integers(1, 4))):
        messages.append(ModelMessage("user", tuple(draw(user_parts)), cache=draw(marks)))
        if not draw(st.booleans()):
            continue
        parts: list[Any] = draw(st.lists(st.one_of(reasoning, text_parts), max_size=2))
        calls = []
        for _ in range(draw(st.integers(0, 3))):
            counter += 1
            call_id = f"{draw(id_stems)}{counter}"
            calls.append(ToolCall(call_id, "bash", {"n": counter}, cache=draw(marks)))
        messages.append(ModelMessage("assistant", tuple(parts + calls), cache=draw(marks)))
        if calls:
            results = tuple(
                ToolResult(
                    c.call_id,
                    c.name,
                    tuple(draw(st.lists(st.one_of(text_parts, media), max_size=2))),
                    is_error=draw(st.booleans()),
                    cache=draw(marks),
                )
                for c in calls
            )
            messages.append(ModelMessage("tool", results, cache=draw(marks)))
    tools = tuple(
        ToolSpec(f"tool_{i}", "d", {"type": "object"}, cache=draw(marks))
        for i in range(draw(st.integers(0, 2)))
    )
    return ModelRequest(
        "model-x", tuple(messages), tools, max_tokens=draw(st.sampled_from([None, 64]))
    )


def client_spots(request: ModelRequest) -> int:
    """An upper bound on the spots client marks occupy (each mark counted once)."""
    n = sum(t.cache is not None for t in request.tools)
    for m in request.messages:
        n += m.cache is not None
        for p in m.parts:
            n += p.cache is not None
            if isinstance(p, ToolResult):
                n += sum(c.cache is not None for c in p.content)
    return n


def pairs(body: dict[str, Any], api: str) -> tuple[Counter[str], Counter[str]]:
    """Tool-call ids and tool-result ids found in a body."""
    calls: Counter[str] = Counter()
    results: Counter[str] = Counter()
    if api == "anthropic":
        for m in body["messages"]:
            for b in m["content"]:
                if b["type"] == "tool_use":
                    calls[b["id"]] += 1
                elif b["type"] == "tool_result":
                    results[b["tool_use_id"]] += 1
    elif api in ("openai", "openai-compatible", "copilot"):
        for m in body["messages"]:
            calls.update(c["id"] for c in m.get("tool_calls", []))
            if m["role"] == "tool":
                results[m["tool_call_id"]] += 1
    elif api == "openai-responses":
        for item in body["input"]:
            if item.get("type") == "function_call":
                calls[item["call_id"]] += 1
            elif item.get("type") == "function_call_output":
                results[item["call_id"]] += 1
    elif api == "bedrock":
        for m in body["messages"]:
            for b in m["content"]:
                if "toolUse" in b:
                    calls[b["toolUse"]["toolUseId"]] += 1
                elif "toolResult" in b:
                    results[b["toolResult"]["toolUseId"]] += 1
    else:
        assert api == "gemini", api
        for c in body["contents"]:
            for p in c["parts"]:
                if "functionCall" in p:
                    calls[p["functionCall"]["id"]] += 1
                elif "functionResponse" in p:
                    results[p["functionResponse"]["id"]] += 1
    return calls, results


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(requests())
def test_every_call_has_its_result_and_every_body_validates(request: ModelRequest) -> None:
    n_calls = sum(isinstance(p, ToolCall) for m in request.messages for p in m.parts)
    for api in APIS:
        body = render(request, api)
        calls, results = pairs(body, api)
        assert calls == results, api
        assert sum(calls.values()) == n_calls, api
        assert all(n == 1 for n in calls.values()), api  # ids stay distinct after cleaning
        check(body, api)


@PROPERTY
@given(requests())
def test_rendering_twice_gives_identical_bytes(request: ModelRequest) -> None:
    for api in APIS:
        assert json.dumps(render(request, api)) == json.dumps(render(request, api))


@PROPERTY
@given(
    requests(),
    st.sampled_from(["kilo", "auto"]),
    st.sampled_from(["message", "last-part"]),
    st.integers(0, 6),
    st.booleans(),
)
def test_markers_stay_within_budget_and_provider_limit(
    request: ModelRequest, rule: str, placement: str, wanted: int, skip_env: bool
) -> None:
    for api in APIS:
        limit = PROVIDER_BREAKPOINT_LIMITS[api]
        budget = min(wanted, limit)
        if client_spots(request) > budget:
            continue  # client marks are never removed; see the over-budget warning test
        cache = CacheSettings(
            rule=rule,  # type: ignore[arg-type]
            placement=placement,  # type: ignore[arg-type]
            budget=budget,
            skip_trailing_environment=skip_env,
        )
        marked, decisions = place_markers(request, cache)
        body = render(marked, api)
        assert count_markers(body, api) <= budget <= max(limit, 0)
        assert sum(d["action"] == "mark" for d in decisions) <= budget
        check(body, api)


@PROPERTY
@given(requests())
def test_anthropic_and_bedrock_roles_alternate(request: ModelRequest) -> None:
    for api in ("anthropic", "bedrock"):
        roles = [m["role"] for m in render(request, api)["messages"]]
        assert all(a != b for a, b in itertools.pairwise(roles)), api
        assert all(m["content"] for m in render(request, api)["messages"])


@PROPERTY
@given(requests())
def test_anthropic_results_answer_the_turn_before(request: ModelRequest) -> None:
    messages = render(request, "anthropic")["messages"]
    for i, m in enumerate(messages):
        ids = [b["tool_use_id"] for b in m["content"] if b["type"] == "tool_result"]
        if not ids:
            continue
        before = {b["id"] for b in messages[i - 1]["content"] if b["type"] == "tool_use"}
        assert set(ids) <= before
        kinds = [b["type"] == "tool_result" for b in m["content"]]
        assert kinds == sorted(kinds, reverse=True)  # tool results come first
