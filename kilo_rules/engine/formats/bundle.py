"""Policy bundles: a policy directory packed as one gzipped tarball, with a revision and,
optionally, an Ed25519 signature (as OPA's bundles carry theirs).

A bundle holds the directory's files, ``manifest.json`` (each file's SHA-256, the
revision, a hash of those, a revision number that grows with every release and optionally
an expiry) and, once signed, ``manifest.sig``: an Ed25519 signature over the exact bytes of
``manifest.json``. Signing the manifest signs every file, since the manifest pins each
file's digest, and it signs the number and the expiry, which a policy store uses to refuse
an older bundle replayed or an expired one. docs/bundles.md describes the format.

Everything a bundle holds is untrusted. The reader here is written for that:

- the file, the decompressed stream, each member, the manifest and their sum are capped
  (the ``MAX_*`` constants), and so is the ratio of decompressed to compressed bytes, so
  that a gzip bomb stops at the cap, not at the end of the disk;
- the tar headers are parsed by :mod:`tarfile` and every member is put through PEP 706's
  ``data`` extraction filter (:func:`tarfile.data_filter`: no absolute or escaping path,
  no device, no link leading out), whose refusals become the errors below; where the
  filter is missing (Python before 3.11.4) the stricter rules here decide alone;
- only what ``build_bundle`` writes is then accepted: plain ustar entries of regular
  files. Links, devices, directories, pax and GNU extension headers are refused, and so
  are names that are absolute, hold ``..``, a dot-file, a backslash or a control
  character, or collide with another name (exactly, or once case and Unicode
  normalisation are folded, as some file systems do);
- nothing is written until every check has passed, and then only under a fresh temporary
  directory beside the destination, renamed into place at the end.

Every refusal is a :class:`~kilo_rules.engine.base.errors.BundleError` located at the bundle, the
member, or the value in ``manifest.json``. ``cryptography`` (the ``bundle`` extra) is
imported only by the functions that sign or check a signature.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import tarfile
import time
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import BundleError, Diagnostic, Location
from kilo_rules.engine.base.source import JsonPath, JsonText

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "MANIFEST",
    "MANIFEST_VERSION",
    "MAX_BUNDLE_BYTES",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_MEMBERS",
    "MAX_PATH_BYTES",
    "MAX_RATIO",
    "MAX_REVISION_NUMBER",
    "MAX_SIGNATURE_BYTES",
    "MAX_TAR_BYTES",
    "MAX_TOTAL_BYTES",
    "RATIO_FLOOR",
    "SIGNATURE",
    "BundleError",
    "FilesCheck",
    "Manifest",
    "build_bundle",
    "default_revision_number",
    "directory_revision",
    "expires_at_text",
    "extract_bundle",
    "generate_keypair",
    "parse_expires_at",
    "path_problem",
    "read_bundle",
    "revision_of",
    "sign_bundle",
    "verify_bundle",
]

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
MANIFEST_VERSION = 2
"""The manifest version :func:`build_bundle` writes: 2 carries ``revision_number`` (and
optionally ``expires_at``). Version 1, without them, is still read (an unnumbered bundle)."""
_VERSIONS = (1, MANIFEST_VERSION)
MAX_REVISION_NUMBER = 2**63 - 1
"""The largest revision number (a signed 64-bit integer, as other tools store it)."""

MAX_FILES = 1000
"""Files a bundle (or a directory given to :func:`directory_revision`) may hold."""
MAX_FILE_BYTES = 4 * 1024 * 1024
"""Size of one file."""
MAX_TOTAL_BYTES = 32 * 1024 * 1024
"""Size of all files together."""
MAX_MANIFEST_BYTES = 1024 * 1024
"""Size of ``manifest.json``."""
MAX_SIGNATURE_BYTES = 1024
"""Size of ``manifest.sig`` (the signature is 88 characters of base64)."""
MAX_PATH_BYTES = 255
"""Length of a path in UTF-8 (what a ustar header holds, split at a slash into 155 + 100)."""
MAX_BUNDLE_BYTES = 32 * 1024 * 1024
"""Size of the compressed bundle file."""
MAX_TAR_BYTES = MAX_TOTAL_BYTES + MAX_MANIFEST_BYTES + 4 * 1024 * 1024
"""Size of the decompressed tar stream: the files, the manifest, headers and padding."""
MAX_RATIO = 100
"""Decompressed bytes per compressed byte, beyond :data:`RATIO_FLOOR` (a gzip bomb)."""
RATIO_FLOOR = 1024 * 1024
"""Decompressed bytes allowed whatever the ratio: a small tarball is mostly zero padding,
which compresses far better than any policy text."""
MAX_MEMBERS = MAX_FILES + 2
"""Tar entries: the files, the manifest and the signature."""

EXTRA_HINT = "install the bundle extra: pip install 'kilo-rules[bundle]'"

_BLOCK = 512
_RECORD = 20 * _BLOCK
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = (b"0", b"\0")
_LINKS = {b"1": "a hard link", b"2": "a symbolic link"}
_TYPES = {
    b"3": "a character device",
    b"4": "a block device",
    b"5": "a directory",
    b"6": "a FIFO",
    b"7": "a contiguous file",
    b"x": "a pax extended header",
    b"g": "a pax global header",
    b"L": "a GNU long name",
    b"K": "a GNU long link name",
    b"S": "a GNU sparse file",
}
_MAGICS = (b"ustar\x0000", b"ustar  \x00")
#: PEP 706's data filter (Python 3.11.4 and later), or None where it is missing.
_DATA_FILTER: Callable[[tarfile.TarInfo, str], tarfile.TarInfo] | None = getattr(
    tarfile, "data_filter", None
)
#: The destination the data filter judges members against: a directory that does not
#: exist, so that its realpath() resolves nothing and its verdict depends on the names
#: alone, not on what this machine's file system holds.
_FILTER_ROOT = "/nonexistent/kilo-rules-bundle"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_REVISION = re.compile(r"sha256:[0-9a-f]{64}")
# RFC 3339 in UTC only ("Z"): one spelling, so a signed expiry reads one way everywhere.
_EXPIRES = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")
# C0 and C1 controls and DEL: never in a file name a bundle writes (a terminal escape, a
# newline that splits a listing), and lone surrogates, which are not UTF-8.
_BAD_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\\\\\ud800-\udfff]")
_MAX_SHOWN = 20  # diagnostics of one kind reported at once
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Non-blocking, so that a FIFO in place of a file opens instead of hanging; fstat then
# refuses it.
_FLAGS_READ = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
_FLAGS_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds: each file's SHA-256, the revision those digests make, and the
    release's revision number and expiry.

    The revision is a hash of the files' names and contents only (not of the tarball, its
    order or its timestamps), so the same directory always has the same revision. The
    revision number orders releases: a policy store refuses a bundle whose number is not
    above the one it serves (docs/bundles.md, "Rollback")."""

    version: int
    revision: str
    """``sha256:<hex>`` over the sorted ``path NUL digest LF`` lines of :attr:`files`."""
    files: Mapping[str, str]
    """POSIX path relative to the bundle root → SHA-256 hex of its bytes, sorted by path."""
    revision_number: int = 0
    """1 to :data:`MAX_REVISION_NUMBER` (version 2); 0 for an unnumbered (version 1)
    manifest, and for :func:`directory_revision`."""
    expires_at: datetime | None = None
    """When the manifest stops being accepted (UTC, version 2 only), or None."""
    where: Mapping[str, Location] = field(default_factory=dict, compare=False, repr=False)
    """Where each top-level key is written in ``manifest.json`` (a manifest read from a
    bundle), for diagnostics about its values."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(sorted(self.files.items()))))
        object.__setattr__(self, "where", MappingProxyType(dict(self.where)))
        numbered = self.revision_number != 0
        if numbered != (self.version >= 2):
            raise ValueError("a version 2 manifest has a revision number, version 1 none")
        if not 0 <= self.revision_number <= MAX_REVISION_NUMBER:
            raise ValueError(f"revision number out of range: {self.revision_number}")
        if self.expires_at is not None and (
            self.version < 2 or self.expires_at.utcoffset() is None
        ):
            raise ValueError("an expiry is a timezone-aware datetime in a version 2 manifest")

    def __hash__(self) -> int:
        return hash((self.version, self.revision, self.revision_number))

    def expired(self, now: datetime | None = None) -> bool:
        """Whether the manifest's expiry has passed at ``now`` (default: the current time)."""
        if self.expires_at is None:
            return False
        return (now if now is not None else datetime.now(UTC)) >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it."""
        out: dict[str, Any] = {"version": self.version, "revision": self.revision}
        if self.version >= 2:
            out["revision_number"] = self.revision_number
        if self.expires_at is not None:
            out["expires_at"] = expires_at_text(self.expires_at)
        out["files"] = dict(self.files)
        return out

    def dumps(self) -> bytes:
        """The bytes of ``manifest.json`` as :func:`build_bundle` writes them."""
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False)
        return (text + "\n").encode("utf-8")


def expires_at_text(when: datetime) -> str:
    """``when`` as a manifest writes it: RFC 3339 in UTC, ``2026-01-31T12:00:00Z`` (whole
    seconds unless it has a fraction)."""
    if when.utcoffset() is None:
        raise ValueError("an expiry needs a timezone")
    utc = when.astimezone(UTC)
    spec = "seconds" if utc.microsecond == 0 else "microseconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def parse_expires_at(text: str) -> datetime:
    """An expiry as a manifest (or ``--expires-at``) writes it: RFC 3339 in UTC with a
    ``Z`` (``2026-01-31T12:00:00Z``, optionally with up to 6 fractional digits). Raises
    ValueError for anything else."""
    if not _EXPIRES.fullmatch(text):
        raise ValueError(f"not an RFC 3339 UTC time such as 2026-01-31T12:00:00Z: {text!r}")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)


def revision_of(files: Mapping[str, str]) -> str:
    """The revision of a bundle whose files have these digests (see :class:`Manifest`)."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path}\0{files[path]}\n".encode())
    return "sha256:" + h.hexdigest()


def _manifest(
    files: Mapping[str, str], number: int = 0, expires_at: datetime | None = None
) -> Manifest:
    version = MANIFEST_VERSION if number else 1
    return Manifest(version, revision_of(files), files, number, expires_at)


# -- failures -------------------------------------------------------------------------------


def _at(bundle: Path | str, member: str | None = None) -> Location:
    return Location(f"{bundle}!/{member}" if member else str(bundle), 1, 1)


def _diag(
    code: str,
    message: str,
    where: Location,
    hint: str | None = None,
    **details: Any,
) -> Diagnostic:
    return Diagnostic(code, message, where, details=details, hint=hint)


def _fail(
    code: str, message: str, where: Location, hint: str | None = None, **details: Any
) -> NoReturn:
    raise BundleError(_diag(code, message, where, hint, **details))


def _io(exc: OSError, what: str, where: Path | str) -> NoReturn:
    raise BundleError(
        _diag("bundle.io", f"cannot {what}: {exc.strerror or exc}", _at(where))
    ) from exc


def _too_large(what: str, size: int, limit: int, where: Location) -> NoReturn:
    _fail(
        "bundle.too-large",
        f"{what} is {size:,} bytes; the limit is {limit:,}",
        where,
        size=size,
        limit=limit,
    )


# -- paths ----------------------------------------------------------------------------------


def _split_name(raw: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) for a ustar header, or None when the path cannot be split to fit."""
    if len(raw) <= 100:
        return b"", raw
    for i in range(len(raw) - 1, -1, -1):
        if raw[i : i + 1] == b"/" and i <= 155 and len(raw) - i - 1 <= 100:
            return raw[:i], raw[i + 1 :]
    return None


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file of a bundle, or None when it can.

    A bundle path is relative, POSIX, at most :data:`MAX_PATH_BYTES` of UTF-8 and fits a
    ustar header; no component is empty, ``.``, ``..`` or a dot-file, and none holds a
    backslash or a control character. The manifest and the signature are not files."""
    if not path:
        return "the path is empty"
    if _BAD_CHARACTER.search(path):
        return "the path holds a control character, a backslash or is not UTF-8"
    if path.startswith("/"):
        return "the path is absolute"
    raw = path.encode("utf-8")
    if len(raw) > MAX_PATH_BYTES:
        return f"the path is {len(raw)} bytes long; the limit is {MAX_PATH_BYTES}"
    for part in path.split("/"):
        if part in ("", ".", ".."):
            return (
                f"the path has a {part!r} component" if part else "the path has an empty component"
            )
        if part.startswith("."):
            return f"the path has a dot-file component {part!r}"
    if path in (MANIFEST, SIGNATURE):
        return f"{path} is the bundle's own, not a policy file"
    if _split_name(raw) is None:
        return "the path cannot be split into a ustar prefix and name"
    return None


def _folded(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()


def _collisions(paths: Iterable[str]) -> Iterator[tuple[str, str, str]]:
    """(path, the path it collides with, why) for each path that would overwrite another
    or need it as a directory on a file system that folds case or Unicode forms."""
    seen: dict[str, str] = {}
    for path in paths:
        key = _folded(path)
        if key in seen:
            yield path, seen[key], f"has the same name as {seen[key]!r} once case is folded"
            continue
        seen[key] = path
    folded = sorted(seen)
    for i, key in enumerate(folded):
        # Sorted, a file's descendants come soon after it, past names such as "a-b" that
        # sort between "a" and "a/".
        for other in folded[i + 1 :]:
            if not other.startswith(key):
                break
            if other[len(key)] == "/":
                yield seen[other], seen[key], f"lies below {seen[key]!r}, which is a file"
                break


# -- reading a directory ----------------------------------------------------------------------


def _read_regular(path: Path, limit: int, where: Location) -> bytes:
    """Read at most ``limit`` bytes of a regular file, never following a final symlink and
    never blocking on a FIFO swapped in after the directory was listed."""
    try:
        fd = os.open(path, _FLAGS_READ | _NOFOLLOW)
    except OSError as exc:
        _io(exc, f"read {path}", where.file)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _fail("bundle.io", f"{path} is not a regular file", where)
        if st.st_size > limit:
            _too_large(str(path), st.st_size, limit, where)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        _io(exc, f"read {path}", where.file)
    finally:
        os.close(fd)
    if len(data) > limit:
        _too_large(str(path), len(data), limit, where)
    return data


def _walk(root: Path, skip: str | None = None) -> Iterator[tuple[str, Path]]:
    """(bundle path, file) for the regular files under ``root``, depth first: symlinks
    are neither followed nor listed, dot-files and dot-directories are skipped, and so
    are the manifest, the signature and ``skip``."""
    stack: list[tuple[str, Path]] = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            _io(exc, f"list {directory}", directory)
        subdirs: list[tuple[str, Path]] = []
        for entry in entries:
            name = entry.name
            rel = prefix + name
            if name.startswith(".") or rel in (MANIFEST, SIGNATURE, skip):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append((rel + "/", Path(entry.path)))
                elif entry.is_file(follow_symlinks=False):
                    yield rel, Path(entry.path)
            except OSError as exc:
                _io(exc, f"stat {entry.path}", entry.path)
        stack.extend(reversed(subdirs))


def _read_directory(root: Path, skip: str | None = None) -> dict[str, bytes]:
    root = Path(root)
    try:
        st = root.stat()
    except OSError as exc:
        _io(exc, f"read directory {root}", root)
    if not stat.S_ISDIR(st.st_mode):
        _fail("bundle.io", f"{root} is not a directory", _at(root))
    files: dict[str, bytes] = {}
    total = 0
    for rel, path in _walk(root, skip):
        where = _at(path)
        problem = path_problem(rel)
        if problem is not None:
            _fail("bundle.path", f"{rel!r} cannot be bundled: {problem}", where, path=rel)
        if len(files) >= MAX_FILES:
            _fail(
                "bundle.too-many",
                f"{root} holds more than {MAX_FILES:,} files",
                _at(root),
                limit=MAX_FILES,
            )
        data = _read_regular(path, MAX_FILE_BYTES, where)
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            _too_large(f"the files under {root}", total, MAX_TOTAL_BYTES, _at(root))
        files[rel] = data
    for rel, other, why in _collisions(files):
        _fail("bundle.duplicate", f"{rel!r} {why}", _at(root / rel), path=rel, other=other)
    return dict(sorted(files.items()))


def _digests(files: Mapping[str, bytes]) -> dict[str, str]:
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


def directory_revision(root: Path) -> Manifest:
    """The manifest a bundle of ``root`` would carry (its revision included), without
    building one.

    The files are the regular files under ``root``: symlinks are not followed (nor listed),
    dot-files and dot-directories are skipped, and so are ``manifest.json`` and
    ``manifest.sig`` at the root. At most :data:`MAX_FILES` files of :data:`MAX_FILE_BYTES`
    each and :data:`MAX_TOTAL_BYTES` in all; a file whose name a bundle cannot hold is
    refused (``bundle.path``), not skipped."""
    return _manifest(_digests(_read_directory(root)))


# -- writing a tarball --------------------------------------------------------------------------


def _octal(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode("ascii") + b"\0"


def _header(path: str, size: int) -> bytes:
    split = _split_name(path.encode("utf-8"))
    if split is None:  # path_problem refused it before
        raise AssertionError(path)
    prefix, name = split
    header = bytearray(_BLOCK)

    def put(offset: int, value: bytes) -> None:
        header[offset : offset + len(value)] = value

    put(0, name)
    put(100, _octal(0o644, 8))
    put(108, _octal(0, 8))  # uid
    put(116, _octal(0, 8))  # gid
    put(124, _octal(size, 12))
    put(136, _octal(0, 12))  # mtime: the same bytes whenever the bundle is built
    put(148, b" " * 8)  # the checksum counts its own field as spaces
    put(156, b"0")
    put(257, b"ustar\x0000")
    put(329, _octal(0, 8))  # devmajor
    put(337, _octal(0, 8))  # devminor
    put(345, prefix)
    put(148, f"{sum(header):06o}".encode("ascii") + b"\0 ")
    return bytes(header)


def _pack(members: Iterable[tuple[str, bytes]]) -> bytes:
    """A gzipped ustar tarball of ``members`` in the order given, the same bytes for the
    same members: fixed mode, owner and mtime, and no name or mtime in the gzip header."""
    tar = io.BytesIO()
    for path, data in members:
        tar.write(_header(path, len(data)))
        tar.write(data)
        tar.write(bytes(-len(data) % _BLOCK))
    tar.write(_ZERO_BLOCK * 2)
    tar.write(bytes(-tar.tell() % _RECORD))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
        gz.write(tar.getvalue())
    return out.getvalue()


def _write_atomic(out: Path, data: bytes) -> None:
    """Write ``out`` whole or not at all (:func:`kilo_rules.engine.base.safefs.write_atomic`); a
    failure is a typed, located I/O error."""
    try:
        safefs.write_atomic(out, data)
    except OSError as exc:
        _io(exc, f"write {out}", out)


def _bundle_members(
    manifest_bytes: bytes, signature: bytes | None, files: Mapping[str, bytes]
) -> Iterator[tuple[str, bytes]]:
    # The manifest first, so that a streaming reader knows what to expect; then the files
    # in path order.
    yield MANIFEST, manifest_bytes
    if signature is not None:
        yield SIGNATURE, signature
    yield from sorted(files.items())


def _check_number(number: int) -> None:
    if type(number) is not int or not 1 <= number <= MAX_REVISION_NUMBER:
        _fail(
            "bundle.revision-number",
            f"a revision number is an integer from 1 to {MAX_REVISION_NUMBER}, not {number!r}",
            Location("<bundle>", 1, 1),
        )


def _check_expiry(when: datetime | None) -> None:
    if when is not None and when.utcoffset() is None:
        _fail("bundle.expired", "an expiry needs a timezone (UTC)", Location("<bundle>", 1, 1))


def _previous_number(bundle: Path) -> int:
    """The revision number of the bundle at ``bundle``, or 0 when there is none (or it
    cannot be read as one): only a default is derived from it, never trust."""
    try:
        if not Path(bundle).is_file():
            return 0
        return _parse_manifest(_read_bundle(bundle)).revision_number
    except (BundleError, OSError):
        return 0


def default_revision_number(previous: Path | None = None, now: float | None = None) -> int:
    """The revision number a bundle gets when none is given: the current Unix time in
    seconds (``now``, default the clock), or one more than the number of the bundle at
    ``previous`` (the release it replaces) when that is not lower. It grows from release
    to release on one machine, and across machines as far as their clocks agree; give
    ``revision_number`` explicitly (a CI build number) when releases are cut faster than
    one a second or from several places."""
    clock = int(now if now is not None else time.time())
    before = _previous_number(previous) if previous is not None else 0
    return min(max(clock, before + 1, 1), MAX_REVISION_NUMBER)


#: Called with the files a bundle is about to hold (path → bytes), before anything is
#: written; it raises to refuse them (``kilo-rules bundle build`` checks the policies).
FilesCheck = Callable[[Mapping[str, bytes]], None]


def build_bundle(
    root: Path,
    out: Path,
    *,
    revision_number: int | None = None,
    expires_at: datetime | None = None,
    check: FilesCheck | None = None,
) -> Manifest:
    """Pack the policy directory ``root`` (the files :func:`directory_revision` lists) into
    the bundle ``out``, unsigned; returns its manifest.

    The manifest carries ``revision_number`` (default :func:`default_revision_number` with
    the bundle already at ``out`` as the previous release) and, when given, ``expires_at``.
    The tarball is deterministic: the same directory and number give a byte-identical
    file. When ``out`` lies under ``root`` it is left out of the bundle. ``check`` is given
    the files as read, the very bytes packed, and nothing is written when it raises."""
    root, out = Path(root), Path(out)
    skip: str | None = None
    with contextlib.suppress(OSError, ValueError):
        skip = out.resolve().relative_to(root.resolve()).as_posix()
    files = _read_directory(root, skip)
    number = revision_number if revision_number is not None else default_revision_number(out)
    _check_number(number)
    _check_expiry(expires_at)
    if check is not None:
        check(MappingProxyType(files))
    manifest = _manifest(_digests(files), number, expires_at)
    _write_atomic(out, _pack(_bundle_members(manifest.dumps(), None, files)))
    return manifest


# -- reading a tarball --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Contents:
    """A bundle's members as read and checked for shape, not yet against the manifest."""

    name: str
    manifest: bytes
    signature: bytes | None
    files: dict[str, bytes]


def _read_file(bundle: Path) -> bytes:
    try:
        fd = os.open(bundle, _FLAGS_READ)
    except OSError as exc:
        _io(exc, "read bundle", bundle)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _fail("bundle.io", "the bundle is not a regular file", _at(bundle))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        _io(exc, "read bundle", bundle)
    finally:
        os.close(fd)
    if len(data) > MAX_BUNDLE_BYTES:
        _too_large("the bundle", len(data), MAX_BUNDLE_BYTES, _at(bundle))
    return data


def _gunzip(data: bytes, where: Location) -> bytearray:
    """The one gzip member ``data`` holds, decompressed to at most :data:`MAX_TAR_BYTES`
    and :data:`MAX_RATIO` times its size (above :data:`RATIO_FLOOR`)."""
    if data[:2] != b"\x1f\x8b":
        _fail("bundle.gzip", "the bundle is not gzip-compressed", where)
    by_ratio = max(RATIO_FLOOR, MAX_RATIO * len(data))
    limit = min(MAX_TAR_BYTES, by_ratio)
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = bytearray()
    tail = data
    try:
        while not inflate.eof:
            chunk = inflate.decompress(tail, limit + 1 - len(out))
            out += chunk
            if len(out) > limit:
                if limit == by_ratio:
                    _fail(
                        "bundle.bomb",
                        f"the bundle decompresses to more than {MAX_RATIO} times its "
                        f"{len(data):,} bytes",
                        where,
                        limit=limit,
                    )
                _too_large("the decompressed bundle", len(out), limit, where)
            tail = inflate.unconsumed_tail
            if not chunk and not tail:
                break
    except zlib.error as exc:
        _fail("bundle.gzip", f"the gzip stream is corrupt: {exc}", where)
    if not inflate.eof:
        _fail("bundle.gzip", "the gzip stream ends early", where)
    if inflate.unused_data:
        _fail("bundle.gzip", "data follows the gzip stream", where)
    return out


def _refuse_filtered(info: tarfile.TarInfo, error: Exception, where: Location) -> NoReturn:
    """A member PEP 706's data filter refuses, as the bundle error of its kind."""
    path = info.name
    why = type(error).__name__
    if isinstance(error, tarfile.SpecialFileError):
        kind = info.type
        _fail(
            "bundle.member-type",
            f"member {path!r} is {_TYPES.get(kind, f'of type {kind!r}')}; "
            "a bundle holds regular files only",
            where,
            member=path,
            type=kind.decode("latin-1"),
            filter=why,
        )
    if isinstance(error, tarfile.AbsoluteLinkError | tarfile.LinkOutsideDestinationError):
        _fail(
            "bundle.link",
            f"member {path!r} is {_LINKS.get(info.type, 'a link')} pointing outside the "
            "bundle; a bundle holds regular files only",
            where,
            member=path,
            filter=why,
        )
    _fail(
        "bundle.path",
        f"member {path!r} is refused: it would be written outside the bundle",
        where,
        member=path,
        filter=why,
    )


def _data_filter(info: tarfile.TarInfo, where: Location) -> None:
    """PEP 706's ``data`` filter, the standard library's own rules for extracting an
    untrusted tarball (no absolute or escaping path, no device, no link leading out),
    applied to each member before the stricter rules of :func:`_untar`. Where the filter
    is missing (Python 3.11 before 3.11.4) those rules alone decide: they refuse
    everything it would."""
    data_filter = _DATA_FILTER
    if data_filter is None:
        return
    try:
        data_filter(info, _FILTER_ROOT)
    except tarfile.FilterError as exc:
        _refuse_filtered(info, exc, where)


class _View(io.RawIOBase):
    """The decompressed stream as a read-only file for :mod:`tarfile`, without the copy
    :class:`io.BytesIO` would make of it (up to :data:`MAX_TAR_BYTES` more memory)."""

    def __init__(self, data: bytearray) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data[self._pos : self._pos + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _open_tar(tar: bytearray, where: Location) -> tarfile.TarFile:
    try:
        return tarfile.TarFile(
            fileobj=io.BufferedReader(_View(tar)),
            mode="r",
            encoding="utf-8",
            errors="surrogateescape",
        )
    except (tarfile.TarError, ValueError, OverflowError, EOFError) as exc:
        _fail("bundle.tar", f"the bundle is not a tarball: {exc}", where)


def _next(archive: tarfile.TarFile, where: Location) -> tarfile.TarInfo | None:
    try:
        return archive.next()
    except (tarfile.TarError, ValueError, OverflowError, EOFError) as exc:
        _fail("bundle.tar", f"a tar header cannot be read: {exc}", where, offset=archive.offset)


def _untar(tar: bytearray, bundle: str) -> _Contents:
    """Read the members with :mod:`tarfile`: each put through PEP 706's data filter, then
    held to what ``build_bundle`` writes (plain ustar entries of regular files, each name
    checked, every size capped)."""
    manifest: bytes | None = None
    signature: bytes | None = None
    files: dict[str, bytes] = {}
    files_total = 0
    count = 0
    where = Location(bundle, 1, 1)
    archive = _open_tar(tar, where)
    while True:
        info = _next(archive, where)
        if info is None:
            break
        count += 1
        if count > MAX_MEMBERS:
            _fail(
                "bundle.too-many",
                f"the bundle has more than {MAX_MEMBERS:,} members",
                where,
                limit=MAX_MEMBERS,
            )
        path = info.name
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raw = path.encode("utf-8", "surrogateescape")
            _fail(
                "bundle.path",
                f"a member's name is not UTF-8: {raw!r}",
                where,
                member=raw.decode("utf-8", "backslashreplace"),
            )
        # tarfile folds an extension header into the member after it; the member's
        # header then starts past the extension's own blocks.
        if info.offset_data - info.offset != _BLOCK or archive.pax_headers:
            what = "a pax extended header" if info.pax_headers else "a GNU long name"
            if archive.pax_headers:
                what = "a pax global header"
            _fail(
                "bundle.member-type",
                f"member {path!r} comes with {what}; a bundle holds plain ustar entries",
                where,
                member=path,
                type="x" if "pax" in what else "L",
            )
        if bytes(tar[info.offset + 257 : info.offset + 265]) not in _MAGICS:
            _fail("bundle.tar", "a tar header is not ustar", where, offset=info.offset)
        _data_filter(info, where)
        special = path in (MANIFEST, SIGNATURE)
        problem = None if special else path_problem(path)
        # A refused name is never put into a location, where it would read as a real path.
        member_at = _at(bundle, path) if problem is None else where
        kind = info.type
        if kind in _LINKS:
            _fail(
                "bundle.link",
                f"member {path!r} is {_LINKS[kind]}; a bundle holds regular files only",
                member_at,
                member=path,
            )
        if kind not in _REGULAR:
            _fail(
                "bundle.member-type",
                f"member {path!r} is {_TYPES.get(kind, f'of type {kind!r}')}; "
                "a bundle holds regular files only",
                member_at,
                member=path,
                type=kind.decode("latin-1"),
            )
        if problem is not None:
            _fail("bundle.path", f"member {path!r} is refused: {problem}", where, member=path)
        size = info.size
        limit = {MANIFEST: MAX_MANIFEST_BYTES, SIGNATURE: MAX_SIGNATURE_BYTES}.get(
            path, MAX_FILE_BYTES
        )
        if size > limit:
            _too_large(f"member {path!r}", size, limit, member_at)
        if not special:
            files_total += size
            if files_total > MAX_TOTAL_BYTES:
                _too_large("the bundle's files", files_total, MAX_TOTAL_BYTES, where)
        start = info.offset_data
        if start + size > len(tar):
            _fail("bundle.tar", f"member {path!r} is cut short", member_at, member=path)
        # One copy of each member, straight out of the stream; the stream goes afterwards.
        data = bytes(memoryview(tar)[start : start + size])
        if (
            path in files
            or (path == MANIFEST and manifest is not None)
            or (path == SIGNATURE and signature is not None)
        ):
            _fail("bundle.duplicate", f"member {path!r} appears twice", member_at, member=path)
        if path == MANIFEST:
            manifest = data
        elif path == SIGNATURE:
            signature = data
        else:
            files[path] = data
    # tarfile ends its listing at the first header it cannot read, as at the end marker:
    # only the end marker (two zero blocks, or the one a short tarball has) is an end.
    end = bytes(tar[archive.offset : archive.offset + _BLOCK])
    if len(end) < _BLOCK:
        _fail("bundle.tar", "the tarball ends without its end marker", where, offset=archive.offset)
    if end != _ZERO_BLOCK:
        _fail("bundle.tar", "a tar header's checksum is wrong", where, offset=archive.offset)
    for path, _other, why in _collisions(files):
        _fail("bundle.duplicate", f"member {path!r} {why}", _at(bundle, path), member=path)
    if manifest is None:
        _fail(
            "bundle.manifest",
            f"the bundle has no {MANIFEST}",
            where,
            hint="build bundles with kilo-rules bundle build",
        )
    return _Contents(bundle, manifest, signature, files)


def _read_bundle(bundle: Path) -> _Contents:
    bundle = Path(bundle)
    where = _at(bundle)
    return _untar(_gunzip(_read_file(bundle), where), str(bundle))


# -- the manifest -----------------------------------------------------------------------------


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _parse_manifest(contents: _Contents) -> Manifest:
    file = f"{contents.name}!/{MANIFEST}"
    try:
        text = contents.manifest.decode("utf-8")
    except UnicodeDecodeError:
        _fail("bundle.manifest", f"{MANIFEST} is not UTF-8", Location(file, 1, 1))
    source = JsonText(file, text)

    def bad(message: str, path: JsonPath = ()) -> NoReturn:
        _fail("bundle.manifest", message, source.locate(path))

    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        _fail("bundle.manifest", f"{MANIFEST}: {exc.msg}", Location(file, exc.lineno, exc.colno))
    except _DuplicateKeyError as exc:
        bad(f"{MANIFEST}: the key {exc.key!r} appears twice")
    except (ValueError, RecursionError) as exc:
        bad(f"{MANIFEST} is not valid JSON: {exc}")
    if not isinstance(data, dict):
        bad(f"{MANIFEST} is not a JSON object")
    if "version" not in data:
        bad(f"{MANIFEST} has no 'version'")
    version = data["version"]
    if type(version) is not int or version not in _VERSIONS:
        bad(f"unsupported manifest version {version!r} (this reads versions 1 and 2)", ("version",))
    # Version 1 has no revision number: anything but its three keys is unknown there.
    required = ("version", "revision", "files") + (("revision_number",) if version >= 2 else ())
    allowed = (*required, "expires_at") if version >= 2 else required
    for key in data:
        if key not in allowed:
            bad(f"unknown key {key!r} in a version {version} {MANIFEST}", (key,))
    for key in required:
        if key not in data:
            bad(f"{MANIFEST} has no {key!r}")
    revision, files = data["revision"], data["files"]
    number = data.get("revision_number", 0)
    if version >= 2 and (type(number) is not int or not 1 <= number <= MAX_REVISION_NUMBER):
        bad(
            f"the revision number is not an integer from 1 to {MAX_REVISION_NUMBER}",
            ("revision_number",),
        )
    expires_at: datetime | None = None
    if "expires_at" in data:
        raw = data["expires_at"]
        try:
            if not isinstance(raw, str):
                raise ValueError("not a string")
            expires_at = parse_expires_at(raw)
        except ValueError:
            bad(
                "expires_at is not an RFC 3339 UTC time such as 2026-01-31T12:00:00Z",
                ("expires_at",),
            )
    if not isinstance(revision, str) or not _REVISION.fullmatch(revision):
        bad("the revision is not 'sha256:' and 64 lowercase hex digits", ("revision",))
    if not isinstance(files, dict):
        bad("'files' is not an object of path to SHA-256", ("files",))
    if len(files) > MAX_FILES:
        bad(f"the manifest lists {len(files):,} files; the limit is {MAX_FILES:,}", ("files",))
    for path, digest in files.items():
        problem = path_problem(path)
        if problem is not None:
            bad(f"file {path!r} is refused: {problem}", ("files", path))
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            bad(f"the digest of {path!r} is not 64 lowercase hex digits", ("files", path))
    if revision != revision_of(files):
        _fail(
            "bundle.revision",
            "the revision does not match the files the manifest lists",
            source.locate(("revision",)),
            expected=revision_of(files),
            found=revision,
        )
    where = {k: source.locate((k,)) for k in ("revision", "revision_number", "expires_at")}
    return Manifest(version, revision, files, number, expires_at, where)


def _check_members(contents: _Contents, manifest: Manifest) -> None:
    problems: list[Diagnostic] = []
    for path, data in contents.files.items():
        expected = manifest.files.get(path)
        at = _at(contents.name, path)
        if expected is None:
            problems.append(
                _diag("bundle.unexpected", f"member {path!r} is not in the manifest", at)
            )
            continue
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            problems.append(
                _diag(
                    "bundle.digest",
                    f"member {path!r} does not match its digest in the manifest",
                    at,
                    expected=expected,
                    actual=actual,
                )
            )
    for path in manifest.files:
        if path not in contents.files:
            problems.append(
                _diag(
                    "bundle.missing",
                    f"the manifest lists {path!r}, which the bundle does not hold",
                    _at(contents.name, MANIFEST),
                    member=path,
                )
            )
    if problems:
        raise BundleError(problems[:_MAX_SHOWN])


# -- signatures -------------------------------------------------------------------------------


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:
        raise BundleError(
            Diagnostic(
                "bundle.cryptography-missing",
                "signing and verifying bundles needs the 'cryptography' package",
                Location("<bundle>", 1, 1),
                hint=EXTRA_HINT,
            )
        ) from exc


def _key_error(message: str) -> NoReturn:
    _fail("bundle.key", message, Location("<key>", 1, 1))


def _private_key(pem: bytes) -> Ed25519PrivateKey:
    _require_cryptography()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        _key_error(f"not an unencrypted PEM private key: {exc}")
    if not isinstance(key, Ed25519PrivateKey):
        _key_error(f"the private key is {type(key).__name__}, not Ed25519")
    return key


def _public_key(pem: bytes) -> Ed25519PublicKey:
    _require_cryptography()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        _key_error(f"not a PEM public key: {exc}")
    if not isinstance(key, Ed25519PublicKey):
        _key_error(f"the public key is {type(key).__name__}, not Ed25519")
    return key


def _check_signature(contents: _Contents, key: Ed25519PublicKey) -> None:
    from cryptography.exceptions import InvalidSignature

    at = _at(contents.name, SIGNATURE)
    if contents.signature is None:
        _fail(
            "bundle.unsigned",
            f"the bundle has no {SIGNATURE}, and a signed bundle is required",
            _at(contents.name),
            hint="sign it with kilo-rules bundle sign FILE --key PRIVATE.pem",
        )
    try:
        raw = base64.b64decode(contents.signature.strip(b"\n"), validate=True)
    except ValueError:
        _fail("bundle.signature", f"{SIGNATURE} is not base64", at)
    if len(raw) != 64:
        _fail("bundle.signature", f"{SIGNATURE} is not an Ed25519 signature", at)
    try:
        key.verify(raw, contents.manifest)
    except InvalidSignature:
        _fail(
            "bundle.signature",
            f"the signature does not match {MANIFEST} for this key",
            at,
            hint="the bundle was changed after signing, or signed with another key",
        )


def generate_keypair() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as (private key PEM, PKCS#8 unencrypted; public key PEM)."""
    _require_cryptography()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


# -- the public operations ------------------------------------------------------------------


def _expired(manifest: Manifest, now: datetime | None) -> None:
    if manifest.expired(now):
        assert manifest.expires_at is not None
        _fail(
            "bundle.expired",
            f"the manifest expired at {expires_at_text(manifest.expires_at)}",
            manifest.where.get("expires_at", Location(MANIFEST, 1, 1)),
            hint="publish a new bundle (kilo-rules bundle build --expires-at ...), signed",
            expires_at=expires_at_text(manifest.expires_at),
        )


def _verified(
    bundle: Path,
    public_key_pem: bytes | None,
    now: datetime | None = None,
    *,
    fresh: bool = True,
) -> tuple[_Contents, Manifest]:
    # The key is loaded first: a bad key is the caller's problem, whatever the bundle holds.
    key = None if public_key_pem is None else _public_key(public_key_pem)
    contents = _read_bundle(bundle)
    if key is not None:
        _check_signature(contents, key)
    manifest = _parse_manifest(contents)
    _check_members(contents, manifest)
    if fresh:
        _expired(manifest, now)
    return contents, manifest


def verify_bundle(
    bundle: Path, public_key_pem: bytes | None = None, *, now: datetime | None = None
) -> Manifest:
    """Check the bundle and return its manifest; nothing is written.

    The tarball must hold only regular files with acceptable names within the size caps,
    ``manifest.json`` must be well-formed, its revision must recompute from the digests it
    lists, every member must match its digest and none may be missing or unlisted. With
    ``public_key_pem``, ``manifest.sig`` must also be present (``bundle.unsigned``) and a
    valid Ed25519 signature of ``manifest.json`` by that key (``bundle.signature``). A
    manifest whose ``expires_at`` is not after ``now`` (default: the current time) is
    refused (``bundle.expired``)."""
    return _verified(bundle, public_key_pem, now)[1]


def read_bundle(
    bundle: Path, public_key_pem: bytes | None = None, *, now: datetime | None = None
) -> tuple[Manifest, Mapping[str, bytes]]:
    """The manifest and files (path → bytes) of ``bundle``, checked as
    :func:`verify_bundle` checks it; nothing is written."""
    contents, manifest = _verified(bundle, public_key_pem, now)
    return manifest, MappingProxyType(contents.files)


def sign_bundle(
    bundle: Path,
    private_key_pem: bytes,
    out: Path | None = None,
    *,
    revision_number: int | None = None,
    expires_at: datetime | None = None,
    check: FilesCheck | None = None,
) -> Manifest:
    """Sign ``bundle`` with an Ed25519 private key: ``manifest.sig`` is added (a signature
    already there is replaced) and the tarball rewritten deterministically to ``out``
    (default: in place, atomically); returns the manifest signed. The bundle is verified
    first: a bundle that does not match its manifest is never signed, nor one whose files
    ``check`` raises for (it is given them once verified).

    The manifest keeps the revision number and expiry it was built with unless
    ``revision_number`` or ``expires_at`` replace them (the signature then covers the new
    ones); an unnumbered (version 1) bundle is numbered as :func:`build_bundle` would,
    with the bundle at ``out`` as the previous release. An expired manifest is signed only
    with a new ``expires_at``."""
    key = _private_key(private_key_pem)
    target = Path(out if out is not None else bundle)
    contents, manifest = _verified(bundle, None, fresh=expires_at is None)
    if check is not None:
        check(MappingProxyType(contents.files))
    if revision_number is not None or expires_at is not None or manifest.revision_number == 0:
        number = revision_number
        if number is None:
            number = manifest.revision_number or default_revision_number(target)
        _check_number(number)
        _check_expiry(expires_at)
        manifest = _manifest(
            manifest.files, number, expires_at if expires_at is not None else manifest.expires_at
        )
        _expired(manifest, None)
        raw = manifest.dumps()
    else:
        raw = contents.manifest  # signed byte for byte as it was built
    signature = base64.b64encode(key.sign(raw)) + b"\n"
    _write_atomic(target, _pack(_bundle_members(raw, signature, contents.files)))
    return manifest


def extract_bundle(
    bundle: Path,
    dest: Path,
    public_key_pem: bytes | None = None,
    *,
    now: datetime | None = None,
) -> Manifest:
    """Verify ``bundle`` (see :func:`verify_bundle`), then write its files under ``dest``.

    The files are written into a new temporary directory beside ``dest`` and renamed to
    ``dest`` at the end, so ``dest`` appears whole or not at all; ``dest`` must not exist
    or be an empty directory (``bundle.dest``). Only the verified bytes are written, each
    path made of components already checked; the manifest and signature are not written,
    so ``directory_revision(dest)`` gives the bundle's revision again."""
    dest = Path(dest)
    contents, manifest = _verified(bundle, public_key_pem, now)
    try:
        occupied = dest.is_symlink() or (
            dest.exists() and (not dest.is_dir() or any(dest.iterdir()))
        )
    except OSError as exc:
        _io(exc, f"look at {dest}", dest)
    if occupied:
        _fail(
            "bundle.dest",
            f"{dest} already exists and is not an empty directory",
            _at(dest),
            hint="extract into a new directory (one per revision, say) and switch to it",
        )
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".{dest.name}.{secrets.token_hex(6)}.tmp"
        tmp.mkdir(mode=0o755)
    except OSError as exc:
        _io(exc, f"create a directory beside {dest}", dest)
    try:
        _write_tree(tmp, contents.files)
        tmp.replace(dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _io(exc, f"extract into {dest}", dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _write_tree(top: Path, files: Mapping[str, bytes]) -> None:
    made: set[str] = set()
    for path, data in sorted(files.items()):
        parts = path.split("/")
        for i in range(1, len(parts)):
            sub = "/".join(parts[:i])
            if sub not in made:
                # Not exist_ok: only directories made here may be written into.
                (top / sub).mkdir(mode=0o755)
                made.add(sub)
        fd = os.open(top / path, _FLAGS_NEW, 0o644)
        try:
            with os.fdopen(fd, "wb", closefd=False) as fh:
                fh.write(data)
        finally:
            os.close(fd)
