"""Measuring a request before it is sent (spec §1, §4, §8 step 6).

Kilo estimates on ``JSON.stringify`` of the AI-SDK model messages, so keys and punctuation
count. :func:`messages_json` produces the same shape from our messages, and
:func:`measure` is the preflight estimate: media and opaque reasoning are swapped for short
placeholders (their real size goes to ``extra``), the result is scaled by the policy's
factor (Kilo: 1.3), and ``continuation`` says whether a tool round-trip is still open.
An exact counter (a tokenizer) counts the text the model reads instead of the JSON
(:func:`_list_count`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kilo_rules.engine.formats.request import (
    Approval,
    Media,
    ModelMessage,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from kilo_rules.engine.runtime.memo import IdentityLRU, PrefixMemo
from kilo_rules.engine.text.tokens import (
    CountCache,
    EstimateCounter,
    TiktokenCounter,
    estimate,
    utf16_len,
)

MEDIA_PLACEHOLDER = "[encoded media]"
REASONING_PLACEHOLDER = "[opaque reasoning state]"


def _part(part: Any, strip: bool, extra: list[int], counter: Callable[[str], int]) -> Any:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    if isinstance(part, Media):
        payload = part.data if part.data is not None else (part.url or "")
        if strip:
            extra[0] += max(0, counter(payload) - counter(MEDIA_PLACEHOLDER))
            extra[1] += 1
            payload = MEDIA_PLACEHOLDER
        kind = "image" if part.mime.startswith("image/") else "file"
        return {"type": kind, "mediaType": part.mime, "data": payload}
    if isinstance(part, Reasoning):
        out: dict[str, Any] = {"type": "reasoning", "text": part.text}
        if part.encrypted is not None:
            enc = part.encrypted
            if strip:
                extra[0] += max(0, counter(enc) - counter(REASONING_PLACEHOLDER))
                enc = REASONING_PLACEHOLDER
            out["providerOptions"] = {"reasoningEncryptedContent": enc}
        elif part.signature is not None:
            out["providerOptions"] = {"signature": part.signature}
        return out
    if isinstance(part, ToolCall):
        return {
            "type": "tool-call",
            "toolCallId": part.call_id,
            "toolName": part.name,
            "input": part.input,
        }
    if isinstance(part, ToolResult):
        content = [_part(c, strip, extra, counter) for c in part.content]
        value: Any
        if len(content) == 1 and content[0]["type"] == "text":
            value = {"type": "error-text" if part.is_error else "text", "value": content[0]["text"]}
        else:
            value = {"type": "content", "value": content}
        return {
            "type": "tool-result",
            "toolCallId": part.call_id,
            "toolName": part.name,
            "output": value,
        }
    if isinstance(part, Approval):  # the AI SDK's tool-approval parts, as Kilo serialises them
        if part.kind == "approval-request":
            return {
                "type": "tool-approval-request",
                "approvalId": part.approval_id,
                "toolCallId": part.call_id,
            }
        answer: dict[str, Any] = {
            "type": "tool-approval-response",
            "approvalId": part.approval_id,
            "approved": part.approved,
        }
        if part.reason is not None:
            answer["reason"] = part.reason
        return answer
    raise TypeError(type(part).__name__)  # pragma: no cover


def _message_dict(
    m: ModelMessage, strip: bool, extra: list[int], count: Callable[[str], int]
) -> dict[str, Any]:
    if m.role == "system":
        return {
            "role": "system",
            "content": "".join(p.text for p in m.parts if isinstance(p, Text)),
        }
    return {"role": m.role, "content": [_part(p, strip, extra, count) for p in m.parts]}


def message_data(
    messages: Sequence[ModelMessage],
    *,
    strip: bool = False,
    counter: Callable[[str], int] | None = None,
) -> tuple[list[dict[str, Any]], int, int]:
    """(AI-SDK-shaped messages, extra tokens hidden by stripping, media count)."""
    count = counter or estimate
    extra = [0, 0]
    out = [_message_dict(m, strip, extra, count) for m in messages]
    return out, extra[0], extra[1]


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _opaque(m: ModelMessage) -> bool:
    """Whether stripping would change the message (media or encrypted reasoning)."""
    for p in m.parts:
        if isinstance(p, Media) or (isinstance(p, Reasoning) and p.encrypted is not None):
            return True
        if isinstance(p, ToolResult) and any(isinstance(c, Media) for c in p.content):
            return True
    return False


MESSAGE_OVERHEAD = 4
"""Tokens an exact count adds per message for its role and framing: the 3 of the framing
OpenAI documents per chat message, and the role's name, which its formula counts too (one
token for each role in the cl100k and o200k encodings; no provider documents its own)."""


def _text_tokens(m: ModelMessage, strip: bool, count: Callable[[str], int]) -> int:
    """What a tokenizer reads in ``m``: its texts, tool names, tool inputs as JSON and
    tool outputs (media and opaque reasoning as placeholders when stripped), plus the
    message overhead. JSON keys and escapes are not sent to the model's tokenizer."""
    total = MESSAGE_OVERHEAD

    def one(part: Any) -> int:
        if isinstance(part, Text):
            return count(part.text)
        if isinstance(part, Media):
            return count(MEDIA_PLACEHOLDER if strip else (part.data or part.url or ""))
        if isinstance(part, Reasoning):
            enc = part.encrypted
            if enc is None:
                return count(part.text)
            return count(part.text) + count(REASONING_PLACEHOLDER if strip else enc)
        if isinstance(part, ToolCall):
            return count(part.name) + count(_dumps(part.input))
        if isinstance(part, ToolResult):
            return sum(one(c) for c in part.content)
        if isinstance(part, Approval):
            return 0  # never sent to the model
        raise TypeError(type(part).__name__)  # pragma: no cover

    for p in m.parts:
        total += one(p)
    return total


def _list_count(
    counter: Callable[[str], int],
) -> tuple[Callable[[ModelMessage, str, bool], int], Callable[[int, int], int]] | None:
    """How ``counter`` counts a list of messages piece by piece: (one message's weight
    from the message, its JSON and whether it is stripped; the count from the weights'
    sum and the number of messages), or None when the counter must see the whole list.

    An estimate measures the JSON (Kilo's rule: keys and punctuation count); a tokenizer
    counts the text the model reads (:func:`_text_tokens`), which is also faster than
    tokenizing escaped JSON."""
    owner = getattr(counter, "__self__", None)
    if isinstance(owner, EstimateCounter):
        estimate = owner
        return (
            lambda _m, text, _strip: utf16_len(text),
            lambda total, n: estimate.count_length(total + max(n - 1, 0) + 2),
        )
    if isinstance(owner, CountCache | TiktokenCounter):
        return (
            lambda m, _text, strip: _text_tokens(m, strip, counter),
            lambda total, _n: total,
        )
    return None


@dataclass(frozen=True, slots=True)
class Piece:
    """One message's JSON as the measures see it."""

    text: str
    size: int  # UTF-8 bytes
    weight: int  # what it adds to a list count (0: the counter must see whole lists)
    extra: int = 0  # tokens hidden by stripping media and opaque reasoning
    media: int = 0  # media stripped


class JsonCache:
    """The JSON of each message and what it adds to a token count, made once and shared
    by the payload guard, the token estimate and the preflight measure — within a step,
    and across steps when the same (immutable) message objects come back."""

    def __init__(self, counter: Callable[[str], int], maxsize: int = 8192) -> None:
        self.counter = counter
        self._list = _list_count(counter)
        # One entry per message, [plain, stripped] (None: not made yet): a step asks for
        # both, and one look-up is what it costs per message.
        self._pieces: IdentityLRU[ModelMessage, list[Piece | None]] = IdentityLRU(maxsize)
        self._plain_lists: PrefixMemo[ModelMessage, Piece] = PrefixMemo()
        self._stripped_lists: PrefixMemo[ModelMessage, Piece] = PrefixMemo()

    def _piece(self, m: ModelMessage, strip: bool) -> Piece:
        extra = [0, 0]
        text = _dumps(_message_dict(m, strip, extra, self.counter))
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        weight = self._list[0](m, text, strip) if self._list is not None else 0
        return Piece(text, size, weight, extra[0], extra[1])

    def _entry(self, m: ModelMessage) -> list[Piece | None]:
        return self._pieces.get_or(m, lambda: [None, None])

    def plain(self, m: ModelMessage) -> Piece:
        """The message's JSON."""
        entry = self._entry(m)
        piece = entry[0]
        if piece is None:
            piece = entry[0] = self._piece(m, False)
        return piece

    def stripped(self, m: ModelMessage) -> Piece:
        """The message's JSON with media and opaque reasoning swapped for placeholders."""
        entry = self._entry(m)
        piece = entry[1]
        if piece is None:
            if _opaque(m):
                piece = self._piece(m, True)
            else:
                piece = entry[0] = entry[0] or self._piece(m, False)
            entry[1] = piece
        return piece

    def plain_list(self, messages: Sequence[ModelMessage]) -> list[Piece]:
        """:meth:`plain` of each message; those the list shares with the one asked for last
        (by its first message) are taken over without a look-up."""
        return self._plain_lists.values(messages, lambda _, m: self.plain(m))

    def stripped_list(self, messages: Sequence[ModelMessage]) -> list[Piece]:
        """:meth:`stripped` of each message, as :meth:`plain_list` reuses them. The leading
        system messages (made anew every step) are looked up one by one."""
        k = _leading_system(messages)
        head = [self.stripped(m) for m in messages[:k]]
        return head + self._stripped_lists.values(messages[k:], lambda _, m: self.stripped(m))

    def count(self, pieces: Sequence[Piece]) -> int:
        """``counter``'s count of the messages of ``pieces`` (their JSON list, for an
        estimate), from the pieces' weights when it adds up piece by piece."""
        return self.count_run(sum(p.weight for p in pieces), len(pieces), lambda: pieces)

    def count_run(self, weight: int, n: int, pieces: Callable[[], Sequence[Piece]]) -> int:
        """The count of ``n`` pieces whose weights sum to ``weight``; a counter that must
        see whole lists counts the JSON list of ``pieces()`` instead."""
        if self._list is None:
            return self.counter("[" + ",".join(p.text for p in pieces()) + "]")
        return self._list[1](weight, n)


def messages_json(messages: Sequence[ModelMessage]) -> str:
    """``JSON.stringify`` of the model messages (compact, as JavaScript writes it)."""
    data, _, _ = message_data(messages)
    return _dumps(data)


@dataclass(frozen=True, slots=True)
class Measure:
    """The preflight estimate of one request (``kilocode/session/overflow.ts`` measure)."""

    chars: int
    tools: int
    extra: int
    normalized: int
    raw: int
    tail: int
    overhead: int
    continuation: bool
    media: int


def _tools_json(tools: Sequence[ToolSpec]) -> str:
    return json.dumps(
        [
            {"name": t.name, "description": t.description, "inputSchema": t.input_schema}
            for t in tools
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )


def measure(
    messages: Sequence[ModelMessage],
    tools: Sequence[ToolSpec],
    *,
    factor: float,
    counter: Callable[[str], int],
    cache: JsonCache | None = None,
) -> Measure:
    """Kilo's preflight ``measure`` (spec §4)."""
    cache = cache or JsonCache(counter)
    pieces = cache.stripped_list(messages)
    extra = sum(p.extra for p in pieces)
    media = sum(p.media for p in pieces)
    chars = cache.count(pieces)
    tool_tokens = counter(_tools_json(tools))
    normalized = math.ceil((chars + tool_tokens) * factor)
    raw = math.ceil((chars + extra + tool_tokens) * factor)
    last_assistant = last_of_role(messages, "assistant")
    tail = math.ceil(cache.count(pieces[last_assistant + 1 :]) * factor)
    system_chars = sum(
        len(p.text) for m in messages if m.role == "system" for p in m.parts if isinstance(p, Text)
    )
    overhead = math.ceil((tool_tokens + math.floor(system_chars / 4 + 0.5)) * factor)
    last_user = last_of_role(messages, "user")
    continuation = any(m.role == "tool" for m in messages[last_user + 1 :])
    return Measure(chars, tool_tokens, extra, normalized, raw, tail, overhead, continuation, media)


def _leading_system(messages: Sequence[ModelMessage]) -> int:
    """How many system messages the list starts with."""
    k = 0
    while k < len(messages) and messages[k].role == "system":
        k += 1
    return k


def last_of_role(messages: Sequence[ModelMessage], role: str) -> int:
    """The index of the last message of ``role`` (-1: none), found from the end."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == role:
            return i
    return -1
