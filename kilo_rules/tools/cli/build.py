"""``kilo-rules build``: the request of the next step of a session, and with ``--explain``
every decision that shaped it."""

from __future__ import annotations

import argparse
import json
import sys

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import StepResult, apply_plan
from kilo_rules.tools.checking.explain import decision_rows, over_window, turn_summary
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_OK, EXIT_OVER_WINDOW
from kilo_rules.tools.cli._table import FULL_HINT, render_table, shorten

#: How much of one input, and of a result, the decisions table shows without ``--full``.
INPUT_WIDTH, RESULT_WIDTH = 24, 70


def register(sub: opt.Subcommands) -> None:
    """Add ``build`` to the subcommands."""
    p = opt.add_command(
        sub,
        "build",
        summary="build the request for the next step of a session",
        description="Build the request an agent would send for the next step of a session: "
        "the provider's wire JSON, exactly. A request over the model's context window is "
        "still printed, with a warning on stderr.",
    )
    opt.add_policy(p)
    opt.add_model(p)
    opt.add_session(p)
    opt.add_config(p)
    opt.add_allow_read(p)
    p.add_argument("--explain", action="store_true", help="show the decisions instead")
    opt.add_format(
        p,
        what="; text: the body as sent (with --explain: a table of the decisions); json: "
        "the body indented (with --explain: body, decisions and mutations)",
    )
    opt.add_full(p)
    p.add_argument(
        "--strict",
        action="store_true",
        help=f"exit {EXIT_OVER_WINDOW} when the request does not fit the context window",
    )
    opt.add_step(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build, print, and warn when the request does not fit the window."""
    plan = compile_policy(
        opt.policy(args.policy), opt.model(args.model), config=opt.config(args.config)
    )
    result = apply_plan(plan, read_session(args.session, run=args.run), opt.step(args))
    as_json = args.format == "json"
    if args.explain and as_json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    elif args.explain:
        print(render_explain(result, full=args.full))
    elif as_json:
        print(json.dumps(result.request, indent=2, ensure_ascii=False))
    else:
        print(result.body())
    problem = over_window(plan, result)
    if problem is None:
        return EXIT_OK
    print(f"kilo-rules build: warning: {problem}", file=sys.stderr)
    return EXIT_OVER_WINDOW if args.strict else EXIT_OK


def render_explain(result: StepResult, *, full: bool = False) -> str:
    """The decisions of one step as a table (long inputs and results cut with an ellipsis
    unless ``full``), then what the request holds and the mutations to persist."""
    input_width, result_width = (None, None) if full else (INPUT_WIDTH, RESULT_WIDTH)
    rows = []
    cut = False
    for row in decision_rows(result.decisions):
        inputs = {k: shorten(v, input_width) for k, v in row.inputs.items()}
        outcome = shorten(row.result, result_width)
        cut = cut or outcome != row.result or inputs != row.inputs
        shown = ", ".join(f"{k}={v}" for k, v in inputs.items())
        flag = "!" if row.warning else " "
        cells = (
            flag + row.stage,
            row.rule,
            row.where,
            f"{shown} -> {outcome}" if shown else outcome,
        )
        rows.append(cells)
    lines = [render_table((" stage", "rule", "policy", "inputs -> result"), rows)]
    if cut:
        lines.append(FULL_HINT)
    return "\n".join([*lines, "", *turn_summary(result)])
