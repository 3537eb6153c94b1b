"""Rendered bodies validate against the official SDK request types and the documented shapes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import jsonschema
import pydantic_core
import pytest
from provider_samples import sample_request
from wire_checks import check

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.providers import render
from kilo_rules.engine.runtime.cache import place_markers


def marked(request: ModelRequest, **settings: Any) -> ModelRequest:
    return place_markers(request, CacheSettings(**settings))[0]


APIS = (
    "anthropic",
    "openai",
    "openai-responses",
    "openai-compatible",
    "copilot",
    "bedrock",
    "gemini",
)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("placement", ["message", "last-part"])
@pytest.mark.parametrize("ttl", [None, "1h"])
def test_sample_body_is_valid(api: str, placement: str, ttl: str | None) -> None:
    request = marked(sample_request(), placement=placement, ttl=ttl)
    check(render(request, api), api)


@pytest.mark.parametrize("api", APIS)
def test_auto_rule_body_is_valid(api: str) -> None:
    check(render(marked(sample_request(), rule="auto"), api), api)


def test_openai_explicit_breakpoints_are_valid() -> None:
    request = marked(sample_request(), placement="last-part")
    request = replace(request, options={"prompt_cache_breakpoints": True})
    body = render(request, "openai")
    assert '"prompt_cache_breakpoint": {"mode": "explicit"}' in json.dumps(body)
    check(body, "openai")


def test_openai_compatible_reasoning_field_is_valid() -> None:
    request = replace(sample_request(), options={"reasoning_field": "reasoning_content"})
    body = render(request, "openai-compatible")
    assistant = [m for m in body["messages"] if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "The test imports app; read it first."
    check(body, "openai-compatible")


def test_openai_responses_breakpoints_and_developer_messages_are_valid() -> None:
    request = marked(sample_request(), placement="message")
    options = {"prompt_cache_breakpoints": True, "system_as_instructions": False}
    body = render(replace(request, options=options), "openai-responses")
    assert [i["role"] for i in body["input"][:2]] == ["developer", "developer"]
    assert '"prompt_cache_breakpoint": {"mode": "explicit"}' in json.dumps(body)
    check(body, "openai-responses")


def responses_with_reasoning_and_media() -> dict[str, Any]:
    request = ModelRequest(
        "gpt-5.6",
        (
            ModelMessage("user", (Text("shoot"),)),
            ModelMessage(
                "assistant",
                (Reasoning("plan", encrypted="enc", origin="openai"), ToolCall("c1", "shot", {})),
            ),
            ModelMessage(
                "tool",
                (ToolResult("c1", "shot", (Text("see"), Media("image/png", data="AA=="))),),
            ),
        ),
    )
    return render(request, "openai-responses")


def test_openai_responses_reasoning_and_media_outputs_are_valid() -> None:
    body = responses_with_reasoning_and_media()
    assert [i["type"] for i in body["input"][1:]] == [
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert isinstance(body["input"][3]["output"], list)
    check(body, "openai-responses")


# The stand-in id given to reasoning items must not hide anything else about them.
BROKEN_RESPONSES: list[Any] = [
    lambda b: b["input"][1].pop("summary"),
    lambda b: b["input"][1].update(encrypted_content=5),
    lambda b: b["input"][1]["summary"].append({"type": "summary", "text": "x"}),
    lambda b: b["input"][3]["output"][1].update(type="image_url"),
    lambda b: b["input"][3]["output"].append({"type": "output_text", "text": "x"}),
]


@pytest.mark.parametrize("breaker", BROKEN_RESPONSES)
def test_invalid_responses_items_are_rejected(breaker: Any) -> None:
    body = responses_with_reasoning_and_media()
    breaker(body)
    with pytest.raises(pydantic_core.ValidationError):
        check(body, "openai-responses")


def test_a_reasoning_item_with_an_id_is_not_what_the_renderer_sends() -> None:
    body = responses_with_reasoning_and_media()
    body["input"][1]["id"] = "rs_1"
    with pytest.raises(AssertionError, match="without an id"):
        check(body, "openai-responses")


def test_anthropic_top_level_automatic_cache_is_valid() -> None:
    request = replace(sample_request(), options={"automatic_cache": "1h"})
    body = render(request, "anthropic")
    assert body["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    check(body, "anthropic")


# A wrong key, a wrong value or a wrong nesting must be caught, or the checks prove nothing.
BROKEN: list[tuple[str, Any]] = [
    (
        "anthropic",
        lambda b: b["messages"][0]["content"][0].update(cache_ctrl={"type": "ephemeral"}),
    ),
    ("anthropic", lambda b: b["messages"][2]["content"][0].update(tool_call_id="x")),
    ("anthropic", lambda b: b["system"][0].update(cache_control={"type": "persistent"})),
    ("anthropic", lambda b: b.update(max_output_tokens=5)),
    ("openai", lambda b: b["messages"][3]["tool_calls"][0]["function"].update(arguments={})),
    ("openai", lambda b: b["messages"][4].update(tool_use_id="x")),
    ("openai", lambda b: b["tools"][0].update(input_schema={})),
    ("openai-compatible", lambda b: b["messages"][0]["content"][0].update(cache_control={})),
    (
        "openai-compatible",
        lambda b: b["messages"][0]["content"][0].update(cache={"type": "ephemeral"}),
    ),
    ("bedrock", lambda b: b["messages"][0]["content"].append({"text": ""})),
    ("bedrock", lambda b: b["messages"][0]["content"][1]["image"].update(format="image/png")),
    ("bedrock", lambda b: b["system"].append({"cachePoint": {"type": "ephemeral"}})),
    ("bedrock", lambda b: b["messages"][1]["content"][2]["toolUse"].update(toolUseId="a.b")),
    ("bedrock", lambda b: b.update(modelId="x")),
    (
        "openai-responses",
        lambda b: b["input"][2].update(arguments={"path": "app.py"}),
    ),
    ("openai-responses", lambda b: b["tools"][0].pop("strict")),
    ("openai-responses", lambda b: b["tools"][0].update(function={"name": "read_file"})),
    ("openai-responses", lambda b: b.update(max_tokens=5)),
    ("openai-responses", lambda b: b["input"][4].update(tool_call_id="call.read:1")),
    (
        "openai-responses",
        lambda b: b["input"][0]["content"][0].update(cache_control={"type": "ephemeral"}),
    ),
    (
        "openai-responses",
        lambda b: b["input"][0]["content"][0].update(
            prompt_cache_breakpoint={"mode": "explicit", "ttl": "1h"}
        ),
    ),
    ("openai-responses", lambda b: b["input"][0]["content"][1].pop("detail")),
    ("copilot", lambda b: b["messages"][0].update(cache_control={"type": "ephemeral"})),
    (
        "copilot",
        lambda b: b["messages"][0].update(copilot_cache_control={"type": "ephemeral", "ttl": "1h"}),
    ),
    ("copilot", lambda b: b["messages"][0].update(copilot_cache_control={"type": "persistent"})),
    ("copilot", lambda b: b["messages"][3]["tool_calls"][0]["function"].update(arguments={})),
    ("copilot", lambda b: b.update(max_output_tokens=5)),
    ("gemini", lambda b: b["contents"][0].update(role="assistant")),
    ("gemini", lambda b: b["contents"][1]["parts"][2]["functionCall"].update(arguments={})),
    ("gemini", lambda b: b["contents"][0]["parts"][1].update(text="both text and inlineData")),
    ("gemini", lambda b: b.update(generationConfig={"max_tokens": 5})),
]


@pytest.mark.parametrize(("api", "breaker"), BROKEN)
def test_invalid_body_is_rejected(api: str, breaker: Any) -> None:
    request = marked(sample_request(), placement="last-part")
    body = render(request, api)
    check(body, api)
    breaker(body)
    with pytest.raises((pydantic_core.ValidationError, jsonschema.ValidationError)):
        check(body, api)
