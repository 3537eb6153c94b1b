"""OpenAI Responses API (``POST /v1/responses``): the request body.

Mapping from the provider-neutral request:

* system messages → ``instructions``, their text joined with ``"\\n"``, as Kilo sends the
  system prompt to Codex models. With ``options["system_as_instructions"]`` false they are
  sent as ``role: developer`` input messages instead (the role the Responses API documents
  for instructions in ``input``; it also takes ``system``, which reasoning models read as
  developer anyway). Only input messages can carry cache breakpoints, ``instructions``
  cannot;
* tools → ``tools[{type: function, name, description, parameters, strict: false}]``. The
  Responses API makes function tools strict by default, which refuses any schema that does
  not close every object with ``additionalProperties: false``, so ``strict`` is spelled out;
* user text and media → an input message whose content is a string when it is one unmarked
  text, else ``input_text``, ``input_image`` (a ``data:`` URL or the media's own URL) and
  ``input_file`` (PDF as a ``data:`` URL, or its ``file_url``) parts; ``text/*``
  attachments are inlined as text, other types become a placeholder. A message with
  nothing to send is left out;
* assistant text → an assistant input message with string content, one per text part.
  ``output_text`` parts belong to output-message items that carry the server's item id,
  which a session does not keep; the string form is the documented way to give earlier
  assistant turns;
* tool calls → ``function_call`` items (``call_id``, ``name``, ``arguments`` as a JSON
  string) in the order the assistant made them;
* a ``tool`` message → one ``function_call_output`` item per result. Its ``output`` is
  the result's text (parts joined with ``"\\n"``), or, when the result holds media or a
  breakpoint must land in it, a list of ``input_text`` / ``input_image`` / ``input_file``
  parts (the list form the SDK's ``ResponseFunctionCallOutputItemListParam`` takes).
  There is no error flag on this item; an error is told by its text;
* call ids longer than the API's 64 characters are shortened the same way for a call and
  its output (a prefix and a hash of the whole id, so distinct ids stay distinct);
* reasoning → a ``reasoning`` item with its ``encrypted_content`` and its text as the
  summary, sent only when an OpenAI model issued it (``Reasoning.origin == "openai"``):
  the API refuses the whole request when ``encrypted_content`` does not decrypt, while
  leaving an item out only costs the model its earlier reasoning, so an unknown origin is
  not trusted here. Reasoning without encrypted state cannot be sent back with
  ``store: false``, and reasoning with nothing after it in its turn is left out (a
  reasoning item comes before the output it led to). The item has no ``id``: the session
  does not keep the server's item ids, and with ``store: false`` the encrypted state is the
  whole item, as OpenAI's Codex CLI sends it;
* cache marks are ignored by default: OpenAI caches prompt prefixes automatically. Models
  that take explicit breakpoints (GPT-5.6 and later) get ``prompt_cache_breakpoint:
  {"mode": "explicit"}`` on the marked input part when the caller sets
  ``options["prompt_cache_breakpoints"]``; a mark that cannot land on an input part of its
  own message (instructions, assistant turns, calls) is dropped;
* blank (whitespace-only) text is not sent;
* ``max_tokens`` → ``max_output_tokens``, and ``store: false`` always: the conversation is
  sent whole each time, so nothing has to be kept on OpenAI's side.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
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
    settle_marks,
    without_approval_parts,
)
from kilo_rules.engine.providers.registry import WireApiSpec

ENDPOINT = "/v1/responses"

#: Whose encrypted reasoning this API reads (see
#: :func:`~kilo_rules.engine.formats.catalog.signature_issuer`).
ISSUER = "openai"

#: The longest ``call_id`` the API takes ("Invalid 'input[5].call_id': string too long.
#: Expected a string with maximum length 64").
MAX_CALL_ID = 64

#: The key an explicit cache breakpoint is written under.
MARK_KEY = "prompt_cache_breakpoint"

_BREAKPOINT = {"mode": "explicit"}


def render(request: ModelRequest) -> dict[str, Any]:
    """The Responses API request body for ``request`` (JSON-serialisable, deterministic)."""
    explicit = bool(request.options.get("prompt_cache_breakpoints"))
    items: list[dict[str, Any]] = []
    for msg in request.conversation:
        items.extend(_items(msg, explicit))
    return dict(_fields(request, items))


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, each conversation message's input
    items taken from ``fragments`` when it was rendered before (``request`` may still hold
    approval parts: they are dropped one message at a time). An item depends on its own
    message and on the breakpoint option only: calls and their outputs are paired by
    ``call_id``, which each renders from its own id, and nothing merges across messages."""
    explicit = bool(request.options.get("prompt_cache_breakpoints"))

    def make(msg: ModelMessage) -> bytes:
        return joined(_items(without_approval_parts(msg), explicit))

    conversation = request.conversation
    if fragments is None:
        items = [make(m) for m in conversation]
    else:
        key = "openai-responses+breakpoints" if explicit else "openai-responses"
        items = fragments.turns(conversation, key, make)
    return body_json(_fields(request, items, wire=True))


def _fields(
    request: ModelRequest, items: Sequence[Any], wire: bool = False
) -> list[tuple[str, Any]]:
    """The body's fields in order, the conversation's input items as given: dicts, or with
    ``wire`` their JSON fragments (and the system messages' approval parts dropped). The
    system's developer messages, when it is sent so, go before them."""
    explicit = bool(request.options.get("prompt_cache_breakpoints"))
    body: list[tuple[str, Any]] = [("model", request.model)]
    developer: list[dict[str, Any]] = []
    if request.options.get("system_as_instructions", True):
        text = "\n".join(
            p.text
            for m in request.system
            for p in m.parts
            if isinstance(p, Text) and not is_blank(p.text)
        )
        if text:
            body.append(("instructions", text))
    else:
        for msg in request.system:
            msg = without_approval_parts(msg) if wire else msg
            developer.extend(_input_message(msg, "developer", explicit))
    if wire:
        body.append(("input", items_json([joined(developer), *items])))
    else:
        body.append(("input", [*developer, *items]))
    if request.tools:
        body.append(("tools", [_tool(t) for t in request.tools]))
    if request.max_tokens is not None:
        body.append(("max_output_tokens", request.max_tokens))
    body.append(("store", False))
    if request.options.get("reasoning"):  # non-reasoning models refuse the include
        body.append(("include", ["reasoning.encrypted_content"]))
    compaction = [
        {"type": "compaction", "compact_threshold": e["trigger"]}
        for e in request.options.get("server_edits") or ()
        if e["edit"] == "compaction"
    ]
    if compaction:
        body.append(("context_management", compaction))
    return body


def call_id(value: str) -> str:
    """``value`` if the API takes it, else a 64-character id made from it.

    The prefix keeps the id readable; the hash of the whole id keeps two long ids that
    share a prefix apart. Calls and outputs go through this same function, so they match.
    """
    if len(value) <= MAX_CALL_ID:
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:8]
    return f"{value[: MAX_CALL_ID - len(digest) - 1]}_{digest}"


def _tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.input_schema,
        "strict": False,
    }


def _text(text: str) -> dict[str, Any] | None:
    return None if is_blank(text) else {"type": "input_text", "text": text}


def _media(media: Media, where: str | None) -> dict[str, Any]:
    """An input part for ``media``; ``where`` names a place media cannot go."""
    if where is not None:
        return {"type": "input_text", "text": placeholder(media, where)}
    kind = media_kind(media)
    if kind == "image":
        return {"type": "input_image", "image_url": data_url(media), "detail": "auto"}
    if kind == "pdf":
        if media.url is not None:
            return {"type": "input_file", "file_url": media.url}
        name = media.filename or "document.pdf"
        return {"type": "input_file", "filename": name, "file_data": data_url(media)}
    if kind == "text":
        text = decode_text(media)
        if text is not None:
            return {"type": "input_text", "text": text}
    return {"type": "input_text", "text": placeholder(media, "type not supported by this API")}


def _parts(
    entries: list[Entry], message_level: CacheMark | None, explicit: bool
) -> list[dict[str, Any]]:
    """The input parts with their breakpoints; a mark no part can carry is dropped."""
    if not explicit:
        return [block for block, _, _ in entries if block is not None]
    kept, _ = settle_marks(entries, message_level)
    return [
        {**block, MARK_KEY: dict(_BREAKPOINT)} if mark is not None else block
        for block, mark in kept
    ]


def _input_message(msg: ModelMessage, role: str, explicit: bool) -> list[dict[str, Any]]:
    where = "not allowed in system messages" if role == "developer" else None
    entries: list[Entry] = []
    for part in msg.parts:
        if isinstance(part, Text):
            entries.append((_text(part.text), part.cache, True))
        elif isinstance(part, Media):
            entries.append((_media(part, where), part.cache, True))
        elif isinstance(part, ToolResult):
            # Results belong in function_call_output items; one elsewhere is shown as text.
            note = _text(f"[tool result {part.call_id}] {part.name}")
            entries.append((note, part.cache, True))
        else:
            entries.append((None, part.cache, True))
    parts = _parts(entries, msg.cache, explicit)
    if not parts:
        return []
    if len(parts) == 1 and parts[0]["type"] == "input_text" and MARK_KEY not in parts[0]:
        return [{"role": role, "content": parts[0]["text"]}]
    return [{"role": role, "content": parts}]


def _items(msg: ModelMessage, explicit: bool) -> list[dict[str, Any]]:
    if msg.role == "tool":
        return _outputs(msg, explicit)
    if msg.role == "assistant":
        return _assistant(msg)
    return _input_message(msg, "developer" if msg.role == "system" else "user", explicit)


def _assistant(msg: ModelMessage) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # reasoning waits for the output it led to
    for part in msg.parts:
        if isinstance(part, Reasoning):
            reasoning = _reasoning(part)
            if reasoning is not None:
                pending.append(reasoning)
            continue
        item: dict[str, Any] | None = None
        if isinstance(part, Text):
            if not is_blank(part.text):
                item = {"role": "assistant", "content": part.text}
        elif isinstance(part, Media):
            note = placeholder(part, "not allowed in assistant turns")
            item = {"role": "assistant", "content": note}
        elif isinstance(part, ToolCall):
            item = {
                "type": "function_call",
                "call_id": call_id(part.call_id),
                "name": part.name,
                "arguments": json.dumps(part.input, ensure_ascii=False),
            }
        elif isinstance(part, ToolResult):
            note = f"[tool result {part.call_id}] {part.name}"
            item = {"role": "assistant", "content": note}
        if item is not None:
            items.extend(pending)
            pending.clear()
            items.append(item)
    return items


def _reasoning(part: Reasoning) -> dict[str, Any] | None:
    if part.origin != ISSUER or not part.encrypted:
        return None
    summary = [] if is_blank(part.text) else [{"type": "summary_text", "text": part.text}]
    return {"type": "reasoning", "summary": summary, "encrypted_content": part.encrypted}


def _outputs(msg: ModelMessage, explicit: bool) -> list[dict[str, Any]]:
    out = []
    results = [p for p in msg.parts if isinstance(p, ToolResult)]
    for i, result in enumerate(results):
        entries: list[Entry] = []
        for part in result.content:
            if isinstance(part, Text):
                entries.append((_text(part.text), part.cache, True))
            else:
                entries.append((_media(part, None), part.cache, True))
        last = i == len(results) - 1
        level = effective_mark(result.cache, msg.cache) if last else result.cache
        parts = _parts(entries, level, explicit)
        output: str | list[dict[str, Any]]
        if all(p["type"] == "input_text" and MARK_KEY not in p for p in parts):
            output = "\n".join(p["text"] for p in parts)
        else:
            output = parts
        out.append(
            {"type": "function_call_output", "call_id": call_id(result.call_id), "output": output}
        )
    return out


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("openai-responses"),
    render=render,
    render_json=render_json,
    endpoint=ENDPOINT,
    marker_key=MARK_KEY,
    rules=ApiRules(
        shape="responses",
        # "No tool output found for function call call_…" and "No tool call found for
        # function call output with call_id call_…": pairs are matched by call_id over
        # the whole input, not by position.
        pairing="by-id",
        unique_call_ids=True,
        # A reasoning item's encrypted_content is decrypted by OpenAI only ("The
        # encrypted content for item … could not be verified").
        signature_issuer="openai",
        # "Invalid 'input[5].call_id': string too long. Expected a string with maximum
        # length 64"
        call_id_max=64,
        # "The Responses API requires that all tool names conform to
        # '^[a-zA-Z0-9_-]+$'" (openai/codex#8694), at most 64 characters.
        tool_name_pattern=TOOL_NAME,
        output_cap=("max_output_tokens",),
    ),
)
