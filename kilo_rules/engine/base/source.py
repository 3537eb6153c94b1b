"""Source maps: where each value of a document was written, as ``file:line:col``.

A path names a value inside JSON-like data by keys and indexes (``("messages", 3, "role")``).
Policies are YAML: the composer reports a position for every node, and :class:`Document`
keeps them (``kilo_rules.engine.formats.load`` builds it). Sessions and imported logs are JSON,
which the ``json`` module parses without positions: :class:`JsonText` finds them in the text
afterwards, only for the paths an error names, so a file with nothing wrong costs nothing.
Both answer "where is this path written, or its nearest ancestor that has a position" with
:func:`nearest`. Lines and columns are 1-based and count characters, as editors show them.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kilo_rules.engine.base.errors import Location

JsonPath = tuple[str | int, ...]
"""Keys and indexes from the root of a document down to one value."""

T = TypeVar("T")


def nearest(table: Mapping[JsonPath, T], path: JsonPath) -> tuple[T, JsonPath] | None:
    """The entry of ``path`` in ``table``, or of its nearest ancestor that has one, with the
    rest of ``path`` below that ancestor (``()`` when ``path`` itself is in the table).

    None when neither ``path`` nor any ancestor, the root ``()`` included, is in ``table``.
    The rest lets a table of origins (path → where it was copied from) carry the remainder
    over to the origin."""
    for cut in range(len(path), -1, -1):
        hit = table.get(path[:cut])
        if hit is not None:
            return hit, path[cut:]
    return None


def lookup(data: Any, path: JsonPath, default: Any = None) -> Any:
    """The value at ``path`` in JSON-like data, or ``default`` where the path breaks off."""
    for p in path:
        if isinstance(data, dict) and p in data:
            data = data[p]
            continue
        if isinstance(data, list) and isinstance(p, int) and 0 <= p < len(data):
            data = data[p]
            continue
        return default
    return data


# -- YAML -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScalarInfo:
    """Where a string scalar sits in the source, to locate positions inside it."""

    style: str | None  # None (plain), "'", '"', "|", ">"
    start: int  # character offset of the scalar's first source character
    end: int


@dataclass
class Document:
    """A loaded YAML document: its data and where every value came from."""

    file: str
    text: str
    data: Any
    values: dict[JsonPath, Location] = field(default_factory=dict)
    keys: dict[JsonPath, Location] = field(default_factory=dict)
    scalars: dict[JsonPath, ScalarInfo] = field(default_factory=dict)
    _line_starts: list[int] | None = field(default=None, repr=False)

    def _pos(self, offset: int) -> Location:
        if self._line_starts is None:
            starts = [0]
            starts.extend(i + 1 for i, ch in enumerate(self.text) if ch == "\n")
            self._line_starts = starts
        ln = bisect.bisect_right(self._line_starts, offset) - 1
        return Location(self.file, ln + 1, offset - self._line_starts[ln] + 1)

    def locate(self, path: JsonPath) -> Location:
        """Location of the value at ``path``, or of its nearest located ancestor."""
        hit = nearest(self.values, path)
        return hit[0] if hit is not None else Location(self.file, 1, 1)

    def locate_key(self, path: JsonPath) -> Location:
        """Location of the mapping key that names ``path`` (falls back to the value)."""
        return self.keys.get(path) or self.locate(path)

    def locate_in_scalar(self, path: JsonPath, offset: int) -> Location:
        """Location of character ``offset`` of the string value at ``path``.

        Works for plain, quoted and block scalars by walking the source and the value in
        step: every non-blank value character is matched to its next occurrence in the
        source span, which skips indentation, quotes and folding."""
        info = self.scalars.get(path)
        value = lookup(self.data, path)
        if info is None or not isinstance(value, str):
            return self.locate(path)
        src = self.text
        i = info.start
        if info.style in ("|", ">"):
            nl = src.find("\n", i)
            i = info.end if nl < 0 else nl + 1
        elif info.style in ("'", '"'):
            i += 1
        end = info.end
        for ch in value[: max(0, offset)]:
            if ch.isspace():
                continue
            j = src.find(ch, i, end)
            if j < 0:
                break
            i = j + 1
        while i < end and offset < len(value) and src[i] != value[offset] and src[i].isspace():
            i += 1
        return self._pos(min(i, max(info.start, end - 1)) if end > info.start else info.start)


# -- JSON -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JsonText:
    """A JSON text and where it sits in its file; finds where the values it holds start.

    ``line`` is the file line of the text's first character (above 1 for one record of a
    JSON Lines file). The text is expected to be JSON that already parsed: where the scan
    cannot read on, the paths below stay unlocated and fall back to an ancestor. When a key
    is repeated, its last value is the one located, as it is the one ``json`` keeps."""

    file: str
    text: str
    line: int = 1

    def locations(self, paths: Iterable[JsonPath]) -> dict[JsonPath, Location]:
        """Where each of ``paths``, and each of their ancestors, starts; a path the text
        does not hold is left out. One pass over the text, however many paths."""
        offsets = _offsets(self.text, paths)
        text = self.text
        at: dict[int, Location] = {}
        line, last_newline, previous = self.line, -1, 0
        for offset in sorted(set(offsets.values())):
            newlines = text.count("\n", previous, offset)
            if newlines:
                line += newlines
                last_newline = text.rfind("\n", previous, offset)
            at[offset] = Location(self.file, line, offset - last_newline)
            previous = offset
        return {path: at[offset] for path, offset in offsets.items()}

    def locate(self, path: JsonPath = ()) -> Location:
        """Where the value at ``path`` starts, or its nearest ancestor the text holds."""
        hit = nearest(self.locations([path]), path)
        return hit[0] if hit is not None else Location(self.file, self.line, 1)

    def too_deep(self, max_depth: int) -> tuple[JsonPath, Location] | None:
        """The first object or array, in text order, opened more than ``max_depth`` levels
        deep (the outermost value is level 1), with where it starts; None when there is none.

        This reads text that ``json`` may have refused for its depth, so it scans tokens in
        one loop instead of parsing: strings are skipped whole by the pattern, and only
        brackets, commas and keys move the path."""
        stack: list[list[Any]] = []  # per open container: [is object, step, expecting key]
        for token in _TOKEN.finditer(self.text):
            ch = token.group()[0]
            if ch in "[{":
                if len(stack) >= max_depth:
                    return tuple(frame[1] for frame in stack), self._at(token.start())
                stack.append([ch == "{", None if ch == "{" else 0, ch == "{"])
            elif ch in "]}":
                if not stack:
                    return None
                stack.pop()
            elif not stack:
                continue
            elif ch == ",":
                frame = stack[-1]
                if frame[0]:
                    frame[2] = True
                else:
                    frame[1] += 1
            elif ch == '"' and stack[-1][0] and stack[-1][2]:
                stack[-1][1] = json.loads(token.group())
                stack[-1][2] = False
        return None

    def _at(self, offset: int) -> Location:
        line = self.line + self.text.count("\n", 0, offset)
        return Location(self.file, line, offset - self.text.rfind("\n", 0, offset))


# A JSON string, or one structural character; numbers, literals and blanks are not matched.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')
# A surrogate escape, searched in the UTF-8 bytes: a pattern with a surrogate character as
# well was a per-character scan several times slower than json.loads of the same text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BAD_KEY = object()


def _may_hold_surrogate(text: str) -> bool:
    """Whether ``text`` may decode to a lone surrogate: it holds a surrogate character
    (the one thing UTF-8 cannot encode) or a surrogate escape."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return _SURROGATE_ESCAPE.search(raw) is not None


def json_problem(
    value: Any, max_depth: int, text: str | None = None
) -> tuple[JsonPath, str] | None:
    """The first value of parsed JSON, in document order, that no reader should accept,
    and why: ``"depth"`` for an object or array nested more than ``max_depth`` levels deep
    (the outermost value is level 1), ``"surrogate"`` for a string or key that holds a lone
    UTF-16 surrogate (a JSON escape can spell one; no UTF-8 output can hold it), ``"number"``
    for ``NaN`` or an infinity (``json`` reads them; JSON has no such numbers). None when all
    is well. ``text``, the JSON the value was parsed from, lets it skip the tests that the
    text shows cannot fail.

    One loop, no recursion: the depth it refuses is what recursive code downstream (pydantic,
    ``json.dumps``, copies) could not handle."""
    strings = text is None or _may_hold_surrogate(text)
    numbers = text is None or "NaN" in text or "Infinity" in text
    stack: list[tuple[JsonPath, Any]] = [((), value)]
    while stack:
        path, v = stack.pop()
        if v is _BAD_KEY:
            return path, "surrogate"
        if isinstance(v, dict):
            if len(path) >= max_depth:
                return path, "depth"
            children = list(v.items())
        elif isinstance(v, list):
            if len(path) >= max_depth:
                return path, "depth"
            children = list(enumerate(v))
        elif isinstance(v, str):
            if _SURROGATE.search(v):
                return path, "surrogate"
            continue
        else:
            if isinstance(v, float) and not math.isfinite(v):
                return path, "number"
            continue
        for step, child in reversed(children):
            if strings and isinstance(step, str) and _SURROGATE.search(step):
                # Found when its value is reached, so keys and values keep document order.
                stack.append(((*path, step), _BAD_KEY))
            elif (
                isinstance(child, dict | list)
                or (strings and isinstance(child, str))
                or (numbers and isinstance(child, float))
            ):
                stack.append(((*path, step), child))
    return None


_Want = dict[str | int, "_Want"]
_DECODER = json.JSONDecoder()
_BLANK = re.compile(r"[ \t\r\n]*")


def _skip(text: str, i: int) -> int:
    blank = _BLANK.match(text, i)
    return blank.end() if blank else i


def _offsets(text: str, paths: Iterable[JsonPath]) -> dict[JsonPath, int]:
    """Character offset of each of ``paths`` and their ancestors that ``text`` holds.

    Reads only the containers on the paths, member by member, and lets the C decoder skip
    every other value whole, so the cost is one decode of the text at most (no recursion,
    no per-character Python loop over skipped values)."""
    want: _Want = {}
    for path in paths:
        node = want
        for key in path:
            node = node.setdefault(key, {})
    i = _skip(text, 0)
    found: dict[JsonPath, int] = {(): i}
    n = len(text)
    if not want or i >= n or text[i] not in "{[":
        return found
    # The container being read: the steps wanted in it, its path, whether it is an object,
    # and the index of its next member; the containers around it wait on the stack.
    node, path, is_obj, index = want, (), text[i] == "{", 0
    stack: list[tuple[_Want, JsonPath, bool, int]] = []
    i = _skip(text, i + 1)
    try:
        while True:
            if i < n and text[i] in "}]":
                if not stack:
                    return found
                node, path, is_obj, index = stack.pop()
                i = _next_member(text, i + 1)
                continue
            step: str | int
            if is_obj:
                step, i = _DECODER.raw_decode(text, i)
                i = _skip(text, _skip(text, i) + 1)  # past the colon
            else:
                step = index
            index += 1
            below = node.get(step)
            if below is not None:
                here = (*path, step)
                if here in found:  # a repeated key: forget what the earlier value held
                    for p in [p for p in found if p[: len(here)] == here]:
                        del found[p]
                found[here] = i
                if below and i < n and text[i] in "{[":
                    stack.append((node, path, is_obj, index))
                    node, path, is_obj, index = below, here, text[i] == "{", 0
                    i = _skip(text, i + 1)
                    continue
            _, i = _DECODER.raw_decode(text, i)
            i = _next_member(text, i)
    except (ValueError, RecursionError):
        return found


def _next_member(text: str, i: int) -> int:
    """Past the blanks and the comma that follow a member's value."""
    i = _skip(text, i)
    if i < len(text) and text[i] == ",":
        i = _skip(text, i + 1)
    return i
