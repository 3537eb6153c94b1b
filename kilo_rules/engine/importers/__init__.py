"""Importers: recorded agent logs → Session v1, and :func:`read_session`, the one reader.

:func:`read_session` is the way in for anything a user may hand over as a session: a
Session v1 file or a recorded agent log in any format below, from a path, a text or
already-parsed JSON. It tells Session v1 from a log by parsing once (never by looking at a
prefix), validates Session v1 as such and imports everything else; every problem is a
typed error located ``file:line:col`` (:class:`~kilo_rules.engine.base.errors.SessionError` for a
bad Session v1 or a file that cannot be read,
:class:`~kilo_rules.engine.base.errors.ImportFormatError` for a log).

One module per foreign format, each with ``NAME``, ``DESCRIPTION``, ``sniff(source)`` and
``convert(source, run)``. :func:`import_text` and :func:`import_file` are the importer on
its own, for ``kilo-rules import``: they refuse a Session v1 document, which needs no
import.

>>> from kilo_rules import read_session
>>> session = read_session("examples/sessions/swe-agent-gpt4-pydicom-1458.traj")
>>> session.messages[0].role
'user'

A file that holds several runs (OpenHands evaluation output, one run per line) gives run 0
unless ``run=`` picks one, with a :class:`MultipleRunsWarning` saying how many there are.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import (
    Diagnostic,
    ImportFormatError,
    Location,
    MultipleRunsWarning,
    SessionError,
    did_you_mean,
)
from kilo_rules.engine.formats.load import read_error
from kilo_rules.engine.formats.session import (
    MAX_BYTES,
    Session,
    is_session_v1,
    session_from_data,
    session_from_json,
)
from kilo_rules.engine.importers import (
    anthropic_messages,
    claude_code,
    mini_swe_agent,
    openai_chat,
    openai_responses,
    openhands,
    swe_agent,
)
from kilo_rules.engine.importers._source import Source, check_size, decode, fail, fail_size, load

__all__ = [
    "FORMATS",
    "MultipleRunsWarning",
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
_MODULES = (
    mini_swe_agent,
    swe_agent,
    openhands,
    claude_code,
    openai_responses,
    anthropic_messages,
    openai_chat,
)
_SNIFF: dict[str, _Sniff] = {m.NAME: m.sniff for m in _MODULES}
_CONVERT: dict[str, _Convert] = {m.NAME: m.convert for m in _MODULES}
# JSON Lines formats; the others are one JSON document.
_JSONL = {claude_code.NAME, openhands.NAME}

FORMATS: Mapping[str, str] = MappingProxyType(
    {m.NAME: m.DESCRIPTION for m in sorted(_MODULES, key=lambda m: m.NAME)}
)
"""Format name → one-line description, for ``fmt=`` and ``kilo-rules import --from``."""


def _warn_if_one_of_many(session: Session, run: int | None, file: str, stacklevel: int) -> None:
    """Warn the caller ``stacklevel`` frames up when ``session`` is one run of several and
    ``run`` did not name it."""
    meta = session.metadata.get("import")
    if run is not None or not isinstance(meta, dict):
        return
    runs, chosen = meta.get("runs"), meta.get("run")
    if isinstance(runs, int) and isinstance(chosen, int) and runs > 1:
        oh = session.metadata.get("openhands")
        instance = oh.get("instance_id") if isinstance(oh, dict) else None
        warnings.warn(
            MultipleRunsWarning(
                file,
                runs,
                chosen,
                instance if isinstance(instance, str) else None,
            ),
            stacklevel=stacklevel + 1,
        )


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


_NO_DATA: Any = object()


def import_text(
    text: str, *, fmt: str = "auto", run: int | None = None, name: str = "<text>"
) -> Session:
    """Import a log held in memory (the importer alone: see :func:`read_session`). ``name``
    is the file name used in error locations.

    ``run`` selects one run of a file that holds several (OpenHands eval output: one per
    line), 0-based, default 0 with a :class:`MultipleRunsWarning`; other formats hold
    exactly one. A Session v1 document is refused (code ``import.session-v1``): it needs no
    import."""
    src = _parse(text, fmt, name)
    session = _convert(src, _detect(src, fmt), run)
    _warn_if_one_of_many(session, run, name, stacklevel=2)
    return session


def _read_text(text: str, fmt: str, run: int | None, name: str, stacklevel: int) -> Session:
    src = _parse(text, fmt, name)
    if fmt == "auto" and _session_v1(src):
        # Its metadata may tell of the runs of the log it came from: no choice was made now.
        _one_run(run, "Session v1 file", name)
        # Read again from the text, through the reader session_from_json keeps: the messages
        # met before are taken as they were validated then, and only new ones are checked
        # (a session re-read every step costs what it gained). It gives what validating the
        # value parsed here gives, the same errors at the same places included.
        return session_from_json(text, file=name)
    session = _convert(src, _detect(src, fmt), run)
    _warn_if_one_of_many(session, run, name, stacklevel + 1)
    return session


def read_session(
    path: str | os.PathLike[str] | None = None,
    *,
    text: str | bytes | None = None,
    data: Any = _NO_DATA,
    name: str | None = None,
    fmt: str = "auto",
    run: int | None = None,
) -> Session:
    """The session in a Session v1 document or a recorded agent log, whichever it is.

    Give one source: ``path``, a file (only a regular file is read: a FIFO, device or
    directory is refused without blocking); ``text``, its contents (``bytes`` are decoded
    as UTF-8, a BOM dropped); or ``data``, JSON already parsed (a ``dict``, a ``list``).
    ``name`` is the file name errors are located in (default: ``path``, else ``<text>``
    or ``<data>``).

    With ``fmt="auto"`` the document is parsed once: when
    :func:`~kilo_rules.engine.formats.session.is_session_v1` holds it is validated as Session v1,
    else its format is detected among :data:`FORMATS` and it is imported. A format named in
    ``fmt`` imports it as that log (a Session v1 document is then refused). ``run`` picks
    one run of a file that holds several (OpenHands output, one per line), 0-based; without
    it run 0 is read and a :class:`MultipleRunsWarning` says so.

    Every problem is a typed, located error: :class:`~kilo_rules.engine.base.errors.SessionError`
    for a file that cannot be read (``io.read``, ``io.not-regular-file``) or a bad Session v1,
    :class:`~kilo_rules.engine.base.errors.ImportFormatError` for a log that cannot be imported (an
    unknown format, a run out of range, a file larger than
    :data:`~kilo_rules.engine.formats.session.MAX_BYTES`: ``import.size``)."""
    given = [k for k, v in (("path", path), ("text", text)) if v is not None]
    if data is not _NO_DATA:
        given.append("data")
    if len(given) != 1:
        raise TypeError(
            "read_session() takes one of path, text= or data=, "
            + (f"not {' and '.join(given)}" if given else "and none was given")
        )
    if path is not None:
        file = name or os.fspath(path)
        raw = _read_path(Path(path), file)
        return _read_text(decode(raw, file), fmt, run, file, stacklevel=2)
    if text is not None:
        file = name or "<text>"
        if isinstance(text, bytes):
            if len(text) > MAX_BYTES:
                fail_size(file)
            text = decode(text, file)
        return _read_text(text.removeprefix("\ufeff"), fmt, run, file, stacklevel=2)
    file = name or "<data>"
    if fmt == "auto" and is_session_v1(data):
        _one_run(run, "Session v1 document", file)
        return session_from_data(data, file=file)
    # A log's importer reads records of JSON text; errors are located in its rendering.
    return _read_text(_render(data, file), fmt, run, file, stacklevel=2)


def _render(data: Any, file: str) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, indent=1, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        fail("import.shape", f"not JSON data: {exc}", Location(file, 1, 1))


def _read_path(path: Path, file: str) -> bytes:
    try:
        return safefs.read_regular(path, max_bytes=MAX_BYTES)
    except safefs.ReadRefused as exc:
        if exc.reason == "too-large":
            fail_size(file)
        raise SessionError(read_error(exc, file, "the session")) from None
    except OSError as exc:
        raise SessionError(read_error(exc, file, "the session")) from None


def read_session_text(text: str, *, run: int | None = None, name: str = "<text>") -> Session:
    """``read_session(text=text, name=name, run=run)``, for callers holding the text."""
    return _read_text(text, "auto", run, name, stacklevel=2)


def read_session_bytes(data: bytes, *, run: int | None = None, name: str = "<bytes>") -> Session:
    """``read_session(text=data, name=name, run=run)``, for callers that read the file
    themselves, e.g. through the sandbox."""
    if len(data) > MAX_BYTES:
        fail_size(name)
    return _read_text(decode(data, name), "auto", run, name, stacklevel=2)


def import_file(path: str | Path, *, fmt: str = "auto", run: int | None = None) -> Session:
    """Import the log at ``path`` (UTF-8; the importer alone, see :func:`import_text`).

    An unreadable file is an :class:`ImportFormatError` with code ``io.read`` (a FIFO,
    device or directory: ``io.not-regular-file``, refused without blocking), one larger
    than :data:`~kilo_rules.engine.formats.session.MAX_BYTES` one with code ``import.size``."""
    p = Path(path)
    try:
        data = safefs.read_regular(p, max_bytes=MAX_BYTES)
    except safefs.ReadRefused as exc:
        if exc.reason == "too-large":
            fail_size(str(p))
        raise ImportFormatError(read_error(exc, str(p), str(p))) from None
    except OSError as exc:
        raise ImportFormatError(read_error(exc, str(p), str(p))) from None
    src = _parse(decode(data, str(p)), fmt, str(p))
    session = _convert(src, _detect(src, fmt), run)
    _warn_if_one_of_many(session, run, str(p), stacklevel=2)
    return session
