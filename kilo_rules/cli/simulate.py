"""``kilo-rules simulate``: replay a recorded session under several policies and compare.

One row per policy: requests, compactions, input tokens and how the prompt cache split
them, output, the largest request against the window, the cost in USD and its ratio to
the first policy. ``--format json`` prints every report with per-step detail. A policy
that stops early (its compaction exhausted) is reported on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ..compile import compile_policy
from ..importers import read_session
from ..simulate import SimulationReport, simulate
from . import _options as opt
from ._runner import EXIT_DIAGNOSTICS, EXIT_OK
from ._table import render_table

_HEADERS = (
    "policy",
    "requests",
    "compactions",
    "input",
    "cache read",
    "cache write",
    "uncached",
    "output",
    "max / window",
    "cost $",
    "vs first",
)


def register(sub: opt.Subcommands) -> None:
    """Add ``simulate`` to the subcommands."""
    p = opt.add_command(
        sub,
        "simulate",
        summary="replay a recorded session under policies; compare cost",
        description="Replay a recorded session step by step under one or more policies: "
        "tokens, prompt-cache reads and writes, compactions and cost (docs/simulate.md).",
    )
    opt.add_model(p)
    opt.add_session(p)
    opt.add_policy(p, many=True)
    opt.add_config(p)
    opt.add_allow_read(p)
    opt.add_format(p, what="; json: every report, step by step")
    p.add_argument(
        "--seconds-per-step",
        type=float,
        default=None,
        metavar="S",
        help="model cache expiry: step k happens at k*S seconds (default: nothing expires)",
    )
    p.add_argument(
        "--lookback",
        type=int,
        default=20,
        metavar="N",
        help="blocks before a breakpoint checked for a cache hit (0: any; default 20)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Replay, print the comparison, and report the policies that stopped early."""
    reports, meta = _simulate(args)
    if args.format == "json":
        doc = {"version": 1, **meta, "reports": [r.to_json() for r in reports]}
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        cache = meta["cache"]
        print(
            f"{meta['session']} on {meta['model']} (cache {cache['kind']}, minimum "
            f"{cache['min_cacheable_tokens']:,} tokens; counted with {reports[0].counter})"
        )
        print(format_table(reports))
        if meta["prices"] is None:
            print("(no prices in the catalog for this model: costs not computed)")
    failed = [r for r in reports if r.error is not None]
    for r in failed:
        print(f"kilo-rules simulate: {r.policy}: stopped early: {r.error}", file=sys.stderr)
    return EXIT_DIAGNOSTICS if failed else EXIT_OK


def _simulate(args: argparse.Namespace) -> tuple[list[SimulationReport], dict[str, Any]]:
    if args.lookback < 0:
        raise ValueError("--lookback must be 0 or more")
    model = opt.model(args.model)
    config = opt.config(args.config)
    plans = [compile_policy(p, model, config=config) for p in opt.policies(args.policy)]
    session = read_session(args.session, run=args.run)
    reports = simulate(
        session,
        plans,
        lookback=args.lookback or None,
        seconds_per_step=args.seconds_per_step,
    )
    meta = {
        "session": args.session,
        "session_messages": len(session.messages),
        "model": model.id,
        "cache": model.cache.model_dump(mode="json"),
        "prices": model.prices.model_dump(mode="json") if model.prices else None,
    }
    return reports, meta


def _row(report: SimulationReport, first: float | None) -> tuple[str, ...]:
    cost = report.cost
    ratio = f"{cost / first:.2f}x" if cost is not None and first else "-"
    done = f"{len(report.steps):,}"
    if report.stopped:  # fewer requests: its totals are not a cost to compare
        done = f"{done} of {report.requests_total:,}, stopped"
        ratio = "-"
    return (
        report.policy,
        done,
        f"{report.compactions:,}",
        f"{report.input:,}",
        f"{report.cache_read:,}",
        f"{report.cache_write:,}",
        f"{report.uncached:,}",
        f"{report.output:,}",
        f"{report.max_request:,} / {report.window:,}",
        "-" if cost is None else f"{cost:.4f}",
        ratio,
    )


def format_table(reports: Sequence[SimulationReport]) -> str:
    """The comparison table: one row per report, the cost ratio against the first; the
    policy name left-aligned, the numbers right-aligned."""
    first = reports[0].cost if reports and not reports[0].stopped else None
    rows = [_row(r, first) for r in reports]
    return render_table(_HEADERS, rows, right=range(1, len(_HEADERS)))
