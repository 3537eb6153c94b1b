"""``kilo-rules check PATH...``: validate policy and catalog files, the way CI needs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from ..check import check_paths
from ..errors import Diagnostic, Location, render_github, render_json, render_text
from ._options import Subcommands, add_allow_read, add_command, add_format, model
from ._runner import relative


def register(sub: Subcommands) -> None:
    """Add ``check`` to the subcommands."""
    p = add_command(
        sub,
        "check",
        summary="validate policy and catalog files (for CI)",
        description="Validate policy and catalog files: YAML limits, JSON Schema, extends "
        "chains, semantic checks and every expression. All problems are reported.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, directories or globs")
    add_format(p, "github", what="; github: workflow annotations")
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
    diags: Sequence[Diagnostic], fmt: str, sources: Mapping[str, str], out: TextIO
) -> None:
    """``diags`` in ``fmt`` (text with source lines and carets, json, github), their files
    shown relative to the working directory."""
    shown = relative(diags)
    if fmt == "json":
        print(render_json(shown), file=out)
    elif fmt == "github":
        if shown:
            print(render_github(shown), file=out)
    elif shown:
        rel_sources = {Location(f, 1, 1).relative().file: t for f, t in sources.items()}
        print(render_text(shown, rel_sources), file=out)


def run(args: argparse.Namespace) -> int:
    """Check every file named; the exit code says whether any error was found."""
    report = check_paths(args.paths, models=[model(m) for m in args.model])
    for problem in report.usage_errors:
        print(f"kilo-rules check: {problem}", file=sys.stderr)
    print_diagnostics(report.diagnostics, args.format, report.sources, sys.stdout)
    if args.format == "text":
        n_err = len(report.errors)
        n_warn = len(report.diagnostics) - n_err
        summary = f"checked {len(report.files)} file(s): {n_err} error(s), {n_warn} warning(s)"
        print(summary, file=sys.stderr)
    return report.exit_code
