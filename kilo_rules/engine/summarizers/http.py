"""A summarizer that asks a model over HTTP: OpenAI-compatible or Anthropic Messages.

The head travels as one plain-text transcript (tools are not offered, so tool calls and
results are written out as text), followed by the instruction as the final user message.
Every request goes through :mod:`kilo_rules.engine.base.net`: a total deadline per attempt, a size
cap on the reply, the scheme, host, address and redirect rules (the configured endpoint is
allowed by whoever builds the summarizer, a private address only with ``allow_private``).
Timeouts, 429 and 5xx answers are retried with exponential backoff and equal jitter,
honouring ``Retry-After``, by the project's one retry policy
(:mod:`kilo_rules.engine.base.retry`, on tenacity); every failure, and every reply that
is not a usable summary (not JSON, the wrong shape, no text, longer than
``max_summary_chars``), becomes a
:class:`~kilo_rules.engine.summarizers.protocol.SummarizerError` that says what happened and whether
another attempt may help. The API key is sent only in its header and is blanked out of any error
text.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Literal, NoReturn

import httpx

from kilo_rules.engine.base.errors import NetworkError
from kilo_rules.engine.base.net import HttpReply, NetClient, NetworkSettings, Resolver, resolve_host
from kilo_rules.engine.base.retry import Backoff, RetryState, retrying
from kilo_rules.engine.summarizers._shared import clip, transcript
from kilo_rules.engine.summarizers.protocol import SummarizerError, SummaryRequest

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_SUMMARY_CHARS", "HttpSummarizer", "reply_text"]

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent to Anthropic endpoints."""

DEFAULT_MAX_SUMMARY_CHARS = 200_000
"""The longest summary accepted (characters); a longer reply is an error, never stored."""

_log = logging.getLogger(__name__)
_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
# How providers word "the input is too long" (OpenAI, Anthropic, vLLM, llama.cpp, Gemini).
_OVERFLOW_WORDS = (
    "context_length_exceeded",
    "context length",
    "prompt is too long",
    "maximum context",
    "too many tokens",
    "exceeds the context",
    "input is too long",
    "context window",
    "reduce the length",
)


class _StatusError(SummarizerError):
    """An HTTP error status; carries what the retry loop needs."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        overflow: bool,
        status: int,
        retry_after: float | None,
    ) -> None:
        super().__init__(
            message,
            retryable=retryable,
            overflow=overflow,
            code="summarizer.http-status",
            details={"status": status},
        )
        self.status = status
        self.retry_after = retry_after


#: A network failure as the summarizer reports it: (what happened, code, retry?); any
#: other refusal is the network policy's (``summarizer.refused``).
_NET_FAILURES: dict[str, tuple[str, str, bool]] = {
    "net.deadline": ("timed out", "summarizer.timeout", True),
    "net.transport": ("request failed", "summarizer.network", True),
    "net.too-large": ("the reply is too large", "summarizer.too-large", False),
    "net.encoding": ("unreadable reply", "summarizer.response", False),
}


class HttpSummarizer:
    """A :class:`~kilo_rules.engine.summarizers.protocol.Summarizer` backed by a chat endpoint.

    ``kind="openai"`` posts to ``{base_url}/v1/chat/completions`` with ``Authorization:
    Bearer``; ``kind="anthropic"`` to ``{base_url}/v1/messages`` with ``x-api-key`` and
    ``anthropic-version``. A ``base_url`` that already ends in ``/v1`` is not doubled.

    The network policy is ``network`` (default: the one in force, ``net.use_network``;
    the CLI reads it from ``KILO_RULES_NET_*``). The endpoint's own host is always allowed; set
    ``allow_private`` when it is a local or internal server (``http://127.0.0.1:8080``), so
    that its private or loopback address is accepted, for that host only. Each attempt has
    a total ``deadline`` (seconds) and the whole call, retries and the waits between them
    included, ``total_deadline``: a retry that could only end after it is not started.
    Within an attempt, ``connect_timeout`` and ``read_timeout`` may cut a phase shorter.
    The reply may hold at most ``max_reply_bytes`` (on the wire and decoded) and the summary
    at most ``max_summary_chars``.

    Seams for tests and embedding: ``client`` (an ``httpx.Client`` the caller owns and
    closes), or ``transport`` (used to build a client per call), ``resolve`` (host name →
    addresses), ``sleep`` (waits between attempts), ``jitter`` (returns a float in
    [0, 1)) and ``clock`` (monotonic seconds).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        kind: Literal["openai", "anthropic"] = "openai",
        api_key: str | None = None,
        system: str | None = None,
        temperature: float | None = None,
        max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        deadline: float = 120.0,
        total_deadline: float = 300.0,
        max_reply_bytes: int = 4 * 1024 * 1024,
        max_summary_chars: int = DEFAULT_MAX_SUMMARY_CHARS,
        network: NetworkSettings | None = None,
        allow_private: bool = False,
        attempts: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_retry_after: float = 120.0,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        resolve: Resolver = resolve_host,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if kind not in ("openai", "anthropic"):
            raise ValueError(f"kind must be 'openai' or 'anthropic', not {kind!r}")
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(deadline, total_deadline) <= 0 or min(max_reply_bytes, max_summary_chars) < 1:
            raise ValueError(
                "deadline, total_deadline, max_reply_bytes and max_summary_chars must be positive"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.kind = kind
        self._api_key = api_key
        self.system = system
        self.temperature = temperature
        self.max_tokens_field = max_tokens_field
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.deadline = deadline
        self.total_deadline = total_deadline
        self._clock = clock
        self.max_reply_bytes = max_reply_bytes
        self.max_summary_chars = max_summary_chars
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.headers = dict(headers or {})
        host = httpx.URL(self.url).host
        self._net = NetClient(
            network,
            allowed_hosts=(host,),
            private_hosts=(host,) if allow_private else (),
            transport=transport,
            client=client,
            resolve=resolve,
        )
        self._sleep = sleep
        self._jitter = jitter

    def __repr__(self) -> str:
        return f"HttpSummarizer({self.base_url!r}, {self.model!r}, kind={self.kind!r})"

    @property
    def url(self) -> str:
        """The endpoint posted to."""
        root = self.base_url if self.base_url.endswith("/v1") else self.base_url + "/v1"
        return root + ("/messages" if self.kind == "anthropic" else "/chat/completions")

    def request_headers(self) -> dict[str, str]:
        """The headers of each request, the API key included."""
        out = {"content-type": "application/json", **self.headers}
        if self.kind == "anthropic":
            out["anthropic-version"] = ANTHROPIC_VERSION
            if self._api_key:
                out["x-api-key"] = self._api_key
        elif self._api_key:
            out["authorization"] = f"Bearer {self._api_key}"
        return out

    def request_body(self, request: SummaryRequest) -> dict[str, Any]:
        """The JSON body for ``request``: transcript, then the instruction, as user turns."""
        turns: list[dict[str, Any]] = []
        text = transcript(request.messages)
        if text:
            turns.append({"role": "user", "content": text})
        turns.append({"role": "user", "content": request.instruction})
        body: dict[str, Any] = {"model": self.model}
        if self.kind == "anthropic":
            body["max_tokens"] = request.max_output_tokens
            if self.system:
                body["system"] = self.system
        else:
            body[self.max_tokens_field] = request.max_output_tokens
            if self.system:
                turns.insert(0, {"role": "system", "content": self.system})
        body["messages"] = turns
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def summarize(self, request: SummaryRequest) -> str:
        """Post ``request`` and return the reply's text, retrying what may pass next time
        (through :func:`kilo_rules.engine.base.retry.retrying`: a cancelled caller stops
        between attempts)."""
        body = json.dumps(self.request_body(request), ensure_ascii=False).encode("utf-8")
        start = self._clock()
        backoff = Backoff(self.backoff, self.max_backoff, "equal").wait(self._uniform)

        def wait(state: RetryState) -> float:
            error = _failure(state)
            after = error.retry_after if isinstance(error, _StatusError) else None
            return backoff(state) if after is None else min(after, self.max_retry_after)

        def before_sleep(state: RetryState) -> None:
            _log.info(
                "%s; attempt %d of %d, retrying in %.2fs",
                _failure(state),
                state.attempt_number,
                self.attempts,
                state.upcoming_sleep,
            )

        def attempt() -> str:
            left = self.total_deadline - (self._clock() - start)
            return self._post(body, min(self.deadline, left))

        policy = retrying(
            attempts=self.attempts,
            wait=wait,
            retry_if=lambda exc: isinstance(exc, SummarizerError) and exc.retryable,
            give_up=self._give_up,
            sleep=self._sleep,
            clock=self._clock,
            total_deadline=self.total_deadline,
            before_sleep=before_sleep,
        )
        text: str = policy(attempt)
        return text

    def _give_up(self, state: RetryState, deadline: bool) -> NoReturn:
        error = _failure(state)
        if not deadline and self.attempts == 1:
            raise error
        details: dict[str, Any]
        if not deadline:
            why, details = f"gave up after {self.attempts} attempts", {"attempts": self.attempts}
        else:
            attempts = state.attempt_number
            why = (
                f"gave up after {attempts} attempts: another would end after the total "
                f"deadline of {self.total_deadline:g} s"
            )
            details = {"attempts": attempts, "total_deadline": self.total_deadline}
        raise SummarizerError(
            f"{error} ({why})",
            retryable=True,
            overflow=error.overflow,
            code=error.diagnostic.code,
            details={**error.diagnostic.details, **details},
        ) from None

    def _uniform(self, low: float, high: float) -> float:
        return low + self._jitter() * (high - low)

    def _post(self, body: bytes, deadline: float) -> str:
        """One attempt: the reply's text, or a SummarizerError saying what went wrong."""
        try:
            reply = self._net.request(
                "POST",
                self.url,
                headers=self.request_headers(),
                content=body,
                deadline=deadline,
                max_bytes=self.max_reply_bytes,
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
            )
        except NetworkError as exc:
            raise self._network_error(exc) from None
        if not reply.is_success:
            raise self._status_error(reply)
        return reply_text(
            reply.content,
            self.kind,
            max_chars=self.max_summary_chars,
            where=self._where(),
            redact=self._redact,
        )

    def _network_error(self, exc: NetworkError) -> SummarizerError:
        d = exc.diagnostic
        what, code, retryable = _NET_FAILURES.get(
            d.code, ("refused by the network policy", "summarizer.refused", False)
        )
        facts: dict[str, Any] = {"net": d.code}
        if d.code == "net.too-large":
            facts["max_bytes"] = self.max_reply_bytes
        return SummarizerError(
            f"{self._where()}: {what}: {self._redact(d.message)}",
            retryable=retryable,
            code=code,
            details=facts,
        )

    def _where(self) -> str:
        return f"{self.kind} summarizer at {self.url}"

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[api key]") if self._api_key else text

    def _status_error(self, reply: HttpReply) -> _StatusError:
        status = reply.status_code
        detail = self._redact(_provider_message(reply.content))
        low = detail.lower()
        overflow = status == 413 or (status == 400 and any(w in low for w in _OVERFLOW_WORDS))
        return _StatusError(
            f"{self._where()}: HTTP {status}" + (f": {detail}" if detail else ""),
            retryable=status in _RETRY_STATUS or status >= 500,
            overflow=overflow,
            status=status,
            retry_after=_retry_after(reply),
        )


def _failure(state: RetryState) -> SummarizerError:
    """The error the last attempt raised (only a SummarizerError is ever retried)."""
    assert state.outcome is not None
    error = state.outcome.exception()
    assert isinstance(error, SummarizerError)
    return error


def _no_redaction(text: str) -> str:
    return text


def _load_json(content: bytes) -> tuple[bool, Any]:
    """(parsed, value): JSON that fails to parse, or nests deeper than the interpreter's
    recursion limit, is (False, reason)."""
    try:
        return True, json.loads(content)
    except (ValueError, UnicodeDecodeError) as exc:
        return False, str(exc)
    except RecursionError:
        return False, "nested too deeply"


def _bad(where: str, message: str, content: bytes, redact: Callable[[str], str]) -> SummarizerError:
    sample = redact(clip(content[:600].decode("utf-8", "replace"), 200))
    return SummarizerError(f"{where}: {message}: {sample!r}", code="summarizer.response")


def reply_text(
    content: bytes,
    kind: Literal["openai", "anthropic"],
    *,
    max_chars: int = DEFAULT_MAX_SUMMARY_CHARS,
    where: str = "summarizer",
    redact: Callable[[str], str] = _no_redaction,
) -> str:
    """The summary in a successful reply body, stripped; anything else is a
    :class:`~kilo_rules.engine.summarizers.protocol.SummarizerError` (``summarizer.response``: not
    JSON, the wrong shape, a text part that is not a string, no text; ``summarizer.too-long``: more
    than ``max_chars`` characters)."""
    ok, data = _load_json(content)
    if not ok:
        raise _bad(where, f"the response is not JSON ({data})", content, redact)
    try:
        text = _anthropic_text(data) if kind == "anthropic" else _openai_text(data)
    except _ShapeError as exc:
        raise _bad(where, str(exc), content, redact) from None
    text = text.strip()
    if not text:
        raise _bad(where, "the response has no text", content, redact)
    if len(text) > max_chars:
        raise SummarizerError(
            f"{where}: the summary is {len(text)} characters long, more than {max_chars}",
            code="summarizer.too-long",
            details={"chars": len(text), "max_chars": max_chars},
        )
    return text


class _ShapeError(Exception):
    """A reply whose text parts are not what the API documents."""


def _openai_text(data: Any) -> str:
    choices = data.get("choices") if isinstance(data, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # some compatible servers answer with content parts
        return _parts(content, lambda p: True)
    return content if isinstance(content, str) else ""


def _anthropic_text(data: Any) -> str:
    blocks = data.get("content") if isinstance(data, dict) else None
    if not isinstance(blocks, list):
        return ""
    return _parts(blocks, lambda b: b.get("type") == "text")


def _parts(parts: list[Any], wanted: Callable[[dict[str, Any]], bool]) -> str:
    out: list[str] = []
    for part in parts:
        if not isinstance(part, dict) or not wanted(part) or "text" not in part:
            continue
        text = part["text"]
        if not isinstance(text, str):
            raise _ShapeError(f"a text part holds {type(text).__name__}, not a string")
        out.append(text)
    return "".join(out)


def _provider_message(content: bytes) -> str:
    """The provider's own error text: ``error.message`` in both APIs, else the raw body."""
    raw = clip(" ".join(content[:2000].decode("utf-8", "replace").split()), 500)
    ok, data = _load_json(content)
    if not ok:
        return raw
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        parts = [
            str(err[k]) for k in ("type", "code", "message") if isinstance(err.get(k), str | int)
        ]
        return clip(": ".join(dict.fromkeys(p for p in parts if p)), 500) or raw
    if isinstance(err, str):
        return clip(err, 500)
    return raw


def _retry_after(response: HttpReply) -> float | None:
    """``Retry-After`` as seconds (delta or HTTP date), on the statuses that may send it."""
    if response.status_code not in (429, 503, 529):
        return None
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, float(when.timestamp()) - time.time())
