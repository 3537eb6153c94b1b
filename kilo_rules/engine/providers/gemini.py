"""Gemini API ``generateContent`` (``POST /v1beta/models/{model}:generateContent``): the body.

The model id travels in the URL path (see :func:`endpoint`), not in the body. Mapping
from the provider-neutral request:

* system messages → ``systemInstruction.parts[{text}]``;
* tools → ``tools[{functionDeclarations[{name, description, parametersJsonSchema}]}]``.
  ``parametersJsonSchema`` takes the tool's JSON Schema as it is; the older
  ``parameters`` field takes only an OpenAPI subset and would reject common keywords
  such as ``additionalProperties``;
* user text and media → ``text``, ``inlineData {mimeType, data}`` for base64 media and
  ``fileData {mimeType, fileUri}`` for media given by URL;
* the assistant role is ``model``; its text → ``text``, reasoning → a ``thought: true``
  text part with its ``thoughtSignature`` where present, tool calls →
  ``functionCall {id, name, args}`` with the ``thoughtSignature`` Gemini gave them.
  Signatures and encrypted reasoning issued by another vendor (``origin``) cannot be read
  here and are not sent; foreign reasoning text goes as an unsigned thought;
* Gemini 3 models refuse a function call turn whose first call has no signature
  ("Function call is missing a thought_signature"); calls recorded on another model have
  none, so the first call of such a turn carries the documented
  ``skip_thought_signature_validator`` value instead;
* a ``tool`` message → a ``user`` turn of ``functionResponse {id, name, response}``
  parts; ``response`` is ``{"content": text}``, or ``{"error": text}`` for a failed call,
  the keys Gemini's function-calling guide names. Media in a result follow the responses
  in the same turn as ``inlineData`` parts;
* cache marks are ignored: Gemini caches prompt prefixes implicitly, and explicit caching
  is a separate ``cachedContents`` resource, not a marker in the request;
* blank (whitespace-only) text is dropped (the API rejects it), and so is a turn left with
  no parts;
* consecutive turns of one role are merged: Gemini requires user and model turns to
  alternate, and a function call turn must come right after a user turn or a function
  response turn (a summary followed by the first kept step, a function response followed
  by the user's next words, two leading user messages);
* ``max_tokens`` → ``generationConfig.maxOutputTokens``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from kilo_rules.engine.providers._api_rules import ApiRules
from kilo_rules.engine.providers._shared import (
    FragmentStore,
    WireTurn,
    body_json,
    is_blank,
    joined,
    merge_same_role,
    readable,
    result_text,
    turns_json,
    without_approval_parts,
)
from kilo_rules.engine.providers.registry import WireApiSpec

#: Whose signatures this API reads (see
#: :func:`~kilo_rules.engine.formats.catalog.signature_issuer`).
ISSUER = "google"

#: The ``thoughtSignature`` Gemini documents for function calls it did not produce
#: (history from another model, or calls injected by the client).
FOREIGN_CALL_SIGNATURE = "skip_thought_signature_validator"

_GEMINI_VERSION = re.compile(r"gemini-(\d+)", re.IGNORECASE)


def endpoint(request: ModelRequest) -> str:
    """The URL path this body is posted to (the model id is a path parameter)."""
    model = request.model.removeprefix("models/")
    return f"/v1beta/models/{quote(model, safe='')}:generateContent"


def render(request: ModelRequest) -> dict[str, Any]:
    """The ``generateContent`` request body for ``request`` (JSON-serialisable, deterministic)."""
    contents = []
    for msg in request.conversation:
        parts = _parts(msg)
        if parts:
            contents.append({"role": _role(msg), "parts": parts})
    contents = merge_same_role(contents, key="parts")
    if requires_call_signatures(request.model):
        contents = [_signed_first_call(c) for c in contents]
    return dict(_fields(request, contents))


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, each conversation message's parts
    taken from ``fragments`` when it was rendered before (``request`` may still hold
    approval parts: they are dropped one message at a time).

    Messages depend on their neighbours in two ways, both settled when the fragments are
    joined: consecutive turns of one role merge, and on Gemini 3 the first call of each
    merged model turn is signed. A fragment keeps its parts both as they are and with its
    own first call signed, and the join picks one by where the message falls."""

    def make(msg: ModelMessage) -> WireTurn:
        parts = _parts(without_approval_parts(msg))
        role, blocks = _role(msg), joined(parts)
        for i, part in enumerate(parts):
            if "functionCall" in part:
                if "thoughtSignature" in part:
                    return WireTurn(role, blocks, blocks)
                signed = {**part, "thoughtSignature": FOREIGN_CALL_SIGNATURE}
                return WireTurn(role, blocks, joined([*parts[:i], signed, *parts[i + 1 :]]))
        return WireTurn(role, blocks)

    conversation = request.conversation
    if fragments is None:
        turns = [make(m) for m in conversation]
    else:
        turns = fragments.turns(conversation, "gemini", make)
    sign = "model" if requires_call_signatures(request.model) else None
    return body_json(_fields(request, turns_json(turns, key="parts", sign_role=sign)))


def _role(msg: ModelMessage) -> str:
    return "model" if msg.role == "assistant" else "user"


def _fields(request: ModelRequest, contents: Any) -> list[tuple[str, Any]]:
    """The body's fields in order, ``contents`` as given."""
    body: list[tuple[str, Any]] = []
    system = [
        {"text": p.text}
        for m in request.system
        for p in m.parts
        if isinstance(p, Text) and not is_blank(p.text)
    ]
    if system:
        body.append(("systemInstruction", {"parts": system}))
    if request.tools:
        body.append(("tools", [{"functionDeclarations": [_declaration(t) for t in request.tools]}]))
    body.append(("contents", contents))
    if request.max_tokens is not None:
        body.append(("generationConfig", {"maxOutputTokens": request.max_tokens}))
    return body


def requires_call_signatures(model: str) -> bool:
    """True for Gemini 3 and later, which validate the thought signature of function calls."""
    found = _GEMINI_VERSION.search(model)
    return found is not None and int(found.group(1)) >= 3


def _signed_first_call(content: dict[str, Any]) -> dict[str, Any]:
    """The content with a signature on its first function call, if that call has none.

    Gemini validates the first call of each model turn; a call recorded without a Gemini
    signature (another model made it, or it was signed by another vendor) gets the value
    Gemini documents for history it did not produce."""
    if content["role"] != "model":
        return content
    for i, part in enumerate(content["parts"]):
        if "functionCall" in part:
            if "thoughtSignature" in part:
                return content
            parts = list(content["parts"])
            parts[i] = {**part, "thoughtSignature": FOREIGN_CALL_SIGNATURE}
            return {**content, "parts": parts}
    return content


def _declaration(tool: ToolSpec) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parametersJsonSchema": tool.input_schema,
    }


def _media(media: Media) -> dict[str, Any]:
    if media.url is not None:
        return {"fileData": {"mimeType": media.mime, "fileUri": media.url}}
    return {"inlineData": {"mimeType": media.mime, "data": media.data or ""}}


def _parts(msg: ModelMessage) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    trailing_media: list[dict[str, Any]] = []
    for part in msg.parts:
        if isinstance(part, Text):
            if not is_blank(part.text):
                parts.append({"text": part.text})
        elif isinstance(part, Media):
            parts.append(_media(part))
        elif isinstance(part, Reasoning):
            thought = _thought(part) if msg.role == "assistant" else None
            if thought is not None:
                parts.append(thought)
        elif isinstance(part, ToolCall):
            call = {"id": part.call_id, "name": part.name, "args": part.input}
            signed: dict[str, Any] = {"functionCall": call}
            signature = readable(part.signature, part.origin, ISSUER)
            if signature is not None:
                signed["thoughtSignature"] = signature
            parts.append(signed)
        elif isinstance(part, ToolResult):
            parts.append({"functionResponse": _response(part)})
            # Media cannot sit inside a functionResponse on every Gemini model; they
            # follow the responses in the same turn, where every model reads them.
            trailing_media.extend(_media(p) for p in part.content if isinstance(p, Media))
    return parts + trailing_media


def _thought(part: Reasoning) -> dict[str, Any] | None:
    signature = readable(part.signature, part.origin, ISSUER)
    if signature is None and is_blank(part.text):
        return None
    thought: dict[str, Any] = {"text": part.text, "thought": True}
    if signature is not None:
        thought["thoughtSignature"] = signature
    return thought


def _response(result: ToolResult) -> dict[str, Any]:
    key = "error" if result.is_error else "content"
    return {"id": result.call_id, "name": result.name, "response": {key: result_text(result)}}


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("gemini"),
    render=render,
    render_json=render_json,
    endpoint=endpoint,
    rules=ApiRules(
        shape="contents",
        roles=("user", "model"),
        first_role="user",
        assistant_role="model",
        pairing="function-turns",
        call_after_user=True,
        # A trailing call with no response is not a documented refusal.
        calls_answered_at_end=False,
        non_blank_text=True,
        # The API returns signatures on empty text parts and takes them back verbatim.
        blank_signed_text=True,
        non_empty_content=True,
        signature_issuer="google",
        # "skip_thought_signature_validator": the documented stand-in for a call whose
        # signature was lost (history from another model, compacted history).
        signature_sentinels=frozenset({"skip_thought_signature_validator"}),
        signature_required=r"gemini-3",
        # "Invalid function name. Must start with a letter or an underscore. Must be
        # a-z, A-Z, 0-9, or contain underscores (_), dots (.), colons (:), or dashes
        # (-), with a maximum length of 64."
        tool_name_pattern=r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}",
        call_names=True,
        output_cap=("generationConfig", "maxOutputTokens"),
    ),
)
