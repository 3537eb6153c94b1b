"""Importers: recorded agent logs → Session v1.

One module per foreign format, each with ``NAME``, ``DESCRIPTION``, ``sniff(source)`` and
``convert(source, run)``. :func:`import_file` reads a file, :func:`detect_format` picks the
format when it is not given, and every problem (bad UTF-8, a line that is not JSON, a value
of the wrong shape, an unknown format) is an :class:`~kilo_rules.errors.ImportFormatError`
located ``file:line:col``. A Session v1 document is not a log: the importers refuse it.

:func:`read_session` is the reader for anything a user may pass as ``--session``: it tells
Session v1 from a log by parsing the file once (never by looking at a prefix), validates
Session v1 as such and imports everything else.

>>> from kilo_rules.importers import import_file
>>> session = import_file("examples/sessions/swe-agent-gpt4-pydicom-1458.traj")
>>> session.messages[0].role
'user'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from .. import safefs
from ..errors import Diagnostic, ImportFormatError, Location, did_you_mean
from ..load import read_error
from ..session import MAX_BYTES, Session, is_session_v1, session_from_data
from . import (
    anthropic_messages,
    claude_code,
    mini_swe_agent,
    openai_chat,
    openhands,
    swe_agent,
)
from ._source import Source, check_size, decode, fail, fail_size, load

__all__ = [
    "FORMATS",
    "detect_format",
    "import_file",
    "import_text",
    "read_session",
    "read_session_bytes",
    "read_session_text",
]

_Sniff = Callable[[Source], bool]
_Convert = Callable[[Source, int], Session]

# Detection order matters: the specific shapes first, the generic chat arrays last.
_MODULES = (mini_swe_agent, swe_agent, openhands, claude_code, anthropic_messages, openai_chat)
_SNIFF: dict[str, _Sniff] = {m.NAME: m.sniff for m in _MODULES}
_CONVERT: dict[str, _Convert] = {m.NAME: m.convert for m in _MODULES}
# JSON Lines formats; the others are one JSON document.
_JSONL = {claude_code.NAME, openhands.NAME}

FORMATS: Mapping[str, str] = MappingProxyType(
    {m.NAME: m.DESCRIPTION for m in sorted(_MODULES, key=lambda m: m.NAME)}
)
"""Format name → one-line description, for ``fmt=`` and ``kilo-rules import --from``."""


def _parse(text: str, fmt: str, name: str) -> Source:
    if fmt != "auto" and fmt not in _CONVERT:
        guess = did_you_mean(fmt, _CONVERT)
        fail(
            "import.unknown-format",
            f"unknown format {fmt!r}",
            Location(name, 1, 1),
            hint=(f"did you mean {guess!r}? " if guess else "")
            + "known formats: "
            + ", ".join(FORMATS),
        )
    check_size(text, name)
    prefer: Literal["json", "jsonl", "auto"] = "auto"
    if fmt != "auto":
        prefer = "auto" if fmt in _JSONL else "json"
    return load(text, name, prefer)


def _session_v1(src: Source) -> bool:
    return src.kind == "json" and is_session_v1(src.records[0].value)


def _detect(src: Source, fmt: str) -> str:
    if _session_v1(src):
        # A generic chat sniffer would take it for a chat log and drop every part; even a
        # named format cannot make sense of it.
        fail(
            "import.session-v1",
            "this is already a Session v1 file: there is nothing to import",
            src.records[0].location(("version",)),
            hint="pass it as it is to build or simulate (--session FILE)",
        )
    if fmt != "auto":
        return fmt
    for candidate, sniff in _SNIFF.items():
        if sniff(src):
            return candidate
    raise ImportFormatError(
        Diagnostic(
            "import.format",
            f"cannot tell the format of this {'JSON Lines file' if src.kind == 'jsonl' else 'JSON'}"
            f" (tried {', '.join(_SNIFF)})",
            Location(src.file, src.records[0].line, 1),
            hint="name the format with fmt= (CLI: --from FORMAT)",
        )
    )


def _one_run(run: int | None, what: str, name: str) -> None:
    if run not in (None, 0):
        fail(
            "import.run",
            f"run {run} is out of range: a {what} holds 1 run (run 0)",
            Location(name, 1, 1),
        )


def _convert(src: Source, fmt: str, run: int | None) -> Session:
    src.check()
    if fmt == openhands.NAME:
        return openhands.convert(src, run or 0)
    _one_run(run, f"{fmt} log", src.file)
    return _CONVERT[fmt](src, 0)


def detect_format(text: str, *, name: str = "<text>") -> str:
    """The name of the format of ``text`` (a key of :data:`FORMATS`).

    Raises :class:`ImportFormatError` when the text is not JSON / JSON Lines (located at the
    bad line and column), is already Session v1, or matches none of the formats (the message
    names those tried)."""
    return _detect(_parse(text, "auto", name), "auto")


def import_text(
    text: str, *, fmt: str = "auto", run: int | None = None, name: str = "<text>"
) -> Session:
    """Import a log held in memory. ``name`` is the file name used in error locations.

    ``run`` selects one run of a file that holds several (OpenHands eval output: one per
    line), 0-based, default 0; other formats hold exactly one. A Session v1 document is
    refused (code ``import.session-v1``): it needs no import."""
    src = _parse(text, fmt, name)
    return _convert(src, _detect(src, fmt), run)


def read_session_text(text: str, *, run: int | None = None, name: str = "<text>") -> Session:
    """A Session v1 document, or a log in any format the importers recognise, as a session.

    The text is parsed once. When :func:`~kilo_rules.session.is_session_v1` holds for the
    parsed value it is validated as Session v1, and a bad one is a located
    :class:`~kilo_rules.errors.SessionError`; anything else is imported as by
    :func:`import_text` with the format detected."""
    src = _parse(text, "auto", name)
    if _session_v1(src):
        _one_run(run, "Session v1 file", name)
        return session_from_data(src.records[0].value, file=name, text=text)
    return _convert(src, _detect(src, "auto"), run)


def read_session_bytes(data: bytes, *, run: int | None = None, name: str = "<bytes>") -> Session:
    """A session from the bytes of a file already read (UTF-8; see
    :func:`read_session_text`), for callers that read it themselves, e.g. through the
    sandbox; a text of more than :data:`~kilo_rules.session.MAX_BYTES` is refused."""
    if len(data) > MAX_BYTES:
        fail_size(name)
    return read_session_text(decode(data, name), run=run, name=name)


def read_session(path: str | Path, *, run: int | None = None) -> Session:
    """The session in the file at ``path``: Session v1 or a recorded log (UTF-8; see
    :func:`read_session_text`). Only a regular file is read: a FIFO, device or directory is
    refused without blocking, as an unreadable file is, with an :class:`OSError`
    (:class:`~kilo_rules.safefs.ReadRefused`, whose ``reason`` says why); a file larger than
    :data:`~kilo_rules.session.MAX_BYTES` is an :class:`ImportFormatError` (code
    ``import.size``), refused without reading it whole."""
    p = Path(path)
    return read_session_bytes(_read(p), run=run, name=str(p))


def _read(path: Path) -> bytes:
    try:
        return safefs.read_regular(path, max_bytes=MAX_BYTES)
    except safefs.ReadRefused as exc:
        if exc.reason == "too-large":
            fail_size(str(path))
        raise


def import_file(path: str | Path, *, fmt: str = "auto", run: int | None = None) -> Session:
    """Import the log at ``path`` (UTF-8; see :func:`import_text`).

    An unreadable file is an :class:`ImportFormatError` with code ``io.read`` (a FIFO,
    device or directory: ``io.not-regular-file``, refused without blocking), one larger
    than :data:`~kilo_rules.session.MAX_BYTES` one with code ``import.size``."""
    p = Path(path)
    try:
        data = _read(p)
    except OSError as exc:
        raise ImportFormatError(read_error(exc, str(p), str(p))) from None
    return import_text(decode(data, str(p)), fmt=fmt, run=run, name=str(p))
