"""OpenAI Responses API request bodies → Session v1.

Accepts an object with ``input`` (a string, or an array of input items) and optionally
``instructions``, ``tools``, ``model``, ``previous_response_id`` and ``id`` (a request
body, or an export of one), or a bare array of input items.

Mapping: ``instructions`` → ``Session.metadata["system_prompt"]``, since Session v1 has no
system role; ``system`` / ``developer`` messages before the first user or assistant item are
appended to it (joined by a blank line), a later one becomes a synthetic user text with
``metadata.role`` set, as in the OpenAI chat importer. A string ``input`` is one user
message. User messages (``type: "message"``, or the short form with a ``role`` and no
``type``): ``input_text`` → text parts, ``input_image`` / ``input_file`` → file parts.
Assistant messages: ``output_text`` → text parts, ``refusal`` → a text part with
``metadata.refusal``. ``reasoning`` → a reasoning part (the summary texts, the
``encrypted_content`` kept as ``encrypted``). ``function_call`` → a tool part (the
``arguments`` JSON string is parsed; text that is not JSON is kept as ``input.arguments``).
``reasoning``, assistant ``message`` and ``function_call`` items that follow one another
make one assistant message, whose id is that of the item that started it. A
``function_call_output`` completes the tool part of the call it answers and produces no
message of its own; one that answers no call of the log becomes a synthetic user text with
``metadata.orphan_tool_result``.

The Session message made from input item ``i`` has id ``msg_{i:06d}``, so a caller holding
the items can map a message back to the item it came from. The item's own API id (``msg_…``,
``rs_…``, ``fc_…``) is kept in its part's ``metadata.item_id``. Items of other types
(``web_search_call``, ``computer_call``, ``item_reference``, …) are kept as they are in
``message.metadata["items"]`` of the message they follow (in ``Session.metadata["items"]``
before the first message), and tools other than functions in
``Session.metadata["other_tools"]``.
"""

from __future__ import annotations

import mimetypes
from typing import Any

from kilo_rules.engine.base.source import JsonPath
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers._build import SessionBuilder, key
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
from kilo_rules.engine.importers.openai_chat import parse_arguments

NAME = "openai_responses"
DESCRIPTION = "OpenAI Responses API input items (request body {model, input}, or an array)"

_ROLES = ("user", "assistant", "system", "developer")
# Item and content types only the Responses API uses: what tells its items from chat messages.
_ITEM_TYPES = {"function_call", "function_call_output", "reasoning"}
_PART_TYPES = {"input_text", "output_text", "input_image", "input_file"}
_TEXT_TYPES = ("input_text", "output_text")


def sniff(src: Source) -> bool:
    """One document: an object with ``input`` (a string or an array of items) beside a
    ``model`` or ``instructions`` and without ``messages``, or an array of items of which one
    at least uses a Responses item or content type (``function_call``, ``reasoning``,
    ``input_text``, ``output_text``, …)."""
    if len(src.records) != 1:
        return False
    doc = src.records[0].value
    if isinstance(doc, dict):
        if "messages" in doc:
            return False
        items = doc.get("input")
        if isinstance(items, str):
            return "model" in doc or "instructions" in doc
        return (
            isinstance(items, list)
            and all(isinstance(item, dict) for item in items)
            and _roles_ok(items)
            and ("model" in doc or "instructions" in doc or _responses_items(items))
        )
    return (
        isinstance(doc, list)
        and bool(doc)
        and all(isinstance(item, dict) for item in doc)
        and _roles_ok(doc)
        and _responses_items(doc)
    )


def _roles_ok(items: list[Any]) -> bool:
    return all(item.get("role", "user") in _ROLES for item in items)


def _responses_items(items: list[Any]) -> bool:
    for item in items[:200]:
        if item.get("type") in _ITEM_TYPES:
            return True
        content = item.get("content")
        if isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type") in _PART_TYPES for part in content
        ):
            return True
    return False


def convert(src: Source, run: int) -> Session:
    """Import one Responses API request body (or array of input items)."""
    rec = src.records[0]
    doc = rec.value
    b = SessionBuilder(NAME, src.file)
    meta: dict[str, Any] = {}
    base: JsonPath = ()
    top: dict[str, Any] = {}
    if isinstance(doc, dict):
        top, base, doc = doc, ("input",), doc.get("input")
        instructions = opt_str_at(rec, ("instructions",), top.get("instructions"))
        if instructions is not None:
            meta["system_prompt"] = instructions
        _tools(b, rec, need_list(rec, ("tools",), top.get("tools") or []), meta)
        previous = opt_str_at(rec, ("previous_response_id",), top.get("previous_response_id"))
        if previous is not None:
            meta["previous_response_id"] = previous
    if isinstance(doc, str):
        b.user_text(key(0), doc)
        count = 1
    else:
        items = need_list(rec, base, doc)
        ResponsesImporter(b, rec, meta).add_all(items, base)
        count = len(items)
    for msg in b.messages:
        if msg["role"] == "assistant":
            b.finish(msg, None)
    meta["import"] = {"format": NAME, "items": count}
    if b.pending_calls():
        meta["import"]["unanswered"] = b.pending_calls()
    model = opt_str(top.get("model"))
    sid = opt_str(top.get("id")) or "openai-responses"
    return b.build(sid, model=model, metadata=meta)


def _tools(b: SessionBuilder, rec: Record, tools: list[Any], meta: dict[str, Any]) -> None:
    """Function tools → tool definitions; the others (hosted, custom) kept in metadata."""
    for j, raw in enumerate(tools):
        tool = need_dict(rec, ("tools", j), raw)
        if tool.get("type", "function") != "function":
            meta.setdefault("other_tools", []).append(tool)
            continue
        # A chat-style {"type": "function", "function": {...}} is read too.
        at: JsonPath = ("tools", j, "function") if obj(tool.get("function")) else ("tools", j)
        fn = obj(tool.get("function")) or tool
        name = need_str(rec, (*at, "name"), fn.get("name"))
        b.tool_defs[name] = {
            "name": name,
            "description": opt_str_at(rec, (*at, "description"), fn.get("description")) or "",
            "input_schema": opt_dict_at(rec, (*at, "parameters"), fn.get("parameters"))
            or {"type": "object", "properties": {}},
        }


class ResponsesImporter:
    """Adds Responses API input items to a :class:`SessionBuilder`, keeping the assistant
    message that reasoning, assistant text and function calls in a row build together."""

    def __init__(self, b: SessionBuilder, rec: Record, meta: dict[str, Any]) -> None:
        self.b = b
        self.rec = rec
        self.meta = meta
        self.turn: dict[str, Any] | None = None  # the assistant message later items join

    def add_all(self, items: list[Any], base: JsonPath) -> None:
        """Add every item of ``items`` (found at ``base`` in the record)."""
        for i, raw in enumerate(items):
            self.add(i, need_dict(self.rec, (*base, i), raw), (*base, i))

    def add(self, i: int, item: dict[str, Any], path: JsonPath) -> None:
        """Add item ``i``."""
        kind = opt_str_at(self.rec, (*path, "type"), item.get("type"))
        if kind == "message" or (kind is None and "role" in item):
            self.message(i, item, path)
        elif kind == "reasoning":
            self.reasoning(i, item, path)
        elif kind == "function_call":
            self.function_call(i, item, path)
        elif kind == "function_call_output":
            self.function_call_output(i, item, path)
        elif kind is None and "id" not in item:  # an item_reference may leave out its type
            self.rec.fail(path, "expected an input item: an object with a type or a role")
        else:
            self.keep(item)

    # -- items ------------------------------------------------------------------------------
    def message(self, i: int, item: dict[str, Any], path: JsonPath) -> None:
        """A ``message`` item (or the short form ``{role, content}``)."""
        role = need_str(self.rec, (*path, "role"), item.get("role"))
        if role not in _ROLES:
            self.rec.fail(
                (*path, "role"),
                f"unknown role {role!r} (expected user, assistant, system or developer)",
            )
        at = (*path, "content")
        if role == "assistant":
            self.assistant_content(self.assistant(i), item, at)
            return
        self.turn = None
        if role == "user":
            self.user_content(i, item.get("content"), at)
            return
        text = self.text_of(item.get("content"), at)
        if not self.b.messages:
            before = self.meta.get("system_prompt")
            self.meta["system_prompt"] = f"{before}\n\n{text}" if before else text
        else:
            self.b.user_text(key(i), text, synthetic=True, metadata={"role": role})

    def reasoning(self, i: int, item: dict[str, Any], path: JsonPath) -> None:
        """A ``reasoning`` item: its summary texts (else its reasoning texts), encrypted
        content kept."""
        summary = self.texts(item.get("summary"), (*path, "summary"), ("summary_text",))
        content = self.texts(item.get("content"), (*path, "content"), ("reasoning_text",))
        item_id = opt_str_at(self.rec, (*path, "id"), item.get("id"))
        encrypted = opt_str_at(
            self.rec, (*path, "encrypted_content"), item.get("encrypted_content")
        )
        metadata: dict[str, Any] = {"item_id": item_id} if item_id is not None else {}
        if summary and content:
            metadata["content"] = "\n\n".join(content)
        self.b.part(
            self.assistant(i),
            "reasoning",
            text="\n\n".join(summary or content),
            encrypted=encrypted,
            metadata=metadata,
        )

    def function_call(self, i: int, item: dict[str, Any], path: JsonPath) -> None:
        """A ``function_call`` item → a tool part, pending until its output."""
        call_id = need_str(self.rec, (*path, "call_id"), item.get("call_id"))
        name = need_str(self.rec, (*path, "name"), item.get("name"))
        args, ok = parse_arguments(item.get("arguments"))
        metadata = {
            "item_id": opt_str_at(self.rec, (*path, "id"), item.get("id")),
            "namespace": opt_str_at(self.rec, (*path, "namespace"), item.get("namespace")),
            "arguments_not_json": None if ok else True,
        }
        self.b.tool_call(
            self.assistant(i),
            call_id,
            name,
            args,
            metadata={k: v for k, v in metadata.items() if v is not None},
            at=(self.rec, (*path, "call_id")),
        )

    def function_call_output(self, i: int, item: dict[str, Any], path: JsonPath) -> None:
        """A ``function_call_output`` item completes its call; one that answers no call of
        the log is kept as a synthetic user text."""
        self.turn = None
        call_id = opt_str_at(self.rec, (*path, "call_id"), item.get("call_id"))
        output, files, other = self.output(item.get("output"), (*path, "output"))
        found = call_id is not None and self.b.tool_result(
            call_id,
            output,
            metadata={"content": other} if other else None,
            attachments=files,
        )
        if not found:
            msg = self.b.user_text(
                key(i), output, synthetic=True, metadata={"orphan_tool_result": call_id}
            )
            for f in files:
                self.b.part(msg, "file", **{k: v for k, v in f.items() if k != "type"})

    def keep(self, item: dict[str, Any]) -> None:
        """An item of a type this module does not convert: kept on the message it follows."""
        target = self.turn or (self.b.messages[-1] if self.b.messages else None)
        where = target.setdefault("metadata", {}) if target is not None else self.meta
        where.setdefault("items", []).append(item)

    # -- content ----------------------------------------------------------------------------
    def assistant(self, i: int) -> dict[str, Any]:
        """The assistant message item ``i`` joins, started by it when none is open."""
        if self.turn is None:
            self.turn = self.b.message("assistant", key(i))
        return self.turn

    def user_content(self, i: int, content: Any, path: JsonPath) -> None:
        """A user ``content``: a string, or text, image and file parts."""
        if isinstance(content, str):
            self.b.user_text(key(i), content)
            return
        msg = self.b.message("user", key(i))
        for j, raw in enumerate(need_list(self.rec, path, content)):
            part = need_dict(self.rec, (*path, j), raw)
            kind = part.get("type")
            if kind in _TEXT_TYPES:
                self.b.text(msg, need_str(self.rec, (*path, j, "text"), part.get("text")))
            elif kind in ("input_image", "input_file"):
                self.b.part(msg, "file", **self.file_fields(part, (*path, j)))
            else:
                msg.setdefault("metadata", {}).setdefault("content", []).append(part)

    def assistant_content(self, msg: dict[str, Any], item: dict[str, Any], path: JsonPath) -> None:
        """An assistant ``content`` (a string, or output text and refusal parts) appended to
        ``msg``; the item's id and ``phase`` go to each text part's metadata."""
        base: dict[str, Any] = {
            "item_id": opt_str_at(self.rec, (*path[:-1], "id"), item.get("id")),
            "phase": opt_str_at(self.rec, (*path[:-1], "phase"), item.get("phase")),
        }
        base = {k: v for k, v in base.items() if v is not None}
        content = item.get("content")
        if isinstance(content, str):
            if content:
                self.b.text(msg, content, metadata=base)
            return
        for j, raw in enumerate(need_list(self.rec, path, content)):
            part = need_dict(self.rec, (*path, j), raw)
            kind = part.get("type")
            if kind in _TEXT_TYPES:
                text = need_str(self.rec, (*path, j, "text"), part.get("text"))
                annotations = part.get("annotations")
                extra = {"annotations": annotations} if annotations else {}
                self.b.text(msg, text, metadata={**base, **extra})
            elif kind == "refusal":
                text = need_str(self.rec, (*path, j, "refusal"), part.get("refusal"))
                self.b.text(msg, text, metadata={**base, "refusal": True})
            else:
                msg.setdefault("metadata", {}).setdefault("content", []).append(part)

    def text_of(self, content: Any, path: JsonPath) -> str:
        """A system or developer ``content`` (a string, or text parts) as one string."""
        if isinstance(content, str):
            return content
        return "\n".join(self.texts(content, path, _TEXT_TYPES, required=True))

    def texts(
        self, parts: Any, path: JsonPath, kinds: tuple[str, ...], *, required: bool = False
    ) -> list[str]:
        """The ``text`` of each part of ``parts`` (an array, or missing unless ``required``)
        whose type is one of ``kinds``."""
        if parts is None and not required:
            return []
        out: list[str] = []
        for j, raw in enumerate(need_list(self.rec, path, parts)):
            part = need_dict(self.rec, (*path, j), raw)
            if part.get("type") in kinds:
                out.append(need_str(self.rec, (*path, j, "text"), part.get("text")))
        return out

    def output(
        self, value: Any, path: JsonPath
    ) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """A ``function_call_output`` output (a string, or text, image and file parts) →
        (text, file attachments, parts of other types)."""
        if value is None:
            return "", [], []
        if isinstance(value, str):
            return value, [], []
        texts: list[str] = []
        files: list[dict[str, Any]] = []
        other: list[dict[str, Any]] = []
        for j, raw in enumerate(need_list(self.rec, path, value)):
            part = need_dict(self.rec, (*path, j), raw)
            kind = part.get("type")
            if kind in _TEXT_TYPES:
                texts.append(need_str(self.rec, (*path, j, "text"), part.get("text")))
            elif kind in ("input_image", "input_file"):
                files.append({"type": "file", **self.file_fields(part, (*path, j))})
            else:
                other.append(part)
        return "\n".join(texts), files, other

    def file_fields(self, part: dict[str, Any], path: JsonPath) -> dict[str, Any]:
        """An ``input_image`` / ``input_file`` part (at ``path``) → FilePart fields (mime, a
        data:, http(s) or ``file-id:`` URL, name)."""
        file_id = opt_str_at(self.rec, (*path, "file_id"), part.get("file_id"))
        if part.get("type") == "input_image":
            url = opt_str_at(self.rec, (*path, "image_url"), part.get("image_url"))
            url = url or (f"file-id:{file_id}" if file_id else "")
            mime = url[5:].split(";")[0] if url.startswith("data:") else "image/*"
            return {"mime": mime or "image/*", "url": url}
        name = opt_str_at(self.rec, (*path, "filename"), part.get("filename"))
        data = opt_str_at(self.rec, (*path, "file_data"), part.get("file_data"))
        link = opt_str_at(self.rec, (*path, "file_url"), part.get("file_url"))
        guessed = mimetypes.guess_type(name or link or "")[0] or "application/pdf"
        if data is not None and data.startswith("data:"):
            url, mime = data, data[5:].split(";")[0] or guessed
        elif data is not None:
            url, mime = f"data:{guessed};base64,{data}", guessed
        else:
            url, mime = link or (f"file-id:{file_id}" if file_id else ""), guessed
        return {"mime": mime, "url": url, "filename": name}
