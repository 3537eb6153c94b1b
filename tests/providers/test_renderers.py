"""Renderer details the golden bodies do not show: ids, empty text, media edge cases."""

from __future__ import annotations

import pytest

import kilo_rules.engine.providers as providers
from kilo_rules.engine.base.errors import CatalogError
from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.providers import APIS, PROVIDER_BREAKPOINT_LIMITS, count_markers, render
from kilo_rules.engine.providers._shared import sanitize_call_id


def round_trip(result: ToolResult, call_id: str = "c1") -> ModelRequest:
    return ModelRequest(
        "m",
        (
            ModelMessage("user", (Text("go"),)),
            ModelMessage("assistant", (ToolCall(call_id, "shot", {}),)),
            ModelMessage("tool", (result,)),
        ),
    )


def test_public_api_is_sorted_and_limits_cover_every_api() -> None:
    assert providers.__all__ == sorted(providers.__all__)
    assert set(PROVIDER_BREAKPOINT_LIMITS) == set(APIS)
    assert PROVIDER_BREAKPOINT_LIMITS["anthropic"] == PROVIDER_BREAKPOINT_LIMITS["bedrock"] == 4


def test_unknown_api_is_a_located_error_with_a_suggestion() -> None:
    with pytest.raises(CatalogError) as err:
        render(ModelRequest("m", ()), "antropic")
    assert err.value.diagnostic.code == "provider.unknown-api"
    assert err.value.diagnostic.hint == "did you mean 'anthropic'?"


def test_call_ids_are_cleaned_the_same_way_for_call_and_result() -> None:
    assert sanitize_call_id("toolu_01-A") == "toolu_01-A"
    assert sanitize_call_id("a.b") != sanitize_call_id("a:b")
    body = render(round_trip(ToolResult("fc.1", "shot", (Text("ok"),)), "fc.1"), "anthropic")
    call = body["messages"][1]["content"][0]
    result = body["messages"][2]["content"][0]
    assert call["id"] == result["tool_use_id"] == sanitize_call_id("fc.1")
    # OpenAI-compatible servers get the id as it is.
    assert (
        render(round_trip(ToolResult("fc.1", "shot", ()), "fc.1"), "openai")["messages"][1][
            "tool_calls"
        ][0]["id"]
        == "fc.1"
    )


def test_empty_text_is_dropped_where_the_api_rejects_it() -> None:
    request = ModelRequest("m", (ModelMessage("user", (Text(""), Text("x"))),))
    assert render(request, "anthropic")["messages"][0]["content"] == [{"type": "text", "text": "x"}]
    assert render(request, "bedrock")["messages"][0]["content"] == [{"text": "x"}]
    assert render(request, "gemini")["contents"][0]["parts"] == [{"text": "x"}]


def test_media_in_tool_results() -> None:
    image = Media("image/png", data="AA==", filename="shot.png")
    request = round_trip(ToolResult("c1", "shot", (Text("see"), image)))
    openai = render(request, "openai")["messages"][2]
    assert openai["content"][1]["text"].startswith("[attachment shot.png (image/png) omitted")
    anthropic = render(request, "anthropic")["messages"][2]["content"][0]["content"]
    assert anthropic[1]["type"] == "image"
    bedrock = render(request, "bedrock")["messages"][2]["content"][0]["toolResult"]["content"]
    assert bedrock[1] == {"image": {"format": "png", "source": {"bytes": "AA=="}}}
    gemini = render(request, "gemini")["contents"][2]["parts"]
    assert gemini[0]["functionResponse"]["response"] == {"content": "see"}
    assert gemini[1] == {"inlineData": {"mimeType": "image/png", "data": "AA=="}}


def test_empty_tool_result() -> None:
    request = round_trip(ToolResult("c1", "shot", ()))
    bedrock = render(request, "bedrock")["messages"][2]["content"][0]["toolResult"]
    assert bedrock["content"] == [{"text": "(no output)"}]
    anthropic = render(request, "anthropic")["messages"][2]["content"][0]
    assert "content" not in anthropic
    assert render(request, "openai")["messages"][2]["content"] == ""


def test_media_by_url() -> None:
    s3 = Media("application/pdf", url="s3://bucket/spec.pdf", filename="spec.pdf")
    web = Media("image/png", url="https://x.test/a.png")
    request = ModelRequest("m", (ModelMessage("user", (s3, web)),))
    bedrock = render(request, "bedrock")["messages"][0]["content"]
    assert bedrock[0]["document"]["source"] == {"s3Location": {"uri": "s3://bucket/spec.pdf"}}
    assert bedrock[1]["text"].startswith("[attachment (image/png) omitted")
    anthropic = render(request, "anthropic")["messages"][0]["content"]
    assert anthropic[1]["source"] == {"type": "url", "url": "https://x.test/a.png"}
    gemini = render(request, "gemini")["contents"][0]["parts"]
    assert gemini[1] == {"fileData": {"mimeType": "image/png", "fileUri": "https://x.test/a.png"}}


def test_unsigned_reasoning_is_not_sent_where_a_signature_is_required() -> None:
    turn = ModelMessage("assistant", (Reasoning("hmm"), Text("done")))
    request = ModelRequest("m", (ModelMessage("user", (Text("q"),)), turn))
    assert render(request, "anthropic")["messages"][1]["content"] == [
        {"type": "text", "text": "done"}
    ]
    assert render(request, "bedrock")["messages"][1]["content"] == [{"text": "done"}]
    assert render(request, "gemini")["contents"][1]["parts"][0] == {"text": "hmm", "thought": True}
    assert "reasoning" not in str(render(request, "openai"))


def test_anthropic_max_tokens_fallbacks() -> None:
    request = ModelRequest("m", (ModelMessage("user", (Text("q"),)),))
    assert render(request, "anthropic")["max_tokens"] == 4096
    with_limit = ModelRequest("m", request.messages, options={"output_limit": 64000})
    assert render(with_limit, "anthropic")["max_tokens"] == 64000
    assert "max_completion_tokens" not in render(request, "openai")


def test_count_markers_ignores_anthropic_automatic_cache() -> None:
    request = ModelRequest(
        "m", (ModelMessage("user", (Text("q"),)),), options={"automatic_cache": True}
    )
    body = render(request, "anthropic")
    assert body["cache_control"] == {"type": "ephemeral"}
    assert count_markers(body, "anthropic") == 0
