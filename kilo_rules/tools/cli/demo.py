"""``kilo-rules demo``: the main job on the bundled default, start to end."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.load import resource_root
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.tools.checking.check import check_paths
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_OK
from kilo_rules.tools.cli.build import render_explain
from kilo_rules.tools.cli.check import print_diagnostics
from kilo_rules.tools.cli.plan import render_plan

#: The recorded session built for when ``--session`` is not given (run from a checkout).
DEMO_SESSION = Path("examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl")


def register(sub: opt.Subcommands) -> None:
    """Add ``demo`` to the subcommands."""
    p = opt.add_command(
        sub,
        "demo",
        summary="check, compile and build on the bundled default",
        description="Check the bundled policies and catalog, compile kilo-default, build "
        "the next request of a recorded session and explain every decision.",
    )
    opt.add_model(p, default="anthropic/claude-sonnet-4-5")
    opt.add_session(p, required=False)
    opt.add_full(p)
    opt.add_allow_read(p)
    opt.add_step(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check, compile, build and explain, printing each part under its heading."""
    report = check_paths([str(resource_root())])
    print_diagnostics(report.diagnostics, "text", report.sources, sys.stdout)
    print(
        f"== check: bundled policies and catalog: {len(report.files)} file(s), "
        f"{len(report.errors)} error(s)"
    )
    if report.exit_code:
        return report.exit_code
    plan = compile_policy("kilo-default", opt.model(args.model))
    print("\n== plan")
    print(render_plan(plan, full=args.full))
    session_ref = args.session or str(DEMO_SESSION)
    if not Path(session_ref).is_file():
        print(f"\n(no example session at {session_ref}; pass --session FILE)")
        return EXIT_OK
    session = read_session(session_ref, run=args.run)
    print(f"\n== build: next step of {session_ref} ({len(session.messages)} messages)")
    print(render_explain(apply_plan(plan, session, opt.step(args)), full=args.full))
    return EXIT_OK
