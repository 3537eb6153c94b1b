"""The exit codes of every command, and the one runner that maps failures onto them."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import import_module
from pathlib import Path

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, render_text

EXIT_OK, EXIT_DIAGNOSTICS, EXIT_USAGE, EXIT_OVER_WINDOW = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

#: What each exit code means, for ``--help`` and the documentation.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_DIAGNOSTICS, "diagnostics: a policy, model, session or log is wrong"),
    (EXIT_USAGE, "usage or I/O: a bad option, a file that cannot be read or written"),
    (EXIT_OVER_WINDOW, "build --strict: the request does not fit the context window"),
)

EPILOG = "exit codes:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES)

# Diagnostics about what was asked rather than about what a file holds: they exit like a
# bad option. Every ``io.*`` code (a file that cannot be read or written) and every
# ``config.*`` one (a bad --config or KILO_RULES_* value) is one too.
_USAGE_CODES = frozenset(
    {
        "import.run",
        "import.session-v1",
        "import.unknown-format",
        # simulate --session naming nothing that exists is a usage error, as a missing file
        "simulate.no-sessions",
        "simulate.session-not-found",
        "simulate.too-many-sessions",
    }
)
_USAGE_PREFIXES = ("io.", "config.")


#: Each optional extra (pyproject's optional-dependencies) and the modules a command needs
#: from it; a command that lacks one exits ``EXIT_USAGE`` with :func:`extra_message`.
EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "starlette", "uvicorn", "h11", "anyio", "prometheus_client"),
    "bundle": ("cryptography",),
    "distributed": ("dask", "distributed"),
}
_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}
# The library's own diagnostics for an extra it could not import.
_EXTRA_CODES = {
    "bundle.cryptography-missing": "bundle",
    "simulate.distributed-missing": "distributed",
}
_PROG: contextvars.ContextVar[str] = contextvars.ContextVar("prog", default="kilo-rules")


class ExtraMissingError(Exception):
    """An optional extra the command needs is not installed (``module`` could not be
    imported)."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(f"the {extra!r} extra is missing ({module} cannot be imported)")
        self.extra, self.module = extra, module


def require_extra(extra: str) -> None:
    """Import the modules of ``extra``; raise :class:`ExtraMissingError` naming the first that
    cannot be imported. Every command that needs an extra calls this before it starts."""
    for module in EXTRAS[extra]:
        try:
            import_module(module)
        except ImportError:
            raise ExtraMissingError(extra, module) from None


def extra_message(prog: str, extra: str) -> str:
    """The one line every command prints for a missing extra."""
    return f"{prog} needs the {extra!r} extra: pip install 'kilo-rules[{extra}]'"


def _missing_extra(prog: str, extra: str) -> int:
    print(extra_message(prog, extra), file=sys.stderr)
    return EXIT_USAGE


def exit_code(diagnostics: Iterable[Diagnostic]) -> int:
    """``EXIT_USAGE`` when every diagnostic is about the request (an unreadable file, a run
    out of range, an unknown format), else ``EXIT_DIAGNOSTICS``."""
    codes = [d.code for d in diagnostics]
    usage = all(c.startswith(_USAGE_PREFIXES) or c in _USAGE_CODES for c in codes)
    return EXIT_USAGE if codes and usage else EXIT_DIAGNOSTICS


def relative(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """``diagnostics`` with their files shown relative to the working directory."""
    return [dataclasses.replace(d, location=d.location.relative()) for d in diagnostics]


def session_failure(
    prog: str, session: str, diagnostics: Sequence[Diagnostic], error: str | None = None
) -> str:
    """One session of a corpus run that failed, for stderr: its diagnostics with their
    locations, led by the session's name when none is located in it (a policy that does
    not compile fails every session), or ``error`` when it has no diagnostics."""
    if not diagnostics:
        return f"{prog}: {session}: {error or 'failed'}"
    text = render_text(relative(diagnostics))
    if any(d.location.file == session for d in diagnostics):
        return text
    return f"{prog}: {session}: {text}"


def report(exc: KiloRulesError, sources: Mapping[str, str] | None = None) -> int:
    """Print the diagnostics of ``exc`` on stderr (with source lines and carets when
    ``sources`` holds the files); returns the exit code. The library's diagnostic for an
    extra it could not import is the missing-extra line instead."""
    extras = {_EXTRA_CODES.get(d.code) for d in exc.diagnostics}
    if len(extras) == 1 and None not in extras:
        return _missing_extra(_PROG.get(), str(extras.pop()))
    shown = relative(exc.diagnostics)
    by_shown = {
        d.location.file: sources[o.location.file]
        for o, d in zip(exc.diagnostics, shown, strict=True)
        if sources and o.location.file in sources
    }
    print(render_text(shown, by_shown), file=sys.stderr)
    return exit_code(exc.diagnostics)


def guarded(action: Callable[[], int], prog: str = "kilo-rules") -> int:
    """Run ``action`` and return its exit code, turning each failure class into its own:
    diagnostics 1 (2 for a file that cannot be read), I/O and bad values 2, Ctrl-C 130.

    A reader that stops early (``kilo-rules models | head -1``) ends the command quietly
    with 0, as ``cat`` does: what it asked for, it got."""
    token = _PROG.set(prog)
    try:
        code = action()
        # Flush here so that a closed pipe is seen now, not at interpreter exit.
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # before OSError, of which it is one
        _discard_stdout()
        return EXIT_OK
    except ExtraMissingError as exc:
        return _missing_extra(prog, exc.extra)
    except ModuleNotFoundError as exc:
        extra = _EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        return _missing_extra(prog, extra)
    except KiloRulesError as exc:
        return report(exc)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{prog}: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        _PROG.reset(token)


def _discard_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush of what is
    still buffered cannot fail again on the closed pipe (the recipe of Python's ``signal``
    documentation)."""
    # A stdout that is not a file (a test's capture) has nothing left to flush.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def read_key(path: str) -> bytes:
    """The bytes of a key file (``--key``, ``--pubkey``); raises OSError."""
    # A key file is small; reading a few kilobytes at most keeps /dev/zero harmless.
    with Path(path).open("rb") as fh:
        return fh.read(64 * 1024)
