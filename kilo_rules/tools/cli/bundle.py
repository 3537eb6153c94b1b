"""``kilo-rules bundle build|sign|verify|keygen``: policy bundles (docs/bundles.md).

``build DIR -o FILE [--revision N] [--expires-at TIME]`` packs a policy directory and
prints its revision; ``sign FILE --key PRIVATE.pem [-o OUT] [--revision N] [--expires-at
TIME]`` adds an Ed25519 signature; ``verify FILE [--pubkey PUBLIC.pem]`` checks a bundle
(and its signature, given a key) and prints its revision; ``keygen --out-dir DIR`` writes a
key pair, ``bundle.key`` (mode 0600) and ``bundle.pub``.

The revision number orders releases (a store refuses one not above the one it serves):
``--revision N``, or by default the Unix time in seconds, or one more than the number of
the bundle already at the output when that is higher (docs/bundles.md, "Rollback").

``build`` and ``sign`` check the policies the bundle holds first, as ``kilo-rules check``
does, and refuse on an error (exit 1, the diagnostics on stderr, nothing written).

A bundle that fails a check exits 1 with the located diagnostic on stderr; a file that
cannot be read or written, a key that cannot be loaded, or a missing ``cryptography``
(the ``bundle`` extra) exits 2."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.engine.formats.bundle import (
    MAX_REVISION_NUMBER,
    BundleError,
    FilesCheck,
    Manifest,
    build_bundle,
    expires_at_text,
    generate_keypair,
    parse_expires_at,
    sign_bundle,
    verify_bundle,
)
from kilo_rules.tools.checking.check import CheckReport, check_files
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_USAGE, read_key, report
from kilo_rules.tools.cli.check import print_diagnostics

#: Codes about what was asked (a path, a key, the installation), not about a bundle.
_USAGE_CODES = frozenset({"bundle.io", "bundle.key", "bundle.cryptography-missing", "bundle.dest"})

PRIVATE_KEY = "bundle.key"
PUBLIC_KEY = "bundle.pub"


def _number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_REVISION_NUMBER:
        raise argparse.ArgumentTypeError(f"a revision number is 1 to {MAX_REVISION_NUMBER}")
    return value


def _expiry(text: str) -> datetime:
    try:
        return parse_expires_at(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _release_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--revision",
        type=_number,
        metavar="N",
        help=f"the release's revision number, signed with the manifest ({default})",
    )
    p.add_argument(
        "--expires-at",
        type=_expiry,
        metavar="TIME",
        help="when the manifest stops being accepted, RFC 3339 UTC (2026-01-31T12:00:00Z)",
    )


def _describe(manifest: Manifest) -> str:
    out = (
        f"revision number {manifest.revision_number}" if manifest.revision_number else "unnumbered"
    )
    if manifest.expires_at is not None:
        out += f", expires {expires_at_text(manifest.expires_at)}"
    return out


def register(sub: opt.Subcommands) -> None:
    """Add ``bundle`` and its actions to the subcommands."""
    p = opt.add_command(
        sub,
        "bundle",
        summary="build, sign and verify policy bundles",
        description="Policy bundles: a policy directory packed as a gzipped tarball with a "
        "manifest of SHA-256 digests, a revision, and optionally an Ed25519 signature "
        "(see docs/bundles.md).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    b = opt.add_command(
        actions,
        "build",
        summary="pack a policy directory into a bundle; prints its revision",
        description="Pack a policy directory into a bundle (deterministic: the same "
        "directory gives a byte-identical file) and print its revision.",
    )
    b.add_argument("dir", metavar="DIR", help="the policy directory")
    b.add_argument("-o", "--output", required=True, metavar="FILE", help="the bundle to write")
    _release_options(
        b,
        "default: the Unix time in seconds, or one more than the bundle already at FILE",
    )
    b.set_defaults(handler=run_build)

    s = opt.add_command(
        actions,
        "sign",
        summary="sign a bundle with an Ed25519 private key",
        description="Verify a bundle, then add manifest.sig: an Ed25519 signature over its "
        "manifest.json. Prints the revision.",
    )
    s.add_argument("file", metavar="FILE", help="the bundle to sign")
    s.add_argument("--key", required=True, metavar="PRIVATE.pem", help="the private key")
    s.add_argument("-o", "--output", metavar="OUT", help="write here (default: FILE, in place)")
    _release_options(s, "default: the one it was built with")
    s.set_defaults(handler=run_sign)

    v = opt.add_command(
        actions,
        "verify",
        summary="verify a bundle (and its signature, given --pubkey)",
        description="Verify a bundle: every member against the manifest, the manifest's "
        "revision, and with --pubkey its signature (an unsigned bundle then fails). "
        "Prints the revision.",
    )
    v.add_argument("file", metavar="FILE", help="the bundle to verify")
    v.add_argument("--pubkey", metavar="PUBLIC.pem", help="require a signature by this key")
    v.set_defaults(handler=run_verify)

    k = opt.add_command(
        actions,
        "keygen",
        summary="write a new Ed25519 key pair for signing bundles",
        description=f"Write a new Ed25519 key pair: {PRIVATE_KEY} (PKCS#8 PEM, mode 0600) "
        f"and {PUBLIC_KEY} (PEM). Existing files are never overwritten.",
    )
    k.add_argument("--out-dir", required=True, metavar="DIR", help="where to write the keys")
    k.set_defaults(handler=run_keygen)


def _refused(exc: BundleError, key: str | None = None) -> int:
    if key is not None:
        # The library is given the key's bytes; the reader wants to know which file.
        where = Location(key, 1, 1)
        exc = BundleError(
            [
                dataclasses.replace(d, location=where) if d.code == "bundle.key" else d
                for d in exc.diagnostics
            ]
        )
    code = report(exc)
    return EXIT_USAGE if all(d.code in _USAGE_CODES for d in exc.diagnostics) else code


class _UncheckedError(Exception):
    """The policies a bundle would hold do not pass ``kilo-rules check``."""

    def __init__(self, report: CheckReport) -> None:
        super().__init__("the bundle's policies have errors")
        self.report = report


def _checked(shown_as: str) -> FilesCheck:
    """A check of the files a bundle is about to hold, as ``kilo-rules check`` checks a
    policy tree, that refuses them on an error (warnings are printed, and let through)."""

    def check(files: Mapping[str, bytes]) -> None:
        report = check_files(files, shown_as)
        if report.errors or report.usage_errors:
            raise _UncheckedError(report)
        if report.diagnostics:
            print_diagnostics(report.diagnostics, "text", report.sources, sys.stderr)

    return check


def _unchecked(exc: _UncheckedError, what: str) -> int:
    report = exc.report
    for problem in report.usage_errors:
        print(f"kilo-rules bundle: {problem}", file=sys.stderr)
    print_diagnostics(report.diagnostics, "text", report.sources, sys.stderr)
    print(
        f"kilo-rules bundle: {what}: {len(report.errors)} error(s) in its policies "
        "(kilo-rules check); nothing written",
        file=sys.stderr,
    )
    return EXIT_DIAGNOSTICS


def run_build(args: argparse.Namespace) -> int:
    """Check the directory's policies, build the bundle and print its revision."""
    root = Path(args.dir)
    try:
        manifest = build_bundle(
            root,
            Path(args.output),
            revision_number=args.revision,
            expires_at=args.expires_at,
            check=_checked(f"{root.as_posix().rstrip('/')}/"),
        )
    except _UncheckedError as exc:
        return _unchecked(exc, args.dir)
    except BundleError as exc:
        return _refused(exc)
    print(manifest.revision)
    print(
        f"{args.output}: {len(manifest.files)} file(s), {_describe(manifest)}, unsigned",
        file=sys.stderr,
    )
    return EXIT_OK


def run_sign(args: argparse.Namespace) -> int:
    """Check the bundle's policies, sign it and print its revision."""
    key = read_key(args.key)
    out = Path(args.output) if args.output else None
    try:
        sign_bundle(
            Path(args.file),
            key,
            out,
            revision_number=args.revision,
            expires_at=args.expires_at,
            check=_checked(f"{args.file}!/"),
        )
        manifest = verify_bundle(out or Path(args.file))
    except _UncheckedError as exc:
        return _unchecked(exc, args.file)
    except BundleError as exc:
        return _refused(exc, args.key)
    print(manifest.revision)
    print(
        f"{out or args.file}: signed, {len(manifest.files)} file(s), {_describe(manifest)}",
        file=sys.stderr,
    )
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    """Verify the bundle and print its revision."""
    key = read_key(args.pubkey) if args.pubkey else None
    try:
        manifest = verify_bundle(Path(args.file), key)
    except BundleError as exc:
        return _refused(exc, args.pubkey)
    signature = "signature valid" if key else "signature not checked (no --pubkey)"
    print(manifest.revision)
    print(
        f"{args.file}: valid, {len(manifest.files)} file(s), {_describe(manifest)}, {signature}",
        file=sys.stderr,
    )
    return EXIT_OK


def run_keygen(args: argparse.Namespace) -> int:
    """Write a new key pair into ``--out-dir``."""
    out = Path(args.out_dir)
    private_path, public_path = out / PRIVATE_KEY, out / PUBLIC_KEY
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            return _refused(
                BundleError(
                    Diagnostic(
                        "bundle.io",
                        f"{path} already exists; keys are never overwritten",
                        Location(str(path), 1, 1),
                        hint="remove it or choose another --out-dir",
                    )
                )
            )
    try:
        private, public = generate_keypair()
    except BundleError as exc:
        return _refused(exc)
    out.mkdir(parents=True, exist_ok=True)
    # Created 0600 rather than chmod-ed after, so the key is never readable by others, not
    # even for a moment; fchmod makes it exactly 0600 whatever the umask.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fd, 0o600)
        fh.write(private)
    with public_path.open("xb") as fh:
        fh.write(public)
    print(private_path)
    print(public_path)
    return EXIT_OK
