"""OpenAI Chat Completions (``POST /v1/chat/completions``): the request body.

Mapping from the provider-neutral request:

* system messages → ``role: system`` messages with string content;
* tools → ``tools[{type: function, function: {name, description, parameters}}]``;
* blank (whitespace-only) text is not sent, so no cache mark lands on it;
* user text and media → a string when the message is one unmarked text, else content
  parts: ``text``, ``image_url`` (a ``data:`` URL or the media's own URL) and ``file``
  (PDF as a ``data:`` URL); ``text/*`` attachments are inlined as text, other types
  become a placeholder;
* assistant text → ``content`` (null when the turn is only tool calls), tool calls →
  ``tool_calls`` with the input as a JSON string;
* a ``tool`` message → one ``role: tool`` message per result, with ``tool_call_id``.
  Tool messages are text-only on this API, so media the runtime left in a result are
  replaced by a text placeholder (the runtime normally moves them to a user message);
* reasoning is not sent back: Chat Completions has no field for it (the Responses API
  does). OpenAI-compatible servers that want it are handled by ``openai_compatible``;
* cache marks are ignored by default: OpenAI caches prompt prefixes automatically.
  Models that take explicit breakpoints (GPT-5.6 and later) get
  ``prompt_cache_breakpoint: {"mode": "explicit"}`` on the marked content part when the
  caller sets ``options["prompt_cache_breakpoints"]``;
* ``max_tokens`` → ``max_completion_tokens`` (``max_tokens`` is refused by reasoning
  models).

The message-building core here is shared with :mod:`.openai_compatible`, which differs
only in its marker, its output-limit key and an optional reasoning field, and with
:mod:`.copilot`, which also puts its marks on message objects and tools and cleans
tool-call ids.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.request import (
    CacheMark,
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from kilo_rules.engine.providers._api_rules import TOOL_NAME, ApiRules
from kilo_rules.engine.providers._shared import (
    Entry,
    FragmentStore,
    body_json,
    data_url,
    decode_text,
    effective_mark,
    is_blank,
    items_json,
    joined,
    media_kind,
    placeholder,
    sanitize_call_id,
    settle_marks,
    without_approval_parts,
)
from kilo_rules.engine.providers.registry import WireApiSpec

ENDPOINT = "/v1/chat/completions"

_TOOL_MEDIA = "tool results are text-only on this API"


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between Chat Completions servers.

    ``part_mark`` renders a cache mark for a content part (None: marks are ignored),
    under the key ``mark_key``. ``message_mark`` says whether a mark with no content part
    to sit on (a turn of only tool calls) may go on the message object itself.
    ``max_tokens_key`` names the output limit; ``reasoning_field`` names the assistant
    field that carries reasoning text back (None: reasoning is not sent).
    ``marks_on_message`` puts every mark of a message on the message object (one per
    message) instead of on content parts; ``tool_marks`` lets a tool definition carry
    its mark; ``clean_ids`` sends tool-call ids through
    :func:`~kilo_rules.engine.providers._shared.sanitize_call_id`; without ``files``, a PDF
    becomes a placeholder instead of a ``file`` part.
    """

    part_mark: Callable[[CacheMark], dict[str, Any]] | None
    mark_key: str
    message_mark: bool
    max_tokens_key: str
    reasoning_field: str | None = None
    marks_on_message: bool = False
    tool_marks: bool = False
    clean_ids: bool = False
    files: bool = True


def _breakpoint(_: CacheMark) -> dict[str, Any]:
    # The SDK's breakpoint ttl buckets (30m, 12h) do not match Anthropic-style 5m/1h
    # marks, so the request-level default applies.
    return {"mode": "explicit"}


def dialect(request: ModelRequest) -> Dialect:
    """OpenAI's own dialect; explicit breakpoints only when the caller opts in."""
    explicit = bool(request.options.get("prompt_cache_breakpoints"))
    return Dialect(
        part_mark=_breakpoint if explicit else None,
        mark_key="prompt_cache_breakpoint",
        message_mark=False,
        max_tokens_key="max_completion_tokens",
    )


def render(request: ModelRequest) -> dict[str, Any]:
    """The Chat Completions request body for ``request`` (JSON-serialisable, deterministic)."""
    return render_chat(request, dialect(request))


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, from per-message fragments."""
    explicit = bool(request.options.get("prompt_cache_breakpoints"))
    key = "openai+breakpoints" if explicit else "openai"
    return render_chat_json(request, dialect(request), fragments, key)


def render_chat(request: ModelRequest, dialect: Dialect) -> dict[str, Any]:
    """A Chat Completions body in the given dialect."""
    body: dict[str, Any] = {"model": request.model}
    messages: list[dict[str, Any]] = []
    for msg in request.messages:
        messages.extend(_message(msg, dialect))
    body["messages"] = messages
    if request.tools:
        body["tools"] = [_tool(t, dialect) for t in request.tools]
    if request.max_tokens is not None:
        body[dialect.max_tokens_key] = request.max_tokens
    return body


@dataclass(frozen=True, slots=True)
class _Turn:
    """One message's messages on the wire (comma-joined JSON, b"" for none); ``bare``: the
    message has no parts at all, ``approvals``: it had tool-approval parts (dropped)."""

    items: bytes
    bare: bool
    approvals: bool


_APPROVALS = operator.attrgetter("approvals")
_BARE = operator.attrgetter("bare")
_ITEMS = operator.attrgetter("items")


def _turn(msg: ModelMessage, dialect: Dialect) -> _Turn:
    stripped = without_approval_parts(msg)
    approvals = stripped is not msg
    if approvals and not stripped.parts:
        return _Turn(b"", False, True)  # a message of approvals only is dropped with them
    return _Turn(joined(_message(stripped, dialect)), not msg.parts, approvals)


def render_chat_json(
    request: ModelRequest, dialect: Dialect, fragments: FragmentStore | None, key: str
) -> bytes:
    """``encode(dumps(render_chat(request, dialect)))``, each conversation message's JSON
    taken from ``fragments`` (under ``key``, which names everything of the request the
    dialect reads) when it was rendered before.

    A message renders alone on Chat Completions: no neighbour is merged with it or read
    by it. The one rule across messages is :func:`~kilo_rules.engine.providers.render`'s
    approval rule: when any message had approval parts, a message with no parts at all
    is dropped too (otherwise it is sent with empty content)."""

    def make(msg: ModelMessage) -> _Turn:
        return _turn(msg, dialect)

    everything: list[_Turn]
    if fragments is None:
        everything = [make(m) for m in request.messages]
    else:
        # The system messages under a key of their own: the store finds a list by its
        # first item, so a changed system prompt would cost the conversation its prefix.
        # A new list is built: the lists the store returns are its own.
        everything = [
            *fragments.turns(request.system, f"{key}/system", make),
            *fragments.turns(request.conversation, key, make),
        ]
    # Flags read off the fragments (at C speed): the rule costs no rendering.
    if any(map(_APPROVALS, everything)) and any(map(_BARE, everything)):
        everything = [t for t in everything if not t.bare]
    fields: list[tuple[str, Any]] = [("model", request.model)]
    fields.append(("messages", items_json(map(_ITEMS, everything))))
    if request.tools:
        fields.append(("tools", [_tool(t, dialect) for t in request.tools]))
    if request.max_tokens is not None:
        fields.append((dialect.max_tokens_key, request.max_tokens))
    return body_json(fields)


def _tool(tool: ToolSpec, dialect: Dialect) -> dict[str, Any]:
    function = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.input_schema,
    }
    out: dict[str, Any] = {"type": "function", "function": function}
    if dialect.tool_marks and tool.cache is not None and dialect.part_mark is not None:
        out[dialect.mark_key] = dialect.part_mark(tool.cache)
    return out


def _id(call_id: str, dialect: Dialect) -> str:
    return sanitize_call_id(call_id) if dialect.clean_ids else call_id


def _text(part: Text) -> dict[str, Any] | None:
    # Blank text is not sent (see is_blank); a mark on it moves to a part with content.
    return None if is_blank(part.text) else {"type": "text", "text": part.text}


def _media_part(media: Media, where: str | None, dialect: Dialect) -> dict[str, Any]:
    """A user content part for ``media``; ``where`` names a place media cannot go."""
    if where is not None:
        return {"type": "text", "text": placeholder(media, where)}
    kind = media_kind(media)
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": data_url(media)}}
    if kind == "pdf" and media.data is not None and dialect.files:
        file = {"filename": media.filename or "document.pdf", "file_data": data_url(media)}
        return {"type": "file", "file": file}
    if kind == "text":
        text = decode_text(media)
        if text is not None:
            return {"type": "text", "text": text}
    return {"type": "text", "text": placeholder(media, "type not supported by this API")}


def _content(
    entries: list[Entry], message_level: CacheMark | None, dialect: Dialect
) -> tuple[str | list[dict[str, Any]] | None, CacheMark | None]:
    """Content parts with their marks, collapsed to a string when that loses nothing.

    Returns the content (None when there are no parts) and a mark no part could carry.
    """
    kept: list[tuple[dict[str, Any], CacheMark | None]]
    leftover: CacheMark | None = None
    if dialect.part_mark is None:
        kept = [(b, None) for b, _, _ in entries if b is not None]
    else:
        kept, leftover = settle_marks(entries, message_level)
        if dialect.marks_on_message:
            leftover = effective_mark(leftover, *(mark for _, mark in kept))
            kept = [(block, None) for block, _ in kept]
    if not kept:
        return None, leftover
    if len(kept) == 1 and kept[0][1] is None and kept[0][0]["type"] == "text":
        return str(kept[0][0]["text"]), leftover
    parts = []
    for block, mark in kept:
        if mark is not None and dialect.part_mark is not None:
            block = {**block, dialect.mark_key: dialect.part_mark(mark)}
        parts.append(block)
    return parts, leftover


def _finish(
    message: dict[str, Any], leftover: CacheMark | None, dialect: Dialect
) -> dict[str, Any]:
    if leftover is not None and dialect.message_mark and dialect.part_mark is not None:
        message[dialect.mark_key] = dialect.part_mark(leftover)
    return message


def _message(msg: ModelMessage, dialect: Dialect) -> list[dict[str, Any]]:
    if msg.role == "tool":
        return _tool_messages(msg, dialect)
    assistant = msg.role == "assistant"
    where = "not allowed in assistant turns" if assistant else None
    if msg.role == "system":
        where = "not allowed in system messages"
    entries: list[Entry] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for part in msg.parts:
        if isinstance(part, Text):
            entries.append((_text(part), part.cache, True))
        elif isinstance(part, Media):
            entries.append((_media_part(part, where, dialect), part.cache, True))
        elif isinstance(part, ToolCall) and assistant:
            calls.append(_call(part, dialect))
            entries.append((None, part.cache, True))
        elif isinstance(part, Reasoning) and assistant:
            reasoning.append(part.text)
            entries.append((None, part.cache, True))
        elif isinstance(part, ToolResult):
            # Results belong in tool messages; one in another role is shown as text.
            text = {"type": "text", "text": f"[tool result {part.call_id}] {part.name}"}
            entries.append((text, part.cache, True))
        else:
            entries.append((None, part.cache, True))
    content, leftover = _content(entries, msg.cache, dialect)
    out: dict[str, Any] = {"role": msg.role}
    if not assistant:
        out["content"] = content if content is not None else ""
        return [_finish(out, leftover, dialect)]
    send_reasoning = dialect.reasoning_field is not None and any(reasoning)
    if content is None and not calls and not send_reasoning:
        return []  # nothing this API can carry (e.g. reasoning only)
    out["content"] = content if content is not None or calls else ""
    if send_reasoning and dialect.reasoning_field is not None:
        out[dialect.reasoning_field] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return [_finish(out, leftover, dialect)]


def _call(call: ToolCall, dialect: Dialect) -> dict[str, Any]:
    arguments = json.dumps(call.input, ensure_ascii=False)
    return {
        "id": _id(call.call_id, dialect),
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _tool_messages(msg: ModelMessage, dialect: Dialect) -> list[dict[str, Any]]:
    out = []
    results = [p for p in msg.parts if isinstance(p, ToolResult)]
    for i, result in enumerate(results):
        entries: list[Entry] = []
        for part in result.content:
            if isinstance(part, Text):
                entries.append((_text(part), part.cache, True))
            else:
                text = {"type": "text", "text": placeholder(part, _TOOL_MEDIA)}
                entries.append((text, part.cache, True))
        last = i == len(results) - 1
        level = result.cache if not last else effective_mark(result.cache, msg.cache)
        content, leftover = _content(entries, level, dialect)
        call_id = _id(result.call_id, dialect)
        message = {"role": "tool", "tool_call_id": call_id, "content": content or ""}
        out.append(_finish(message, leftover, dialect))
    return out


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("openai"),
    render=render,
    render_json=render_json,
    endpoint=ENDPOINT,
    marker_key="prompt_cache_breakpoint",
    rules=ApiRules(
        shape="chat",
        pairing="tool-messages",
        unique_call_ids=True,
        marked_text_not_blank=True,
        assistant_needs_content=True,
        # "Invalid 'messages[2].tool_calls[0].id': string too long. Expected a string
        # with maximum length 40"
        call_id_max=40,
        tool_name_pattern=TOOL_NAME,
        output_cap=("max_completion_tokens",),
    ),
)
