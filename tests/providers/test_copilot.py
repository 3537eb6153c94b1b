"""The GitHub Copilot body: Chat Completions with ``copilot_cache_control`` on message
objects and tools, cleaned call ids, and what Copilot's chat endpoint does not take."""

from __future__ import annotations

import json
from typing import Any

import pytest
from provider_samples import sample_request
from wire_checks import check

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.catalog import bundled_catalog
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
from kilo_rules.engine.providers import PROVIDER_BREAKPOINT_LIMITS, count_markers, endpoint, render
from kilo_rules.engine.providers._shared import sanitize_call_id
from kilo_rules.engine.providers.acceptance import check_body
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.cache import place_markers
from kilo_rules.engine.runtime.context import StepInput
from tests.runtime.helpers import assistant, session, text, tool, user

API = "copilot"
KEY = "copilot_cache_control"
MARK = CacheMark()
EPHEMERAL = {"type": "ephemeral"}


def body_of(request: ModelRequest) -> dict[str, Any]:
    """The rendered body, checked against the SDK type and the acceptance rules."""
    body = render(request, API)
    check(body, API)
    assert check_body(body, API) == []
    return body


def part_marks(body: dict[str, Any]) -> list[str]:
    """Paths of marks on content parts (Copilot's client never puts them there)."""
    return [
        f"messages[{i}].content[{j}]"
        for i, m in enumerate(body["messages"])
        if isinstance(m.get("content"), list)
        for j, part in enumerate(m["content"])
        if KEY in part
    ]


def test_kilo_marks_land_on_message_objects() -> None:
    settings = CacheSettings(placement="last-part", skip_trailing_environment=True)
    request = place_markers(sample_request(), settings)[0]
    body = body_of(request)
    marked = [i for i, m in enumerate(body["messages"]) if KEY in m]
    assert marked == [0, 1, 6, 7]  # first two system messages, last two others
    assert all(body["messages"][i][KEY] == EPHEMERAL for i in marked)
    assert part_marks(body) == []
    assert count_markers(body, API) == 4 == PROVIDER_BREAKPOINT_LIMITS[API]
    # the same request on OpenRouter carries the same four marks, as cache_control
    assert count_markers(render(request, "openai-compatible"), "openai-compatible") == 4
    assert KEY not in json.dumps(render(request, "openai-compatible"))


def test_several_marks_in_one_message_are_one_breakpoint() -> None:
    message = ModelMessage(
        "user", (Text("a", cache=MARK), Text("b"), Text("c", cache=MARK)), cache=MARK
    )
    body = body_of(ModelRequest("claude-sonnet-4.5", (message,)))
    assert body["messages"][0] == {
        "role": "user",
        "content": [{"type": "text", "text": t} for t in "abc"],
        KEY: EPHEMERAL,
    }
    assert count_markers(body, API) == 1


def test_a_single_marked_text_stays_a_string() -> None:
    message = ModelMessage("user", (Text("hi", cache=MARK),))
    body = body_of(ModelRequest("claude-sonnet-4.5", (message,)))
    assert body["messages"][0] == {"role": "user", "content": "hi", KEY: EPHEMERAL}


def test_an_hour_mark_has_no_ttl_on_this_wire() -> None:
    message = ModelMessage("user", (Text("hi"),), cache=CacheMark(ttl="1h"))
    body = body_of(ModelRequest("claude-sonnet-4.5", (message,)))
    assert body["messages"][0][KEY] == EPHEMERAL


def test_tool_definitions_and_tool_messages_carry_marks() -> None:
    request = ModelRequest(
        "claude-sonnet-4.5",
        (
            ModelMessage("user", (Text("go"),)),
            ModelMessage("assistant", (ToolCall("c1", "bash", {}),), cache=MARK),
            ModelMessage("tool", (ToolResult("c1", "bash", (Text("ok"),)),), cache=MARK),
        ),
        tools=(ToolSpec("bash", "Run.", {"type": "object"}, cache=MARK),),
    )
    body = body_of(request)
    assert body["tools"][0][KEY] == EPHEMERAL
    assert body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ],
        KEY: EPHEMERAL,
    }
    assert body["messages"][2][KEY] == EPHEMERAL
    assert count_markers(body, API) == 3


def test_call_ids_are_cleaned_alike_for_call_and_result() -> None:
    body = body_of(sample_request())
    calls = body["messages"][3]["tool_calls"]
    results = [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
    assert [c["id"] for c in calls] == results == [sanitize_call_id("call.read:1"), "toolu_02"]
    assert results[0] != "call.read:1"
    # the same request on OpenAI keeps the id as it is
    assert render(sample_request(), "openai")["messages"][3]["tool_calls"][0]["id"] == "call.read:1"


def test_a_pdf_becomes_a_placeholder_and_an_image_stays() -> None:
    body = body_of(sample_request())
    first = body["messages"][2]["content"]
    assert first[1]["type"] == "image_url"
    last = body["messages"][-1]["content"]
    assert last[1] == {
        "type": "text",
        "text": "[attachment spec.pdf (application/pdf) omitted: type not supported by this API]",
    }
    assert "file_data" not in json.dumps(body)


def test_reasoning_is_not_sent_and_the_limit_is_max_tokens() -> None:
    request = ModelRequest(
        "claude-sonnet-4.5",
        (
            ModelMessage("user", (Text("q"),)),
            ModelMessage("assistant", (Reasoning("hmm", signature="sig"), Text("a"))),
            ModelMessage("user", (Media("image/png", data="AA=="), Text("more"))),
        ),
        max_tokens=512,
    )
    body = body_of(request)
    assert body["messages"][1] == {"role": "assistant", "content": "a"}
    assert "sig" not in json.dumps(body) and "reasoning" not in json.dumps(body)
    assert body["max_tokens"] == 512
    assert "max_completion_tokens" not in body
    assert endpoint(request, API) == "/chat/completions"


@pytest.mark.parametrize(
    ("where", "mutate"),
    [
        ("a part-level mark on blank text", "blank"),
        ("a fifth mark", "fifth"),
        ("an id Claude refuses", "id"),
    ],
)
def test_the_rules_catch_what_the_renderer_never_sends(where: str, mutate: str) -> None:
    settings = CacheSettings(placement="last-part", skip_trailing_environment=True)
    body = body_of(place_markers(sample_request(), settings)[0])
    if mutate == "blank":
        del body["messages"][7][KEY]
        body["messages"][2]["content"][2] = {"type": "text", "text": " ", KEY: EPHEMERAL}
        rule = "marker-on-blank-text"
    elif mutate == "fifth":
        body["messages"][3][KEY] = EPHEMERAL
        rule = "marker-budget"
    else:
        body["messages"][3]["tool_calls"][1]["id"] = "toolu.02"
        body["messages"][5]["tool_call_id"] = "toolu.02"
        rule = "call-id-format"
    assert rule in {v.rule for v in check_body(body, API)}, where


def test_spec_10_1_copilot_gets_its_own_cache_namespace_through_the_runtime() -> None:
    """transform.ts@006a344:335-354: Copilot reads `copilot_cache_control`, not
    `cache_control`; kilo-default marks the Copilot Claude entry in that namespace."""
    entry = bundled_catalog().get("github-copilot/claude-sonnet-4.5")
    assert (entry.api, entry.provider, entry.family) == (API, "github-copilot", "claude")
    assert entry.limits.input is not None and entry.limits.input < entry.limits.context
    plan = compile_policy("kilo-default", entry)
    log = session(
        user("u1", "fix it"),
        assistant("a1", text("a1t", "reading"), tool("t1", "file body")),
        user("u2", "go on"),
    )
    result = apply_plan(plan, log, StepInput())
    assert result.provider == API
    body = result.request
    check(body, API)
    assert 0 < count_markers(body, API) <= PROVIDER_BREAKPOINT_LIMITS[API]
    assert part_marks(body) == []
    assert "cache_control" not in json.dumps(body).replace(KEY, "")
