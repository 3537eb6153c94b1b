"""``kilo-rules models``: the bundled model catalog, as a table or as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.tools.cli._options import Subcommands, add_command, add_format
from kilo_rules.tools.cli._runner import EXIT_OK
from kilo_rules.tools.cli._table import render_table

_HEADERS = ("id", "api", "context", "input", "output", "cache")


def register(sub: Subcommands) -> None:
    """Add ``models`` to the subcommands."""
    p = add_command(
        sub,
        "models",
        summary="list the bundled model catalog",
        description="List the bundled model catalog: one row per model, or every field "
        "of every model with --format json.",
    )
    add_format(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the catalog."""
    cat = bundled_catalog()
    if args.format == "json":
        print(json.dumps([m.model_dump(mode="json") for m in cat.models], indent=2))
        return EXIT_OK
    rows = [
        (
            m.id,
            m.api,
            f"{m.limits.context:,}",
            f"{m.limits.input:,}" if m.limits.input else "-",
            f"{m.limits.output:,}",
            m.cache.kind,
        )
        for m in cat.models
    ]
    print(render_table(_HEADERS, rows, right={2, 3, 4}))
    print(f"{len(cat.models)} models, catalog as of {cat.as_of}", file=sys.stderr)
    return EXIT_OK
