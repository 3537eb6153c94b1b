"""Amazon Bedrock Converse (``POST /model/{modelId}/converse``): the request body.

The model id travels in the URL path (see :func:`endpoint`), not in the body. Mapping
from the provider-neutral request:

* system messages → ``system: [{text}, …]``;
* tools → ``toolConfig.tools[{toolSpec: {name, description, inputSchema: {json}}}]``;
* user text and media → ``text``, ``image {format, source: {bytes}}`` and
  ``document {format, name, source: {bytes}}`` blocks. In the JSON body ``bytes`` is the
  base64 string. Bedrock reads media only from bytes or S3, so an ``s3://`` URL becomes
  an ``s3Location`` source and any other URL (or an unsupported type) a text placeholder;
* assistant reasoning → ``reasoningContent.reasoningText {text, signature}`` or
  ``reasoningContent.redactedContent``; unsigned reasoning, and reasoning signed by a
  vendor other than the model's own (Claude signatures go to Claude models only), is not
  sent (Claude on Bedrock rejects it, other models ignore it);
* tool calls → ``toolUse``; a ``tool`` message becomes a ``user`` turn of ``toolResult``
  blocks (``status: error`` for errors); consecutive turns of one role are merged, since
  Converse requires user and assistant to alternate. A result with no content gets the
  text ``(no output)``: Converse rejects both an empty list and blank text;
* cache marks → a separate ``{"cachePoint": {"type": "default"}}`` element (plus
  ``"ttl": "1h"`` for the hour bucket) appended after the marked content block, system
  block or tool; a message-level mark goes after the message's last block. A mark inside
  a tool result is hoisted to after the result, since result content takes no cache point;
* blank (whitespace-only) text is dropped, system and results included; tool-call ids
  are cleaned to ``^[a-zA-Z0-9_-]+$``;
* ``max_tokens`` → ``inferenceConfig.maxTokens``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import signature_issuer
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
    WireTurn,
    body_json,
    effective_mark,
    is_blank,
    is_blank_text,
    joined,
    merge_same_role,
    placeholder,
    readable,
    sanitize_call_id,
    settle_marks,
    turns_json,
    without_approval_parts,
)
from kilo_rules.engine.providers.registry import WireApiSpec

#: Document formats Converse reads, by MIME type.
DOCUMENT_FORMATS = {
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "text/plain": "txt",
    "text/markdown": "md",
}

#: Image formats Converse reads, by MIME type.
IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}

_NAME_BAD = re.compile(r"[^A-Za-z0-9\-()\[\] ]+")


def endpoint(request: ModelRequest) -> str:
    """The URL path this body is posted to (the model id is a path parameter)."""
    return f"/model/{quote(request.model, safe='')}/converse"


def render(request: ModelRequest) -> dict[str, Any]:
    """The Converse request body for ``request`` (JSON-serialisable, deterministic)."""
    names: dict[str, int] = {}
    # Bedrock serves several vendors; only Claude models read Claude's signatures.
    reader = signature_issuer(request.model)
    turns = [_message(m, names, reader) for m in request.conversation]
    return dict(_fields(request, merge_same_role(turns)))


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, each conversation message's blocks
    taken from ``fragments`` when it was rendered before (``request`` may still hold
    approval parts: they are dropped one message at a time).

    A message's blocks depend on the model (whose signatures it reads: part of the
    fragments' key) and, for one that holds a document, on the document names taken
    before it (names are unique within a request). Those few messages are not kept: they
    are rendered every time, in order, with the names carried from one to the next, and
    the others, which neither read nor add a name, are taken from the fragments."""
    reader = signature_issuer(request.model)

    def make(msg: ModelMessage) -> WireTurn | None:
        if _names_documents(msg):
            return None
        return _turn(without_approval_parts(msg), {}, reader)

    conversation = request.conversation
    turns: list[WireTurn | None]
    if fragments is None:
        turns = [make(m) for m in conversation]
    else:
        turns = fragments.turns(conversation, f"bedrock+{reader}", make)
    if None in turns:
        names: dict[str, int] = {}
        turns = [
            t if t is not None else _turn(without_approval_parts(m), names, reader)
            for m, t in zip(conversation, turns, strict=True)
        ]
    return body_json(_fields(request, turns_json(t for t in turns if t is not None)))


def _turn(msg: ModelMessage, names: dict[str, int], reader: str | None) -> WireTurn:
    rendered = _message(msg, names, reader)
    return WireTurn(rendered["role"], joined(rendered["content"]))


def _names_documents(msg: ModelMessage) -> bool:
    """Whether ``msg`` may hold a document (which takes a name unique in the request)."""
    for part in msg.parts:
        if isinstance(part, Media) and part.mime.lower() in DOCUMENT_FORMATS:
            return True
        if isinstance(part, ToolResult) and any(
            isinstance(p, Media) and p.mime.lower() in DOCUMENT_FORMATS for p in part.content
        ):
            return True
    return False


def _fields(request: ModelRequest, messages: Any) -> list[tuple[str, Any]]:
    """The body's fields in order, ``messages`` as given."""
    body: list[tuple[str, Any]] = []
    if request.tools:
        tools = _with_points([(_tool(t), t.cache) for t in request.tools])
        body.append(("toolConfig", {"tools": tools}))
    system: list[tuple[dict[str, Any], CacheMark | None]] = []
    for msg in map(without_approval_parts, request.system):
        entries: list[Entry] = [
            (
                {"text": p.text} if isinstance(p, Text) and not is_blank(p.text) else None,
                p.cache,
                True,
            )
            for p in msg.parts
        ]
        system.extend(settle_marks(entries, msg.cache)[0])
    if system:
        body.append(("system", _with_points(system)))
    body.append(("messages", messages))
    if request.max_tokens is not None:
        body.append(("inferenceConfig", {"maxTokens": request.max_tokens}))
    return body


def cache_point(mark: CacheMark) -> dict[str, Any]:
    """The wire form of a mark: its own element, placed after the block it closes."""
    point: dict[str, Any] = {"type": "default"}
    if mark.ttl == "1h":
        point["ttl"] = "1h"
    return {"cachePoint": point}


def _with_points(blocks: list[tuple[dict[str, Any], CacheMark | None]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block, mark in blocks:
        out.append(block)
        if mark is not None:
            out.append(cache_point(mark))
    return out


def _tool(tool: ToolSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name}
    # Converse rejects an empty description (minimum length 1); it is optional.
    if tool.description:
        spec["description"] = tool.description
    spec["inputSchema"] = {"json": tool.input_schema}
    return {"toolSpec": spec}


def _source(media: Media) -> dict[str, Any] | None:
    if media.url is None:
        return {"bytes": media.data or ""}
    if media.url.startswith("s3://"):
        return {"s3Location": {"uri": media.url}}
    return None


def _document_name(media: Media, names: dict[str, int]) -> str:
    # Names may hold letters, digits, spaces, hyphens, parentheses and square brackets,
    # no two spaces in a row, and must be unique within the request.
    raw = media.filename or "document"
    base = " ".join(_NAME_BAD.sub("-", raw).split()) or "document"
    count = names.get(base, 0)
    names[base] = count + 1
    return base if count == 0 else f"{base} ({count + 1})"


def _media(media: Media, names: dict[str, int]) -> dict[str, Any]:
    mime = media.mime.lower()
    source = _source(media)
    if source is None:
        return {"text": placeholder(media, "Bedrock reads media from bytes or S3 only")}
    if mime in IMAGE_FORMATS:
        return {"image": {"format": IMAGE_FORMATS[mime], "source": source}}
    if mime in DOCUMENT_FORMATS:
        document = {
            "format": DOCUMENT_FORMATS[mime],
            "name": _document_name(media, names),
            "source": source,
        }
        return {"document": document}
    return {"text": placeholder(media, "type not supported by this API")}


def _result(result: ToolResult, names: dict[str, int]) -> tuple[dict[str, Any], CacheMark | None]:
    content: list[dict[str, Any]] = []
    inner: CacheMark | None = None
    for part in result.content:
        inner = effective_mark(inner, part.cache)
        if isinstance(part, Text):
            if not is_blank(part.text):
                content.append({"text": part.text})
        else:
            content.append(_media(part, names))
    block: dict[str, Any] = {
        "toolUseId": sanitize_call_id(result.call_id),
        "content": content or [{"text": "(no output)"}],
    }
    if result.is_error:
        block["status"] = "error"
    return {"toolResult": block}, inner


def _message(msg: ModelMessage, names: dict[str, int], reader: str | None) -> dict[str, Any]:
    assistant = msg.role == "assistant"
    entries: list[Entry] = []
    for part in msg.parts:
        if isinstance(part, Text):
            text = None if is_blank_text(part) else {"text": part.text}
            entries.append((text, part.cache, True))
        elif isinstance(part, Media):
            if assistant:  # assistant turns carry no media
                note = {"text": placeholder(part, "not allowed in assistant turns")}
                entries.append((note, part.cache, True))
            else:
                entries.append((_media(part, names), part.cache, True))
        elif isinstance(part, Reasoning):
            reasoning = _reasoning(part, reader) if assistant else None
            entries.append((reasoning, part.cache, False))
        elif isinstance(part, ToolCall):
            use = {
                "toolUseId": sanitize_call_id(part.call_id),
                "name": part.name,
                "input": part.input,
            }
            entries.append(({"toolUse": use}, part.cache, True))
        elif isinstance(part, ToolResult):
            block, inner = _result(part, names)
            entries.append((block, effective_mark(part.cache, inner), True))
    kept, _ = settle_marks(entries, msg.cache)
    return {"role": "assistant" if assistant else "user", "content": _with_points(kept)}


def _reasoning(part: Reasoning, reader: str | None) -> dict[str, Any] | None:
    signature = readable(part.signature, part.origin, reader)
    if signature is not None:
        text = {"text": part.text, "signature": signature}
        return {"reasoningContent": {"reasoningText": text}}
    encrypted = readable(part.encrypted, part.origin, reader)
    if encrypted is not None:
        return {"reasoningContent": {"redactedContent": encrypted}}
    return None


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("bedrock"),
    render=render,
    render_json=render_json,
    endpoint=endpoint,
    marker_key="cachePoint",
    rules=ApiRules(
        shape="converse",
        roles=("user", "assistant"),
        first_role="user",
        results_first=True,
        unique_call_ids=True,
        non_blank_text=True,
        non_empty_content=True,
        result_content_required=True,
        marker_not_on_thinking=True,
        marker_not_first=True,
        ttl_order=True,
        signature_issuer="anthropic",
        # ToolUseBlock / ToolResultBlock.toolUseId: length 1..64, [a-zA-Z0-9_-]+ (newer
        # references also allow ".:" in toolUse ids; Claude behind Bedrock does not).
        call_id_pattern=r"[a-zA-Z0-9_-]{1,64}",
        tool_name_pattern=TOOL_NAME,
        call_names=True,  # ToolUseBlock.name has the same constraint as the spec's
        output_cap=("inferenceConfig", "maxTokens"),
    ),
)
