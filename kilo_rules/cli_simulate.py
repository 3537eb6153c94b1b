"""``kilo-rules simulate``: replay a recorded session under several policies and compare.

One row per policy: requests, compactions, input tokens and how the prompt cache split
them, output, the largest request against the window, the cost in USD and its ratio to
the first policy. ``--json`` prints every report with per-step detail. Exit codes as for
the rest of the CLI: 0 success, 1 diagnostics (a bad policy or model, a plan whose
compaction was exhausted), 2 usage or I/O problems.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from .cli import EXIT_DIAGNOSTICS, EXIT_OK, guarded
from .simulate import SimulationReport, simulate

__all__ = ["add_arguments", "format_table", "run"]


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``simulate`` options on ``parser``."""
    parser.add_argument("--model", required=True, help="catalog id or a model file")
    parser.add_argument("--session", required=True, help="Session v1 JSON or a recorded log")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="POLICY",
        help="bundled name or path; repeat to compare (default: kilo-default)",
    )
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--run", type=int, default=None, help="run number in multi-run logs")
    parser.add_argument("--json", action="store_true", help="every report, step by step")
    parser.add_argument(
        "--seconds-per-step",
        type=float,
        default=None,
        metavar="S",
        help="model cache expiry: step k happens at k*S seconds (default: nothing expires)",
    )
    parser.add_argument(
        "--lookback",
        type=int,
        default=20,
        metavar="N",
        help="blocks before a breakpoint checked for a cache hit (0: any; default 20)",
    )


def _int(n: int) -> str:
    return f"{n:,}"


def _row(report: SimulationReport, first: float | None) -> tuple[str, ...]:
    cost = report.cost
    ratio = "-"
    if cost is not None and first:
        ratio = f"{cost / first:.2f}x"
    return (
        report.policy,
        _int(len(report.steps)),
        _int(report.compactions),
        _int(report.input),
        _int(report.cache_read),
        _int(report.cache_write),
        _int(report.uncached),
        _int(report.output),
        f"{report.max_request:,} / {report.window:,}",
        "-" if cost is None else f"{cost:.4f}",
        ratio,
    )


def format_table(reports: Sequence[SimulationReport]) -> str:
    """The comparison table: one row per report, the cost ratio against the first."""
    first = reports[0].cost if reports else None
    rows = [_HEADERS, *(_row(r, first) for r in reports)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    lines = []
    for n, row in enumerate(rows):
        # the policy name reads best left-aligned, numbers right-aligned
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _simulate(args: argparse.Namespace) -> tuple[list[SimulationReport], dict[str, Any]]:
    from .cli import _config, _model
    from .compile import compile_policy
    from .importers import read_session

    model = _model(args.model)
    config = _config(args.config)
    policies = args.policy or ["kilo-default"]
    plans = [compile_policy(p, model, config=config) for p in policies]
    session = read_session(args.session, run=args.run)
    if args.lookback is not None and args.lookback < 0:
        raise ValueError("--lookback must be 0 or more")
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


def _print(
    reports: list[SimulationReport], meta: dict[str, Any], as_json: bool, out: TextIO
) -> None:
    if as_json:
        doc = {"version": 1, **meta, "reports": [r.to_json() for r in reports]}
        print(json.dumps(doc, indent=2, ensure_ascii=False), file=out)
        return
    cache = meta["cache"]
    print(
        f"{meta['session']} on {meta['model']} (cache {cache['kind']}, minimum "
        f"{cache['min_cacheable_tokens']:,} tokens; counted with {reports[0].counter})",
        file=out,
    )
    print(format_table(reports), file=out)
    if meta["prices"] is None:
        print("(no prices in the catalog for this model: costs not computed)", file=out)


def run(args: argparse.Namespace) -> int:
    """Run ``simulate`` with parsed ``args``; returns the exit code."""
    return guarded(lambda: _run(args), "kilo-rules simulate")


def _run(args: argparse.Namespace) -> int:
    reports, meta = _simulate(args)
    _print(reports, meta, args.json, sys.stdout)
    failed = [r for r in reports if r.error is not None]
    for r in failed:
        print(f"kilo-rules simulate: {r.policy}: stopped early: {r.error}", file=sys.stderr)
    return EXIT_DIAGNOSTICS if failed else EXIT_OK
