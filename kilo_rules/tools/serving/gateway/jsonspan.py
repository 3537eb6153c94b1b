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
from dataclasses import dataclass
from typing import Any

__all__ = ["JsonBodyError", "Scanned", "Span", "scan", "splice"]

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
    member named when scanning (``items_of``), where each of its elements lies."""

    text: str
    value: dict[str, Any]
    members: dict[str, Span]
    items: tuple[Span, ...] | None  # None when the member is missing or not an array


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


def _array(text: str, at: int) -> tuple[list[Any], list[Span], int]:
    """The elements of the array whose ``[`` is at ``at``, their spans, and its end."""
    values: list[Any] = []
    spans: list[Span] = []
    at = _skip(text, at + 1)
    if text.startswith("]", at):
        return values, spans, at + 1
    while True:
        start = at
        value, at = _value(text, start)
        values.append(value)
        spans.append(Span(start, at))
        at = _skip(text, at)
        if text.startswith(",", at):
            at = _skip(text, at + 1)
        elif text.startswith("]", at):
            return values, spans, at + 1
        else:
            raise JsonBodyError("expected ',' or ']' after an array element", at)


def scan(text: str, items_of: str | None = None) -> Scanned:
    """Parse ``text``, a JSON object, recording member spans (and element spans of the
    array member ``items_of``). A repeated key keeps its last value, as ``json.loads``
    does. Raises :class:`JsonBodyError` for anything else."""
    at = _skip(text, 0)
    if not text.startswith("{", at):
        raise JsonBodyError("the body must be a JSON object", at)
    value: dict[str, Any] = {}
    members: dict[str, Span] = {}
    items: tuple[Span, ...] | None = None
    at = _skip(text, at + 1)
    if text.startswith("}", at):
        at += 1
    else:
        while True:
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
                elements, spans, at = _array(text, start)
                value[key], items = elements, tuple(spans)
            else:
                value[key], at = _value(text, start)
                if key == items_of:
                    items = None
            members[key] = Span(start, at)
            at = _skip(text, at)
            if text.startswith(",", at):
                at = _skip(text, at + 1)
            elif text.startswith("}", at):
                at += 1
                break
            else:
                raise JsonBodyError("expected ',' or '}' after a member", at)
    if _skip(text, at) != len(text):
        raise JsonBodyError("extra data after the JSON object", _skip(text, at))
    return Scanned(text, value, members, items)


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
