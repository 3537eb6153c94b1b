"""Measuring a request before it is sent (spec §1, §4, §8 step 6).

Kilo estimates on ``JSON.stringify`` of the AI-SDK model messages, so keys and punctuation
count. :func:`messages_json` produces the same shape from our messages, and
:func:`measure` is the preflight estimate: media and opaque reasoning are swapped for short
placeholders (their real size goes to ``extra``), the result is scaled by the policy's
factor (Kilo: 1.3), and ``continuation`` says whether a tool round-trip is still open.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Media, ModelMessage, Reasoning, Text, ToolCall, ToolResult, ToolSpec

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
    raise TypeError(type(part).__name__)  # pragma: no cover


def message_data(
    messages: Sequence[ModelMessage],
    *,
    strip: bool = False,
    counter: Callable[[str], int] | None = None,
) -> tuple[list[dict[str, Any]], int, int]:
    """(AI-SDK-shaped messages, extra tokens hidden by stripping, media count)."""
    from ..tokens import estimate

    count = counter or estimate
    extra = [0, 0]
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            text = "".join(p.text for p in m.parts if isinstance(p, Text))
            out.append({"role": "system", "content": text})
        else:
            out.append(
                {"role": m.role, "content": [_part(p, strip, extra, count) for p in m.parts]}
            )
    return out, extra[0], extra[1]


def messages_json(messages: Sequence[ModelMessage]) -> str:
    """``JSON.stringify`` of the model messages (compact, as JavaScript writes it)."""
    data, _, _ = message_data(messages)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def payload_bytes(messages: Sequence[ModelMessage]) -> int:
    """UTF-8 byte size of the messages' JSON (Kilo's REQUEST_PRUNE_BYTES measure)."""
    return len(messages_json(messages).encode("utf-8", "surrogatepass"))


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
) -> Measure:
    """Kilo's preflight ``measure`` (spec §4)."""
    data, extra, media = message_data(messages, strip=True, counter=counter)
    chars = counter(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    tool_tokens = counter(_tools_json(tools))
    normalized = math.ceil((chars + tool_tokens) * factor)
    raw = math.ceil((chars + extra + tool_tokens) * factor)
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    tail_data = data[last_assistant + 1 :]
    tail = math.ceil(counter(json.dumps(tail_data, separators=(",", ":"))) * factor)
    system_chars = sum(len(d["content"]) for d in data if d["role"] == "system")
    overhead = math.ceil((tool_tokens + math.floor(system_chars / 4 + 0.5)) * factor)
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    continuation = any(m.role == "tool" for m in messages[last_user + 1 :])
    return Measure(chars, tool_tokens, extra, normalized, raw, tail, overhead, continuation, media)
