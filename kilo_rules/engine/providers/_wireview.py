"""One view of a rendered request body, whatever its wire API: tools, system and turns
of typed blocks, each with the JSON path it sits at.

The acceptance checks (:mod:`.acceptance`) read bodies only through this view, so a rule
shared by several APIs is written once. Readers are lenient: a body the SDK types would
refuse still gives a view (unknown elements become ``other`` blocks), since those types
are checked elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class Block:
    """One element of a content list (or a tool), whatever the API calls it.

    ``kind``: text, thinking, call, result, media, marker (a Bedrock cachePoint element),
    tool (a declaration) or other. ``keys`` maps ``text``/``id``/``name``/``mark``/
    ``signature`` to where the value sits under ``path`` ("" for ``path`` itself)."""

    path: str
    kind: str
    keys: Mapping[str, str]
    text: str | None = None
    call_id: str | None = None
    name: str | None = None
    mark: Mapping[str, Any] | None = None
    signature: str | None = None
    content: tuple[Block, ...] = ()

    def at(self, what: str) -> str:
        """The JSON path of one of the block's fields (``text``, ``id``, ``mark``, …)."""
        key = self.keys.get(what, "")
        return f"{self.path}.{key}" if key else self.path


@dataclass(frozen=True, slots=True)
class Turn:
    """One message (Anthropic, Bedrock, Chat Completions), content (Gemini) or input item
    (Responses API: a ``function_call`` or ``reasoning`` item is an ``assistant`` turn, a
    ``function_call_output`` item a ``tool`` turn)."""

    path: str
    role: str
    blocks: tuple[Block, ...]
    content_path: str
    has_content: bool = True  # Chat Completions: ``content`` present, not null, not []
    mark: Mapping[str, Any] | None = None  # a mark on the message object itself
    mark_path: str = ""


@dataclass(frozen=True, slots=True)
class View:
    """A body as tools, system blocks and turns, in the order the API processes them."""

    body: Mapping[str, Any]
    tools: tuple[Block, ...]
    system: tuple[Block, ...]
    turns: tuple[Turn, ...]
    turns_path: str
    system_path: str | None = None  # set where an empty system list is refused


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mark(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _items(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    for i, item in enumerate(_list(value)):
        yield f"{path}[{i}]", item


# Anthropic Messages ---------------------------------------------------------------

_A_KEYS = MappingProxyType(
    {"text": "text", "mark": "cache_control", "id": "id", "name": "name", "signature": ""}
)


def _anthropic_block(b: Any, path: str) -> Block:
    item = _map(b)
    kind, mark = item.get("type"), _mark(item.get("cache_control"))
    if kind == "text":
        return Block(path, "text", _A_KEYS, text=_str(item.get("text")) or "", mark=mark)
    if kind == "tool_use":
        call_id, name = _str(item.get("id")), _str(item.get("name"))
        return Block(path, "call", _A_KEYS, call_id=call_id, name=name, mark=mark)
    if kind == "tool_result":
        keys = {**_A_KEYS, "id": "tool_use_id"}
        raw = item.get("content")
        inner = tuple(_anthropic_block(c, p) for p, c in _items(raw, f"{path}.content"))
        call_id = _str(item.get("tool_use_id"))
        return Block(path, "result", keys, call_id=call_id, mark=mark, content=inner)
    if kind in ("thinking", "redacted_thinking"):
        key = "signature" if kind == "thinking" else "data"
        keys = {**_A_KEYS, "signature": key}
        return Block(path, "thinking", keys, mark=mark, signature=_str(item.get(key)))
    media = kind in ("image", "document")
    return Block(path, "media" if media else "other", _A_KEYS, mark=mark)


def _read_messages(body: Mapping[str, Any], marker_key: str | None) -> View:
    tools = tuple(
        Block(
            p,
            "tool",
            _A_KEYS,
            name=_str(_map(t).get("name")),
            mark=_mark(_map(t).get("cache_control")),
        )
        for p, t in _items(body.get("tools"), "tools")
    )
    raw_system = body.get("system")
    if isinstance(raw_system, str):
        system: tuple[Block, ...] = (Block("system", "text", {}, text=raw_system),)
    else:
        system = tuple(_anthropic_block(b, p) for p, b in _items(raw_system, "system"))
    turns = []
    for p, m in _items(body.get("messages"), "messages"):
        content = _map(m).get("content")
        if isinstance(content, str):  # shorthand for one text block
            blocks: tuple[Block, ...] = (Block(f"{p}.content", "text", {}, text=content),)
        else:
            blocks = tuple(_anthropic_block(b, q) for q, b in _items(content, f"{p}.content"))
        turns.append(Turn(p, str(_map(m).get("role")), blocks, f"{p}.content"))
    return View(body, tools, system, tuple(turns), "messages")


# Bedrock Converse -------------------------------------------------------------------

_B_KEYS = MappingProxyType({"text": "text", "mark": "", "id": "toolUseId", "name": "name"})


def _bedrock_block(b: Any, path: str) -> Block:
    item = _map(b)
    if "cachePoint" in item:
        return Block(path, "marker", _B_KEYS, mark=_map(item["cachePoint"]))
    if "text" in item:
        return Block(path, "text", _B_KEYS, text=_str(item["text"]) or "")
    if "toolUse" in item:
        use = _map(item["toolUse"])
        call_id, name = _str(use.get("toolUseId")), _str(use.get("name"))
        return Block(f"{path}.toolUse", "call", _B_KEYS, call_id=call_id, name=name)
    if "toolResult" in item:
        result = _map(item["toolResult"])
        at = f"{path}.toolResult"
        inner = tuple(
            _bedrock_block(c, p) for p, c in _items(result.get("content"), f"{at}.content")
        )
        return Block(at, "result", _B_KEYS, call_id=_str(result.get("toolUseId")), content=inner)
    if "reasoningContent" in item:
        reasoning = _map(item["reasoningContent"])
        if "redactedContent" in reasoning:
            keys, signature = {"signature": "redactedContent"}, reasoning["redactedContent"]
        else:
            keys = {"signature": "reasoningText.signature"}
            signature = _map(reasoning.get("reasoningText")).get("signature")
        return Block(f"{path}.reasoningContent", "thinking", keys, signature=_str(signature))
    media = any(k in item for k in ("image", "document", "video"))
    return Block(path, "media" if media else "other", _B_KEYS)


def _read_converse(body: Mapping[str, Any], marker_key: str | None) -> View:
    tools = []
    for p, t in _items(_map(body.get("toolConfig")).get("tools"), "toolConfig.tools"):
        if "toolSpec" in _map(t):
            name = _str(_map(_map(t)["toolSpec"]).get("name"))
            tools.append(Block(f"{p}.toolSpec", "tool", _B_KEYS, name=name))
        else:
            tools.append(_bedrock_block(t, p))
    system = tuple(_bedrock_block(b, p) for p, b in _items(body.get("system"), "system"))
    turns = tuple(
        Turn(
            p,
            str(_map(m).get("role")),
            tuple(_bedrock_block(b, q) for q, b in _items(_map(m).get("content"), f"{p}.content")),
            f"{p}.content",
        )
        for p, m in _items(body.get("messages"), "messages")
    )
    return View(body, tuple(tools), system, turns, "messages")


# Chat Completions (OpenAI and compatible servers) -------------------------------------


def _chat_content(content: Any, path: str, key: str) -> tuple[Block, ...]:
    if isinstance(content, str):
        return (Block(path, "text", {"text": "content"}, text=content),)
    keys = {"text": "text", "mark": key}
    out = []
    for p, part in _items(content, f"{path}.content"):
        item = _map(part)
        if item.get("type") == "text":
            text = _str(item.get("text")) or ""
            out.append(Block(p, "text", keys, text=text, mark=_mark(item.get(key))))
        else:
            out.append(Block(p, "media", keys, mark=_mark(item.get(key))))
    return tuple(out)


def _read_chat(body: Mapping[str, Any], marker_key: str | None) -> View:
    key = marker_key or ""
    tool_keys = {"name": "function.name", "mark": key}
    tools = tuple(
        Block(
            p,
            "tool",
            tool_keys,
            name=_str(_map(_map(t).get("function")).get("name")),
            mark=_mark(_map(t).get(key)),
        )
        for p, t in _items(body.get("tools"), "tools")
    )
    call_keys = {"id": "id", "name": "function.name"}
    turns = []
    for p, m in _items(body.get("messages"), "messages"):
        msg = _map(m)
        role, content = str(msg.get("role")), msg.get("content")
        blocks = _chat_content(content, p, key)
        if role == "tool":
            call_id = _str(msg.get("tool_call_id"))
            blocks = (Block(p, "result", {"id": "tool_call_id"}, call_id=call_id, content=blocks),)
        for q, c in _items(msg.get("tool_calls"), f"{p}.tool_calls"):
            call = _map(c)
            name = _str(_map(call.get("function")).get("name"))
            blocks += (Block(q, "call", call_keys, call_id=_str(call.get("id")), name=name),)
        present = content is not None and content != []
        mark = _mark(msg.get(key))
        turns.append(Turn(p, role, blocks, f"{p}.content", present, mark, f"{p}.{key}"))
    return View(body, tools, (), tuple(turns), "messages")


# OpenAI Responses API ---------------------------------------------------------------

_TEXT_PARTS = ("input_text", "output_text")


def _responses_content(content: Any, path: str, field: str, key: str) -> tuple[Block, ...]:
    """The blocks of a message's ``content`` or an output's ``output`` (``field``)."""
    if isinstance(content, str):
        return (Block(path, "text", {"text": field}, text=content),)
    keys = {"text": "text", "mark": key}
    out = []
    for p, part in _items(content, f"{path}.{field}"):
        item = _map(part)
        mark = _mark(item.get(key))
        if item.get("type") in _TEXT_PARTS:
            out.append(Block(p, "text", keys, text=_str(item.get("text")) or "", mark=mark))
        else:
            out.append(Block(p, "media", keys, mark=mark))
    return tuple(out)


def _responses_item(item: Mapping[str, Any], path: str, key: str) -> tuple[str, tuple[Block, ...]]:
    """The role and blocks of one input item."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return str(item.get("role")), _responses_content(item.get("content"), path, "content", key)
    if kind == "function_call":
        keys = {"id": "call_id", "name": "name"}
        call_id, name = _str(item.get("call_id")), _str(item.get("name"))
        return "assistant", (Block(path, "call", keys, call_id=call_id, name=name),)
    if kind == "function_call_output":
        inner = _responses_content(item.get("output"), path, "output", key)
        call_id = _str(item.get("call_id"))
        return "tool", (Block(path, "result", {"id": "call_id"}, call_id=call_id, content=inner),)
    if kind == "reasoning":
        keys = {"signature": "encrypted_content"}
        signature = _str(item.get("encrypted_content"))
        return "assistant", (Block(path, "thinking", keys, signature=signature),)
    return str(kind), (Block(path, "other", {}),)


def _read_responses(body: Mapping[str, Any], marker_key: str | None) -> View:
    key = marker_key or ""
    tools = tuple(
        Block(p, "tool", {"name": "name"}, name=_str(_map(t).get("name")))
        for p, t in _items(body.get("tools"), "tools")
    )
    instructions = body.get("instructions")
    system: tuple[Block, ...] = ()
    if isinstance(instructions, str):
        system = (Block("instructions", "text", {}, text=instructions),)
    turns = []
    for p, it in _items(body.get("input"), "input"):
        role, blocks = _responses_item(_map(it), p, key)
        turns.append(Turn(p, role, blocks, f"{p}.content"))
    return View(body, tools, system, tuple(turns), "input")


# Gemini generateContent -------------------------------------------------------------

_G_KEYS = MappingProxyType({"text": "text", "signature": "thoughtSignature"})


def _gemini_part(part: Any, path: str) -> Block:
    item = _map(part)
    signature = _str(item.get("thoughtSignature"))
    for key, kind in (("functionCall", "call"), ("functionResponse", "result")):
        if key in item:
            inner = _map(item[key])
            keys = {**_G_KEYS, "id": f"{key}.id", "name": f"{key}.name"}
            call_id, name = _str(inner.get("id")), _str(inner.get("name"))
            return Block(path, kind, keys, call_id=call_id, name=name, signature=signature)
    if "text" in item:
        kind = "thinking" if item.get("thought") is True else "text"
        return Block(path, kind, _G_KEYS, text=_str(item["text"]) or "", signature=signature)
    media = "inlineData" in item or "fileData" in item
    return Block(path, "media" if media else "other", _G_KEYS, signature=signature)


def _read_contents(body: Mapping[str, Any], marker_key: str | None) -> View:
    tools = tuple(
        Block(q, "tool", {"name": "name"}, name=_str(_map(d).get("name")))
        for p, t in _items(body.get("tools"), "tools")
        for q, d in _items(_map(t).get("functionDeclarations"), f"{p}.functionDeclarations")
    )
    instruction = body.get("systemInstruction")
    system = tuple(
        _gemini_part(b, p)
        for p, b in _items(_map(instruction).get("parts"), "systemInstruction.parts")
    )
    turns = tuple(
        Turn(
            p,
            str(_map(c).get("role")),
            tuple(_gemini_part(b, q) for q, b in _items(_map(c).get("parts"), f"{p}.parts")),
            f"{p}.parts",
        )
        for p, c in _items(body.get("contents"), "contents")
    )
    # "contents.parts must not be empty" holds for systemInstruction as well.
    system_path = "systemInstruction.parts" if instruction is not None else None
    return View(body, tools, system, turns, "contents", system_path)


_READERS: Mapping[str, Callable[[Mapping[str, Any], str | None], View]] = MappingProxyType(
    {
        "messages": _read_messages,
        "converse": _read_converse,
        "chat": _read_chat,
        "responses": _read_responses,
        "contents": _read_contents,
    }
)


def read(body: Mapping[str, Any], shape: str, marker_key: str | None) -> View:
    """The view of ``body`` in the given shape (``messages``, ``converse``, ``chat``,
    ``responses``, ``contents``); ``marker_key`` names the cache mark of a Chat Completions
    dialect or of the Responses API."""
    return _READERS[shape](body, marker_key)


def walk(view: View) -> Iterator[Block]:
    """Every block in the order the API processes them: tools, system, messages
    (a tool result before its content)."""
    for block in (*view.tools, *view.system, *(b for t in view.turns for b in t.blocks)):
        yield block
        yield from block.content


def lists(view: View) -> Iterator[tuple[Block, ...]]:
    """Every ordered list of blocks: tools, system, each turn and each result's content."""
    yield view.tools
    yield view.system
    for turn in view.turns:
        yield turn.blocks
        for block in turn.blocks:
            if block.kind == "result":
                yield block.content


def marks(view: View) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, mark) of every cache breakpoint, in processing order."""
    for block in walk(view):
        if block.mark is not None:
            yield block.at("mark"), block.mark
    for turn in view.turns:
        if turn.mark is not None:
            yield turn.mark_path, turn.mark


def calls(turn: Turn) -> list[Block]:
    return [b for b in turn.blocks if b.kind == "call"]


def results(turn: Turn) -> list[Block]:
    return [b for b in turn.blocks if b.kind == "result"]
