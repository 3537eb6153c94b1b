"""Anthropic Messages API (``POST /v1/messages``): the request body.

Mapping from the provider-neutral request:

* system messages → top-level ``system``, a list of text blocks;
* tools → ``tools[{name, description, input_schema}]``;
* user text and media → ``text``, ``image`` (base64 or url source) and ``document``
  (PDF as base64 or url, ``text/*`` as a plain-text source) blocks; other media types
  become a text placeholder so the model knows something was there;
* assistant reasoning → ``thinking`` with its ``signature``, or ``redacted_thinking``
  with the encrypted ``data``. Reasoning with neither, or whose signature another vendor
  issued (``Reasoning.origin``), cannot be verified here: the API would reject the
  thinking block, so it is not sent;
* tool calls → ``tool_use``; a ``tool`` message becomes a ``user`` turn of
  ``tool_result`` blocks (``tool_use_id``, ``is_error``). Consecutive turns of one role
  are merged so that user and assistant alternate, tool results first;
* cache marks → ``cache_control: {"type": "ephemeral"}`` (``"ttl": "1h"`` for the hour
  bucket) on the marked block; a message-level mark goes on the message's last block.
  Thinking blocks cannot carry ``cache_control``, so a mark there moves to the nearest
  block that can (see :func:`~kilo_rules.engine.providers._shared.settle_marks`);
* blank (whitespace-only) text is dropped everywhere, system and tool results included
  (the API rejects it), and tool-call ids are
  cleaned to ``^[a-zA-Z0-9_-]+$`` the same way for the call and its result.

``max_tokens`` is required by this API. When the request leaves it unset, the model's
output limit is used if the caller put it in ``options["output_limit"]``, else 4096
(a value every current Claude model accepts).

``options["automatic_cache"]`` (true, or ``"1h"``) turns on Anthropic's automatic caching:
a top-level ``cache_control``, which lets the API move one breakpoint forward by itself.
"""

from __future__ import annotations

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
from kilo_rules.engine.providers._api_rules import CALL_ID, TOOL_NAME, ApiRules
from kilo_rules.engine.providers._shared import (
    Entry,
    FragmentStore,
    WireTurn,
    body_json,
    decode_text,
    dumps,
    effective_mark,
    encode,
    is_blank,
    is_blank_text,
    media_kind,
    merge_same_role,
    placeholder,
    readable,
    sanitize_call_id,
    settle_marks,
    turns_json,
    without_approval_parts,
)
from kilo_rules.engine.providers.registry import WireApiSpec

#: Used for ``max_tokens`` when neither the request nor ``options["output_limit"]`` sets it.
DEFAULT_MAX_TOKENS = 4096

ENDPOINT = "/v1/messages"

#: Whose reasoning signatures this API reads (see
#: :func:`~kilo_rules.engine.formats.catalog.signature_issuer`).
ISSUER = "anthropic"


def render(request: ModelRequest) -> dict[str, Any]:
    """The Messages API request body for ``request`` (JSON-serialisable, deterministic)."""
    turns = [_message(m) for m in request.conversation]
    return dict(_fields(request, merge_same_role(turns)))


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, each message's blocks taken from
    ``fragments`` when it was rendered before (``request`` may still hold approval parts:
    they are dropped one message at a time)."""

    def turn(m: ModelMessage) -> WireTurn:
        rendered = _message(without_approval_parts(m))
        blocks = ",".join(dumps(b) for b in rendered["content"])
        return WireTurn(rendered["role"], encode(blocks))

    conversation = request.conversation
    if fragments is None:
        turns = [turn(m) for m in conversation]
    else:
        turns = fragments.turns(conversation, "anthropic", turn)
    return body_json(_fields(request, turns_json(turns)))


def _fields(request: ModelRequest, messages: Any) -> list[tuple[str, Any]]:
    """The body's fields in order, ``messages`` as given."""
    body: list[tuple[str, Any]] = [("model", request.model), ("max_tokens", _max_tokens(request))]
    system = _system(request.system)
    if system:
        body.append(("system", system))
    if request.tools:
        body.append(("tools", [_tool(t) for t in request.tools]))
    body.append(("messages", messages))
    automatic = request.options.get("automatic_cache")
    if automatic:
        mark = cache_control(CacheMark(ttl="1h" if automatic == "1h" else None))
        body.append(("cache_control", mark))
    edits = [context_edit(e) for e in request.options.get("server_edits") or ()]
    if edits:
        body.append(("context_management", {"edits": edits}))
    return body


#: The beta each context edit needs (sent as the ``anthropic-beta`` header).
EDIT_BETAS = {
    "clear_thinking": "context-management-2025-06-27",
    "clear_tool_uses": "context-management-2025-06-27",
    "compaction": "compact-2026-01-12",
}


def headers(request: ModelRequest) -> dict[str, str]:
    """The ``anthropic-beta`` header the context edits the request asks for need (the
    betas sorted, comma-separated); none without edits."""
    betas = {EDIT_BETAS[e["edit"]] for e in request.options.get("server_edits") or ()}
    return {"anthropic-beta": ",".join(sorted(betas))} if betas else {}


def context_edit(edit: dict[str, Any]) -> dict[str, Any]:
    """One provider-neutral edit (:mod:`kilo_rules.engine.runtime.server`) in the Messages API's
    ``context_management.edits`` shape."""
    name = edit["edit"]
    if name == "clear_thinking":
        keep = edit["keep"]
        return {
            "type": "clear_thinking_20251015",
            "keep": "all" if keep == "all" else {"type": "thinking_turns", "value": keep},
        }
    if name == "clear_tool_uses":
        out: dict[str, Any] = {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": edit["trigger"]},
            "keep": {"type": "tool_uses", "value": edit["keep"]},
        }
        if edit.get("clear_at_least"):
            out["clear_at_least"] = {"type": "input_tokens", "value": edit["clear_at_least"]}
        if edit.get("exclude_tools"):
            out["exclude_tools"] = list(edit["exclude_tools"])
        if edit.get("clear_tool_inputs"):
            out["clear_tool_inputs"] = True
        return out
    out = {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": edit["trigger"]},
    }
    if edit.get("instructions"):
        out["instructions"] = edit["instructions"]
    return out


def cache_control(mark: CacheMark) -> dict[str, Any]:
    """The wire form of a mark; the 5-minute bucket is the default, so it is not spelled."""
    out: dict[str, Any] = {"type": "ephemeral"}
    if mark.ttl == "1h":
        out["ttl"] = "1h"
    return out


def _max_tokens(request: ModelRequest) -> int:
    if request.max_tokens is not None:
        return request.max_tokens
    limit = request.options.get("output_limit")
    return int(limit) if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_TOKENS


def _with_mark(block: dict[str, Any], mark: CacheMark | None) -> dict[str, Any]:
    return {**block, "cache_control": cache_control(mark)} if mark is not None else block


def _system(messages: tuple[ModelMessage, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        entries: list[Entry] = []
        for part in msg.parts:
            if isinstance(part, Text) and not is_blank(part.text):
                entries.append(({"type": "text", "text": part.text}, part.cache, True))
            else:
                entries.append((None, part.cache, True))
        kept, _ = settle_marks(entries, msg.cache)
        out.extend(_with_mark(block, mark) for block, mark in kept)
    return out


def _tool(tool: ToolSpec) -> dict[str, Any]:
    block = {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
    return _with_mark(block, tool.cache)


def _media(media: Media, *, assistant: bool) -> dict[str, Any]:
    if assistant:
        # Assistant turns take text, thinking and tool_use only.
        return {"type": "text", "text": placeholder(media, "not allowed in assistant turns")}
    kind = media_kind(media)
    if kind == "image":
        if media.url is not None:
            return {"type": "image", "source": {"type": "url", "url": media.url}}
        source = {"type": "base64", "media_type": media.mime.lower(), "data": media.data or ""}
        return {"type": "image", "source": source}
    doc: dict[str, Any] | None = None
    if kind == "pdf":
        if media.url is not None:
            doc = {"type": "document", "source": {"type": "url", "url": media.url}}
        else:
            pdf = {"type": "base64", "media_type": "application/pdf", "data": media.data or ""}
            doc = {"type": "document", "source": pdf}
    elif kind == "text":
        text = decode_text(media)
        if text is not None:
            source = {"type": "text", "media_type": "text/plain", "data": text}
            doc = {"type": "document", "source": source}
    if doc is None:
        return {"type": "text", "text": placeholder(media, "type not supported by this API")}
    if media.filename:
        doc["title"] = media.filename
    return doc


def _result(result: ToolResult) -> tuple[dict[str, Any], CacheMark | None]:
    """The ``tool_result`` block, and the mark of an inner part that had nowhere to go."""
    entries: list[Entry] = []
    for part in result.content:
        if isinstance(part, Text):
            text = None if is_blank(part.text) else {"type": "text", "text": part.text}
            entries.append((text, part.cache, True))
        else:
            entries.append((_media(part, assistant=False), part.cache, True))
    kept, leftover = settle_marks(entries, None)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": sanitize_call_id(result.call_id)}
    if kept:
        block["content"] = [_with_mark(b, m) for b, m in kept]
    block["is_error"] = result.is_error
    return block, leftover


def _message(msg: ModelMessage) -> dict[str, Any]:
    assistant = msg.role == "assistant"
    entries: list[Entry] = []
    for part in msg.parts:
        if isinstance(part, Text):
            text = None if is_blank_text(part) else {"type": "text", "text": part.text}
            entries.append((text, part.cache, True))
        elif isinstance(part, Media):
            entries.append((_media(part, assistant=assistant), part.cache, True))
        elif isinstance(part, Reasoning):
            entries.append((_reasoning(part) if assistant else None, part.cache, False))
        elif isinstance(part, ToolCall):
            call = {
                "type": "tool_use",
                "id": sanitize_call_id(part.call_id),
                "name": part.name,
                "input": part.input,
            }
            entries.append((call, part.cache, True))
        elif isinstance(part, ToolResult):
            block, leftover = _result(part)
            # An inner mark with no inner block to sit on is carried by the result block.
            entries.append((block, effective_mark(part.cache, leftover), True))
    kept, _ = settle_marks(entries, msg.cache)
    return {
        "role": "assistant" if assistant else "user",
        "content": [_with_mark(block, mark) for block, mark in kept],
    }


def _reasoning(part: Reasoning) -> dict[str, Any] | None:
    signature = readable(part.signature, part.origin, ISSUER)
    if signature is not None:
        return {"type": "thinking", "thinking": part.text, "signature": signature}
    encrypted = readable(part.encrypted, part.origin, ISSUER)
    if encrypted is not None:
        return {"type": "redacted_thinking", "data": encrypted}
    return None


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("anthropic"),
    render=render,
    render_json=render_json,
    endpoint=ENDPOINT,
    marker_key="cache_control",
    headers=headers,
    rules=ApiRules(
        shape="messages",
        roles=("user", "assistant"),
        first_role="user",
        results_first=True,
        unique_call_ids=True,
        non_blank_text=True,
        non_empty_content=True,
        # "all messages must have non-empty content except for the optional final
        # assistant message"
        empty_final_assistant=True,
        marker_not_on_thinking=True,
        ttl_order=True,
        signature_issuer="anthropic",
        call_id_pattern=CALL_ID,
        tool_name_pattern=TOOL_NAME,
        output_cap=("max_tokens",),
    ),
)
