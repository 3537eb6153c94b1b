"""The fake provider is faithful: the official SDKs parse every reply it sends, streamed or
not, and it refuses what the providers refuse, with their errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from .upstream import Upstream

CLAUDE = "claude-sonnet-4-5"
GPT = "gpt-4o"
#: Well above every minimum cacheable prefix (1024 tokens for these models).
LONG = "The quick brown fox jumps over the lazy dog, again and again. " * 400

WEATHER_ANTHROPIC = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_CHAT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
WEATHER_RESPONSES = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


@pytest.fixture
def claude(upstream: Upstream) -> Iterator[anthropic.Anthropic]:
    """The Anthropic SDK's client of the upstream (closed after the test)."""
    with anthropic.Anthropic(base_url=upstream.url, api_key="test", max_retries=0) as client:
        yield client


@pytest.fixture
def gpt(upstream: Upstream) -> Iterator[openai.OpenAI]:
    """The OpenAI SDK's client of the upstream (closed after the test)."""
    with openai.OpenAI(base_url=upstream.url + "/v1", api_key="test", max_retries=0) as client:
        yield client


def sse_events(raw: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event in ``raw``."""
    out: list[tuple[str | None, str]] = []
    for chunk in raw.split("\n\n"):
        if not chunk.strip():
            continue
        name: str | None = None
        data = ""
        for line in chunk.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
        out.append((name, data))
    return out


# --- Anthropic Messages ------------------------------------------------------------------


def test_anthropic_message_parses_and_is_recorded(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    upstream.reply_text = "Hello there, friend."
    message = claude.messages.create(
        model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == CLAUDE
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello there, friend."  # type: ignore[union-attr]
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_read_input_tokens == 0
    (got,) = upstream.received
    assert got.path == "/v1/messages" and got.refused is None and got.status == 200
    # This SDK sends the key as a bearer token (older ones as x-api-key).
    assert "test" in (got.headers.get("x-api-key"), got.headers.get("authorization", "")[7:])
    assert "anthropic-version" in got.headers
    assert got.json == json.loads(got.body)
    assert got.usage == {
        "input_tokens": message.usage.input_tokens,
        "uncached": message.usage.input_tokens,
        "cache_read": 0,
        "cache_write": 0,
        "output_tokens": message.usage.output_tokens,
    }


def test_anthropic_stream_is_the_exact_event_sequence(upstream: Upstream) -> None:
    upstream.reply_text = "one two three four"
    body = {
        "model": CLAUDE,
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "count"}],
    }
    reply = httpx.post(upstream.url + "/v1/messages", json=body, timeout=30)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_events(reply.text)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [json.loads(data) for name, data in events if name == "content_block_delta"]
    assert len(deltas) >= 3 and names[3 : 3 + len(deltas)] == ["content_block_delta"] * len(deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == "one two three four"
    for name, data in events:
        assert json.loads(data)["type"] == name
    final = json.loads(events[-2][1])
    assert final["delta"]["stop_reason"] == "end_turn" and final["usage"]["output_tokens"] > 0
    assert reply.text.startswith("event: message_start\ndata: {")


def test_anthropic_stream_helper_gives_the_text_and_usage(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    upstream.reply_text = "streamed reply text"
    with claude.messages.stream(
        model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed reply text"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == upstream.received[0].usage["output_tokens"]  # type: ignore[index]
    assert final.usage.input_tokens == upstream.received[0].usage["input_tokens"]  # type: ignore[index]
    assert upstream.received[0].stream and not upstream.received[0].disconnected


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_use(upstream: Upstream, stream: bool, claude: anthropic.Anthropic) -> None:
    upstream.tool_call = True
    upstream.tool_input = {"city": "Paris"}
    client = claude
    kwargs: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 64,
        "tools": [WEATHER_ANTHROPIC],
        "messages": [{"role": "user", "content": "weather in Paris?"}],
    }
    if stream:
        with client.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use"
    assert block.name == "get_weather" and block.input == {"city": "Paris"}
    assert block.id.startswith("toolu_")


def test_a_tool_call_needs_tools_in_the_body(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    upstream.tool_call = True
    message = claude.messages.create(
        model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"


def test_count_tokens(upstream: Upstream, claude: anthropic.Anthropic) -> None:
    client = claude
    messages: Any = [{"role": "user", "content": "hello " * 100}]
    counted = client.messages.count_tokens(model=CLAUDE, messages=messages)
    created = client.messages.create(model=CLAUDE, max_tokens=8, messages=messages)
    assert counted.input_tokens == created.usage.input_tokens > 100


def test_a_repeated_prefix_with_a_breakpoint_is_read_from_the_cache(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    client = claude
    system: Any = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(
        model=CLAUDE, max_tokens=8, system=system, messages=[{"role": "user", "content": "a"}]
    )
    assert (
        first.usage.cache_creation_input_tokens and first.usage.cache_creation_input_tokens > 1024
    )
    assert first.usage.cache_read_input_tokens == 0
    second = client.messages.create(
        model=CLAUDE, max_tokens=8, system=system, messages=[{"role": "user", "content": "b"}]
    )
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens < 20  # only the new message is uncached
    assert upstream.received[1].usage["cache_read"] > 0  # type: ignore[index]
    # Another model has a cache of its own.
    other = client.messages.create(
        model="claude-opus-4-1",
        max_tokens=8,
        system=system,
        messages=[{"role": "user", "content": "b"}],
    )
    assert other.usage.cache_read_input_tokens == 0
    upstream.reset()
    again = client.messages.create(
        model=CLAUDE, max_tokens=8, system=system, messages=[{"role": "user", "content": "b"}]
    )
    assert again.usage.cache_read_input_tokens == 0 and len(upstream.received) == 1


def test_without_a_breakpoint_nothing_is_cached(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    client = claude
    for _ in range(2):
        message = client.messages.create(
            model=CLAUDE, max_tokens=8, system=LONG, messages=[{"role": "user", "content": "a"}]
        )
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0


def test_anthropic_over_the_window_is_prompt_too_long(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    upstream.window = 1000
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=CLAUDE, max_tokens=8, messages=[{"role": "user", "content": LONG}]
        )
    tokens = upstream.count(upstream.received[0].json)
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {tokens} tokens > 1000 maximum",
        },
    }
    assert upstream.received[0].refused == "context_length_exceeded"
    assert upstream.received[0].usage is None


def test_a_large_body_is_counted_quickly(upstream: Upstream) -> None:
    text = "def handler(request): return respond(request.body) # comment\n" * 28_000
    assert len(text) > 1_700_000
    body = {"model": CLAUDE, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    start = time.monotonic()
    reply = httpx.post(upstream.url + "/v1/messages", json=body, timeout=60)
    assert time.monotonic() - start < 20
    assert reply.status_code == 400
    assert reply.json()["error"]["message"].startswith("prompt is too long: ")
    assert upstream.received[0].refused == "context_length_exceeded"


ORPHAN_RESULT: list[Any] = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": [{"type": "text", "text": "let me look"}]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "sunny"}],
    },
]
UNANSWERED_CALL: list[Any] = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
    },
    {"role": "user", "content": "never mind"},
]
WRONG_ID: list[Any] = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "sunny"}],
    },
]


@pytest.mark.parametrize("messages", [ORPHAN_RESULT, UNANSWERED_CALL, WRONG_ID])
def test_a_broken_tool_pair_is_refused(
    upstream: Upstream, messages: list[Any], claude: anthropic.Anthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=CLAUDE, max_tokens=8, tools=[WEATHER_ANTHROPIC], messages=messages
        )
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert "result" in error["message"]  # check_body's call/result pairing rules
    assert upstream.received[0].refused == "invalid_body"


def test_a_well_paired_tool_result_is_accepted(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    messages = [
        *WRONG_ID[:2],
        {**WRONG_ID[2], "content": [{**WRONG_ID[2]["content"][0], "tool_use_id": "toolu_1"}]},
    ]
    message = claude.messages.create(
        model=CLAUDE, max_tokens=8, tools=[WEATHER_ANTHROPIC], messages=messages
    )
    assert message.content[0].type == "text"


@pytest.mark.parametrize(
    "body",
    [
        # an unknown key (the SDK type, made strict)
        {"model": CLAUDE, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "x": 1},
        # no max_tokens
        {"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}]},
        # an unknown content block
        {
            "model": CLAUDE,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "bogus"}]}],
        },
        # opens on an assistant turn (check_body)
        {"model": CLAUDE, "max_tokens": 8, "messages": [{"role": "assistant", "content": "hi"}]},
        # blank text (check_body)
        {
            "model": CLAUDE,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "  "}]}],
        },
    ],
)
def test_an_invalid_anthropic_body_is_refused(upstream: Upstream, body: dict[str, Any]) -> None:
    reply = httpx.post(upstream.url + "/v1/messages", json=body, timeout=30)
    assert reply.status_code == 400
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert upstream.received[0].refused == "invalid_body"


def test_the_raw_bytes_are_recorded_even_when_not_json(upstream: Upstream) -> None:
    raw = b'{"model": "x", "messages": [}'
    reply = httpx.post(
        upstream.url + "/v1/messages", content=raw, headers={"X-Custom": "Yes"}, timeout=30
    )
    assert reply.status_code == 400
    (got,) = upstream.received
    assert got.body == raw and got.json is None and got.refused == "invalid_body"
    assert got.headers["x-custom"] == "Yes"


# --- OpenAI Chat Completions -------------------------------------------------------------


def test_chat_completion_parses(upstream: Upstream, gpt: openai.OpenAI) -> None:
    upstream.reply_text = "Hi from chat."
    completion = gpt.chat.completions.create(
        model=GPT, messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.object == "chat.completion" and completion.model == GPT
    assert completion.id.startswith("chatcmpl-")
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and choice.message.content == "Hi from chat."
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert upstream.received[0].headers["authorization"] == "Bearer test"


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream(upstream: Upstream, include_usage: bool, gpt: openai.OpenAI) -> None:
    upstream.reply_text = "alpha beta gamma"
    kwargs: dict[str, Any] = {}
    if include_usage:
        kwargs["stream_options"] = {"include_usage": True}
    chunks = list(
        gpt.chat.completions.create(
            model=GPT, messages=[{"role": "user", "content": "hi"}], stream=True, **kwargs
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha beta gamma"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == upstream.received[0].usage["input_tokens"]  # type: ignore[index]
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.choices and c.usage is None for c in chunks)


def test_chat_stream_ends_with_done(upstream: Upstream) -> None:
    body = {"model": GPT, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(upstream.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.text.endswith("data: [DONE]\n\n")
    events = sse_events(reply.text)
    assert all(name is None for name, _ in events)
    assert len(events) >= 4


def test_chat_stream_helper(upstream: Upstream, gpt: openai.OpenAI) -> None:
    upstream.reply_text = "helper text"
    with gpt.chat.completions.stream(
        model=GPT,
        messages=[{"role": "user", "content": "hi"}],
        stream_options={"include_usage": True},
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "helper text"
    assert final.usage is not None and final.usage.completion_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_calls(upstream: Upstream, stream: bool, gpt: openai.OpenAI) -> None:
    upstream.tool_call = True
    upstream.tool_input = {"city": "Oslo"}
    client = gpt
    messages: Any = [{"role": "user", "content": "weather?"}]
    if stream:
        with client.chat.completions.stream(
            model=GPT, messages=messages, tools=[WEATHER_CHAT]
        ) as s:
            for _ in s:
                pass
            completion: Any = s.get_final_completion()
    else:
        completion = client.chat.completions.create(
            model=GPT, messages=messages, tools=[WEATHER_CHAT]
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_chat_automatic_cache_reads_a_repeated_prefix(
    upstream: Upstream, gpt: openai.OpenAI
) -> None:
    client = gpt
    first = client.chat.completions.create(
        model=GPT,
        messages=[{"role": "system", "content": LONG}, {"role": "user", "content": "a"}],
    )
    second = client.chat.completions.create(
        model=GPT,
        messages=[{"role": "system", "content": LONG}, {"role": "user", "content": "b"}],
    )
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 1024 and (cached - 1024) % 128 == 0
    assert cached <= second.usage.prompt_tokens
    assert upstream.received[1].usage["cache_read"] == cached  # type: ignore[index]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": GPT, "messages": [{"role": "user", "content": LONG}]}),
        ("/v1/responses", {"model": GPT, "input": LONG}),
    ],
)
def test_openai_over_the_window_is_context_length_exceeded(
    upstream: Upstream, path: str, body: dict[str, Any], gpt: openai.OpenAI
) -> None:
    upstream.window = 1000
    client = gpt
    with pytest.raises(openai.BadRequestError) as caught:
        if path == "/v1/responses":
            client.responses.create(**body)
        else:
            client.chat.completions.create(**body)
    tokens = upstream.count(upstream.received[0].json)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert caught.value.type == "invalid_request_error"
    message = (
        f"This model's maximum context length is 1000 tokens. However, your messages "
        f"resulted in {tokens} tokens. Please reduce the length of the messages."
    )
    assert caught.value.message == f"Error code: 400 - {message}"
    assert caught.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    assert upstream.received[0].refused == "context_length_exceeded"


def test_an_orphan_tool_message_is_refused(upstream: Upstream, gpt: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_nowhere", "content": "sunny"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        gpt.chat.completions.create(model=GPT, messages=messages)
    assert caught.value.type == "invalid_request_error"
    assert upstream.received[0].refused == "invalid_body"


def test_an_invalid_chat_body_is_refused(upstream: Upstream) -> None:
    body = {"model": GPT, "messages": [{"role": "wizard", "content": "hi"}]}
    reply = httpx.post(upstream.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert upstream.received[0].refused == "invalid_body"


# --- OpenAI Responses --------------------------------------------------------------------


def test_response_parses(upstream: Upstream, gpt: openai.OpenAI) -> None:
    upstream.reply_text = "A response."
    response = gpt.responses.create(
        model="gpt-5", instructions="Be brief.", input=[{"role": "user", "content": "hi"}]
    )
    assert response.object == "response" and response.status == "completed"
    assert response.output_text == "A response."
    assert response.instructions == "Be brief."
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    # The JSON itself, not only what the SDK made of it, is a Response.
    raw = httpx.post(
        upstream.url + "/v1/responses", json={"model": "gpt-5", "input": "hi"}, timeout=30
    )
    Response.model_validate(raw.json())


def test_responses_stream_events_are_the_sdk_shapes(upstream: Upstream) -> None:
    upstream.reply_text = "one two three"
    body = {"model": "gpt-5", "input": "hi", "stream": True}
    reply = httpx.post(upstream.url + "/v1/responses", json=body, timeout=30)
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_json(data) for _, data in sse_events(reply.text)]
    names = [name for name, _ in sse_events(reply.text)]
    assert names == [e.type for e in events]
    deltas = names.count("response.output_text.delta")
    assert deltas >= 3
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].response
    assert completed.usage is not None and completed.usage.output_tokens > 0
    assert completed.output_text == "one two three"


def test_responses_stream_helper(upstream: Upstream, gpt: openai.OpenAI) -> None:
    upstream.reply_text = "streamed response"
    with gpt.responses.stream(model="gpt-5", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "streamed response" == final.output_text
    assert final.usage is not None
    assert final.usage.input_tokens == upstream.received[0].usage["input_tokens"]  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_call(upstream: Upstream, stream: bool, gpt: openai.OpenAI) -> None:
    upstream.tool_call = True
    upstream.tool_input = {"city": "Rome"}
    client = gpt
    if stream:
        with client.responses.stream(
            model="gpt-5", input="weather?", tools=[WEATHER_RESPONSES]
        ) as s:
            for _ in s:
                pass
            response = s.get_final_response()
    else:
        response = client.responses.create(
            model="gpt-5", input="weather?", tools=[WEATHER_RESPONSES]
        )
    (item,) = response.output
    assert item.type == "function_call"
    assert item.name == "get_weather" and json.loads(item.arguments) == {"city": "Rome"}
    assert item.call_id.startswith("call_")


def test_a_responses_output_without_its_call_is_refused(
    upstream: Upstream, gpt: openai.OpenAI
) -> None:
    items: Any = [
        {"role": "user", "content": "hi"},
        {"type": "function_call_output", "call_id": "call_nowhere", "output": "sunny"},
    ]
    with pytest.raises(openai.BadRequestError):
        gpt.responses.create(model="gpt-5", input=items)
    assert upstream.received[0].refused == "invalid_body"


def test_responses_automatic_cache(upstream: Upstream, gpt: openai.OpenAI) -> None:
    client = gpt
    client.responses.create(model="gpt-5", instructions=LONG, input="a")
    second = client.responses.create(model="gpt-5", instructions=LONG, input="b")
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens >= 1024


# --- the rest ------------------------------------------------------------------------------


def test_models(upstream: Upstream, claude: anthropic.Anthropic, gpt: openai.OpenAI) -> None:
    models = gpt.models.list()
    assert [m.id for m in models.data] == ["gpt-4o", "gpt-5"]
    listed = claude.models.list()
    assert [m.id for m in listed.data] == [CLAUDE]
    assert [r.path for r in upstream.received] == ["/v1/models", "/v1/models"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {"model": CLAUDE, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/chat/completions", {"model": GPT, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "gpt-5", "input": "hi"}),
    ],
)
def test_a_client_leaving_a_stream_is_counted(
    upstream: Upstream, path: str, body: dict[str, Any]
) -> None:
    upstream.reply_text = " ".join(["word"] * 50)
    upstream.stream_delay = 0.1
    url = upstream.url + path
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json={**body, "stream": True}) as reply,
    ):
        assert reply.status_code == 200
        next(reply.iter_raw())
    deadline = time.monotonic() + 10
    while upstream.disconnects < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.disconnects == 1
    assert upstream.received[0].disconnected


def test_a_finished_stream_is_no_disconnect(
    upstream: Upstream, claude: anthropic.Anthropic
) -> None:
    upstream.stream_delay = 0.01
    with claude.messages.stream(
        model=CLAUDE, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        stream.get_final_message()
    time.sleep(0.1)
    assert upstream.disconnects == 0 and not upstream.received[0].disconnected


def test_stream_delay_spaces_the_events(upstream: Upstream, claude: anthropic.Anthropic) -> None:
    upstream.stream_delay = 0.05
    start = time.monotonic()
    with claude.messages.stream(
        model=CLAUDE, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        stream.get_final_message()
    # message_start, block start, ping, 2 deltas, block stop, message delta, message stop
    assert time.monotonic() - start >= 7 * 0.05
