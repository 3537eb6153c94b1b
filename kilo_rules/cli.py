"""The ``kilo-rules`` command line. ``main(argv) -> int``; each failure class has its exit code:
0 success, 1 diagnostics (the input is wrong), 2 usage or I/O problems."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from . import __version__
from .errors import Diagnostic, KiloRulesError, Location, render_github, render_json, render_text

EXIT_OK, EXIT_DIAGNOSTICS, EXIT_USAGE = 0, 1, 2


def _print_diagnostics(
    diags: Sequence[Diagnostic], fmt: str, sources: dict[str, str], out: TextIO
) -> None:
    from .check import relativize

    shown = [dataclasses.replace(d, location=relativize(d.location)) for d in diags]
    rel_sources = {relativize(Location(f, 1, 1)).file: t for f, t in sources.items()}
    if fmt == "json":
        print(render_json(shown), file=out)
    elif fmt == "github":
        if shown:
            print(render_github(shown), file=out)
    elif shown:
        print(render_text(shown, rel_sources), file=out)


def cmd_check(args: argparse.Namespace) -> int:
    """Validate policy and catalog files."""
    from .check import check_paths

    report = check_paths(args.paths)
    for problem in report.usage_errors:
        print(f"kilo-rules check: {problem}", file=sys.stderr)
    _print_diagnostics(report.diagnostics, args.format, report.sources, sys.stdout)
    if args.format == "text":
        n_err = len(report.errors)
        n_warn = len(report.diagnostics) - n_err
        summary = f"checked {len(report.files)} file(s): {n_err} error(s), {n_warn} warning(s)"
        print(summary, file=sys.stderr)
    return report.exit_code


def cmd_schema(args: argparse.Namespace) -> int:
    """Print, write or verify the JSON Schemas generated from the models."""
    from .jsonschemas import generated_schemas, render
    from .load import schema_root

    schemas = generated_schemas()
    root = Path(str(schema_root()))
    if args.write or args.check:
        stale = []
        for name, schema in schemas.items():
            target = root / name
            text = render(schema)
            current = target.read_text(encoding="utf-8") if target.exists() else None
            if current != text:
                stale.append(name)
                if args.write:
                    target.write_text(text, encoding="utf-8")
        if args.check and stale:
            print(
                f"stale schemas: {', '.join(stale)} (run kilo-rules schema --write)",
                file=sys.stderr,
            )
            return EXIT_DIAGNOSTICS
        return EXIT_OK
    name = args.name if args.name.endswith(".json") else f"{args.name}.v1.json"
    if name not in schemas:
        print(f"unknown schema {args.name!r}; known: {', '.join(schemas)}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(render(schemas[name]))
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    """List the bundled model catalog."""
    from .catalog import bundled_catalog

    cat = bundled_catalog()
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in cat.models], indent=2))
        return EXIT_OK
    print(f"{'id':44} {'api':18} {'context':>9} {'input':>9} {'output':>8}  cache")
    for m in cat.models:
        inp = f"{m.limits.input:,}" if m.limits.input else "-"
        print(
            f"{m.id:44} {m.api:18} {m.limits.context:>9,} {inp:>9} {m.limits.output:>8,}  "
            f"{m.cache.kind}"
        )
    print(f"{len(cat.models)} models, catalog as of {cat.as_of}", file=sys.stderr)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the bundled default: check the bundled policies, then show what
    kilo-default compiles to."""
    from .check import check_paths
    from .load import resource_root

    root = str(resource_root())
    report = check_paths([root])
    _print_diagnostics(report.diagnostics, "text", report.sources, sys.stdout)
    print(
        f"bundled policies and catalog: {len(report.files)} file(s), {len(report.errors)} error(s)"
    )
    if report.exit_code:
        return report.exit_code
    from .summary import policy_summary

    print()
    print(policy_summary("kilo-default", args.model))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="kilo-rules",
        description="Context policies as code: check, compile and apply YAML policies.",
    )
    parser.add_argument("--version", action="version", version=f"kilo-rules {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check", help="validate policy and catalog files (for CI)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, directories or globs")
    p.add_argument("--format", choices=["text", "json", "github"], default="text")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("schema", help="print, write or verify the JSON Schemas")
    p.add_argument("name", nargs="?", default="policy", help="policy, session or catalog")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="regenerate schemas/*.json")
    g.add_argument("--check", action="store_true", help="fail if schemas/*.json are stale")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("models", help="list the bundled model catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("demo", help="check the bundled policies and summarise kilo-default")
    p.add_argument("--model", default="anthropic/claude-sonnet-4-5")
    p.set_defaults(func=cmd_demo)

    import importlib

    try:
        import_cli = importlib.import_module("kilo_rules.importers.cli")
    except ImportError:  # the importers may be absent from a trimmed build
        import_cli = None
    if import_cli is not None:
        p = sub.add_parser("import", help="import a recorded agent log into Session v1")
        import_cli.add_arguments(p)
        p.set_defaults(func=import_cli.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help / usage errors
        return int(exc.code or 0) if exc.code in (0, None) else EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except KiloRulesError as exc:
        print(render_text(exc.diagnostics), file=sys.stderr)
        return EXIT_DIAGNOSTICS
    except OSError as exc:
        print(f"kilo-rules: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # pragma: no cover
        return 130
