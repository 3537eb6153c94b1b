"""Reading a foreign log: bytes → text → JSON records, every failure located ``file:line:col``.

A log is either one JSON document (mini-swe-agent, SWE-agent, chat exports; usually
pretty-printed) or JSON Lines (Claude Code, OpenHands eval output). Both end up as a list of
:class:`Record` s, so that a converter can point at a bad value with :meth:`Record.fail` and the
user sees the line and column of that value in the original file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from ..errors import Diagnostic, ImportFormatError, Location
from ..source import JsonPath, JsonText

# json.loads raises on these; a corrupted copy of a log must never escape as a traceback.
_DECODE_ERRORS = (json.JSONDecodeError, RecursionError)


def fail(code: str, message: str, location: Location, hint: str | None = None) -> NoReturn:
    """Raise one located :class:`ImportFormatError`."""
    raise ImportFormatError(Diagnostic(code, message, location, hint=hint))


@dataclass(frozen=True, slots=True)
class Record:
    """One parsed JSON value and where its text starts in the file.

    ``line`` is the 1-based line of the value's first character; ``text`` is the value's own
    text (one line of a JSONL file, or the whole document), used to locate nested values."""

    file: str
    line: int
    text: str
    value: Any

    def location(self, path: JsonPath = ()) -> Location:
        """Where the value at ``path`` (keys and indexes below this record) starts."""
        return JsonText(self.file, self.text, self.line).locate(path)

    def fail(self, path: JsonPath, message: str, code: str = "import.shape") -> NoReturn:
        """Raise an error located at ``path``; the path is spelled out in the message."""
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
        fail(code, f"{where}: {message}" if where else message, self.location(path))


@dataclass(frozen=True, slots=True)
class Source:
    """A decoded log: its records, and whether it was one document or JSON Lines."""

    file: str
    kind: Literal["json", "jsonl"]
    records: list[Record]


def decode(data: bytes, file: str) -> str:
    """Decode UTF-8 (a BOM is dropped); invalid bytes are reported at their line and column."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[: exc.start]
        line = head.count(b"\n") + 1
        col = len(head[head.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        fail(
            "import.encoding",
            f"not UTF-8: invalid byte 0x{data[exc.start]:02x}",
            Location(file, line, col),
        )
    return text.removeprefix("\ufeff")


def _lines(text: str) -> list[str]:
    # Only "\n" ends a line: str.splitlines would also split on U+2028 and friends, which are
    # legal inside JSON strings, and the line numbers would drift from what editors show.
    return [ln.removesuffix("\r") for ln in text.split("\n")]


def load(text: str, file: str, prefer: Literal["json", "jsonl", "auto"] = "auto") -> Source:
    """Parse ``text`` as one JSON document or as JSON Lines.

    With ``prefer="auto"`` the whole text is tried as one document first; when that fails and
    the first non-empty line is a complete JSON value of its own, the text is JSON Lines.
    Blank lines in JSON Lines are skipped; any other bad line is an error at its line."""
    if not text.strip():
        fail("import.empty", "the file is empty", Location(file, 1, 1))
    if prefer != "jsonl":
        try:
            value = json.loads(text)
        except _DECODE_ERRORS as exc:
            doc_error = exc
        else:
            return Source(file, "json", [Record(file, 1, text, value)])
        lines_ok = _first_line_is_json(text)
        if prefer == "json" or not lines_ok:
            _raise_decode(
                doc_error,
                file,
                0,
                hint="this looks like JSON Lines, and the chosen format is one JSON document"
                if lines_ok
                else None,
            )
    records = []
    for number, line_text in enumerate(_lines(text), start=1):
        if not line_text.strip():
            continue
        try:
            value = json.loads(line_text)
        except _DECODE_ERRORS as exc:
            _raise_decode(exc, file, number - 1)
        records.append(Record(file, number, line_text, value))
    return Source(file, "jsonl", records)


def _first_line_is_json(text: str) -> bool:
    for line in _lines(text):
        if line.strip():
            try:
                json.loads(line)
            except _DECODE_ERRORS:
                return False
            return True
    return False


def _raise_decode(exc: Exception, file: str, line_offset: int, hint: str | None = None) -> NoReturn:
    if isinstance(exc, json.JSONDecodeError):
        fail(
            "import.json",
            f"not valid JSON: {exc.msg}",
            Location(file, exc.lineno + line_offset, exc.colno),
            hint=hint,
        )
    fail("import.json", "not valid JSON: nested too deeply", Location(file, line_offset + 1, 1))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


def need_dict(rec: Record, path: JsonPath, value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else a located error."""
    if not isinstance(value, dict):
        rec.fail(path, f"expected an object, found {_kind(value)}")
    return value


def need_list(rec: Record, path: JsonPath, value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else a located error."""
    if not isinstance(value, list):
        rec.fail(path, f"expected an array, found {_kind(value)}")
    return value


def need_str(rec: Record, path: JsonPath, value: Any) -> str:
    """``value`` if it is a string, else a located error."""
    if not isinstance(value, str):
        rec.fail(path, f"expected a string, found {_kind(value)}")
    return value


def obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (for optional, free-form parts)."""
    return value if isinstance(value, dict) else {}


def opt_str(value: Any) -> str | None:
    """``value`` if it is a string, else None."""
    return value if isinstance(value, str) else None
