"""``kilo-rules plan``: what a policy compiles to for one model, every value with the
place in the policy that set it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kilo_rules.engine.base.errors import Location, render_text
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan, transforms_line
from kilo_rules.tools.checking.explain import location_of, where
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_OK, relative
from kilo_rules.tools.cli._table import FULL_HINT, render_table, shorten

#: How much of a value the table shows without ``--full``.
VALUE_WIDTH = 60


def register(sub: opt.Subcommands) -> None:
    """Add ``plan`` to the subcommands."""
    p = opt.add_command(
        sub,
        "plan",
        summary="print the compiled plan of a policy for one model",
        description="Compile a policy for one model and print the plan: every value with "
        "where the policy sets it, the family prompt, the system layers, the cache rule.",
    )
    opt.add_policy(p)
    opt.add_model(p)
    opt.add_config(p)
    opt.add_allow_read(p)
    opt.add_format(p, what="; json: the plan as data, every value whole")
    opt.add_full(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Compile and print the plan."""
    plan = compile_policy(
        opt.policy(args.policy), opt.model(args.model), config=opt.config(args.config)
    )
    if args.format == "json":
        print(json.dumps(plan.to_json(), indent=2, ensure_ascii=False))
    else:
        print(render_plan(plan, full=args.full))
        if plan.warnings:
            print(render_text(relative(plan.warnings)), file=sys.stderr)
    return EXIT_OK


def _file(path: str) -> str:
    return Location(path, 1, 1).relative().file


def _sort_key(item: tuple[str, dict[str, Any]]) -> tuple[str, int]:
    loc = location_of(item[1].get("at"))
    return (loc.file, loc.line) if loc is not None else ("", 0)


def render_plan(plan: Plan, *, full: bool = False) -> str:
    """The plan for people: the model, the values in the order the policy writes them (cut
    at :data:`VALUE_WIDTH` characters with an ellipsis unless ``full``), the family prompt,
    the system layers, the cache rule and the stages."""
    data = plan.to_json()
    m = data["model"]
    limits = m["limits"]
    lines = [
        f"plan: policy {data['policy']} ({_file(data['policy_file'])}) for {m['id']}",
        f"  model: {m['api']} api, api id {m['api_id']}, context {limits['context']:,}"
        + (f", input {limits['input']:,}" if limits.get("input") else "")
        + f", output {limits['output']:,}, cache {m['cache']['kind']}",
        f"  overrides applied: {', '.join(data['overrides']) or 'none'}",
        "  values:",
    ]
    width = None if full else VALUE_WIDTH
    rows = []
    cut = False
    for name, value in sorted(data["values"].items(), key=_sort_key):
        whole = (
            "(per step)" if value.get("dynamic") else json.dumps(value["value"], ensure_ascii=False)
        )
        shown = shorten(whole, width)
        cut = cut or shown != whole
        rows.append((name, shown, where(value.get("at"))))
    lines.append(render_table(("name", "value", "set at"), rows, indent="    "))
    if cut:
        lines.append(f"    {FULL_HINT}")
    prompt = data["prompt"]
    if prompt:
        lines.append(
            f"  family prompt: {prompt['rule']} -> {_file(prompt['file'])} "
            f"({prompt['chars']} chars, rule at {where(prompt['at'])})"
        )
    lines.append(
        "  system layers: "
        + ", ".join(
            layer["id"] + (f" [when {layer['when']}]" if "when" in layer else "")
            for layer in data["layers"]
        )
    )
    system = data["system"]
    lines.append(transforms_line(system["transforms"], system["collapse"]))
    c = data["cache"]
    lines.append(
        f"  cache: rule {c['rule']}, {'on' if c['enabled'] else 'off'}, placement "
        f"{c['placement']}, budget {c['budget']} (provider limit {c['provider_limit']})"
    )
    lines.append(f"  stages: {' -> '.join(data['stages'])}")
    return "\n".join(lines)
