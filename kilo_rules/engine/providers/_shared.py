"""Helpers every wire format needs: ids, media kinds, empty-content rules, role merging.

Kept apart from the provider modules so that each of them reads as one mapping from the
provider-neutral request onto its own JSON, and so that the rules they must agree on
(how a tool-call id is cleaned, which text counts as the per-turn environment) live once.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from kilo_rules.engine.formats.request import (
    Approval,
    CacheMark,
    Media,
    ModelMessage,
    Part,
    Text,
    ToolResult,
)

T = TypeVar("T")

_ID_OK = re.compile(r"^[a-zA-Z0-9_-]+$")
_ID_BAD_CHAR = re.compile(r"[^a-zA-Z0-9_-]")

#: Image types Anthropic, Bedrock and OpenAI all accept.
IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def sanitize_call_id(call_id: str) -> str:
    """A tool-call id that matches ``^[a-zA-Z0-9_-]+$`` (Anthropic, Bedrock).

    Ids that already match are returned unchanged. Others have each bad character
    replaced by ``_`` and a short hash of the original appended, so that two ids that
    differ only in replaced characters (``a.b`` and ``a:b``) stay distinct; the call and
    its result go through this same function, so they keep matching.
    """
    if _ID_OK.match(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:8]
    return f"{_ID_BAD_CHAR.sub('_', call_id)}_{digest}"


def is_blank(text: str) -> bool:
    """Text with nothing but whitespace (or nothing at all).

    Anthropic refuses it ("text content blocks must contain non-whitespace text"), so do
    Bedrock and Gemini, and it tells the model nothing, so no wire sends it: Claude Code,
    for one, records ``"\\n\\n"`` text blocks before its tool calls.
    """
    return not text or text.isspace()  # isspace stops at the first other character


def is_blank_text(part: Part) -> bool:
    """A text part that :func:`is_blank` says no wire sends."""
    return isinstance(part, Text) and is_blank(part.text)


def readable(value: str | None, origin: str | None, reader: str | None) -> str | None:
    """``value`` (a reasoning signature or encrypted state) if ``reader`` can read it.

    Only the vendor that issued a signature can verify it; sent anywhere else it is refused
    or, at best, meaningless. A value whose ``origin`` is unknown was recorded by the same
    agent that asks now, so it is passed back as recorded.
    """
    if value is None or origin is None or origin == reader:
        return value
    return None


def media_kind(media: Media) -> str:
    """``image`` (a type every provider takes), ``pdf``, ``text`` (text/*) or ``other``."""
    mime = media.mime.lower()
    if mime in IMAGE_MIMES:
        return "image"
    if mime == "application/pdf":
        return "pdf"
    if mime.startswith("text/"):
        return "text"
    return "other"


def data_url(media: Media) -> str:
    """The media as a URL: its own ``url``, or a ``data:`` URL built from the base64."""
    if media.url is not None:
        return media.url
    return f"data:{media.mime};base64,{media.data or ''}"


def decode_text(media: Media) -> str | None:
    """The UTF-8 text of a base64 ``text/*`` attachment, or None if it does not decode."""
    if media.data is None:
        return None
    try:
        return base64.b64decode(media.data, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def placeholder(media: Media, why: str) -> str:
    """The text put where an attachment cannot go on this wire, so the model knows."""
    name = f" {media.filename}" if media.filename else ""
    return f"[attachment{name} ({media.mime}) omitted: {why}]"


def result_text(result: ToolResult, media_note: str | None = None) -> str:
    """The text of a tool result, parts joined by newlines.

    With ``media_note``, each media part becomes a placeholder line (for wires whose tool
    results are text-only); without it, media parts are skipped (rendered elsewhere).
    """
    lines: list[str] = []
    for part in result.content:
        if isinstance(part, Text):
            if not is_blank(part.text):
                lines.append(part.text)
        elif media_note is not None:
            lines.append(placeholder(part, media_note))
    return "\n".join(lines)


def effective_mark(*marks: CacheMark | None) -> CacheMark | None:
    """One mark for a block that several marks land on: the longest ttl wins."""
    found = [m for m in marks if m is not None]
    if not found:
        return None
    for mark in found:
        if mark.ttl == "1h":
            return mark
    return found[0]


def merge_same_role(messages: list[dict[str, Any]], key: str = "content") -> list[dict[str, Any]]:
    """Merge consecutive messages of the same role by concatenating their ``key`` lists.

    Anthropic and Bedrock require user and assistant turns to alternate; a tool message
    becomes a user turn there, so it merges with a user message that follows it. Blocks
    keep their order, which puts tool results first, as Anthropic requires.
    """
    out: list[dict[str, Any]] = []
    for msg in messages:
        if not msg[key]:
            continue
        if out and out[-1]["role"] == msg["role"]:
            out[-1] = {**out[-1], key: [*out[-1][key], *msg[key]]}
        else:
            out.append(msg)
    return out


#: One rendered part before marks are settled: the block (None when the part renders to
#: nothing on this wire), the part's own mark, and whether the block may carry a mark.
Entry = tuple[dict[str, Any] | None, CacheMark | None, bool]


def settle_marks(
    entries: list[Entry], message_level: CacheMark | None
) -> tuple[list[tuple[dict[str, Any], CacheMark | None]], CacheMark | None]:
    """Decide which rendered block carries each mark of one message.

    A part mark stays on its block when the block can carry it. Otherwise (a dropped
    part, a thinking block) it moves to the nearest earlier block that can, else the
    nearest later one: the cached prefix then ends where the part's content ended. The
    message-level mark goes on the last block that can carry it. Marks that meet on one
    block become one. Returns the kept blocks with their marks and the mark nothing
    could carry (the caller may put it on the message itself, or drop it).
    """
    if message_level is None and all(mark is None for _, mark, _ in entries):
        return [(b, None) for b, _, _ in entries if b is not None], None  # the common case
    carriers = [i for i, (block, _, ok) in enumerate(entries) if block is not None and ok]
    marks: dict[int, CacheMark | None] = {}
    leftover: CacheMark | None = None
    for i, (block, mark, ok) in enumerate(entries):
        if mark is None:
            continue
        if block is not None and ok:
            target: int | None = i
        else:
            before = [c for c in carriers if c < i]
            after = [c for c in carriers if c > i]
            target = before[-1] if before else (after[0] if after else None)
        if target is None:
            leftover = effective_mark(leftover, mark)
        else:
            marks[target] = effective_mark(marks.get(target), mark)
    if message_level is not None:
        if carriers:
            marks[carriers[-1]] = effective_mark(marks.get(carriers[-1]), message_level)
        else:
            leftover = effective_mark(leftover, message_level)
    kept = [(b, marks.get(i)) for i, (b, _, _) in enumerate(entries) if b is not None]
    return kept, leftover


def encode(text: str) -> bytes:
    """``text`` as the UTF-8 bytes sent; a lone surrogate (which JSON text may hold) is
    kept as its three bytes, so decoding the same way gives the text back."""
    return text.encode("utf-8", "surrogatepass")


def decode(data: bytes) -> str:
    """The text :func:`encode` made ``data`` from."""
    return data.decode("utf-8", "surrogatepass")


def dumps(value: Any) -> str:
    """``value`` as the body is sent: compact JSON, UTF-8 text unescaped. The encoding is
    compositional (a list's JSON is its items' JSON joined by commas in brackets), which is
    what lets a body be assembled from fragments rendered at earlier steps."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclasses.dataclass(frozen=True, slots=True)
class WireTurn:
    """One message's rendered JSON on a wire whose turns of one role merge: its role and
    the JSON of its content blocks, comma-joined without the brackets, as UTF-8 (b"" for
    none). Bytes, not text: a Python string of one emoji holds four bytes per character,
    and a body joined from fragments would be that wide throughout."""

    role: str
    blocks: bytes
    #: The blocks with the message's first function call signed, for a wire that signs the
    #: first call of each merged turn (Gemini); None when the message makes no call.
    signed: bytes | None = None


def turns_json(
    turns: Iterable[WireTurn], key: str = "content", sign_role: str | None = None
) -> Raw:
    """The JSON of :func:`merge_same_role` applied to the turns' messages
    (``{"role": …, key: [...]}`` each), built from their fragments: turns without blocks
    are dropped, consecutive turns of one role become one. Left in pieces: the body joins
    them once, so a long history is copied once per step, not once per level.

    With ``sign_role``, the first turn of each merged ``sign_role`` turn that makes a call
    gives its ``signed`` blocks: which message holds the first call of a merged turn is
    known only once the neighbours are, so both forms are kept in the fragment."""
    out: list[bytes] = [b"["]
    heads: dict[str, bytes] = {}
    field = dumps(key)
    role: str | None = None
    called = False  # the merged turn being written has had its first call
    for turn in turns:
        blocks = turn.blocks
        if not blocks:
            continue
        if turn.role == role:
            out.append(b",")
        else:
            if role is not None:
                out.append(b"]},")
            role = turn.role
            called = False
            head = heads.get(role)
            if head is None:
                head = heads[role] = encode(f'{{"role":{dumps(role)},{field}:[')
            out.append(head)
        if turn.signed is not None and not called and role == sign_role:
            blocks = turn.signed
            called = True
        out.append(blocks)
    out.append(b"]}]" if role is not None else b"]")
    return Raw(out)


def items_json(items: Iterable[bytes]) -> Raw:
    """A JSON list from fragments that are each zero or more comma-joined items (b"" for
    none), in pieces like :func:`turns_json`'s."""
    out: list[bytes] = [b"["]
    for piece in items:
        if piece:
            if len(out) > 1:
                out.append(b",")
            out.append(piece)
    out.append(b"]")
    return Raw(out)


def joined(values: Iterable[Any]) -> bytes:
    """The values' compact JSON, comma-joined, as UTF-8 (b"" for none): one fragment of
    :func:`items_json` or one turn's blocks."""
    return encode(",".join(dumps(v) for v in values))


class Raw:
    """JSON already encoded as UTF-8 (in pieces to be joined in order), placed as is by
    :func:`body_json`."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces


def body_json(fields: Iterable[tuple[str, Any]]) -> bytes:
    """The JSON object of ``fields`` in order as UTF-8, each value encoded by
    :func:`dumps` unless it is :class:`Raw`: byte-identical to
    ``encode(dumps(dict(fields)))`` with the raw values decoded."""
    out: list[bytes] = []
    for name, value in fields:
        out.append(b"," if out else b"{")
        out.append(encode(dumps(name) + ":"))
        if isinstance(value, Raw):
            out.extend(value.pieces)
        else:
            out.append(encode(dumps(value)))
    out.append(b"}" if out else b"{}")
    return b"".join(out)


def without_approval_parts(msg: ModelMessage) -> ModelMessage:
    """``msg`` without its tool-approval parts, which no wire API takes (the same rule as
    :func:`kilo_rules.engine.providers.render`, applied one message at a time)."""
    if not any(isinstance(p, Approval) for p in msg.parts):
        return msg
    parts = tuple(p for p in msg.parts if not isinstance(p, Approval))
    return dataclasses.replace(msg, parts=parts)


class FragmentStore(Protocol):
    """Where a renderer finds the fragments it rendered at earlier steps (the runtime's
    :class:`kilo_rules.engine.runtime.memo.Fragments`)."""

    def turns(
        self, messages: Sequence[ModelMessage], api: str, make: Callable[[ModelMessage], T]
    ) -> list[T]:
        """The fragment of each message on ``api``: ``make(message)`` for a message not
        rendered before (the same object), the one made before otherwise."""
        ...
