"""HttpSummarizer under the network policy, against a hostile server on 127.0.0.1: total
deadline, reply size caps (wire and decoded), redirect, address and scheme rules, and
every reply shape that is not a usable summary."""

from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any

import pytest

from kilo_rules.engine.base.net import NetworkSettings
from kilo_rules.engine.summarizers import HttpSummarizer
from kilo_rules.engine.summarizers.http import DEFAULT_MAX_SUMMARY_CHARS, reply_text
from kilo_rules.engine.summarizers.protocol import SummarizerError, SummaryRequest

from ..hostile_server import HostileServer, elapsed, hostile
from .conftest import Reply, ScriptedServer

__all__ = ["hostile"]  # the fixture, imported for pytest

REQUEST = SummaryRequest("Summarise.", (), 256)
MB = 1024 * 1024


def at(server: HostileServer, route: str, **kw: Any) -> HttpSummarizer:
    opts: dict[str, Any] = {"allow_private": True, "attempts": 1}
    opts.update(kw)
    return HttpSummarizer(f"{server.base_url}/{route}", "m", **opts)


def failure(summarizer: HttpSummarizer) -> SummarizerError:
    with pytest.raises(SummarizerError) as info:
        summarizer.summarize(REQUEST)
    return info.value


def test_its_own_local_endpoint_needs_allow_private(hostile: HostileServer) -> None:
    err = failure(at(hostile, "summary", allow_private=False))
    assert err.diagnostic.code == "summarizer.refused"
    assert err.diagnostic.details["net"] == "net.address"
    assert not err.retryable
    assert hostile.hits["summary"] == 0
    assert at(hostile, "summary").summarize(REQUEST) == "Use tabs."
    by_policy = at(
        hostile,
        "summary",
        allow_private=False,
        network=NetworkSettings(private_hosts=("127.0.0.1",)),
    )
    assert by_policy.summarize(REQUEST) == "Use tabs."


def test_its_own_endpoint_is_allowed_even_when_hosts_are_restricted(
    hostile: HostileServer,
) -> None:
    network = NetworkSettings(allowed_hosts=("api.example",))
    assert at(hostile, "summary", network=network).summarize(REQUEST) == "Use tabs."


@pytest.mark.parametrize("base", ["file:///etc", "ftp://127.0.0.1/x"])
def test_other_schemes_are_refused(base: str) -> None:
    err = failure(HttpSummarizer(base, "m", allow_private=True))
    assert err.diagnostic.code == "summarizer.refused"
    assert err.diagnostic.details["net"] == "net.scheme"


def test_a_drip_is_cut_by_the_total_deadline(hostile: HostileServer) -> None:
    start = time.monotonic()
    err = failure(at(hostile, "drip", deadline=1.0, read_timeout=60.0))
    assert elapsed(start) < 2.0
    assert err.diagnostic.code == "summarizer.timeout" and err.retryable


def test_a_gzip_bomb_is_refused_without_expanding(hostile: HostileServer) -> None:
    tracemalloc.start()
    try:
        err = failure(at(hostile, "bomb", max_reply_bytes=MB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.diagnostic.code == "summarizer.too-large" and not err.retryable
    assert peak < 8 * MB


@pytest.mark.parametrize("route", ["big", "flood"])
def test_a_50_mb_reply_is_refused(hostile: HostileServer, route: str) -> None:
    tracemalloc.start()
    try:
        err = failure(at(hostile, route))  # the default cap: 4 MiB
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.diagnostic.code == "summarizer.too-large"
    assert err.diagnostic.details["max_bytes"] == 4 * MB
    assert peak < 16 * MB


def test_a_redirect_to_a_private_address_is_refused(hostile: HostileServer) -> None:
    err = failure(at(hostile, "redirect"))
    assert err.diagnostic.code == "summarizer.refused"
    assert err.diagnostic.details["net"] == "net.redirect"
    assert "169.254.169.254" in str(err)


def test_a_redirect_to_another_host_is_refused(hostile: HostileServer) -> None:
    hostile.redirect_to = f"http://localhost:{hostile.server_address[1]}/summary"
    network = NetworkSettings(allowed_hosts=("api.example",), allow_private=True)
    err = failure(at(hostile, "redirect", network=network))
    assert err.diagnostic.details["net"] == "net.redirect"
    assert hostile.hits["summary"] == 0


def test_an_over_long_summary_is_an_error(hostile: HostileServer) -> None:
    hostile.text = "word " * 1000
    err = failure(at(hostile, "summary", max_summary_chars=100))
    assert err.diagnostic.code == "summarizer.too-long"
    assert err.diagnostic.details["max_chars"] == 100
    assert at(hostile, "summary", max_summary_chars=5000).summarize(REQUEST).startswith("word")


def test_bad_limits_are_refused() -> None:
    for kw in ({"deadline": 0}, {"max_reply_bytes": 0}, {"max_summary_chars": 0}):
        with pytest.raises(ValueError, match="positive"):
            HttpSummarizer("http://x", "m", **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- reply shapes


def nested(depth: int) -> bytes:
    return b'{"choices": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("kind", "body", "says"),
    [
        ("openai", b"{not json", "not JSON"),
        ("openai", b"\xff\xfe\x00garbage", "not JSON"),
        ("openai", nested(100_000), "nested too deeply"),
        ("anthropic", b"[" * 100_000, "nested too deeply"),
        ("openai", b'"just a string"', "no text"),
        ("openai", b'{"choices": "abc"}', "no text"),
        ("openai", b'{"choices": [{"message": {"content": 42}}]}', "no text"),
        ("openai", b'{"choices": [{"message": {"content": [{"text": 7}]}}]}', "not a string"),
        ("anthropic", b'{"content": [{"type": "text", "text": ["a"]}]}', "not a string"),
        ("anthropic", b'{"content": {"type": "text", "text": "a"}}', "no text"),
        ("anthropic", b'{"content": [{"type": "text", "text": "   "}]}', "no text"),
    ],
)
def test_reply_shapes_are_summarizer_errors(kind: Any, body: bytes, says: str) -> None:
    with pytest.raises(SummarizerError, match=says) as info:
        reply_text(body, kind)
    assert info.value.diagnostic.code == "summarizer.response"


def test_reply_text_accepts_both_apis() -> None:
    openai = {"choices": [{"message": {"content": [{"type": "text", "text": " a"}, {"x": 1}]}}]}
    assert reply_text(json.dumps(openai).encode(), "openai") == "a"
    anthropic = {"content": [{"type": "thinking", "thinking": 1}, {"type": "text", "text": "b"}]}
    assert reply_text(json.dumps(anthropic).encode(), "anthropic") == "b"
    assert DEFAULT_MAX_SUMMARY_CHARS == 200_000


def test_a_deeply_nested_error_body_is_still_a_status_error(server: ScriptedServer) -> None:
    server.script(Reply(400, '{"error": ' + "[" * 50_000 + "]" * 50_000 + "}"))
    s = HttpSummarizer(server.base_url, "m", allow_private=True, attempts=1)
    with pytest.raises(SummarizerError, match="HTTP 400") as info:
        s.summarize(REQUEST)
    assert info.value.diagnostic.code == "summarizer.http-status"
