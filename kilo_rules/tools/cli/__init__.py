"""The ``kilo-rules`` command line: ``main(argv) -> int``, one module per command.

Every command runs under one guarded runner and exits with one set of codes:

* 0 (``EXIT_OK``): success; also when the reader of a pipe stops early (``| head``).
* 1 (``EXIT_DIAGNOSTICS``): diagnostics, the input is wrong (a policy, model, session or
  log); ``simulate``: a policy stopped early.
* 2 (``EXIT_USAGE``): usage or I/O problems (a bad option, a file that cannot be read or
  written; an unknown log format, a run out of range, a file already in Session v1).
* 3 (``EXIT_OVER_WINDOW``): ``build --strict`` built a request that does not fit the model's
  context window (without ``--strict`` the same request exits 0 with a warning on stderr).

Structured output takes ``--format text|json`` (``check`` also ``github``); long values in
tables end in an ellipsis, and ``--full`` shows them whole.

The parser is the standard library's :mod:`argparse`: it serves every command here, and a
third-party CLI framework would add a core dependency without removing any of the exit-code
and error handling above, which is the project's own.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from importlib import import_module
from typing import TextIO

from kilo_rules.engine.base.errors import MultipleRunsWarning
from kilo_rules.engine.base.sandbox import allow_read
from kilo_rules.engine.base.version import __version__
from kilo_rules.tools.cli._options import read_roots, settings_in_environment
from kilo_rules.tools.cli._runner import (
    EPILOG,
    EXIT_CODES,
    EXIT_DIAGNOSTICS,
    EXIT_OK,
    EXIT_OVER_WINDOW,
    EXIT_USAGE,
    guarded,
    require_extra,
)

__all__ = [
    "EXIT_CODES",
    "EXIT_DIAGNOSTICS",
    "EXIT_OK",
    "EXIT_OVER_WINDOW",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

#: The commands in the order ``--help`` lists them, each with the module that defines it.
#: A command's module (and what it imports) loads only when that command runs, or for the
#: full ``--help``: ``kilo-rules check`` does not import the runtime or the sidecar.
COMMANDS: dict[str, str] = {
    "check": "check",
    "test": "test",
    "schema": "schema",
    "models": "models",
    "plan": "plan",
    "diff": "diff",
    "build": "build",
    "demo": "demo",
    "import": "import_",
    "simulate": "simulate",
    "tune": "tune",
    "verify": "verify",
    "bundle": "bundle",
    "serve": "serve",
    "gateway": "gateway",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation): every command, or only
    ``command`` when it names one."""
    parser = argparse.ArgumentParser(
        prog="kilo-rules",
        description="Context policies as code: check, compile and apply YAML policies.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kilo-rules {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = [command] if command in COMMANDS else list(COMMANDS)
    for name in names:
        import_module(f".{COMMANDS[name]}", __name__).register(sub)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs: its first word, when no top-level option comes first."""
    for word in argv:
        return None if word.startswith("-") else word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(words))
    # Parsing runs guarded too: ``--help`` into a closed pipe must end as quietly as output.
    return guarded(lambda: _run(parser, argv))


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # --json was the switch before --format; say what replaced it.
            hint = " (use --format json)" if "--json" in extra else ""
            parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    except SystemExit as exc:  # argparse exits on --help, --version and usage errors
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return guarded(lambda: _handle(args), f"kilo-rules {args.command}")


def _handle(args: argparse.Namespace) -> int:
    # Every command reads policies under the same roots, set once here rather than passed
    # to each check and compile call.
    # The same for the network policy: read from KILO_RULES_NET_* here, never by the library.
    extra = _extra_needed(args)
    if extra is not None:
        require_extra(extra)
    with allow_read(read_roots(args)), _network(), _notes(args.command):
        return int(args.handler(args))


def _network() -> contextlib.AbstractContextManager[object]:
    """The network policy of ``KILO_RULES_NET_*`` in force for the command. When the
    environment holds no setting, that policy is the library's default, already in force."""
    if not settings_in_environment():
        return contextlib.nullcontext()
    from kilo_rules.engine.base.net import NetworkSettings, use_network

    return use_network(NetworkSettings())


def _extra_needed(args: argparse.Namespace) -> str | None:
    """The optional extra the command about to run needs, checked before it starts so that
    every missing extra ends the same way (``kilo-rules X needs the 'Y' extra``, exit 2)."""
    if args.command in ("serve", "gateway"):
        return "serve"
    if args.command == "bundle" and args.action in ("sign", "keygen"):
        return "bundle"  # verify needs it only for a signed bundle: the library says when
    if getattr(args, "executor", None) == "dask" or getattr(args, "scheduler", None):
        return "distributed"
    return None


@contextlib.contextmanager
def _notes(command: str) -> Iterator[None]:
    """Show the library's :class:`MultipleRunsWarning` as a note in the CLI's words, every
    time it is given, whatever the warning filters say; other warnings as before."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", MultipleRunsWarning)
        shown = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if isinstance(message, MultipleRunsWarning):
                print(run_note(command, message), file=sys.stderr)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def run_note(command: str, w: MultipleRunsWarning) -> str:
    """The note a command prints when it read run ``w.run`` of a log that holds several."""
    what = f" ({w.instance})" if w.instance else ""
    return (
        f"kilo-rules {command}: note: {w.file} holds {w.runs} runs (one per line); "
        f"read run {w.run}{what}; pick another with --run N (0–{w.runs - 1})"
    )
