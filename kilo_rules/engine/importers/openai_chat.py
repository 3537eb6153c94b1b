"""OpenAI Chat Completions conversations → Session v1.

Accepts a JSON array of messages, or an object with ``messages`` (and optionally ``tools``,
``model``, ``id``), i.e. a request body or an export of one.

Mapping: ``assistant.tool_calls[]`` → tool parts (the ``arguments`` JSON string is parsed;
text that is not JSON is kept as ``input.arguments``), and each ``role: "tool"`` message
completes the part with the same ``tool_call_id``. Legacy ``function_call`` / ``role:
"function"`` pairs are handled the same way. ``reasoning_content`` (DeepSeek) or
``reasoning`` (OpenRouter) → a reasoning part. The first ``system`` (or ``developer``)
message goes to ``Session.metadata["system_prompt"]``, since Session v1 has no system role;
a later one becomes a synthetic user text with ``metadata.role`` set. Image, audio and file
content parts become file parts.

:class:`ChatImporter` is reused by the mini-swe-agent v2 importer, whose messages are this
shape plus an ``extra`` object per message.
"""

from __future__ import annotations

from typing import Any

from kilo_rules.engine.base.source import JsonPath
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers._build import SessionBuilder, key, openai_tokens
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
    parse_embedded,
)

NAME = "openai_chat"
DESCRIPTION = "OpenAI chat messages with tool_calls and role tool (array, or {messages})"

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def sniff(src: Source) -> bool:
    """One document: an array of ``{role, …}`` messages (or ``{messages: [...]}``) using
    OpenAI roles only."""
    if len(src.records) != 1:
        return False
    doc = src.records[0].value
    messages = doc.get("messages") if isinstance(doc, dict) else doc
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        and all(m["role"] in _ROLES for m in messages)
    )


def parse_arguments(raw: Any) -> tuple[Any, bool]:
    """Tool-call ``arguments`` → (value, parsed ok). Models do emit broken JSON; the text is
    kept rather than failing the import."""
    if not isinstance(raw, str):
        return raw if raw is not None else {}, True
    value, ok = parse_embedded(raw)
    return (value, True) if ok else (raw, False)


def content_text(content: Any) -> str:
    """A message ``content`` (string, or list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


class ChatImporter:
    """Adds OpenAI-style messages to a :class:`SessionBuilder`; subclasses add per-message
    extras through the ``assistant_extra`` / ``tool_extra`` / ``other_role`` hooks."""

    def __init__(self, b: SessionBuilder, rec: Record, meta: dict[str, Any]) -> None:
        self.b = b
        self.rec = rec
        self.meta = meta
        self._legacy_call: str | None = None

    def add_all(self, messages: list[Any], base: JsonPath) -> None:
        """Add every message of ``messages`` (found at ``base`` in the record)."""
        for i, raw in enumerate(messages):
            self.add(i, need_dict(self.rec, (*base, i), raw), (*base, i))

    def add(self, i: int, m: dict[str, Any], path: JsonPath) -> None:
        """Add message ``i``."""
        role = m.get("role")
        if role in ("system", "developer"):
            text = content_text(m.get("content"))
            if not self.b.messages and "system_prompt" not in self.meta:
                self.meta["system_prompt"] = text
            else:
                self.b.user_text(key(i), text, synthetic=True, metadata={"role": role})
        elif role == "user":
            self.user(i, m, path)
        elif role == "assistant":
            self.assistant(i, m, path)
        elif role in ("tool", "function"):
            call_id = m.get("tool_call_id") if role == "tool" else self._legacy_call
            text = content_text(m.get("content"))
            extra = self.tool_extra(m)
            if not isinstance(call_id, str) or not self.b.tool_result(
                call_id, text, end=extra.pop("end", None), metadata=extra
            ):
                self.b.user_text(
                    key(i), text, synthetic=True, metadata={"orphan_tool_result": call_id}
                )
        elif not self.other_role(i, m, path):
            self.rec.fail((*path, "role"), f"unknown role {role!r}")

    def user(self, i: int, m: dict[str, Any], path: JsonPath) -> None:
        """A user message: text, image, audio and file content parts."""
        content = m.get("content")
        if not isinstance(content, list):
            self.b.user_text(key(i), content_text(content))
            return
        msg = self.b.message("user", key(i))
        for j, raw in enumerate(content):
            part = need_dict(self.rec, (*path, "content", j), raw)
            kind = part.get("type")
            if kind == "text":
                self.b.text(
                    msg, need_str(self.rec, (*path, "content", j, "text"), part.get("text"))
                )
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                url = url if isinstance(url, str) else ""
                mime = url[5:].split(";")[0] if url.startswith("data:") else "image/*"
                self.b.part(msg, "file", mime=mime, url=url)
            elif kind == "input_audio" and isinstance(part.get("input_audio"), dict):
                at = (*path, "content", j, "input_audio")
                audio = part["input_audio"]
                fmt = opt_str_at(self.rec, (*at, "format"), audio.get("format")) or "wav"
                data = opt_str_at(self.rec, (*at, "data"), audio.get("data")) or ""
                self.b.part(msg, "file", mime=f"audio/{fmt}", url=f"data:audio/{fmt};base64,{data}")
            elif kind == "file" and isinstance(part.get("file"), dict):
                at = (*path, "content", j, "file")
                f = part["file"]
                file_id = opt_str_at(self.rec, (*at, "file_id"), f.get("file_id")) or ""
                url = opt_str_at(self.rec, (*at, "file_data"), f.get("file_data"))
                url = url or f"file-id:{file_id}"
                mime = url[5:].split(";")[0] if url.startswith("data:") else "application/pdf"
                name = opt_str_at(self.rec, (*at, "filename"), f.get("filename"))
                self.b.part(msg, "file", mime=mime, url=url, filename=name)
            else:
                msg.setdefault("metadata", {}).setdefault("content", []).append(part)

    def assistant(self, i: int, m: dict[str, Any], path: JsonPath) -> None:
        """An assistant message: reasoning, text, refusal, then its tool calls."""
        model = opt_str_at(self.rec, (*path, "model"), m.get("model"))
        msg = self.b.message("assistant", key(i), model=model)
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.b.part(msg, "reasoning", text=reasoning)
        text = content_text(m.get("content"))
        if text:
            self.b.text(msg, text)
        if isinstance(m.get("refusal"), str) and m["refusal"]:
            self.b.text(msg, m["refusal"], metadata={"refusal": True})
        for j, raw in enumerate(
            need_list(self.rec, (*path, "tool_calls"), m.get("tool_calls") or [])
        ):
            tc = need_dict(self.rec, (*path, "tool_calls", j), raw)
            fn = need_dict(self.rec, (*path, "tool_calls", j, "function"), tc.get("function"))
            call_id = need_str(self.rec, (*path, "tool_calls", j, "id"), tc.get("id"))
            self._call(
                msg,
                call_id,
                fn,
                (*path, "tool_calls", j, "function"),
                at=(self.rec, (*path, "tool_calls", j, "id")),
            )
        if isinstance(m.get("function_call"), dict):
            self._legacy_call = self.b.new_call_id(key(i))
            self._call(msg, self._legacy_call, m["function_call"], (*path, "function_call"))
        raw_finish = self.assistant_extra(msg, m, path)
        finish = opt_str_at(self.rec, (*path, "finish_reason"), m.get("finish_reason"))
        self.b.finish(msg, raw_finish or finish)

    def _call(
        self,
        msg: dict[str, Any],
        call_id: str,
        fn: dict[str, Any],
        path: JsonPath,
        at: tuple[Record, JsonPath] | None = None,
    ) -> None:
        name = need_str(self.rec, (*path, "name"), fn.get("name"))
        args, ok = parse_arguments(fn.get("arguments"))
        self.b.tool_call(
            msg,
            call_id,
            name,
            args,
            metadata=None if ok else {"arguments_not_json": True},
            at=at,
        )

    # -- hooks ------------------------------------------------------------------------------
    def assistant_extra(self, msg: dict[str, Any], m: dict[str, Any], path: JsonPath) -> str | None:
        """Fill usage, times, cost of message ``m`` (at ``path``); return the provider's
        finish reason if known."""
        if "usage" in m:
            msg["tokens"] = openai_tokens(m["usage"])
        return None

    def tool_extra(self, m: dict[str, Any]) -> dict[str, Any]:
        """Metadata for a tool result (the key ``end`` becomes its end time)."""
        return {}

    def other_role(self, i: int, m: dict[str, Any], path: JsonPath) -> bool:
        """Handle a role this module does not know; False makes it an error."""
        return False


def convert(src: Source, run: int) -> Session:
    """Import one OpenAI chat conversation."""
    rec = src.records[0]
    doc = rec.value
    b = SessionBuilder(NAME, src.file)
    meta: dict[str, Any] = {}
    base: JsonPath = ()
    top: dict[str, Any] = {}
    if isinstance(doc, dict):
        top, base, doc = doc, ("messages",), doc.get("messages")
        for j, raw in enumerate(need_list(rec, ("tools",), top.get("tools") or [])):
            tool = need_dict(rec, ("tools", j), raw)
            at: JsonPath = ("tools", j, "function") if obj(tool.get("function")) else ("tools", j)
            fn = obj(tool.get("function")) or tool
            name = need_str(rec, (*at, "name"), fn.get("name"))
            b.tool_defs[name] = {
                "name": name,
                "description": opt_str_at(rec, (*at, "description"), fn.get("description")) or "",
                "input_schema": opt_dict_at(rec, (*at, "parameters"), fn.get("parameters"))
                or {"type": "object", "properties": {}},
            }
    messages = need_list(rec, base, doc)
    ChatImporter(b, rec, meta).add_all(messages, base)
    meta["import"] = {"format": NAME, "messages": len(messages)}
    model = opt_str(top.get("model"))
    sid = opt_str(top.get("id")) or "openai-chat"
    return b.build(sid, model=model, metadata=meta)
