"""Which files a policy may read, and reading them so that no file can hurt the reader.

Policies arrive by pull request and as remote bundles, so a file a policy names is
untrusted twice over: *which* file (``/proc/self/environ``, ``../../.ssh/id_rsa``) and
*what* it is (a FIFO that blocks forever, ``/dev/zero``, a 300 MB log). Every file named by
a policy value — a prompt, a system layer, the soul, the summary template, an ``extends:``
base — goes through this module:

* it must lie inside an allowed root, both as written (``..`` collapsed) and after every
  symlink is resolved. The roots are the directory of the file that names it, the bundled
  policies, and whatever the operator adds (``--allow-read DIR``, ``KILO_RULES_READ_ROOTS``,
  or :func:`allow_read` in a program);
* it must be a regular file: FIFOs, devices, sockets and directories are refused from a
  ``stat`` before any ``open``, and the ``open`` itself is non-blocking and re-checked with
  ``fstat``, so a file swapped for a FIFO in between cannot hang the reader either;
* it is read to at most the size cap plus one byte, so a huge file costs the cap, not its size.

Each refusal is a :class:`~kilo_rules.engine.base.errors.PolicyError` diagnostic located at the YAML
value that names the file. The size cap is a parameter: callers pass the one default of
``load.Limits`` (this module sits below ``load`` and may not import it).

The operator's roots live in a :class:`contextvars.ContextVar`, set by the CLI around each
command, so that every path that reads a policy file — ``check`` and ``compile`` alike —
sees the same roots without threading them through each call; the library never reads the
environment itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, Location, PolicyError, did_you_mean

#: What a refused file's hint says (every refusal can be lifted the same way).
ALLOW_HINT = (
    "a policy reads files only under its own directory and the bundled policies; "
    "allow another directory with --allow-read DIR (or KILO_RULES_READ_ROOTS)"
)

_OPERATOR_ROOTS: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar(
    "kilo_rules_read_roots", default=()
)


def operator_roots() -> tuple[Path, ...]:
    """The directories the operator allowed besides the defaults (resolved, absolute)."""
    return _OPERATOR_ROOTS.get()


@contextlib.contextmanager
def allow_read(dirs: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[Path, ...]]:
    """Within the ``with`` block, policies may also read files under ``dirs`` (added to the
    roots already allowed); yields every operator root now in force."""
    added = tuple(Path(d).expanduser().resolve() for d in dirs)
    roots = tuple(dict.fromkeys((*_OPERATOR_ROOTS.get(), *added)))
    token = _OPERATOR_ROOTS.set(roots)
    try:
        yield roots
    finally:
        _OPERATOR_ROOTS.reset(token)


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file named by a policy value: the text as written, where it is written, and the
    directory a relative path starts from (that of the file that names it)."""

    value: str
    at: Location
    base: Path

    @property
    def path(self) -> Path:
        """The path as written, made absolute against :attr:`base` (``..`` kept)."""
        p = Path(self.value).expanduser()
        return p if p.is_absolute() else self.base / p


def _lexical(p: Path) -> Path:
    # Not Path.resolve(): that follows symlinks, and here the path as written is wanted.
    return Path(os.path.normpath(os.path.abspath(p)))  # noqa: PTH100


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def confine(ref: FileRef, roots: Sequence[Path]) -> tuple[Path, Diagnostic | None]:
    """(the file's real path, a refusal if it lies outside every root, as written or once
    its symlinks are resolved). Only names are looked at; nothing is opened."""
    written = _lexical(ref.path)
    real = Path(os.path.realpath(written))
    lexical_roots = [_lexical(r) for r in roots]
    real_roots = [Path(os.path.realpath(r)) for r in lexical_roots]
    if _inside(written, [*lexical_roots, *real_roots]) and _inside(real, real_roots):
        return real, None
    escape = "" if written == real else f" (a symlink to {real})"
    return real, Diagnostic(
        "policy.file-outside-roots",
        f"{ref.value!r} is outside the directories a policy may read{escape}",
        ref.at,
        details={"resolved": str(real), "roots": [str(r) for r in real_roots]},
        hint=ALLOW_HINT,
    )


def _missing(ref: FileRef, what: str) -> Diagnostic:
    target = _lexical(ref.path)
    siblings: list[str] = []
    with contextlib.suppress(OSError):
        siblings = sorted(x.name for x in target.parent.iterdir())
    guess = did_you_mean(target.name, siblings)
    return Diagnostic(
        "policy.missing-file",
        f"{what} {ref.value!r} does not exist",
        ref.at,
        details={"resolved": str(target)},
        hint=f"did you mean {guess!r}?" if guess else "paths are relative to the policy file",
    )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _shape(ref: FileRef, st: os.stat_result, max_bytes: int, what: str) -> Diagnostic | None:
    if not stat.S_ISREG(st.st_mode):
        return Diagnostic(
            "policy.not-a-regular-file",
            f"{what} {ref.value!r} is {_kind(st.st_mode)}; only regular files are read",
            ref.at,
            hint="name a regular file (FIFOs, devices and directories are never read)",
        )
    if st.st_size > max_bytes:
        return _too_large(ref, st.st_size, max_bytes, what)
    return None


def _too_large(ref: FileRef, size: int, max_bytes: int, what: str) -> Diagnostic:
    return Diagnostic(
        "policy.file-too-large",
        f"{what} {ref.value!r} is {size:,} bytes; the limit is {max_bytes:,}",
        ref.at,
        details={"bytes": size, "limit": max_bytes},
        hint="keep prompt files short; split long texts into layers",
    )


def _unreadable(ref: FileRef, exc: OSError, what: str) -> Diagnostic:
    return Diagnostic(
        "policy.file-unreadable",
        f"cannot read {what} {ref.value!r}: {exc.strerror or exc}",
        ref.at,
    )


def file_problem(
    ref: FileRef, roots: Sequence[Path], *, max_bytes: int, what: str = "prompt file"
) -> tuple[Path, Diagnostic | None]:
    """(real path, the first reason ``ref`` may not be read, or None): outside the roots,
    missing, not a regular file, larger than ``max_bytes``. Nothing is opened."""
    real, problem = confine(ref, roots)
    if problem is not None:
        return real, problem
    try:
        st = real.stat()
    except FileNotFoundError:
        return real, _missing(ref, what)
    except OSError as exc:
        return real, _unreadable(ref, exc, what)
    return real, _shape(ref, st, max_bytes, what)


def check_file(
    ref: FileRef, roots: Sequence[Path], *, max_bytes: int, what: str = "prompt file"
) -> Path:
    """The real path of ``ref`` if it may be read (see :func:`file_problem`); otherwise a
    :class:`PolicyError` located at the value that names it."""
    real, problem = file_problem(ref, roots, max_bytes=max_bytes, what=what)
    if problem is not None:
        raise PolicyError(problem)
    return real


def _containing(real: Path, roots: Sequence[Path]) -> Path:
    """The real root that holds ``real`` (``confine`` has proved there is one)."""
    real_roots = [Path(os.path.realpath(_lexical(r))) for r in roots]
    return next(r for r in sorted(real_roots, key=lambda r: -len(r.parts)) if _inside(real, [r]))


def read_bytes(
    ref: FileRef, roots: Sequence[Path], *, max_bytes: int, what: str = "prompt file"
) -> tuple[Path, bytes]:
    """(real path, content) of ``ref``, checked as :func:`check_file` does, then opened one
    component at a time from the root that holds it, never following a symlink
    (:func:`kilo_rules.engine.base.safefs.open_beneath`), so that a directory or the file swapped
    for a symlink after the check is refused rather than read; the open file is re-checked and
    at most ``max_bytes + 1`` bytes are ever read."""
    real = check_file(ref, roots, max_bytes=max_bytes, what=what)
    try:
        _, data = safefs.read_beneath(_containing(real, roots), real, max_bytes=max_bytes)
    except safefs.ReadRefused as exc:
        raise PolicyError(_refused(ref, exc, roots, max_bytes, what)) from None
    return real, data


def _refused(
    ref: FileRef, exc: safefs.ReadRefused, roots: Sequence[Path], max_bytes: int, what: str
) -> Diagnostic:
    if exc.reason == "missing":
        return _missing(ref, what)
    if exc.reason == "too-large":
        return _too_large(ref, max_bytes + 1, max_bytes, what)
    if exc.reason == "not-regular":
        return Diagnostic(
            "policy.not-a-regular-file",
            f"{what} {ref.value!r} is not a regular file; only regular files are read",
            ref.at,
            hint="name a regular file (FIFOs, devices and directories are never read)",
        )
    if exc.reason == "outside":
        return confine(ref, roots)[1] or _unreadable(ref, exc, what)
    return Diagnostic(
        "policy.file-unreadable",
        f"cannot read {what} {ref.value!r}: it changed while it was read"
        if exc.reason == "changed"
        else f"cannot read {what} {ref.value!r}: {exc}",
        ref.at,
    )


def read_text(
    ref: FileRef, roots: Sequence[Path], *, max_bytes: int, what: str = "prompt file"
) -> tuple[Path, str]:
    """(real path, UTF-8 text) of ``ref``, read as :func:`read_bytes` does."""
    real, data = read_bytes(ref, roots, max_bytes=max_bytes, what=what)
    try:
        return real, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            Diagnostic(
                "policy.file-encoding",
                f"{what} {ref.value!r} is not valid UTF-8 (byte {exc.start:,})",
                ref.at,
            )
        ) from None
