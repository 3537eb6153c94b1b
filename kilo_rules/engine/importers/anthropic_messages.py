"""Anthropic Messages API conversations → Session v1.

Accepts a JSON array of messages, or an object with ``messages`` and optionally ``system``,
``tools``, ``model`` and ``id`` (a request body, or an export of one). The content-block
conversion here is shared with the Claude Code importer, whose log lines carry the same
blocks.

Mapping: ``text`` → text part, ``thinking`` → reasoning part with its signature,
``redacted_thinking`` → reasoning part with ``encrypted`` data, ``tool_use`` → tool part;
in user messages ``tool_result`` completes the tool part of the call it answers (status
``error`` when ``is_error``), ``image``/``document`` → file parts. A user message that holds
only tool results produces no message of its own: Session v1 keeps call and result in one
tool part. The ``system`` prompt goes to ``Session.metadata["system_prompt"]`` since Session v1
has no system role. Blocks of other types are kept in ``message.metadata["blocks"]``.
"""

from __future__ import annotations

import base64
import mimetypes
from typing import Any

from kilo_rules.engine.base.source import JsonPath
from kilo_rules.engine.importers._build import SessionBuilder, anthropic_tokens, key
from kilo_rules.engine.importers._source import (
    Record,
    Source,
    need_dict,
    need_list,
    need_str,
    obj,
    opt_dict_at,
    opt_str,
    opt_str_at,
)

NAME = "anthropic_messages"
DESCRIPTION = "Anthropic Messages content blocks (array of messages, or {messages, system})"


def sniff(src: Source) -> bool:
    """A messages array whose content uses Anthropic block types, or a ``system`` beside it."""
    messages = _messages_of(src.records[0].value) if len(src.records) == 1 else None
    if messages is None:
        return False
    doc = src.records[0].value
    if isinstance(doc, dict) and "system" in doc and "model" in doc:
        return True
    anthropic = {"tool_use", "tool_result", "thinking", "redacted_thinking", "document"}
    for m in messages[:200]:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if isinstance(kind, str) and (
                    kind in anthropic or (block.get("type") == "image" and "source" in block)
                ):
                    return True
    return False


def _messages_of(doc: Any) -> list[Any] | None:
    if isinstance(doc, dict):
        doc = doc.get("messages")
    if isinstance(doc, list) and doc and all(isinstance(m, dict) and "role" in m for m in doc):
        return doc
    return None


def convert(src: Source, run: int) -> Any:
    """Import one Anthropic Messages conversation."""
    rec = src.records[0]
    doc = rec.value
    base: JsonPath = ()
    meta: dict[str, Any] = {}
    b = SessionBuilder(NAME, src.file)
    if isinstance(doc, dict):
        base = ("messages",)
        system = doc.get("system")
        if isinstance(system, str):
            meta["system_prompt"] = system
        elif isinstance(system, list):
            meta["system_prompt"] = "\n\n".join(
                blk["text"]
                for blk in system
                if isinstance(blk, dict) and isinstance(blk.get("text"), str)
            )
            meta["system_blocks"] = system
        for i, tool in enumerate(need_list(rec, ("tools",), doc.get("tools") or [])):
            at = ("tools", i)
            tool = need_dict(rec, at, tool)
            name = need_str(rec, (*at, "name"), tool.get("name"))
            b.tool_defs[name] = {
                "name": name,
                "description": opt_str_at(rec, (*at, "description"), tool.get("description")) or "",
                "input_schema": opt_dict_at(rec, (*at, "input_schema"), tool.get("input_schema"))
                or {"type": "object", "properties": {}},
            }
        doc = doc.get("messages")
    messages = need_list(rec, base, doc)
    for i, raw in enumerate(messages):
        path = (*base, i)
        m = need_dict(rec, path, raw)
        role = m.get("role")
        if role == "user":
            add_user(b, key(i), m.get("content"), rec, (*path, "content"))
        elif role == "assistant":
            model = opt_str_at(rec, (*path, "model"), m.get("model"))
            msg = b.message("assistant", key(i), model=model)
            add_assistant_blocks(b, msg, m.get("content"), rec, (*path, "content"))
            if "usage" in m:
                msg["tokens"] = anthropic_tokens(m["usage"])
            b.finish(msg, opt_str_at(rec, (*path, "stop_reason"), m.get("stop_reason")))
        else:
            rec.fail((*path, "role"), f"unknown role {role!r} (expected user or assistant)")
    top = rec.value if isinstance(rec.value, dict) else {}
    model = opt_str(top.get("model"))
    sid = opt_str(top.get("id")) or "anthropic-messages"
    meta["import"] = {"format": NAME, "messages": len(messages)}
    return b.build(sid, model=model, metadata=meta)


def add_assistant_blocks(
    b: SessionBuilder,
    msg: dict[str, Any],
    content: Any,
    rec: Record,
    path: JsonPath,
    *,
    start: int | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Append the parts of an assistant ``content`` (string or block list) to ``msg``."""
    if isinstance(content, str):
        if content:
            b.text(msg, content)
        return
    for j, raw in enumerate(need_list(rec, path, content)):
        block = need_dict(rec, (*path, j), raw)
        kind = block.get("type")
        if kind == "text":
            b.text(msg, need_str(rec, (*path, j, "text"), block.get("text")))
        elif kind == "thinking":
            b.part(
                msg,
                "reasoning",
                text=opt_str_at(rec, (*path, j, "thinking"), block.get("thinking")) or "",
                signature=opt_str_at(rec, (*path, j, "signature"), block.get("signature")),
            )
        elif kind == "redacted_thinking":
            data = opt_str_at(rec, (*path, j, "data"), block.get("data"))
            b.part(msg, "reasoning", text="", encrypted=data)
        elif kind == "tool_use":
            call_id = need_str(rec, (*path, j, "id"), block.get("id"))
            name = need_str(rec, (*path, j, "name"), block.get("name"))
            b.tool_call(
                msg,
                call_id,
                name,
                block.get("input"),
                start=start,
                metadata=extra,
                at=(rec, (*path, j, "id")),
            )
        else:
            msg.setdefault("metadata", {}).setdefault("blocks", []).append(block)


def add_user(
    b: SessionBuilder,
    stem: str,
    content: Any,
    rec: Record,
    path: JsonPath,
    *,
    created: int | None = None,
    synthetic: bool = False,
    result_meta: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Append a user ``content``: tool results complete their calls, anything else becomes a
    user message (returned; None when the content held only tool results)."""
    if isinstance(content, str):
        return b.user_text(stem, content, created=created, synthetic=synthetic)
    msg: dict[str, Any] | None = None

    def target() -> dict[str, Any]:
        nonlocal msg
        if msg is None:
            msg = b.message("user", stem, created=created)
        return msg

    for j, raw in enumerate(need_list(rec, path, content)):
        block = need_dict(rec, (*path, j), raw)
        kind = block.get("type")
        if kind == "tool_result":
            call_id = need_str(rec, (*path, j, "tool_use_id"), block.get("tool_use_id"))
            output, files = _result_content(block.get("content"), rec, (*path, j, "content"))
            found = b.tool_result(
                call_id,
                output,
                error=block.get("is_error") is True,
                end=created,
                metadata=result_meta,
                attachments=files,
            )
            if not found:  # an answer to a call the log does not hold: keep its text
                b.text(target(), output, synthetic=True, metadata={"orphan_tool_result": call_id})
        elif kind == "text":
            b.text(
                target(), need_str(rec, (*path, j, "text"), block.get("text")), synthetic=synthetic
            )
        elif kind in ("image", "document"):
            b.part(target(), "file", **file_fields(block, rec, (*path, j)))
        else:
            target().setdefault("metadata", {}).setdefault("blocks", []).append(block)
    return msg


def _result_content(content: Any, rec: Record, path: JsonPath) -> tuple[str, list[dict[str, Any]]]:
    """A ``tool_result`` content (string or blocks) → (text, file attachments)."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    files: list[dict[str, Any]] = []
    for j, raw in enumerate(need_list(rec, path, content)):
        block = need_dict(rec, (*path, j), raw)
        if block.get("type") == "text":
            texts.append(need_str(rec, (*path, j, "text"), block.get("text")))
        elif block.get("type") in ("image", "document"):
            files.append({"type": "file", **file_fields(block, rec, (*path, j))})
    return "\n".join(texts), files


def file_fields(block: dict[str, Any], rec: Record, path: JsonPath) -> dict[str, Any]:
    """An ``image``/``document`` block (at ``path``) → FilePart fields (mime, data: or http
    URL, name)."""
    source = obj(block.get("source"))
    media_type = opt_str_at(rec, (*path, "source", "media_type"), source.get("media_type"))
    mime = media_type or "application/octet-stream"
    data = source.get("data")
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
        mime = media_type or mimetypes.guess_type(url)[0] or mime
    elif source.get("type") == "text" and isinstance(data, str):
        url = f"data:{mime};base64," + base64.b64encode(data.encode()).decode()
    else:
        url = f"data:{mime};base64,{data if isinstance(data, str) else ''}"
    return {
        "mime": mime,
        "url": url,
        "filename": opt_str_at(rec, (*path, "title"), block.get("title")),
    }
