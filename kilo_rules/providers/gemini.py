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
  text part with its ``thoughtSignature`` where present (encrypted reasoning from another
  provider cannot be read here and is not sent), tool calls →
  ``functionCall {id, name, args}``;
* a ``tool`` message → a ``user`` turn of ``functionResponse {id, name, response}``
  parts; ``response`` is ``{"content": text}``, or ``{"error": text}`` for a failed call,
  the keys Gemini's function-calling guide names. Media in a result follow the responses
  in the same turn as ``inlineData`` parts;
* cache marks are ignored: Gemini caches prompt prefixes implicitly, and explicit caching
  is a separate ``cachedContents`` resource, not a marker in the request;
* empty text is dropped (the API rejects it), and so is a turn left with no parts;
* ``max_tokens`` → ``generationConfig.maxOutputTokens``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..runtime.messages import (
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from ._shared import result_text


def endpoint(request: ModelRequest) -> str:
    """The URL path this body is posted to (the model id is a path parameter)."""
    model = request.model.removeprefix("models/")
    return f"/v1beta/models/{quote(model, safe='')}:generateContent"


def render(request: ModelRequest) -> dict[str, Any]:
    """The ``generateContent`` request body for ``request`` (JSON-serialisable, deterministic)."""
    body: dict[str, Any] = {}
    system = [
        {"text": p.text} for m in request.system for p in m.parts if isinstance(p, Text) and p.text
    ]
    if system:
        body["systemInstruction"] = {"parts": system}
    if request.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(t) for t in request.tools]}]
    contents = []
    for msg in request.conversation:
        parts = _parts(msg)
        if parts:
            role = "model" if msg.role == "assistant" else "user"
            contents.append({"role": role, "parts": parts})
    body["contents"] = contents
    if request.max_tokens is not None:
        body["generationConfig"] = {"maxOutputTokens": request.max_tokens}
    return body


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
            if part.text:
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
            if part.signature is not None:
                signed["thoughtSignature"] = part.signature
            parts.append(signed)
        else:
            parts.append({"functionResponse": _response(part)})
            # Media cannot sit inside a functionResponse on every Gemini model; they
            # follow the responses in the same turn, where every model reads them.
            trailing_media.extend(_media(p) for p in part.content if isinstance(p, Media))
    return parts + trailing_media


def _thought(part: Reasoning) -> dict[str, Any] | None:
    if not part.text and part.signature is None:
        return None
    thought: dict[str, Any] = {"text": part.text, "thought": True}
    if part.signature is not None:
        thought["thoughtSignature"] = part.signature
    return thought


def _response(result: ToolResult) -> dict[str, Any]:
    key = "error" if result.is_error else "content"
    return {"id": result.call_id, "name": result.name, "response": {key: result_text(result)}}
