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

from kilo_rules.plan import CacheSettings
from kilo_rules.providers import render
from kilo_rules.request import ModelRequest
from kilo_rules.runtime.cache import place_markers


def marked(request: ModelRequest, **settings: Any) -> ModelRequest:
    return place_markers(request, CacheSettings(**settings))[0]


APIS = ("anthropic", "openai", "openai-compatible", "bedrock", "gemini")


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
