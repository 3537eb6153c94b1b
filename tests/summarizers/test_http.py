"""HttpSummarizer against a real HTTP server on 127.0.0.1, for both endpoint kinds."""

from __future__ import annotations

from typing import Any, Literal

import httpx
import pytest

from kilo_rules.engine.base.cancel import CancelToken, cancellable
from kilo_rules.engine.base.errors import CancellationError, KiloRulesError
from kilo_rules.engine.formats.request import ModelMessage, Text, ToolCall, ToolResult
from kilo_rules.engine.summarizers import ANTHROPIC_VERSION, HttpSummarizer
from kilo_rules.engine.summarizers.protocol import Summarizer, SummarizerError, SummaryRequest

from .conftest import Reply, ScriptedServer

KEY = "sk-test-secret-0123456789"
HEAD = (
    ModelMessage("user", (Text("Fix the failing test in src/app.py"),)),
    ModelMessage(
        "assistant",
        (
            Text("Running the tests."),
            ToolCall("c1", "bash", {"command": "pytest -x"}),
        ),
    ),
    ModelMessage("tool", (ToolResult("c1", "bash", (Text("FAILED tests/test_app.py::t"),)),)),
)
TRANSCRIPT = (
    "[user]\nFix the failing test in src/app.py\n\n"
    '[assistant]\nRunning the tests.\nbash({"command": "pytest -x"})\n\n'
    "[tool]\nbash result:\nFAILED tests/test_app.py::t"
)
REQUEST = SummaryRequest("Create a new anchored summary.\n\n## Goal", HEAD, 512)
Kind = Literal["openai", "anthropic"]
KINDS: tuple[Kind, ...] = ("openai", "anthropic")


def ok(kind: Kind, text: str = "## Goal\n- fix it") -> Reply:
    if kind == "openai":
        return Reply(200, {"choices": [{"message": {"role": "assistant", "content": text}}]})
    return Reply(200, {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})


def error_body(kind: Kind, message: str, code: str = "invalid_request_error") -> dict[str, Any]:
    if kind == "openai":
        return {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return {"type": "error", "error": {"type": code, "message": message}}


class Sleeps(list[float]):
    """A ``sleep`` that records the waits instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make(server: ScriptedServer, kind: Kind, sleeps: Sleeps, **kw: Any) -> HttpSummarizer:
    opts: dict[str, Any] = {
        "api_key": KEY,
        "sleep": sleeps,
        "jitter": lambda: 0.5,
        "allow_private": True,  # the test server listens on 127.0.0.1
    }
    opts.update(kw)
    return HttpSummarizer(server.base_url, "test-model", kind=kind, **opts)


def test_is_a_summarizer() -> None:
    assert isinstance(HttpSummarizer("http://127.0.0.1:1", "m"), Summarizer)


def test_openai_request_is_exact(server: ScriptedServer) -> None:
    server.script(ok("openai", "  ## Goal\n- fix it\n"))
    text = make(server, "openai", Sleeps()).summarize(REQUEST)
    assert text == "## Goal\n- fix it"
    [got] = server.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == f"Bearer {KEY}"
    assert got.headers["content-type"] == "application/json"
    assert "x-api-key" not in got.headers
    assert got.body == {
        "model": "test-model",
        "max_tokens": 512,
        "messages": [
            {"role": "user", "content": TRANSCRIPT},
            {"role": "user", "content": "Create a new anchored summary.\n\n## Goal"},
        ],
    }


def test_anthropic_request_is_exact(server: ScriptedServer) -> None:
    server.script(ok("anthropic"))
    summarizer = make(server, "anthropic", Sleeps(), system="You write notes.", temperature=0.0)
    assert summarizer.summarize(REQUEST) == "## Goal\n- fix it"
    [got] = server.received
    assert got.path == "/v1/messages"
    assert got.headers["x-api-key"] == KEY
    assert got.headers["anthropic-version"] == ANTHROPIC_VERSION == "2023-06-01"
    assert "authorization" not in got.headers
    assert got.body == {
        "model": "test-model",
        "max_tokens": 512,
        "system": "You write notes.",
        "messages": [
            {"role": "user", "content": TRANSCRIPT},
            {"role": "user", "content": "Create a new anchored summary.\n\n## Goal"},
        ],
        "temperature": 0.0,
    }


def test_openai_options_and_v1_base_url(server: ScriptedServer) -> None:
    server.script(ok("openai"))
    summarizer = HttpSummarizer(
        server.base_url + "/v1/",
        "m",
        max_tokens_field="max_completion_tokens",
        system="sys",
        headers={"x-extra": "1"},
        allow_private=True,
    )
    summarizer.summarize(SummaryRequest("go", (), 100))
    [got] = server.received
    assert got.path == "/v1/chat/completions"
    assert "authorization" not in got.headers  # no key, no header
    assert got.headers["x-extra"] == "1"
    assert got.body == {
        "model": "m",
        "max_completion_tokens": 100,
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}],
    }


@pytest.mark.parametrize("kind", KINDS)
def test_500_then_200_is_retried(server: ScriptedServer, kind: Kind) -> None:
    server.script(Reply(500, error_body(kind, "boom", "server_error")), ok(kind))
    sleeps = Sleeps()
    assert make(server, kind, sleeps, backoff=2.0).summarize(REQUEST) == "## Goal\n- fix it"
    assert len(server.received) == 2
    assert server.received[0].body == server.received[1].body
    assert sleeps == [1.5]  # equal jitter: half of 2 s fixed, plus 0.5 × the other half


@pytest.mark.parametrize("kind", KINDS)
def test_503_retry_after_is_honoured(server: ScriptedServer, kind: Kind) -> None:
    server.script(Reply(503, "overloaded", {"Retry-After": "7"}), ok(kind))
    sleeps = Sleeps()
    assert make(server, kind, sleeps).summarize(REQUEST) == "## Goal\n- fix it"
    assert sleeps == [7.0]


def test_retry_after_is_capped(server: ScriptedServer) -> None:
    server.script(Reply(429, {}, {"Retry-After": "3600"}), ok("openai"))
    sleeps = Sleeps()
    make(server, "openai", sleeps, max_retry_after=20.0).summarize(REQUEST)
    assert sleeps == [20.0]


@pytest.mark.parametrize("kind", KINDS)
def test_429_exhausted_is_a_retryable_error(server: ScriptedServer, kind: Kind) -> None:
    server.script(Reply(429, error_body(kind, "Rate limit reached", "rate_limit_error")))
    sleeps = Sleeps()
    with pytest.raises(SummarizerError) as info:
        make(server, kind, sleeps, attempts=4, backoff=1.0).summarize(REQUEST)
    assert len(server.received) == 4
    assert sleeps == [0.75, 1.5, 3.0]  # exponential, with the injected jitter
    err = info.value
    assert err.retryable and not err.overflow
    assert "HTTP 429" in str(err) and "Rate limit reached" in str(err)
    assert "after 4 attempts" in str(err)
    assert err.diagnostic.code == "summarizer.http-status"
    assert err.diagnostic.details == {
        "retryable": True,
        "overflow": False,
        "status": 429,
        "attempts": 4,
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_timeout_is_retried_then_fails(server: ScriptedServer, kind: Kind) -> None:
    server.script(Reply(200, ok(kind).body, delay=3.0))
    sleeps = Sleeps()
    with pytest.raises(SummarizerError) as info:
        make(server, kind, sleeps, attempts=2, read_timeout=1.0).summarize(REQUEST)
    assert len(server.received) == 2
    assert len(sleeps) == 1
    assert info.value.retryable
    assert "timed out" in str(info.value)
    assert info.value.diagnostic.code == "summarizer.timeout"


def test_timeout_then_success(server: ScriptedServer) -> None:
    server.script(Reply(200, ok("openai").body, delay=3.0), ok("openai", "done"))
    assert make(server, "openai", Sleeps(), read_timeout=1.0).summarize(REQUEST) == "done"


@pytest.mark.parametrize(
    ("kind", "message", "code"),
    [
        (
            "openai",
            "This model's maximum context length is 8192 tokens.",
            "context_length_exceeded",
        ),
        (
            "anthropic",
            "prompt is too long: 250000 tokens > 200000 maximum",
            "invalid_request_error",
        ),
    ],
)
def test_context_length_400_is_overflow(
    server: ScriptedServer, kind: Kind, message: str, code: str
) -> None:
    server.script(Reply(400, error_body(kind, message, code)))
    with pytest.raises(SummarizerError) as info:
        make(server, kind, Sleeps()).summarize(REQUEST)
    assert info.value.overflow and not info.value.retryable
    assert len(server.received) == 1
    assert "HTTP 400" in str(info.value) and message in str(info.value)


def test_plain_400_is_not_overflow(server: ScriptedServer) -> None:
    server.script(Reply(400, error_body("openai", "temperature must be <= 2")))
    with pytest.raises(SummarizerError) as info:
        make(server, "openai", Sleeps()).summarize(REQUEST)
    assert not info.value.overflow and not info.value.retryable


@pytest.mark.parametrize("kind", KINDS)
def test_401_is_not_retried_and_key_is_not_echoed(server: ScriptedServer, kind: Kind) -> None:
    server.script(
        Reply(401, error_body(kind, f"Incorrect API key provided: {KEY}", "authentication_error"))
    )
    sleeps = Sleeps()
    summarizer = make(server, kind, sleeps)
    with pytest.raises(SummarizerError) as info:
        summarizer.summarize(REQUEST)
    assert len(server.received) == 1 and sleeps == []
    assert not info.value.retryable
    assert "HTTP 401" in str(info.value) and "Incorrect API key provided" in str(info.value)
    assert KEY not in str(info.value) and KEY not in repr(summarizer)


@pytest.mark.parametrize("kind", KINDS)
def test_malformed_json_is_an_error(server: ScriptedServer, kind: Kind) -> None:
    server.script(Reply(200, "{not json"))
    with pytest.raises(SummarizerError, match="not JSON") as info:
        make(server, kind, Sleeps()).summarize(REQUEST)
    assert not info.value.retryable and len(server.received) == 1
    assert info.value.diagnostic.code == "summarizer.response"


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("openai", {"choices": [{"message": {"role": "assistant", "content": ""}}]}),
        ("openai", {"choices": [{"message": {"role": "assistant", "content": None}}]}),
        ("openai", {"choices": []}),
        ("anthropic", {"content": []}),
        ("anthropic", {"content": [{"type": "thinking", "thinking": "hm"}]}),
    ],
)
def test_response_without_text_is_an_error(
    server: ScriptedServer, kind: Kind, body: dict[str, Any]
) -> None:
    server.script(Reply(200, body))
    with pytest.raises(SummarizerError, match="no text"):
        make(server, kind, Sleeps()).summarize(REQUEST)


def test_openai_content_parts_are_joined(server: ScriptedServer) -> None:
    parts = [{"type": "text", "text": "## Goal\n"}, {"type": "text", "text": "- a"}]
    server.script(Reply(200, {"choices": [{"message": {"content": parts}}]}))
    assert make(server, "openai", Sleeps()).summarize(REQUEST) == "## Goal\n- a"


def test_connection_refused_is_retryable() -> None:
    # Bind then close a socket to get a port nothing listens on.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    summarizer = HttpSummarizer(
        f"http://127.0.0.1:{port}", "m", attempts=2, sleep=sleeps, allow_private=True
    )
    with pytest.raises(SummarizerError, match="request failed") as info:
        summarizer.summarize(REQUEST)
    assert info.value.retryable and len(sleeps) == 1
    assert info.value.diagnostic.code == "summarizer.network"


def test_injected_client_and_transport() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"content": [{"type": "text", "text": "ok"}]})

    def resolve(host: str, timeout: float) -> list[str]:
        assert host == "api.example"
        return ["93.184.215.14"]  # a public address: the policy checks it before sending

    transport = httpx.MockTransport(handler)
    by_transport = HttpSummarizer(
        "https://api.example", "m", kind="anthropic", transport=transport, resolve=resolve
    )
    assert by_transport.summarize(REQUEST) == "ok"
    with httpx.Client(transport=transport) as client:
        by_client = HttpSummarizer(
            "https://api.example", "m", kind="anthropic", client=client, resolve=resolve
        )
        assert by_client.summarize(REQUEST) == "ok"
        assert not client.is_closed  # the caller owns it
    assert [str(r.url) for r in seen] == ["https://api.example/v1/messages"] * 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        HttpSummarizer("http://x", "m", kind="gemini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempts"):
        HttpSummarizer("http://x", "m", attempts=0)


def test_retry_after_as_an_http_date(server: ScriptedServer) -> None:
    from email.utils import formatdate

    server.script(Reply(429, {}, {"Retry-After": formatdate(0, usegmt=True)}), ok("openai"))
    sleeps = Sleeps()
    make(server, "openai", sleeps).summarize(REQUEST)
    assert sleeps == [0.0]  # a date in the past means "now"


def test_public_api_is_sorted_and_documented() -> None:
    import kilo_rules.engine.summarizers as pkg

    assert list(pkg.__all__) == sorted(pkg.__all__)
    for name in pkg.__all__:
        assert (getattr(pkg, name).__doc__ or "").strip() or name.isupper(), name


def test_a_summarizer_error_is_a_located_kilo_rules_error() -> None:
    err = SummarizerError("prompt is too long", overflow=True)
    assert isinstance(err, KiloRulesError)
    assert str(err) == "prompt is too long"  # callers fold it into their own messages
    assert str(err.diagnostic) == ("<summarizer>:1:1: error[summarizer.failed]: prompt is too long")
    assert err.diagnostic.details == {"retryable": False, "overflow": True}
    assert err.overflow and not err.retryable


def test_retries_stop_at_the_total_deadline(server: ScriptedServer) -> None:
    # The server keeps failing; the waits would run 0.75, 1.5, 3, 6, 12, 24 s.
    server.script(Reply(500, error_body("openai", "boom", "server_error")))
    now = [0.0]
    sleeps = Sleeps()

    def sleep(seconds: float) -> None:
        sleeps(seconds)
        now[0] += seconds

    summarizer = make(
        server, "openai", sleeps, sleep=sleep, clock=lambda: now[0], attempts=10, backoff=1.0
    )
    summarizer.total_deadline = 10.0
    with pytest.raises(SummarizerError) as info:
        summarizer.summarize(REQUEST)
    assert sleeps == [0.75, 1.5, 3.0]  # the next wait (6 s) would end past 10 s
    assert len(server.received) == 4
    err = info.value
    assert err.retryable and "total deadline of 10 s" in str(err)
    assert err.diagnostic.details["attempts"] == 4


def test_a_cancelled_caller_stops_between_attempts(server: ScriptedServer) -> None:
    # The caller gives up while the summarizer waits to retry: no second request is sent.
    server.script(Reply(500, error_body("openai", "boom", "server_error")), ok("openai"))
    token = CancelToken()
    sleeps = Sleeps()

    def sleep(seconds: float) -> None:
        sleeps(seconds)
        token.cancel("the step's time bound passed")

    summarizer = make(server, "openai", sleeps, sleep=sleep, attempts=5)
    with cancellable(token), pytest.raises(CancellationError) as info:
        summarizer.summarize(REQUEST)
    assert "time bound" in str(info.value)
    assert len(server.received) == 1 and sleeps == [0.75]
