"""Importers: recorded agent logs → Session v1.

One module per foreign format, each with ``NAME``, ``DESCRIPTION``, ``sniff(source)`` and
``convert(source, run)``. :func:`import_file` reads a file, :func:`detect_format` picks the
format when it is not given, and every problem (bad UTF-8, a line that is not JSON, a value
of the wrong shape, an unknown format) is an :class:`~kilo_rules.errors.ImportFormatError`
located ``file:line:col``.

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

from ..errors import Diagnostic, ImportFormatError, Location, did_you_mean
from ..session import Session
from . import (
    anthropic_messages,
    claude_code,
    mini_swe_agent,
    openai_chat,
    openhands,
    swe_agent,
)
from ._source import Source, decode, fail, load

__all__ = ["FORMATS", "detect_format", "import_file", "import_text"]

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


def _load(text: str, fmt: str, name: str) -> tuple[Source, str]:
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
    prefer: Literal["json", "jsonl", "auto"] = "auto"
    if fmt != "auto":
        prefer = "auto" if fmt in _JSONL else "json"
    src = load(text, name, prefer)
    if fmt != "auto":
        return src, fmt
    for candidate, sniff in _SNIFF.items():
        if sniff(src):
            return src, candidate
    raise ImportFormatError(
        Diagnostic(
            "import.format",
            f"cannot tell the format of this {'JSON Lines file' if src.kind == 'jsonl' else 'JSON'}"
            f" (tried {', '.join(_SNIFF)})",
            Location(name, src.records[0].line, 1),
            hint="name the format with fmt= (CLI: --from FORMAT)",
        )
    )


def detect_format(text: str, *, name: str = "<text>") -> str:
    """The name of the format of ``text`` (a key of :data:`FORMATS`).

    Raises :class:`ImportFormatError` when the text is not JSON / JSON Lines (located at the
    bad line and column) or matches none of the formats (the message names those tried)."""
    return _load(text, "auto", name)[1]


def import_text(
    text: str, *, fmt: str = "auto", run: int | None = None, name: str = "<text>"
) -> Session:
    """Import a log held in memory. ``name`` is the file name used in error locations.

    ``run`` selects one run of a file that holds several (OpenHands eval output: one per
    line), 0-based, default 0; other formats hold exactly one."""
    src, chosen = _load(text, fmt, name)
    if chosen == openhands.NAME:
        return openhands.convert(src, run or 0)
    if run not in (None, 0):
        fail(
            "import.run",
            f"run {run} is out of range: a {chosen} log holds 1 run (run 0)",
            Location(name, 1, 1),
        )
    return _CONVERT[chosen](src, 0)


def import_file(path: str | Path, *, fmt: str = "auto", run: int | None = None) -> Session:
    """Import the log at ``path`` (UTF-8; see :func:`import_text`).

    An unreadable file is an :class:`ImportFormatError` with code ``io.read``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        fail("io.read", f"cannot read {p}: {exc.strerror or exc}", Location(str(p), 1, 1))
    return import_text(decode(data, str(p)), fmt=fmt, run=run, name=str(p))
