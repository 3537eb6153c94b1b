"""``kilo-rules schema [NAME] [--write | --check]``: the JSON Schemas generated from the
models, printed, written to ``schemas/`` or checked against it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kilo_rules.engine.base import safefs
from kilo_rules.engine.formats.load import schema_root
from kilo_rules.tools.checking.jsonschemas import generated_schemas, render
from kilo_rules.tools.cli._options import Subcommands, add_command
from kilo_rules.tools.cli._runner import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_USAGE

#: The schemas by the name the command takes (``NAME.v1.json`` in ``schemas/``); a test
#: keeps it equal to what the generator makes.
NAMES = (
    "policy",
    "session",
    "catalog",
    "routes",
    "policytest",
    "tune",
    "simulate",
    "corpus",
    "tune-report",
)


def register(sub: Subcommands) -> None:
    """Add ``schema`` to the subcommands."""
    p = add_command(
        sub,
        "schema",
        summary="print, write or verify the JSON Schemas",
        description="Print a JSON Schema (for editors), or write or verify schemas/*.json.",
    )
    p.add_argument("name", nargs="?", default="policy", help=f"one of: {', '.join(NAMES)}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="regenerate schemas/*.json")
    g.add_argument("--check", action="store_true", help="fail if schemas/*.json are stale")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print, write or verify the schemas."""
    schemas = generated_schemas()
    if args.write or args.check:
        root = Path(str(schema_root()))
        stale = []
        for name, schema in schemas.items():
            target = root / name
            text = render(schema)
            current = target.read_text(encoding="utf-8") if target.exists() else None
            if current != text:
                stale.append(name)
                if args.write:
                    safefs.write_atomic(target, text)
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
