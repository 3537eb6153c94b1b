"""Where the values of a JSON body are, so that the gateway can splice it.

A gateway that re-serialises the client's body changes bytes nobody asked it to change:
key order, escapes, number spelling, whitespace — and the provider's prompt cache is keyed
by what the model sees, which is built from those values. :func:`scan` parses a body once
(with the standard library's C scanner, value by value) and remembers where each top-level
member's value and each element of one array member lie in the text, so that a forwarded
body is the client's own text with only the changed spans replaced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JsonBodyError", "Scanned", "Span", "repeated", "scan", "splice"]

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


class JsonBodyError(ValueError):
    """The body is not one JSON object; ``offset`` is where the text stops making sense."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Span:
    """A value's place in the text: ``text[start:end]`` is its JSON."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Scanned:
    """A parsed JSON object body: the value of every member, where each lies, and for the
    member named when scanning (``items_of``), where each of its elements lies.

    ``raw`` is the body's bytes and ``byte_ends[i]`` the byte offset where element ``i``
    ends, so that the next body of the same conversation can be compared with this one
    byte for byte (:func:`scan` with ``previous``). ``memo`` holds what callers computed
    per element (kept, by position, for the elements a later scan reuses)."""

    text: str
    value: dict[str, Any]
    members: dict[str, Span]
    items: tuple[Span, ...] | None  # None when the member is missing or not an array
    raw: bytes = b""
    byte_ends: tuple[int, ...] = ()
    reused: int = 0  # leading elements taken from the previous scan, not parsed again
    memo: dict[Any, Any] = field(default_factory=dict)


def _skip(text: str, at: int) -> int:
    n = len(text)
    while at < n and text[at] in _WS:
        at += 1
    return at


def _value(text: str, at: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, at)
    except json.JSONDecodeError as exc:
        raise JsonBodyError(exc.msg, exc.pos) from None
    except RecursionError:
        raise JsonBodyError("the body nests too deeply", at) from None
    except ValueError as exc:  # an integer past the interpreter's digit limit
        raise JsonBodyError(str(exc).split(";")[0], at) from None


def _byte_ends(text: str, raw: bytes, spans: list[Span], start: int, base: int) -> list[int]:
    """The byte offset in ``raw`` where each span ends, ``base`` being the byte offset of
    character ``start`` (each span's text encoded once)."""
    if len(raw) == len(text):  # ASCII (or Latin-1-free UTF-8 of the same length)
        return [sp.end for sp in spans]
    out: list[int] = []
    at, offset = start, base
    for sp in spans:
        offset += len(text[at : sp.end].encode("utf-8", "surrogatepass"))
        at = sp.end
        out.append(offset)
    return out


def repeated(previous: Scanned, raw: bytes, *, quick: bool = False) -> int:
    """How many leading elements of ``previous`` the body ``raw`` repeats byte for byte,
    from the body's first byte (its members before the array included). ``quick``: only
    all of them, or all but the newest, are tried (0 otherwise)."""
    ends = previous.byte_ends
    old = previous.raw

    def same(k: int) -> bool:  # the first k elements (k >= 1)
        end = ends[k - 1]
        return len(raw) > end and raw.startswith(old[:end])

    n = len(ends)
    # A client resends its history and appends to it; the newest element may differ (a
    # cache mark moved off it), so the two longest prefixes are tried first.
    for k in (n, n - 1):
        if k >= 1 and same(k):
            return k
    if quick:
        return 0
    lo, hi = 0, n - 2  # the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if same(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def scan(
    text: str,
    items_of: str | None = None,
    *,
    raw: bytes | None = None,
    previous: Scanned | None = None,
) -> Scanned:
    """Parse ``text``, a JSON object, recording member spans (and element spans of the
    array member ``items_of``). A repeated key keeps its last value, as ``json.loads``
    does. Raises :class:`JsonBodyError` for anything else.

    With ``raw`` (the bytes ``text`` was decoded from) and ``previous`` (the scan of an
    earlier body of the same conversation), the elements the body repeats byte for byte
    from its start are not parsed again: their values and spans are ``previous``'s."""
    body = raw if raw is not None else text.encode("utf-8", "surrogatepass")
    value: dict[str, Any] = {}
    members: dict[str, Span] = {}
    items: tuple[Span, ...] | None = None
    byte_ends: list[int] = []
    reused = 0
    if previous is not None and items_of is not None and previous.items:
        reused = repeated(previous, body)
    if reused:
        assert previous is not None and previous.items is not None and items_of is not None
        array_start = previous.members[items_of].start
        for key, span in previous.members.items():  # the members before the array
            if span.end <= array_start:
                value[key], members[key] = previous.value[key], span
        spans = list(previous.items[:reused])
        elements = list(previous.value[items_of][:reused])
        more, at = _array_from(text, spans[-1].end, elements, spans)
        byte_ends = list(previous.byte_ends[:reused])
        byte_ends += _byte_ends(text, body, more, spans[reused - 1].end, byte_ends[-1])
        value[items_of], items = elements, tuple(spans)
        members[items_of] = Span(array_start, at)
        at, done = _next(text, at)
    else:
        at = _skip(text, 0)
        if not text.startswith("{", at):
            raise JsonBodyError("the body must be a JSON object", at)
        at = _skip(text, at + 1)
        done = text.startswith("}", at)
        if done:
            at += 1
    while not done:
        if not text.startswith('"', at):
            raise JsonBodyError("expected a member name in double quotes", at)
        try:
            key, at = json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined]
        except json.JSONDecodeError as exc:
            raise JsonBodyError(exc.msg, exc.pos) from None
        except ValueError as exc:
            raise JsonBodyError(str(exc), at) from None
        at = _skip(text, at)
        if not text.startswith(":", at):
            raise JsonBodyError("expected ':' after a member name", at)
        start = _skip(text, at + 1)
        if key == items_of and text.startswith("[", start):
            elements, spans = [], []
            more, at = _array_from(text, start, elements, spans, opening=True)
            value[key], items = elements, tuple(spans)
            same = len(body) == len(text)
            base = start if same else len(text[:start].encode("utf-8", "surrogatepass"))
            byte_ends = _byte_ends(text, body, more, start, base)
        else:
            value[key], at = _value(text, start)
            if key == items_of:
                items, byte_ends = None, []
        members[key] = Span(start, at)
        at, done = _next(text, at)
    if _skip(text, at) != len(text):
        raise JsonBodyError("extra data after the JSON object", _skip(text, at))
    return Scanned(text, value, members, items, body, tuple(byte_ends), reused)


def _next(text: str, at: int) -> tuple[int, bool]:
    """After a member's value: where the next member starts, or the offset past the
    closing brace (and True)."""
    at = _skip(text, at)
    if text.startswith(",", at):
        return _skip(text, at + 1), False
    if text.startswith("}", at):
        return at + 1, True
    raise JsonBodyError("expected ',' or '}' after a member", at)


def _array_from(
    text: str, at: int, values: list[Any], spans: list[Span], *, opening: bool = False
) -> tuple[list[Span], int]:
    """Parse array elements into ``values``/``spans``: from its ``[`` at ``at``
    (``opening``), or from the end of an element already parsed. Returns the new spans
    and the offset past the ``]``."""
    new: list[Span] = []
    if opening:
        at = _skip(text, at + 1)
        if text.startswith("]", at):
            return new, at + 1
    else:
        at = _skip(text, at)
        if text.startswith("]", at):
            return new, at + 1
        if not text.startswith(",", at):
            raise JsonBodyError("expected ',' or ']' after an array element", at)
        at = _skip(text, at + 1)
    while True:
        start = at
        element, at = _value(text, start)
        values.append(element)
        span = Span(start, at)
        spans.append(span)
        new.append(span)
        at = _skip(text, at)
        if text.startswith(",", at):
            at = _skip(text, at + 1)
        elif text.startswith("]", at):
            return new, at + 1
        else:
            raise JsonBodyError("expected ',' or ']' after an array element", at)


def splice(text: str, edits: dict[Span, str]) -> str:
    """``text`` with each span replaced by its new JSON text (spans must not overlap)."""
    out: list[str] = []
    at = 0
    for span in sorted(edits, key=lambda s: s.start):
        out.append(text[at : span.start])
        out.append(edits[span])
        at = span.end
    out.append(text[at:])
    return "".join(out)
