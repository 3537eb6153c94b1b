"""Files beneath a root, read so that no symlink and no race leads outside it, and files
written whole or not at all.

A workspace, a policy tree or a test file's directory is writable by someone we do not
trust, and may change while we read it: a directory swapped for a symlink between the
check and the ``open``, a file flipped to a link to ``~/.ssh/id_rsa``. Checking a path and
then opening it by name cannot be made safe, so a read here never opens a path by name:

* the path must lie under the root as written (``..`` collapsed) and once every symlink is
  resolved (symlinks that stay inside are fine);
* the resolved path is then opened one component at a time, each relative to the file
  descriptor of the directory before it, with ``O_NOFOLLOW``. The resolved path has no
  symlinks in it, so any symlink met on the way was put there after the check, and the
  open fails instead of following it (:class:`ReadRefused` with reason ``changed``);
* the opened file is checked with ``fstat`` (regular, within the cap) and read to at most
  the cap plus one byte; the open is non-blocking so a FIFO never hangs the reader.

:func:`glob_beneath` walks a directory for a glob with the same discipline, never
following a directory symlink (so ``ln -s . a`` cannot loop it) and bounded in entries
visited and in time. :func:`write_atomic` writes a temporary file beside the target and
renames it into place, so a reader (or a process killed mid-write) never sees half a file.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Reason = Literal["outside", "changed", "missing", "not-regular", "too-large", "unreadable"]

_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_FILE_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO opens instead of blocking, then fstat refuses it
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_ROOT_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


class ReadRefused(OSError):  # noqa: N818 - an OSError like FileNotFoundError, named for what it says
    """A file beneath a root that may not be read, and why (``reason``).

    An :class:`OSError`, so that a caller that already turns I/O errors into located
    diagnostics keeps doing so; ``reason`` lets it pick the diagnostic code."""

    def __init__(self, reason: Reason, path: str, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type[ReadRefused], tuple[Reason, str, str]]:
        # OSError pickles from its args; keep the three fields across process boundaries.
        return (ReadRefused, (self.reason, self.path, str(self.args[0])))


def lexical(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute with ``..`` collapsed, symlinks not followed."""
    return os.path.normpath(os.path.abspath(path))  # noqa: PTH100


def is_within(path: str, root: str) -> bool:
    """Whether the absolute, normalised ``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


def _check_name(path: str) -> None:
    if "\x00" in path:
        raise ReadRefused("unreadable", path.replace("\x00", "\\0"), "a path may not hold NUL")


def resolve_beneath(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> str:
    """The real path of ``path`` (absolute, or relative to ``root``) if it lies under
    ``root`` both as written and once its symlinks are resolved; otherwise
    :class:`ReadRefused` (``outside``). Only names are looked at; nothing is opened."""
    root_s, path_s = os.fspath(root), os.fspath(path)
    _check_name(root_s)
    _check_name(path_s)
    lex_root = lexical(root_s)
    real_root = os.path.realpath(lex_root)
    written = lexical(os.path.join(lex_root, path_s))  # noqa: PTH118 - absolute path_s wins
    if not (is_within(written, lex_root) or is_within(written, real_root)):
        raise ReadRefused("outside", path_s, f"{path_s}: outside {lex_root}; not read")
    real = os.path.realpath(written)
    if not is_within(real, real_root):
        raise ReadRefused(
            "outside", path_s, f"{path_s}: resolves to {real}, outside {lex_root}; not read"
        )
    return real


def _parts(real: str, real_root: str) -> list[str]:
    rel = os.path.relpath(real, real_root)
    return [] if rel == "." else list(Path(rel).parts)


def _step(name: str, dir_fd: int, flags: int, shown: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise ReadRefused("missing", shown, f"{shown}: does not exist") from None
    except OSError as exc:
        # ELOOP/ENOTDIR: a symlink (or a file) now stands where the check saw a directory.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ReadRefused(
                "changed", shown, f"{shown}: changed while it was read (a symlink appeared)"
            ) from None
        raise ReadRefused("unreadable", shown, f"{shown}: {exc.strerror or exc}") from None


def open_beneath(
    root: str | os.PathLike[str], path: str | os.PathLike[str], *, directory: bool = False
) -> tuple[str, int]:
    """(real path, an open descriptor) of ``path`` under ``root``, opened component by
    component with ``O_NOFOLLOW`` from the root's descriptor (see the module docstring).
    The caller closes the descriptor. Raises :class:`ReadRefused`."""
    shown = os.fspath(path)
    real = resolve_beneath(root, path)
    real_root = os.path.realpath(lexical(root))
    try:
        fd = os.open(real_root, _ROOT_FLAGS)
    except OSError as exc:
        raise ReadRefused("unreadable", shown, f"{real_root}: {exc.strerror or exc}") from None
    parts = _parts(real, real_root)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            flags = _FILE_FLAGS if last and not directory else _DIR_FLAGS
            nxt = _step(name, fd, flags, shown)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return real, fd


def read_beneath(
    root: str | os.PathLike[str], path: str | os.PathLike[str], *, max_bytes: int
) -> tuple[str, bytes]:
    """(real path, content) of the regular file ``path`` under ``root``, at most
    ``max_bytes`` long, read through :func:`open_beneath`. Raises :class:`ReadRefused`."""
    shown = os.fspath(path)
    real, fd = open_beneath(root, path)
    return real, _read_open(fd, shown, max_bytes)


def _read_open(fd: int, shown: str, max_bytes: int) -> bytes:
    """The content of the open descriptor ``fd`` (closed here): a regular file of at most
    ``max_bytes``, checked with ``fstat`` before a byte is read."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReadRefused("not-regular", shown, f"{shown}: not a regular file; not read")
        if st.st_size > max_bytes:
            raise ReadRefused(
                "too-large",
                shown,
                f"{shown}: {st.st_size:,} bytes, over the {max_bytes:,}-byte cap; not read",
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except ReadRefused:
        raise
    except OSError as exc:
        raise ReadRefused("unreadable", shown, f"{shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew after the fstat: the cap holds on what was read
        raise ReadRefused("too-large", shown, f"{shown}: over the {max_bytes:,}-byte cap; not read")
    return data


def read_regular(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (symlinks followed: the caller named it), at
    most ``max_bytes``; a FIFO, device or directory is refused without blocking.
    Raises :class:`ReadRefused` (``missing``, ``not-regular``, ``too-large``, ``unreadable``)."""
    shown = os.fspath(path)
    return _read_open(_open_named(shown), shown, max_bytes)


def _open_named(shown: str) -> int:
    """A descriptor on ``shown`` opened without blocking (a FIFO opens at once), so that
    the caller can ``fstat`` it before reading."""
    _check_name(shown)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(shown, flags)
    except FileNotFoundError:
        raise ReadRefused("missing", shown, f"{shown}: does not exist") from None
    except OSError as exc:
        raise ReadRefused("unreadable", shown, f"{shown}: {exc.strerror or exc}") from None


def read_head(path: str | os.PathLike[str], size: int) -> bytes:
    """The first ``size`` bytes (or fewer) of the regular file ``path``, to tell what kind
    of file it is; a FIFO, device or directory is refused without blocking, as by
    :func:`read_regular`. Raises :class:`ReadRefused`."""
    shown = os.fspath(path)
    fd = _open_named(shown)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReadRefused("not-regular", shown, f"{shown}: not a regular file; not read")
        return os.read(fd, size)
    except ReadRefused:
        raise
    except OSError as exc:
        raise ReadRefused("unreadable", shown, f"{shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


# -- globs ------------------------------------------------------------------------------

#: How far one glob may walk before it stops (and says so): entries looked at, seconds.
GLOB_MAX_ENTRIES = 20_000
GLOB_MAX_SECONDS = 2.0
_MAX_DEPTH = 64


@dataclass(slots=True)
class GlobResult:
    """What :func:`glob_beneath` found: matching paths (sorted, joined to the start
    directory as given) and, when a bound cut the walk short, why."""

    matches: list[str] = field(default_factory=list)
    cut: str | None = None


class _CutError(Exception):
    pass


def _magic(segment: str) -> bool:
    return any(c in segment for c in "*?[")


def _hidden_ok(segment: str, name: str) -> bool:
    # glob's rule: wildcards do not match a leading dot unless the pattern spells it.
    return not name.startswith(".") or segment.startswith(".")


@dataclass(slots=True)
class _Walk:
    segments: list[str]
    max_entries: int
    deadline: float
    entries: int = 0
    seen: set[tuple[int, int, int]] = field(default_factory=set)
    found: set[str] = field(default_factory=set)

    def tick(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise _CutError(f"stopped after {self.max_entries:,} entries")
        if self.entries % 256 == 0 and time.monotonic() > self.deadline:
            raise _CutError("stopped at its time limit")

    def entries_of(self, fd: int) -> Iterator[os.DirEntry[str]]:
        with os.scandir(fd) as it:
            for entry in it:
                self.tick()
                yield entry

    def walk(self, fd: int, rel: str, index: int, depth: int) -> None:
        """Match ``segments[index:]`` in the open directory ``fd`` (at ``rel``)."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, index)
        if key in self.seen or depth > _MAX_DEPTH:
            return
        self.seen.add(key)
        if time.monotonic() > self.deadline:
            raise _CutError("stopped at its time limit")
        seg = self.segments[index]
        last = index == len(self.segments) - 1
        if seg == "**":
            if last:
                self._everything(fd, rel, depth)
                return
            self.walk(fd, rel, index + 1, depth)  # ** as zero directories
            for entry in list(self.entries_of(fd)):
                if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                    self._descend(fd, entry.name, rel, index, depth)
            return
        if not _magic(seg):
            names = [seg] if _exists(fd, seg) else []
        else:
            names = [
                e.name
                for e in self.entries_of(fd)
                if _hidden_ok(seg, e.name) and fnmatch.fnmatchcase(e.name, seg)
            ]
        for name in names:
            if last:
                self.found.add(os.path.join(rel, name))  # noqa: PTH118
            else:
                self._descend(fd, name, rel, index + 1, depth)

    def _everything(self, fd: int, rel: str, depth: int) -> None:
        for entry in list(self.entries_of(fd)):
            if entry.name.startswith("."):
                continue
            self.found.add(os.path.join(rel, entry.name))  # noqa: PTH118
            if entry.is_dir(follow_symlinks=False):
                self._descend(fd, entry.name, rel, len(self.segments) - 1, depth)

    def _descend(self, fd: int, name: str, rel: str, index: int, depth: int) -> None:
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            return  # not a directory, a symlink to one, gone, or unreadable: not walked
        try:
            self.walk(sub, os.path.join(rel, name), index, depth + 1)  # noqa: PTH118
        except OSError:
            pass  # unreadable below here: nothing found there
        finally:
            os.close(sub)


def _exists(fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=fd)
    except (OSError, ValueError):
        return False
    return True


def glob_beneath(
    start: str | os.PathLike[str],
    pattern: str,
    *,
    max_entries: int = GLOB_MAX_ENTRIES,
    max_seconds: float = GLOB_MAX_SECONDS,
) -> GlobResult:
    """Paths under the directory ``start`` that match the relative glob ``pattern``
    (``*``, ``?``, ``[...]`` within a name, ``**`` for any number of directories; names
    starting with a dot only where the pattern spells the dot), like
    ``glob.glob(..., recursive=True)`` except that directory symlinks are never followed.
    At most ``max_entries`` directory entries are looked at and ``max_seconds`` spent;
    when either bound stops the walk, :attr:`GlobResult.cut` says which, and the matches
    found so far are kept. Matched names may still be symlinks to files: read them with
    :func:`read_beneath`, which decides where they lead."""
    start_s = os.fspath(start)
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    result = GlobResult()
    if not segments or "\x00" in pattern or "\x00" in start_s:
        return result
    walk = _Walk(segments, max_entries, time.monotonic() + max_seconds)
    try:
        fd = os.open(start_s, _ROOT_FLAGS)
    except OSError:
        return result
    try:
        walk.walk(fd, start_s, 0, 0)
    except _CutError as cut:
        result.cut = str(cut)
    except OSError:
        pass
    finally:
        os.close(fd)
    result.matches = sorted(walk.found)
    return result


#: The bounds of a glob typed by a person on the command line (a corpus, a policy tree).
SPEC_MAX_ENTRIES = 500_000
SPEC_MAX_SECONDS = 30.0


def glob_spec(
    spec: str,
    *,
    max_entries: int = SPEC_MAX_ENTRIES,
    max_seconds: float = SPEC_MAX_SECONDS,
) -> GlobResult:
    """``glob.glob(spec, recursive=True)`` for a glob given on the command line (absolute
    or relative to the working directory), walked as :func:`glob_beneath` walks: the
    segments before the first wildcard name the directory to start from, and from there no
    directory symlink is followed, so ``ln -s . a`` cannot make the walk endless."""
    parts = spec.split("/")
    first = next((i for i, p in enumerate(parts) if _magic(p)), None)
    if first is None:
        return GlobResult([spec] if os.path.lexists(spec) else [])
    prefix = "/".join(parts[:first]) or ("/" if spec.startswith("/") else "")
    found = glob_beneath(
        prefix or ".",
        "/".join(parts[first:]),
        max_entries=max_entries,
        max_seconds=max_seconds,
    )
    if not prefix:  # relative to the working directory: named as glob names them
        found.matches = [m.removeprefix("./") for m in found.matches]
    return found


# -- writes -----------------------------------------------------------------------------


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all: a temporary file in the same directory, flushed
    to disk, then renamed over ``path``. A process killed mid-write leaves the old file (or
    none), never a torn one. Raises :class:`OSError`."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # noqa: PTH101 - mkstemp makes it 0600
        os.replace(tmp, target)  # noqa: PTH105
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # noqa: PTH108
        raise
