"""``kilo-rules check PATH...``: validate policy and catalog files, the way CI needs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.tools.checking.check import check_paths
from kilo_rules.tools.checking.report import render
from kilo_rules.tools.cli._options import (
    DIAGNOSTIC_FORMATS,
    DIAGNOSTIC_FORMATS_HELP,
    Subcommands,
    add_allow_read,
    add_command,
    add_format,
    model,
)
from kilo_rules.tools.cli._runner import EXIT_USAGE, read_key, relative


def register(sub: Subcommands) -> None:
    """Add ``check`` to the subcommands."""
    p = add_command(
        sub,
        "check",
        summary="validate policy and catalog files (for CI)",
        description="Validate policy and catalog files: YAML limits, JSON Schema, extends "
        "chains, semantic checks and every expression. All problems are reported. A bundle "
        "file (kilo-rules bundle build) is verified, then every policy in it is checked.",
    )
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="files, directories, globs or bundle files"
    )
    p.add_argument(
        "--pubkey",
        metavar="PUBLIC.pem",
        help="require the bundles checked to be signed by this Ed25519 key (as bundle verify)",
    )
    add_format(p, *DIAGNOSTIC_FORMATS, what=DIAGNOSTIC_FORMATS_HELP)
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="MODEL",
        help="also compile each policy for MODEL (catalog id or model file; repeatable) and "
        "report what would not work for it, e.g. a window with no room left",
    )
    add_allow_read(p)
    p.set_defaults(handler=run)


def print_diagnostics(
    diags: Sequence[Diagnostic],
    fmt: str,
    sources: Mapping[str, str],
    out: TextIO,
    *,
    files: Sequence[str] = (),
) -> None:
    """``diags`` in ``fmt`` (text with source lines and carets, json, github, sarif, junit:
    see ``kilo_rules.tools.checking.report``), their files shown relative to the working directory.
    ``files`` are the files looked at, each a JUnit case. Text and github print nothing
    when there is nothing to report; the other formats always print a document."""
    shown = relative(diags)
    rel_sources: dict[str, str] = {}
    if fmt == "text":
        rel_sources = {Location(f, 1, 1).relative().file: t for f, t in sources.items()}
    rel_files = [Location(f, 1, 1).relative().file for f in files]
    text = render(shown, fmt, sources=rel_sources, files=rel_files, suite="kilo-rules check")
    if text or fmt not in ("text", "github"):
        print(text, file=out)


def run(args: argparse.Namespace) -> int:
    """Check every file named; the exit code says whether any error was found."""
    key = None
    if args.pubkey:
        try:
            key = read_key(args.pubkey)
        except OSError as exc:
            print(f"kilo-rules check: {args.pubkey}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
    report = check_paths(args.paths, models=[model(m) for m in args.model], bundle_key=key)
    for problem in report.usage_errors:
        print(f"kilo-rules check: {problem}", file=sys.stderr)
    print_diagnostics(
        report.diagnostics, args.format, report.sources, sys.stdout, files=report.files
    )
    if args.format == "text":
        n_err = len(report.errors)
        n_warn = len(report.diagnostics) - n_err
        summary = f"checked {len(report.files)} file(s): {n_err} error(s), {n_warn} warning(s)"
        print(summary, file=sys.stderr)
    return report.exit_code
