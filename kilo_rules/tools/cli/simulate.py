"""``kilo-rules simulate``: replay recorded sessions under several policies and compare.

One session: one row per policy (requests, compactions, input tokens and how the prompt
cache split them, output, the largest request against the window, the cost in USD, its
ratio to the session's cost floor and to the first policy). Many sessions (several
``--session``, a folder or a glob): they run in parallel on every core (or on a Dask
cluster), with progress on stderr, and the report aggregates them per policy and lists the
worst sessions. ``--format json`` prints every document with per-step detail; ``--html``
writes the report with its charts. A policy that stops early (its compaction exhausted) or
a session that cannot be simulated is reported on stderr and exits 1; over many sessions
the others are reported all the same, and a file a folder or glob matched that is not a
log at all is skipped with a note (docs/simulate.md, "Many sessions").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location, SessionError
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_DIAGNOSTICS, EXIT_OK, session_failure
from kilo_rules.tools.cli._table import render_table

if TYPE_CHECKING:
    from kilo_rules.tools.simulation.documents import (
        CorpusDocument,
        FailedSession,
        PolicyReport,
        SessionDocument,
    )
    from kilo_rules.tools.simulation.fleet import Outcome

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
    "vs floor",
    "vs first",
)


def register(sub: opt.Subcommands) -> None:
    """Add ``simulate`` to the subcommands."""
    p = opt.add_command(
        sub,
        "simulate",
        summary="replay recorded sessions under policies; compare cost",
        description="Replay recorded sessions step by step under one or more policies: "
        "tokens, prompt-cache reads and writes, compactions, cost and the cost floor "
        "(docs/simulate.md).",
    )
    opt.add_model(p)
    p.add_argument(
        "--session",
        action="append",
        required=True,
        metavar="FILE|DIR|GLOB",
        help="a Session v1 file or a recorded agent log; a folder or a glob for many (repeatable)",
    )
    opt.add_run(p)
    opt.add_policy(p, many=True)
    opt.add_config(p)
    opt.add_allow_read(p)
    opt.add_format(p, what="; json: every report, step by step")
    p.add_argument("--html", metavar="FILE", help="also write the report with its charts")
    cal = p.add_argument_group("calibration")
    cal.add_argument(
        "--calibrate",
        action="store_true",
        help="fit the log's recorded usage and replay with it (docs/simulate.md)",
    )
    cal.add_argument(
        "--hidden-prefix",
        type=int,
        default=None,
        metavar="TOKENS",
        help="tokens the agent sent that the log does not hold (its system prompt, tools)",
    )
    cal.add_argument(
        "--token-factor",
        action="append",
        default=[],
        metavar="[PROVIDER=]F",
        help="the provider's tokens per simulated token (repeatable, per provider)",
    )
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
    many = opt.add_corpus(p, title="many sessions")
    many.add_argument(
        "--worst", type=int, default=10, metavar="N", help="worst sessions listed (default 10)"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Replay, print the comparison, and report what stopped early or failed."""
    from kilo_rules.tools.simulation.fleet import expand_sessions

    if args.lookback < 0:
        raise ValueError("--lookback must be 0 or more")
    paths = expand_sessions(args.session)
    single = len(args.session) == 1 and len(paths) == 1 and Path(args.session[0]).is_file()
    if args.run is not None and not single:
        raise ValueError("--run picks a run of one log: give exactly one --session file")
    job = _job(args, steps=single or args.format == "json" or bool(args.html))
    if single:
        return _one(args, job(paths[0]))
    return _many(args, paths, job)


def _job(args: argparse.Namespace, *, steps: bool) -> Any:
    from kilo_rules.engine.base.sandbox import operator_roots
    from kilo_rules.tools.simulation.simulate import SessionJob

    model = opt.model(args.model)
    return SessionJob(
        policies=tuple(str(p) for p in opt.policies(args.policy)),
        model=model,
        config=opt.config(args.config),
        read_roots=tuple(str(r) for r in operator_roots()),
        calibrate=args.calibrate,
        declared=_declared(args, model.provider),
        lookback=args.lookback or None,
        seconds_per_step=args.seconds_per_step,
        steps=steps,
        run=args.run,
    )


def _declared(args: argparse.Namespace, provider: str) -> Any:
    """The calibration set by hand, or None: ``--hidden-prefix`` and the
    ``--token-factor`` of the model's provider (a bare factor applies to any)."""
    from kilo_rules.tools.simulation.simulate import Calibration

    factor: float | None = None
    general: float | None = None
    for raw in args.token_factor:
        name, sep, value = str(raw).rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--token-factor {raw!r}: expected F or PROVIDER=F") from None
        if not sep:
            general = number
        elif name == provider:
            factor = number
    factor = factor if factor is not None else general
    if factor is None and args.hidden_prefix is None:
        return None
    return Calibration(factor=factor or 1.0, offset=args.hidden_prefix or 0)


def _one(args: argparse.Namespace, doc: SessionDocument) -> int:
    if args.format == "json":
        print(json.dumps(doc.to_json(), indent=2, ensure_ascii=False))
    else:
        cache = doc.cache
        reports = doc.reports
        print(
            f"{doc.session} on {doc.model} (cache {cache.kind}, minimum "
            f"{cache.min_cacheable_tokens:,} tokens; counted with {reports[0].counter})"
        )
        for line in _notes(doc):
            print(line)
        print(format_table(reports))
        if doc.prices is None:
            print("(no prices in the catalog for this model: costs not computed)")
    _write_html(args, doc)
    failed = [r for r in doc.reports if r.error is not None]
    for r in failed:
        print(f"kilo-rules simulate: {r.policy}: stopped early: {r.error}", file=sys.stderr)
    return EXIT_DIAGNOSTICS if failed else EXIT_OK


def _notes(doc: SessionDocument) -> list[str]:
    """The notes, the calibration and the floor, one line each."""
    out = [f"note: {n}" for n in doc.notes]
    cal = doc.calibration
    if cal is not None:
        how = "declared" if cal.declared else f"fitted on {cal.steps} recorded requests"
        fit = ""
        if not cal.declared:
            fit = (
                f", R² {cal.r2:.3f}, median error {100 * cal.median_abs_error:.1f} %"
                if cal.r2 is not None and cal.median_abs_error is not None
                else ""
            )
        state = "applied" if cal.applied else "not applied (--calibrate applies it)"
        out.append(
            f"calibration ({how}{fit}): provider count = {cal.factor:.3f} x simulated "
            f"+ {cal.offset:,} hidden tokens; {state}"
        )
    floor = doc.floor
    if floor is not None:
        out.append(
            f"cost floor ${floor.cost_usd:.4f}: {floor.policy}'s requests under a "
            "perfect prompt cache (each token written once, read by every later request "
            "that repeats it)"
        )
    return out


def _many(args: argparse.Namespace, paths: Sequence[Path], job: Any) -> int:
    from kilo_rules.tools.simulation.documents import CorpusDocument, SkippedFile
    from kilo_rules.tools.simulation.fleet import (
        aggregate_documents,
        aggregate_rows,
        named_files,
        not_a_log,
        run_corpus,
        worst_rows,
    )

    with opt.corpus_run(args, len(paths)) as how:
        outcomes = run_corpus(paths, job, **how)
    named = named_files(args.session)
    docs: list[SessionDocument] = []
    failures: list[Outcome[SessionDocument]] = []
    skipped: list[SkippedFile] = []
    for o in outcomes:
        reason = not_a_log(o, named)
        if o.value is not None:
            docs.append(o.value)
        elif reason is not None:
            skipped.append(
                SkippedFile(session=str(o.path), code=o.diagnostics[0].code, reason=reason)
            )
        else:
            failures.append(o)
    if not docs and not failures:
        raise _nothing_to_replay(len(skipped))
    failed = [_failed(o) for o in failures]
    agg = aggregate_documents([*docs, *failed], worst=args.worst)
    corpus = CorpusDocument(
        version=1,
        model=job.model.id,
        sessions=docs,
        aggregate=agg,
        failed=failed,
        skipped=skipped,
    )
    if args.format == "json":
        print(json.dumps(corpus.to_json(), indent=2, ensure_ascii=False))
    else:
        also = ""
        if skipped:
            also = f", {len(skipped):,} skipped as not {'a log' if len(skipped) == 1 else 'logs'}"
        print(f"{len(docs):,} sessions on {job.model.id} ({len(failures):,} failed{also})")
        headers, rows = aggregate_rows(agg)
        print(render_table(headers, rows, right=range(1, len(headers))))
        if agg.worst:
            print("\nworst sessions (stopped first, then by cost against the floor):")
            headers, rows = worst_rows(agg)
            print(render_table(headers, rows))
    for doc in docs:
        for note in doc.notes:
            print(f"kilo-rules simulate: note: {doc.session}: {note}", file=sys.stderr)
    for entry in skipped:
        print(
            f"kilo-rules simulate: skipped {entry.session}: not a recorded log ({entry.reason})",
            file=sys.stderr,
        )
    if docs:
        _write_html(args, corpus)
    elif args.html:
        print(
            f"kilo-rules simulate: {args.html} not written: no session could be replayed",
            file=sys.stderr,
        )
    for o in failures:
        print(
            session_failure("kilo-rules simulate", str(o.path), o.diagnostics, o.error),
            file=sys.stderr,
        )
    early = sum(1 for d in docs for r in d.reports if r.error is not None)
    if early:
        print(f"kilo-rules simulate: {early} replays stopped early", file=sys.stderr)
    if failures and docs:
        print(
            f"kilo-rules simulate: {len(failures):,} of {len(failures) + len(docs):,} "
            "sessions could not be replayed (the others are reported)",
            file=sys.stderr,
        )
    elif failures:
        print("kilo-rules simulate: no session could be replayed", file=sys.stderr)
    return EXIT_DIAGNOSTICS if failures or early else EXIT_OK


def _failed(o: Outcome[Any]) -> FailedSession:
    """A failed session as the corpus document lists it: the first diagnostic as text (what
    the HTML report shows) and all of them."""
    from kilo_rules.tools.simulation.documents import DiagnosticDocument, FailedSession

    return FailedSession(
        session=str(o.path),
        error=str(o.diagnostics[0]) if o.diagnostics else (o.error or "failed"),
        diagnostics=[DiagnosticDocument.of(d) for d in o.diagnostics],
    )


def _nothing_to_replay(skipped: int) -> SessionError:
    from kilo_rules.tools.simulation.fleet import COMMAND_LINE

    return SessionError(
        Diagnostic(
            "simulate.no-sessions",
            "the one file matched is not a recorded log"
            if skipped == 1
            else f"none of the {skipped:,} files matched is a recorded log",
            Location(COMMAND_LINE, 1, 1),
            hint="name the logs, or a folder or glob that holds some",
        )
    )


def _write_html(args: argparse.Namespace, doc: SessionDocument | CorpusDocument) -> None:
    if not args.html:
        return
    from kilo_rules.tools.simulation.htmlreport import render_html

    try:
        # Whole or not at all: a run killed mid-write leaves the old report, never half one.
        safefs.write_atomic(args.html, render_html(doc))
    except OSError as exc:
        raise KiloRulesError(
            Diagnostic(
                "simulate.html",
                f"cannot write {args.html}: {exc.strerror or exc}",
                Location(args.html, 1, 1),
            )
        ) from None


def _row(report: PolicyReport, first: float | None) -> tuple[str, ...]:
    cost = report.cost_usd
    ratio = f"{cost / first:.2f}x" if cost is not None and first else "-"
    floor = report.floor_ratio
    done = f"{report.requests:,}"
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
        "-" if floor is None else f"{floor:.2f}x",
        ratio,
    )


def format_table(reports: Sequence[PolicyReport | Mapping[str, Any]]) -> str:
    """The comparison table of one session's reports (the documents' reports, or their
    JSON): one row per report, the cost against the floor and against the first; the
    policy name left-aligned, the numbers right-aligned."""
    from kilo_rules.tools.simulation.documents import PolicyReport

    typed = [r if isinstance(r, PolicyReport) else PolicyReport.model_validate(r) for r in reports]
    first = typed[0].cost_usd if typed and not typed[0].stopped else None
    rows = [_row(r, first) for r in typed]
    return render_table(_HEADERS, rows, right=range(1, len(_HEADERS)))
