"""The gateway with the official SDKs as clients, in front of the fake upstream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("uvicorn")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from kilo_rules.tools.serving.gateway.jsonspan import scan  # noqa: E402

from .gateway_server import AUTH, TOKEN, Gateway, running_gateway, small_model  # noqa: E402
from .upstream import Upstream  # noqa: E402

CLAUDE = "claude-sonnet-4-5-20250929"


class Capture:
    """The bytes an SDK client sent, request by request."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __call__(self, request: Any) -> None:
        request.read()
        self.bodies.append(request.content)


_OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Every SDK client a test made is closed after it (their sockets too)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


@pytest.fixture
def gateway(upstream: Upstream, tmp_path: Path) -> Iterator[Gateway]:
    with running_gateway(upstream.url, tmp_path) as gw:
        yield gw


def _anthropic(gw: Gateway, capture: Capture | None = None) -> Any:
    hooks = {"request": [capture]} if capture else {}
    # This SDK speaks through httpx2, a fork with the same API.
    http = pytest.importorskip("httpx2")
    client = anthropic.Anthropic(
        base_url=gw.url,
        api_key="sk-ant-test",
        default_headers=AUTH,
        http_client=http.Client(event_hooks=hooks),
        max_retries=0,
    )
    _OPEN.append(client)
    return client


def _openai(gw: Gateway, capture: Capture | None = None) -> Any:
    hooks = {"request": [capture]} if capture else {}
    client = openai.OpenAI(
        base_url=gw.url + "/v1",
        api_key="sk-test",
        default_headers=AUTH,
        http_client=httpx.Client(event_hooks=hooks),
        max_retries=0,
    )
    _OPEN.append(client)
    return client


THINKING = {
    "type": "thinking",
    "thinking": "The user wants a listing.",
    "signature": "EqQBCkYIBRgCKkBsig+nature/with=odd\\u00e9bytes",
}


def _claude_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": [
                THINKING,
                {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"cmd": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.py\nb.py"},
                {"type": "text", "text": "Now read a.py.", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]


TOOLS = [
    {
        "name": "bash",
        "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
SYSTEM = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]


def test_anthropic_bytes_pass_through_exactly(upstream: Upstream, gateway: Gateway) -> None:
    capture = Capture()
    client = _anthropic(gateway, capture)
    reply = client.messages.create(
        model=CLAUDE,
        max_tokens=1024,
        system=SYSTEM,
        tools=TOOLS,
        tool_choice={"type": "auto"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=_claude_history(),
    )
    assert reply.content[0].text == "ok"
    got = upstream.received[-1]
    assert got.path == "/v1/messages" and got.refused is None
    assert got.body == capture.bodies[-1]  # the client's exact bytes
    assert "proxy-authorization" not in got.headers  # the gateway's token stays here
    assert got.headers["authorization"] == "Bearer sk-ant-test"  # the provider's is forwarded


def test_anthropic_stream_is_relayed_event_for_event(upstream: Upstream, gateway: Gateway) -> None:
    upstream.reply_text = "one two three four"
    client = _anthropic(gateway)
    with client.messages.stream(
        model=CLAUDE, max_tokens=256, messages=[{"role": "user", "content": "Count."}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds
    assert final.content[0].text == "one two three four"
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_and_responses(upstream: Upstream, gateway: Gateway, stream: bool) -> None:
    capture = Capture()
    client = _openai(gateway, capture)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say ok."},
    ]
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="gpt-4.1",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage is not None
    else:
        text = client.chat.completions.create(model="gpt-4.1", messages=messages).choices[0]
        text = text.message.content
    assert text == "ok"
    assert upstream.received[-1].body == capture.bodies[-1]

    if stream:
        with client.responses.stream(model="gpt-5-codex", input="Say ok.") as events:
            kinds = [e.type for e in events]
            final = events.get_final_response()
        assert kinds[-1] == "response.completed"
        assert final.output_text == "ok"
    else:
        assert client.responses.create(model="gpt-5-codex", input="Say ok.").output_text == "ok"
    assert upstream.received[-1].path == "/v1/responses"
    assert upstream.received[-1].body == capture.bodies[-1]


def test_observability_headers(upstream: Upstream, gateway: Gateway) -> None:
    body = {"model": CLAUDE, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(
        gateway.url + "/v1/messages",
        json=body,
        headers={**AUTH, "x-request-id": "req-42", "x-api-key": "k"},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "req-42"
    assert r.headers["x-kilo-rules-revision"].startswith("sha256:")
    assert upstream.received[-1].headers["x-request-id"] == "req-42"
    metrics = httpx.get(gateway.url + "/metrics", headers=AUTH).text
    assert 'kilo_rules_gateway_requests_total{api="anthropic-messages",status="200"}' in metrics


def test_authentication_comes_first(upstream: Upstream, gateway: Gateway) -> None:
    body = {"model": CLAUDE, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    missing = httpx.post(gateway.url + "/v1/messages", json=body)
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"  # the SDK's shape
    with pytest.raises(anthropic.AuthenticationError, match="Proxy-Authorization"):
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        _OPEN.append(client)
        client.messages.create(**body)
    wrong = httpx.post(
        gateway.url + "/v1/messages",
        json=body,
        headers={"proxy-authorization": "Bearer " + "x" * len(TOKEN)},
    )
    assert wrong.status_code == 401
    assert upstream.received == []  # nothing reached the provider
    foreign = httpx.post(
        gateway.url + "/v1/messages", json=body, headers={**AUTH, "host": "evil.example"}
    )
    assert foreign.status_code == 421


def test_other_paths_pass_through(upstream: Upstream, gateway: Gateway) -> None:
    r = httpx.get(gateway.url + "/v1/models", headers={**AUTH, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200
    assert upstream.received[-1].path == "/v1/models"
    assert "data" in r.json()


def test_a_bad_body_is_a_located_error_in_the_api_shape(gateway: Gateway) -> None:
    r = httpx.post(
        gateway.url + "/v1/messages",
        content=b'{"model": "x",\n "messages": [}',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "<body>:2:" in error["message"]


def test_unknown_model_passes_through_and_says_why(upstream: Upstream, gateway: Gateway) -> None:
    body = {
        "model": "claude-nobody-knows",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    }
    raw = json.dumps(body).encode()
    r = httpx.post(
        gateway.url + "/v1/messages",
        content=raw,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 200
    assert "unknown model" in r.headers["x-kilo-rules-passthrough"]
    assert upstream.received[-1].body == raw


def test_a_client_that_goes_away_cancels_the_upstream(upstream: Upstream, gateway: Gateway) -> None:
    upstream.stream_delay = 0.2
    upstream.reply_text = " ".join(["word"] * 40)
    body = {
        "model": CLAUDE,
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "Talk."}],
    }
    with httpx.stream("POST", gateway.url + "/v1/messages", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        next(r.iter_raw())
    deadline = time.monotonic() + 10
    while upstream.disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.disconnects == 1


def _long_history(turns: int, words: int = 400) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "Task: fix the bug in src/app.py."}]
    for i in range(turns):
        out.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{i}",
                        "name": "bash",
                        "input": {"cmd": f"cat f{i}.py"},
                    }
                ],
            }
        )
        out.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{i}",
                        "content": f"file {i}: " + " ".join(f"w{i}x{j}" for j in range(words)),
                    }
                ],
            }
        )
    return out


def test_overflow_is_compacted_and_retried_once(upstream: Upstream, tmp_path: Path) -> None:
    # The routed model believes in a large window; the provider refuses at 20k tokens.
    models = {"claude-big": small_model("claude-big", "anthropic", 1_000_000)}
    with running_gateway(upstream.url, tmp_path, models=models) as gw:
        upstream.window = 20_000
        client = _anthropic(gw)
        reply = client.messages.create(
            model="claude-big", max_tokens=512, tools=TOOLS, messages=_long_history(30)
        )
    assert reply.content[0].text == "ok"
    refused, accepted = upstream.received[-2:]
    assert refused.refused == "context_length_exceeded" and accepted.refused is None
    sent = accepted.json["messages"]
    assert len(sent) < 61
    assert "Task: fix the bug in src/app.py." in json.dumps(sent)  # the task is pinned
    assert sent[-1] == _long_history(30)[-1]  # the last turn as sent


def test_the_ledger_keeps_the_compacted_prefix_byte_stable(
    upstream: Upstream, tmp_path: Path
) -> None:
    models = {"claude-small": small_model("claude-small", "anthropic", 30_000)}
    history = _long_history(60, words=150)
    sent: list[bytes] = []
    ledger = tmp_path / "ledger.sqlite3"

    def turn(gw: Gateway, k: int) -> None:
        client = _anthropic(gw)
        client.messages.create(
            model="claude-small", max_tokens=512, tools=TOOLS, messages=history[:k]
        )
        sent.append(upstream.received[-1].body)
        assert upstream.received[-1].refused is None

    with running_gateway(upstream.url, tmp_path, models=models, ledger=ledger) as gw:
        for k in range(41, 100, 2):
            turn(gw, k)
    compacted = [json.loads(b)["messages"] for b in sent]
    first = next(i for i, m in enumerate(compacted) if len(m) < 40)
    # Every later request starts with the same compacted bytes until the next compaction.
    head = json.dumps(compacted[first][:2])
    assert json.dumps(compacted[first + 1][:2]) == head
    # A restarted gateway resumes from the ledger: the same bytes for the next request.
    with running_gateway(upstream.url, tmp_path, models=models, ledger=ledger) as gw:
        before = sent[-1]
        turn(gw, 101)
    old, new = json.loads(before)["messages"], json.loads(sent[-1])["messages"]
    assert json.dumps(new[:2]) == json.dumps(old[:2])
    # Byte for byte: the new body extends the old one's messages (the provider reads its
    # whole prefix from the cache).
    end = scan(before.decode(), "messages").members["messages"].end - 1
    assert sent[-1].startswith(before[:end])


def _chat_history(turns: int, words: int = 400) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Task: fix the bug in src/app.py."},
    ]
    for i in range(turns):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat f{i}.py"})},
        }
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = f"file {i}: " + " ".join(f"w{i}x{j}" for j in range(words))
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": body})
    return out


CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def test_openai_overflow_is_compacted_and_retried_once(upstream: Upstream, tmp_path: Path) -> None:
    models = {"gpt-big": small_model("gpt-big", "openai", 1_000_000)}
    history = _chat_history(30)
    with running_gateway(upstream.url, tmp_path, models=models) as gw:
        upstream.window = 20_000
        reply = _openai(gw).chat.completions.create(
            model="gpt-big", messages=history, tools=CHAT_TOOLS
        )
    assert reply.choices[0].message.content == "ok"
    refused, accepted = upstream.received[-2:]
    assert refused.refused == "context_length_exceeded" and accepted.refused is None
    sent = accepted.json["messages"]
    assert sent[0] == history[0]  # the system message stays first
    assert sent[-1] == history[-1] and len(sent) < len(history)
