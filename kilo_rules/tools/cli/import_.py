"""``kilo-rules import FILE [--from FORMAT] [-o OUT.json] [--run N]``: a recorded agent
log as Session v1 JSON, on stdout or in ``OUT.json``. ``FILE`` may be ``-`` for stdin.

Every problem is a ``file:line:col: error[code]: message`` diagnostic on stderr; a log
that cannot be imported exits 1, a file that cannot be read or written, an unknown
format, a run out of range or a file that is already Session v1 exit 2."""

from __future__ import annotations

import argparse
import sys

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, ImportFormatError, KiloRulesError, Location
from kilo_rules.engine.formats.load import read_error
from kilo_rules.engine.formats.session import MAX_BYTES, dump_session
from kilo_rules.engine.importers import FORMATS, import_text
from kilo_rules.engine.importers._source import decode, fail_size
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_OK, report

# A source line longer than this is not echoed under a diagnostic: Claude Code lines run to
# tens of kilobytes and would bury the message.
_MAX_ECHO = 240


def register(sub: opt.Subcommands) -> None:
    """Add ``import`` to the subcommands."""
    p = opt.add_command(
        sub,
        "import",
        summary="import a recorded agent log into Session v1",
        description="Import a recorded agent log into Session v1 JSON. Formats: "
        + "; ".join(f"{name} ({what})" for name, what in FORMATS.items())
        + ".",
    )
    p.add_argument("file", metavar="FILE", help="the agent log to import (- for stdin)")
    p.add_argument(
        "--from",
        dest="fmt",
        metavar="FORMAT",
        default="auto",
        choices=["auto", *FORMATS],
        help="log format (default: auto-detect): " + ", ".join(FORMATS),
    )
    p.add_argument(
        "-o", "--output", metavar="OUT.json", help="write the session here instead of stdout"
    )
    opt.add_run(p)
    p.set_defaults(handler=run)


def _io_error(code: str, name: str, what: str, exc: OSError) -> KiloRulesError:
    return KiloRulesError(
        Diagnostic(code, f"cannot {what}: {exc.strerror or exc}", Location(name, 1, 1))
    )


def run(args: argparse.Namespace) -> int:
    """Import the log and write the session."""
    name = "<stdin>" if args.file == "-" else str(args.file)
    try:
        # At most one byte past the cap. Stdin may be a pipe; a FILE named must be a
        # regular file (a FIFO or device is refused without blocking).
        if args.file == "-":
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            data = safefs.read_regular(args.file, max_bytes=MAX_BYTES)
    except safefs.ReadRefused as exc:
        if exc.reason != "too-large":
            raise KiloRulesError(read_error(exc, name, what="")) from None
        fail_size(name)
    except OSError as exc:
        raise _io_error("io.read", name, "read", exc) from exc
    if len(data) > MAX_BYTES:
        fail_size(name)
    text = ""
    try:
        text = decode(data, name)
        session = import_text(text, fmt=args.fmt, run=args.run, name=name)
    except ImportFormatError as exc:
        return report(exc, {name: text} if _short_lines(text, exc) else None)
    out = dump_session(session) + "\n"
    if args.output in (None, "-"):
        sys.stdout.write(out)
        return EXIT_OK
    try:
        # Whole or not at all: a run killed mid-write leaves the old file, never half a one.
        safefs.write_atomic(args.output, out)
    except OSError as exc:
        raise _io_error("io.write", args.output, "write", exc) from exc
    return EXIT_OK


def _short_lines(text: str, exc: ImportFormatError) -> bool:
    lines = text.split("\n")
    for diag in exc.diagnostics:
        n = diag.location.line
        if not 1 <= n <= len(lines) or len(lines[n - 1]) > _MAX_ECHO:
            return False
    return True
