"""``kilo-rules tune``: the cheapest setting of a policy's knobs that stays safe.

Reads a tune file (docs/tune.md: the base policy, the model, the sessions, the knobs and
their candidate values, the constraints), replays every session under every candidate in
parallel (or on a Dask cluster), prints the best candidates as a table and writes the
winner as a policy extending the base, with ``report.json`` and ``report.html``. Exits 1
when no candidate meets the constraints or a session could not be replayed (the report is
written all the same); a file the sessions' folders or globs match that is not a log is
skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_DIAGNOSTICS, EXIT_OK, session_failure
from kilo_rules.tools.cli._table import render_table, shorten

if TYPE_CHECKING:
    from kilo_rules.tools.simulation.tune import TuneResult

#: Candidates the text output lists (the report holds them all).
TOP = 10

#: Widest knob value shown in the table (an expression can be long).
_VALUE_WIDTH = 32


def register(sub: opt.Subcommands) -> None:
    """Add ``tune`` to the subcommands."""
    p = opt.add_command(
        sub,
        "tune",
        summary="find the cheapest safe setting of a policy's knobs on recorded sessions",
        description="Replay recorded sessions under every candidate setting of a policy's "
        "knobs, keep those that meet the constraints (provider overflows, compactions, "
        "replays that stop) and write the cheapest as a policy extending the base, with a "
        "JSON and an HTML report (docs/tune.md).",
    )
    p.add_argument("tune_file", metavar="TUNE_FILE", help="the tune file (YAML, version: 1)")
    p.add_argument(
        "--out",
        default="tuned",
        metavar="DIR",
        help="where the winner and the reports are written (default: ./tuned)",
    )
    opt.add_format(p, what="; json: the whole report")
    opt.add_allow_read(p)
    opt.add_corpus(p, title="running")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the tune file, replay, write the outputs and print the best candidates."""
    from kilo_rules.tools.simulation.tune import (
        load_tune_file,
        run_tune,
        with_winner_file,
        write_outputs,
    )

    # Refused before the tune file is read: a mistyped option is the first thing to say.
    opt.check_jobs(args)
    spec = load_tune_file(args.tune_file)
    with opt.corpus_run(args, len(spec.sessions)) as how:
        result = run_tune(spec, **how)
    written = write_outputs(result, args.out)
    if args.format == "json":
        report = result.document()
        if "policy" in written:
            report = with_winner_file(report, written["policy"])
        report = report.model_copy(update={"outputs": {k: str(v) for k, v in written.items()}})
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        _print_text(result, written)
    for session, reason in result.skipped:
        print(f"kilo-rules tune: skipped {session}: not a recorded log ({reason})", file=sys.stderr)
    for i, (session, error) in enumerate(result.failed):
        diags = result.failed_diagnostics[i] if i < len(result.failed_diagnostics) else ()
        print(session_failure("kilo-rules tune", session, diags, error), file=sys.stderr)
    for session in result.uncalibrated:
        print(
            f"kilo-rules tune: note: {session} replayed uncalibrated: its log records no usage "
            "to fit",
            file=sys.stderr,
        )
    if result.winner is None:
        print(
            "kilo-rules tune: no candidate meets the constraints; "
            f"the report is in {written['html']}",
            file=sys.stderr,
        )
    return EXIT_DIAGNOSTICS if result.winner is None or result.failed else EXIT_OK


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return shorten(text, _VALUE_WIDTH)


def _money(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def rows(
    result: TuneResult, limit: int | None = TOP
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The candidates table of a :class:`~kilo_rules.tools.simulation.tune.TuneResult`: the headers
    and one row per candidate, feasible ones first by cost (at most ``limit``)."""
    knobs = result.spec.knobs
    headers = (
        "#",
        *(k.path for k in knobs),
        "cost $",
        "vs baseline",
        "vs floor",
        "compactions",
        "max/session",
        "overflows",
        "stopped",
        "",
    )
    out: list[tuple[str, ...]] = []
    for r in result.ranked()[:limit]:
        c, m = r.candidate, r.measures
        notes = []
        if result.winner == c.index:
            notes.append("winner")
        if c.baseline:
            notes.append("baseline")
        if r.skipped:
            notes.append(f"skipped: {r.diagnostics[0].message}" if r.diagnostics else "skipped")
        elif not r.feasible:
            notes.append("infeasible: " + "; ".join(r.reasons))
        ratio = result.vs_baseline(r)
        out.append(
            (
                str(c.index),
                *(_value(c.values.get(k.path)) for k in knobs),
                _money(m.cost if m else None),
                "-" if ratio is None else f"{100 * (ratio - 1):+.1f} %",
                "-" if m is None or m.floor_ratio is None else f"{m.floor_ratio:.2f}x",
                "-" if m is None else f"{m.compactions:,}",
                "-" if m is None else f"{m.max_compactions:,}",
                "-" if m is None else f"{m.overflows:,}",
                "-" if m is None else f"{m.stopped:,}",
                ", ".join(notes),
            )
        )
    return headers, out


def _skipped(result: TuneResult) -> str:
    n = len(result.skipped)
    return f", {n:,} skipped as not {'a log' if n == 1 else 'logs'}" if n else ""


def _print_text(result: TuneResult, written: dict[str, Path]) -> None:
    spec = result.spec
    measured = sum(1 for r in result.results if not r.skipped)
    calibrated = f", {result.calibration()}" if result.spec.calibrate else ""
    sessions = len(result.sessions)
    count = len(result.results) - 1
    print(
        f"{spec.file.name}: {count:,} candidate{'' if count == 1 else 's'} and the baseline "
        f"({measured - 1:,} replayed) on {sessions:,} session{'' if sessions == 1 else 's'} "
        f"with {spec.model.id}{calibrated}; {len(result.failed):,} failed{_skipped(result)}"
    )
    headers, table = rows(result)
    numeric = range(len(spec.knobs) + 1, len(headers) - 1)
    print(render_table(headers, table, right={0, *numeric}))
    if len(result.results) > TOP:
        print(f"({len(result.results) - TOP:,} more in the report)")
    if result.winner is not None:
        w = result.results[result.winner]
        ratio = result.vs_baseline(w)
        change = "" if ratio is None else f", {100 * (ratio - 1):+.1f} % against the baseline"
        cost = w.measures.cost if w.measures else 0.0
        print(f"winner: candidate {w.candidate.index}, ${cost:.4f}{change}: {written['policy']}")
    print(f"report: {written['html']} ({written['json'].name} beside it)")
