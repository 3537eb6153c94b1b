"""Why a request looks as it does: one step's decisions as rows people read, a summary of
the request and its mutations, and what to say when the request does not fit the window.

Values are given whole; how much of them a screen shows is the caller's choice
(``kilo-rules build --explain`` cuts long ones unless ``--full``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kilo_rules.engine.base.errors import Location
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.runtime.apply import Decision, StepResult


def location_of(at: str | Location | None) -> Location | None:
    """A decision's or a plan value's ``at`` as a :class:`Location`, or None when it does
    not name one (JSON documents carry it as a ``file:line:col`` string)."""
    if at is None or isinstance(at, Location):
        return at
    try:
        file, line, col = at.rsplit(":", 2)
        return Location(file, int(line), int(col))
    except ValueError:
        return None


def where(at: str | Location | None) -> str:
    """``at`` as people read it: ``file:line:col`` relative to the working directory when
    the file is under it; ``-`` when the decision is not written in any policy."""
    if not at:
        return "-"
    loc = location_of(at)
    return str(loc.relative()) if loc is not None else str(at)


def value_text(value: Any) -> str:
    """A decision's input or result on one line: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One decision, ready to print: every field a string, nothing cut."""

    stage: str
    rule: str
    where: str
    inputs: dict[str, str]
    result: str
    warning: bool


def decision_rows(decisions: Iterable[Decision]) -> list[DecisionRow]:
    """The decisions of one step in trace order, one row each."""
    return [
        DecisionRow(
            stage=d.stage,
            rule=d.rule,
            where=where(d.at),
            inputs={k: value_text(v) for k, v in d.inputs.items()},
            result=value_text(d.result),
            warning=d.severity == "warning",
        )
        for d in decisions
    ]


def turn_summary(result: StepResult) -> list[str]:
    """The lines after the decisions: the request's shape, a compaction the policy asks
    for before this step, and the mutations to persist."""
    req = result.model_request
    lines = [
        f"request: {result.provider} wire format, {len(req.system)} system block(s), "
        f"{len(req.conversation)} message(s), {len(req.tools)} tool(s), "
        f"max_tokens {req.max_tokens}, {len(result.body()):,} bytes"
    ]
    if result.compaction_needed:
        lines.append(f"compaction needed before this step: {result.compaction_needed}")
    ops: dict[str, int] = {}
    for m in result.mutations:
        ops[m["op"]] = ops.get(m["op"], 0) + 1
    done = ", ".join(f"{n} {op}" for op, n in sorted(ops.items()))
    lines.append(f"mutations to persist: {done or 'none'}")
    return lines


def over_window(plan: Plan, result: StepResult) -> str | None:
    """One line for the user when the request in ``result`` does not fit the context window
    of ``plan``'s model, else None.

    "Fits" is :attr:`StepResult.fits`: the request's input as the plan's counter measures
    it (system and tools included, no safety factor), plus the output cap sent, within the
    window. Providers refuse a request over it as too long."""
    if result.fits:
        return None
    output = result.model_request.max_tokens or 0
    total = result.input_tokens + output
    out = f"{output:,} output cap" if output else "no output cap"
    cap = next((d for d in result.decisions if d.rule.startswith("cap.")), None)
    reported = cap.inputs.get("reported") if cap is not None else None
    how = (
        "usage reported for the last step"
        if reported == result.input_tokens
        else f"counted with {result.counter}"
    )
    return (
        f"the request does not fit the context window of {plan.model.id}: "
        f"{result.input_tokens:,} input tokens ({how}) + {out} = "
        f"{total:,} > {result.context:,}; {_next_step(result)}"
    )


def _next_step(result: StepResult) -> str:
    """What the policy does about an oversized request, from its overflow checks."""
    checks = [
        _check_text(d)
        for d in result.decisions
        if d.stage == "guards" and d.rule in ("overflow", "preflight", "window")
    ]
    if result.compaction_needed:
        return f"the policy would compact first ({'; '.join(checks)})"
    why = "; ".join(checks) or "automatic compaction is off"
    return f"the policy would not compact first ({why}): expect the provider to reject it"


_LABELS = {"overflow": "last step used", "preflight": "preflight estimate"}
_WINDOW = {"compact": "overflow.unfit: compact", "send": "overflow.unfit: send"}
_NOT = {">=": "<", ">": "<="}


def _check_text(d: Decision) -> str:
    at = f" at {where(d.at)}" if d.at else ""
    if d.rule == "window":
        if str(d.result) not in _WINDOW:  # e.g. "send: automatic compaction is off"
            return str(d.result).partition(": ")[2]
        return f"{_WINDOW[str(d.result)]}{at}"
    if isinstance(d.result, str):  # e.g. "skipped: mid tool loop"
        return f"{d.rule} {d.result}{at}"
    value = d.inputs.get("count", d.inputs.get("normalized", 0))
    comparison = str(d.inputs.get("comparison", ">="))
    op = comparison if d.result else _NOT.get(comparison, "<")
    return f"{_LABELS[d.rule]} {value:,} {op} limit {d.inputs.get('limit', 0):,}{at}"
