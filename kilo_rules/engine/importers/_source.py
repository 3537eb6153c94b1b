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

from kilo_rules.engine.base.errors import Diagnostic, ImportFormatError, Location
from kilo_rules.engine.base.source import JsonPath, JsonText, json_problem
from kilo_rules.engine.formats.session import (
    MAX_BYTES,
    MAX_DEPTH,
    NumberTooLongError,
    number_location,
    parse_json,
    problem_diagnostic,
)

# parse_json raises on these; a corrupted copy of a log must never escape as a traceback.
_DECODE_ERRORS = (json.JSONDecodeError, RecursionError, NumberTooLongError)

MAX_LOG_DEPTH = MAX_DEPTH - 10
"""How deeply a log may nest: an importer copies log values into a session a few levels
further down (``messages[i].parts[j].metadata…``), and that session must load back."""


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
        where = _dotted(path)
        fail(code, f"{where}: {message}" if where else message, self.location(path))


@dataclass(frozen=True, slots=True)
class Source:
    """A decoded log: its records, and whether it was one document or JSON Lines."""

    file: str
    kind: Literal["json", "jsonl"]
    records: list[Record]

    def check(self) -> None:
        """Refuse a record nested deeper than :data:`MAX_LOG_DEPTH`, or holding a lone UTF-16
        surrogate or a NaN (see :func:`~kilo_rules.engine.base.source.json_problem`), located at the
        offending value."""
        for rec in self.records:
            problem = json_problem(rec.value, MAX_LOG_DEPTH, rec.text)
            if problem is not None:
                path, kind = problem
                raise ImportFormatError(
                    problem_diagnostic("import", kind, path, rec.location(path), MAX_LOG_DEPTH)
                )


def check_size(text: str, file: str) -> None:
    """Refuse a text of more than :data:`~kilo_rules.engine.formats.session.MAX_BYTES` UTF-8
    bytes."""
    # A character is at least one byte, so most texts are judged without encoding them.
    if len(text) <= MAX_BYTES // 4 or (
        len(text) <= MAX_BYTES and len(text.encode("utf-8", "surrogatepass")) <= MAX_BYTES
    ):
        return
    fail_size(file)


def fail_size(file: str) -> NoReturn:
    """Raise the error of a log larger than :data:`~kilo_rules.engine.formats.session.MAX_BYTES`."""
    raise ImportFormatError(
        Diagnostic(
            "import.size",
            f"the file is larger than the limit of {MAX_BYTES:,} bytes",
            Location(file, 1, 1),
            details={"limit": MAX_BYTES},
        )
    )


def _dotted(path: JsonPath) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _fail_depth(path: JsonPath, location: Location) -> NoReturn:
    raise ImportFormatError(problem_diagnostic("import", "depth", path, location, MAX_LOG_DEPTH))


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
            value = parse_json(text)
        except NumberTooLongError as exc:
            _raise_decode(exc, JsonText(file, text))
        except _DECODE_ERRORS as exc:
            doc_error = exc
        else:
            return Source(file, "json", [Record(file, 1, text, value)])
        lines_ok = _first_line_is_json(text)
        if prefer == "json" or not lines_ok:
            _raise_decode(
                doc_error,
                JsonText(file, text),
                hint="this looks like JSON Lines, and the chosen format is one JSON document"
                if lines_ok
                else None,
            )
    records = []
    for number, line_text in enumerate(_lines(text), start=1):
        if not line_text.strip():
            continue
        try:
            value = parse_json(line_text)
        except _DECODE_ERRORS as exc:
            _raise_decode(exc, JsonText(file, line_text, number))
        records.append(Record(file, number, line_text, value))
    return Source(file, "jsonl", records)


def _first_line_is_json(text: str) -> bool:
    for line in _lines(text):
        if line.strip():
            try:
                parse_json(line)
            except NumberTooLongError:
                return True  # JSON, with a number refused where the line is read
            except _DECODE_ERRORS:
                return False
            return True
    return False


def _raise_decode(exc: Exception, where: JsonText, hint: str | None = None) -> NoReturn:
    if isinstance(exc, NumberTooLongError):
        fail(
            "import.number",
            str(exc),
            number_location(where.text, where.file, exc.offset, where.line),
        )
    if isinstance(exc, json.JSONDecodeError):
        fail(
            "import.json",
            f"not valid JSON: {exc.msg}",
            Location(where.file, exc.lineno + where.line - 1, exc.colno),
            hint=hint,
        )
    # Too deep for the decoder: far deeper than any log may nest.
    deep = where.too_deep(MAX_LOG_DEPTH)
    if deep is not None:
        _fail_depth(*deep)
    fail("import.json", "not valid JSON: nested too deeply", where.locate())


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


def parse_embedded(text: str) -> tuple[Any, bool]:
    """JSON held in a string of the log (tool-call arguments, a stored model response) →
    (value, True), or (None, False) when it does not parse or holds what a log may not
    (see :meth:`Source.check`): a model writes such text, and a bad one is kept as text."""
    try:
        value = parse_json(text)
    except _DECODE_ERRORS:
        return None, False
    return (None, False) if json_problem(value, MAX_LOG_DEPTH, text) else (value, True)


def opt_str_at(rec: Record, path: JsonPath, value: Any) -> str | None:
    """``value`` if it is a string, None if it is null or missing, else a located error."""
    if value is None:
        return None
    return need_str(rec, path, value)


def opt_dict_at(rec: Record, path: JsonPath, value: Any) -> dict[str, Any] | None:
    """``value`` if it is an object, None if it is null or missing, else a located error."""
    if value is None:
        return None
    return need_dict(rec, path, value)


def obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (for optional, free-form parts)."""
    return value if isinstance(value, dict) else {}


def opt_str(value: Any) -> str | None:
    """``value`` if it is a string, else None."""
    return value if isinstance(value, str) else None
