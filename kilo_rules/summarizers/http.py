"""A summarizer that asks a model over HTTP: OpenAI-compatible or Anthropic Messages.

The head travels as one plain-text transcript (tools are not offered, so tool calls and
results are written out as text), followed by the instruction as the final user message.
Timeouts, 429 and 5xx answers are retried with exponential backoff and jitter, honouring
``Retry-After``; every failure becomes a :class:`~kilo_rules.summarize.SummarizerError`
that says what happened and whether another attempt may help. The API key is sent only in
its header and is blanked out of any error text.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx

from ..summarize import SummarizerError, SummaryRequest
from ._shared import clip, transcript

__all__ = ["ANTHROPIC_VERSION", "HttpSummarizer"]

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent to Anthropic endpoints."""

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


class HttpSummarizer:
    """A :class:`~kilo_rules.summarize.Summarizer` backed by a chat endpoint.

    ``kind="openai"`` posts to ``{base_url}/v1/chat/completions`` with ``Authorization:
    Bearer``; ``kind="anthropic"`` to ``{base_url}/v1/messages`` with ``x-api-key`` and
    ``anthropic-version``. A ``base_url`` that already ends in ``/v1`` is not doubled.

    Seams for tests and embedding: ``client`` (an ``httpx.Client`` the caller owns and
    closes), or ``transport`` (used to build a client per call), ``sleep`` (waits between
    attempts) and ``jitter`` (returns a float in [0, 1)).
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
        attempts: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_retry_after: float = 120.0,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if kind not in ("openai", "anthropic"):
            raise ValueError(f"kind must be 'openai' or 'anthropic', not {kind!r}")
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.kind = kind
        self._api_key = api_key
        self.system = system
        self.temperature = temperature
        self.max_tokens_field = max_tokens_field
        self.timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.headers = dict(headers or {})
        self._client = client
        self._transport = transport
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
        """Post ``request`` and return the reply's text, retrying what may pass next time."""
        body = self.request_body(request)
        if self._client is not None:
            return self._attempts(self._client, body)
        with httpx.Client(transport=self._transport, timeout=self.timeout) as client:
            return self._attempts(client, body)

    def _attempts(self, client: httpx.Client, body: dict[str, Any]) -> str:
        attempt = 1
        while True:
            try:
                return self._post(client, body)
            except SummarizerError as error:
                if not error.retryable or attempt >= self.attempts:
                    if error.retryable and self.attempts > 1:
                        raise SummarizerError(
                            f"{error} (gave up after {self.attempts} attempts)",
                            retryable=True,
                            overflow=error.overflow,
                            code=error.diagnostic.code,
                            details={**error.diagnostic.details, "attempts": self.attempts},
                        ) from None
                    raise
                wait = error.retry_after if isinstance(error, _StatusError) else None
                delay = self._delay(attempt) if wait is None else min(wait, self.max_retry_after)
                _log.info(
                    "%s; attempt %d of %d, retrying in %.2fs", error, attempt, self.attempts, delay
                )
            self._sleep(delay)
            attempt += 1

    def _post(self, client: httpx.Client, body: dict[str, Any]) -> str:
        """One attempt: the reply's text, or a SummarizerError saying what went wrong."""
        try:
            response = client.post(
                self.url, json=body, headers=self.request_headers(), timeout=self.timeout
            )
        except httpx.TimeoutException as exc:
            raise SummarizerError(
                f"{self._where()}: timed out ({type(exc).__name__})",
                retryable=True,
                code="summarizer.timeout",
            ) from None
        except httpx.TransportError as exc:
            raise SummarizerError(
                f"{self._where()}: request failed: {self._redact(str(exc))}",
                retryable=True,
                code="summarizer.network",
            ) from None
        if not response.is_success:
            raise self._status_error(response)
        return self._text(response)

    def _delay(self, attempt: int) -> float:
        # "Equal jitter": half the exponential step is fixed, half random, so concurrent
        # clients spread out without any of them retrying immediately.
        step = min(self.max_backoff, self.backoff * float(2 ** (attempt - 1)))
        return step / 2 + self._jitter() * step / 2

    def _where(self) -> str:
        return f"{self.kind} summarizer at {self.url}"

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[api key]") if self._api_key else text

    def _status_error(self, response: httpx.Response) -> _StatusError:
        status = response.status_code
        detail = self._redact(_provider_message(response))
        low = detail.lower()
        overflow = status == 413 or (status == 400 and any(w in low for w in _OVERFLOW_WORDS))
        return _StatusError(
            f"{self._where()}: HTTP {status}" + (f": {detail}" if detail else ""),
            retryable=status in _RETRY_STATUS or status >= 500,
            overflow=overflow,
            status=status,
            retry_after=_retry_after(response),
        )

    def _text(self, response: httpx.Response) -> str:
        try:
            data = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SummarizerError(
                f"{self._where()}: the response is not JSON ({exc}): "
                f"{self._redact(clip(response.text, 200))!r}",
                code="summarizer.response",
            ) from None
        text = _anthropic_text(data) if self.kind == "anthropic" else _openai_text(data)
        if not text.strip():
            raise SummarizerError(
                f"{self._where()}: the response has no text: "
                f"{self._redact(clip(json.dumps(data), 300))}",
                code="summarizer.response",
            )
        return text.strip()


def _openai_text(data: Any) -> str:
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return ""
    if isinstance(content, list):  # some compatible servers answer with content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _anthropic_text(data: Any) -> str:
    blocks = data.get("content") if isinstance(data, dict) else None
    if not isinstance(blocks, list):
        return ""
    return "".join(
        b["text"]
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def _provider_message(response: httpx.Response) -> str:
    """The provider's own error text: ``error.message`` in both APIs, else the raw body."""
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return clip(" ".join(response.text.split()), 500)
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        parts = [str(err[k]) for k in ("type", "code", "message") if err.get(k)]
        return clip(": ".join(dict.fromkeys(parts)), 500)
    if isinstance(err, str):
        return clip(err, 500)
    return clip(json.dumps(data), 500)


def _retry_after(response: httpx.Response) -> float | None:
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
