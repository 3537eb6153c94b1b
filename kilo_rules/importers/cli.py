"""``kilo-rules import FILE [--from FORMAT] [-o OUT.json] [--run N]``.

Writes the imported session as Session v1 JSON to stdout or ``OUT.json``. Exit codes:
0 imported; 1 the log could not be imported (one ``file:line:col: error[code]: message``
diagnostic per problem on stderr); 2 the file could not be read or written, or a bad
argument (unknown format, ``--run`` out of range, a ``FILE`` that is already Session v1).
``FILE`` may be ``-`` for standard input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ImportFormatError, render_text
from ..session import dump_session
from . import FORMATS, import_text
from ._source import decode

EXIT_OK, EXIT_IMPORT, EXIT_IO = 0, 1, 2
# Errors in what was asked rather than in the log: usage errors, like a bad option.
_USAGE_CODES = {"import.run", "import.session-v1", "import.unknown-format"}

# A source line longer than this is not echoed under a diagnostic: Claude Code lines run to
# tens of kilobytes and would bury the message.
_MAX_ECHO = 240


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``import`` subcommand's arguments to ``parser``."""
    parser.add_argument("file", metavar="FILE", help="the agent log to import (- for stdin)")
    parser.add_argument(
        "--from",
        dest="fmt",
        metavar="FORMAT",
        default="auto",
        choices=["auto", *FORMATS],
        help="log format (default: auto-detect): " + ", ".join(FORMATS),
    )
    parser.add_argument(
        "-o", "--output", metavar="OUT.json", help="write the session here instead of stdout"
    )
    parser.add_argument(
        "--run",
        type=int,
        metavar="N",
        default=None,
        help="which run of a multi-run file (OpenHands output.jsonl), 0-based",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``kilo-rules import`` with parsed ``args``; returns the exit code."""
    name = "<stdin>" if args.file == "-" else str(args.file)
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        print(f"{name}: error[io.read]: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_IO
    text = ""
    try:
        text = decode(data, name)
        session = import_text(text, fmt=args.fmt, run=args.run, name=name)
    except ImportFormatError as exc:
        sources = {name: text} if _short_lines(text, exc) else None
        print(render_text(exc.diagnostics, sources), file=sys.stderr)
        return EXIT_IO if exc.diagnostic.code in _USAGE_CODES else EXIT_IMPORT
    out = dump_session(session) + "\n"
    if args.output in (None, "-"):
        sys.stdout.write(out)
        return EXIT_OK
    try:
        Path(args.output).write_text(out, encoding="utf-8")
    except OSError as exc:
        print(
            f"{args.output}: error[io.write]: cannot write: {exc.strerror or exc}", file=sys.stderr
        )
        return EXIT_IO
    return EXIT_OK


def _short_lines(text: str, exc: ImportFormatError) -> bool:
    lines = text.split("\n")
    for diag in exc.diagnostics:
        n = diag.location.line
        if not 1 <= n <= len(lines) or len(lines[n - 1]) > _MAX_ECHO:
            return False
    return True
