"""The three client APIs the gateway speaks, as data: where the history is, which items may
open a kept tail, how usage and a context overflow are reported, what an error looks like.

Everything here reads JSON the client or the upstream sent; nothing is trusted to have the
documented shape, so each reader answers None (or False) for what it does not recognise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ANTHROPIC", "CHAT", "PROTOCOLS", "RESPONSES", "Protocol", "SseUsage", "Usage"]

ProtocolName = Literal["anthropic-messages", "openai-chat", "openai-responses"]
Provider = Literal["anthropic", "openai"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens the provider reported for one reply. ``input`` counts every prompt token,
    cached or not (Anthropic's three input fields added up)."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        """What the next request starts from: the prompt and the reply (Kilo's count)."""
        return self.input + self.output


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _dig(value: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(k)
    return value


@dataclass(frozen=True, slots=True)
class Protocol:
    """One client API."""

    name: ProtocolName
    path: str  # the endpoint the gateway manages
    provider: Provider  # whose upstream it forwards to
    items: str  # the body member that holds the history
    wire_api: str  # the engine's wire API the summary is rendered for
    importer: str  # the importer that reads the history into Session v1
    output_keys: tuple[str, ...]  # members that cap the output, first the one set

    # -- history --------------------------------------------------------------------------
    def leading(self, items: Sequence[Any]) -> int:
        """How many items must stay first whatever is compacted (system instructions)."""
        if self.name == "anthropic-messages":
            return 0
        n = 0
        for item in items:
            if not (isinstance(item, dict) and item.get("role") in ("system", "developer")):
                break
            n += 1
        return n

    def role(self, item: Any) -> str | None:
        """``user`` or ``assistant`` for an item a tail may start on, else None: a tool
        result (its call would be cut off), a system item, anything unrecognised."""
        if not isinstance(item, dict):
            return None
        role = item.get("role")
        if self.name == "anthropic-messages":
            if role == "assistant":
                return "assistant"
            content = item.get("content")
            if role == "user" and not (
                isinstance(content, list)
                and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
            ):
                return "user"
            return None
        if self.name == "openai-chat":
            return role if role in ("user", "assistant") else None
        kind = item.get("type", "message")
        if kind == "message" and role in ("user", "assistant"):
            return str(role)
        if kind in ("function_call", "reasoning", "custom_tool_call"):
            return "assistant"
        return None

    # -- replies --------------------------------------------------------------------------
    def usage(self, reply: Any) -> Usage | None:
        """The usage of a JSON reply, or None."""
        if self.name == "openai-responses" and _dig(reply, "object") != "response":
            reply = _dig(reply, "response")
        u = _dig(reply, "usage")
        if not isinstance(u, dict):
            return None
        if self.name == "anthropic-messages":
            read, write = (
                _int(u.get("cache_read_input_tokens")),
                _int(u.get("cache_creation_input_tokens")),
            )
            return Usage(
                _int(u.get("input_tokens")) + read + write,
                read,
                write,
                _int(u.get("output_tokens")),
            )
        if self.name == "openai-chat":
            cached = _int(_dig(u, "prompt_tokens_details", "cached_tokens"))
            return Usage(_int(u.get("prompt_tokens")), cached, 0, _int(u.get("completion_tokens")))
        cached = _int(_dig(u, "input_tokens_details", "cached_tokens"))
        return Usage(_int(u.get("input_tokens")), cached, 0, _int(u.get("output_tokens")))

    def overflowed(self, status: int, body: bytes) -> bool:
        """Whether an upstream error says the prompt did not fit the context window."""
        if status not in (400, 413, 422):
            return False
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return False
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            return False
        code, message = error.get("code"), str(error.get("message", "")).lower()
        if code == "context_length_exceeded":
            return True
        return any(
            words in message
            for words in (
                "prompt is too long",
                "maximum context length",
                "context window",
                "input is too long",
                "too many tokens",
            )
        )

    def error(self, status: int, message: str) -> bytes:
        """One of the gateway's own errors, shaped the way this API's SDKs read errors."""
        if self.provider == "anthropic":
            kind = {401: "authentication_error", 413: "request_too_large", 429: "rate_limit_error"}
            kind |= {502: "api_error", 503: "overloaded_error", 504: "api_error"}
            data: dict[str, Any] = {
                "type": "error",
                "error": {"type": kind.get(status, "invalid_request_error"), "message": message},
            }
        else:
            data = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error" if status < 500 else "server_error",
                    "param": None,
                    "code": None,
                }
            }
        return json.dumps(data).encode()


ANTHROPIC = Protocol(
    "anthropic-messages",
    "/v1/messages",
    "anthropic",
    "messages",
    "anthropic",
    "anthropic_messages",
    ("max_tokens",),
)
CHAT = Protocol(
    "openai-chat",
    "/v1/chat/completions",
    "openai",
    "messages",
    "openai",
    "openai_chat",
    ("max_completion_tokens", "max_tokens"),
)
RESPONSES = Protocol(
    "openai-responses",
    "/v1/responses",
    "openai",
    "input",
    "openai-responses",
    "openai_responses",
    ("max_output_tokens",),
)
PROTOCOLS: dict[str, Protocol] = {p.path: p for p in (ANTHROPIC, CHAT, RESPONSES)}


class SseUsage:
    """Reads usage out of a server-sent event stream as it is relayed, chunk by chunk.

    Only events whose data mentions ``usage`` are parsed; an event longer than
    ``max_event`` bytes is skipped (the stream is still relayed whole)."""

    def __init__(self, protocol: Protocol, max_event: int = 1 << 20) -> None:
        self.protocol = protocol
        self.max_event = max_event
        self._buffer = b""
        self._skipping = False
        self.input = self.cache_read = self.cache_write = self.output = 0
        self.seen = False

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the stream."""
        # Lines may end in CRLF; one split across two chunks is joined here, since the
        # unparsed rest of the buffer is kept.
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        while True:
            cut = self._buffer.find(b"\n\n")
            if cut < 0:
                if len(self._buffer) > self.max_event:
                    # Keep the last byte: it may be the first half of the separator.
                    self._buffer, self._skipping = self._buffer[-1:], True
                return
            event, self._buffer = self._buffer[:cut], self._buffer[cut + 2 :]
            if self._skipping or len(event) > self.max_event:
                self._skipping = False  # the end of an event too long to read
                continue
            self._event(event)

    def _event(self, event: bytes) -> None:
        if b"usage" not in event:
            return
        data = b"".join(
            line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        )
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            return
        name = self.protocol.name
        if name == "anthropic-messages":
            # message_start carries the input (the same fields as a whole reply's usage);
            # message_delta the output so far.
            kind = _dig(value, "type")
            if kind == "message_start":
                got = self.protocol.usage(_dig(value, "message"))
                if got is not None:
                    self.input, self.cache_read = got.input, got.cache_read
                    self.cache_write, self.output = got.cache_write, got.output
                    self.seen = True
            elif kind == "message_delta" and isinstance(_dig(value, "usage"), dict):
                self.output = _int(_dig(value, "usage", "output_tokens")) or self.output
                self.seen = True
            return
        got = self.protocol.usage(value)
        if got is not None:
            self.input, self.cache_read, self.output = got.input, got.cache_read, got.output
            self.seen = True

    def usage(self) -> Usage | None:
        """What the stream reported, or None when it reported nothing."""
        if not self.seen:
            return None
        return Usage(self.input, self.cache_read, self.cache_write, self.output)
