"""``kilo-rules verify``: what a policy would get wrong on each catalog model, and with
``--session`` whether a recorded session's cached prefix stays a prefix under it.

Findings for many models at one place in the policy are one diagnostic listing the models
(docs/verify.md). Exit codes as ``check``: 1 when an error is found (warnings and notes
exit 0), 2 for a bad option or an unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog
from kilo_rules.engine.importers import read_session
from kilo_rules.tools.checking.report import render
from kilo_rules.tools.checking.verify import (
    StabilityReport,
    match_models,
    prefix_stability,
    verify_policy,
)
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_DIAGNOSTICS, EXIT_OK, relative


def register(sub: opt.Subcommands) -> None:
    """Add ``verify`` to the subcommands."""
    p = opt.add_command(
        sub,
        "verify",
        summary="verify a policy on every catalog model (and a session's cache prefix)",
        description="Compile the policy for every catalog model (or those --model selects) "
        "and report what would go wrong: breakpoint budgets, breakpoints on a prefix too "
        "short to cache, windows with no room, output caps, tokenizers, missing prompts. "
        "With --session, replay the session and report every step whose cached prefix "
        "changed, and why (docs/verify.md).",
    )
    opt.add_policy(p, many=True)
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="GLOB",
        help="catalog ids to verify on, as a glob (anthropic/*), or a model file "
        "(repeatable; default: the whole catalog)",
    )
    opt.add_session(p, required=False)
    opt.add_config(p)
    opt.add_allow_read(p)
    opt.add_format(
        p,
        *opt.DIAGNOSTIC_FORMATS,
        what=opt.DIAGNOSTIC_FORMATS_HELP + "; json also holds the --session report",
    )
    p.set_defaults(handler=run)


def _models(refs: Sequence[str]) -> list[ModelInfo]:
    catalog = bundled_catalog().models
    if not refs:
        return list(catalog)
    chosen: list[ModelInfo] = []
    for ref in refs:
        path = Path(ref)
        if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
            chosen.append(opt.model(ref))
            continue
        hits = match_models(catalog, [ref])
        if not hits:
            raise ValueError(f"--model {ref!r} matches no catalog model")
        chosen.extend(hits)
    return list({m.id: m for m in chosen}.values())


def _stability_models(
    args: argparse.Namespace, models: list[ModelInfo], recorded: str | None
) -> list[ModelInfo]:
    # Replaying is the slow part: without --model, only the model the session ran with.
    if args.model or recorded is None:
        return models
    try:
        return [bundled_catalog().get(recorded)]
    except Exception:  # a model the catalog does not know: replay on every model chosen
        return models


def run(args: argparse.Namespace) -> int:
    """Verify every policy on every chosen model; replay the session when one is given."""
    models = _models(args.model)
    config = opt.config(args.config)
    session = read_session(args.session, run=args.run) if args.session else None
    tools = session.tools if session is not None else ()
    diagnostics: list[Diagnostic] = []
    reports: list[StabilityReport] = []
    for ref in opt.policies(args.policy):
        diagnostics.extend(verify_policy(ref, models, config=config, tools=tools))
        if session is None:
            continue
        for model in _stability_models(args, models, session.model):
            plan = compile_policy(ref, model, config=config)
            report = prefix_stability(plan, session)
            reports.append(report)
            diagnostics.extend(report.diagnostics())
    diagnostics = sorted(_once(diagnostics), key=Diagnostic.sort_key)
    _print(diagnostics, reports, args.format, len(models))
    failed = any(d.severity == "error" for d in diagnostics)
    return EXIT_DIAGNOSTICS if failed else EXIT_OK


def _once(diagnostics: Sequence[Diagnostic]) -> list[Diagnostic]:
    """Each finding once: policies that extend one base find its problems each, at the
    same place with the same message, and the reader needs to see them once."""
    unique: dict[tuple[str, str, str], Diagnostic] = {}
    for d in diagnostics:
        unique.setdefault((d.code, str(d.location), d.message), d)
    return list(unique.values())


def _print(
    diagnostics: list[Diagnostic], reports: list[StabilityReport], fmt: str, n_models: int
) -> None:
    shown = relative(diagnostics)
    sources: dict[str, str] = {}
    for d in shown:
        path = Path(d.location.file)
        if d.location.file not in sources and path.is_file():
            sources[d.location.file] = path.read_text(encoding="utf-8")
    if fmt == "json":
        doc = {
            "version": 1,
            "models": n_models,
            "diagnostics": json.loads(render(shown, "json")),
            "stability": [r.to_json() for r in reports],
        }
        print(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    files = sorted(sources)
    out = render(shown, fmt, sources=sources, files=files, suite="kilo-rules verify")
    if out:
        print(out)
    if fmt != "text":
        return
    for r in reports:
        print(_stability_text(r))
    errors = sum(d.severity == "error" for d in diagnostics)
    print(
        f"verified on {n_models} model(s): {errors} error(s), "
        f"{len(diagnostics) - errors} warning(s) or note(s)",
        file=sys.stderr,
    )


def _stability_text(r: StabilityReport) -> str:
    expected = len(r.changes) - len(r.unexpected)
    lines = [
        f"cache prefix under {r.policy} on {r.model}: {r.steps} step(s), "
        f"{len(r.changes)} change(s) of the cached prefix ({expected} expected at "
        f"compactions, {len(r.unexpected)} unexpected)"
        + (f"; stopped early: {r.error}" if r.error else "")
    ]
    for c in r.changes:
        what = f"system layer {c.layer!r}" if c.layer else c.cause
        at = f" ({c.location.relative()})" if isinstance(c.location, Location) else ""
        kind = "expected" if c.expected else "UNEXPECTED"
        lines.append(
            f"  step {c.step}: byte {c.offset:,} of {c.previous:,} in {c.block}: "
            f"{what}{at} [{kind}]"
        )
    return "\n".join(lines)
