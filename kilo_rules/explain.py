"""Readable renderings of a plan and of a turn's decisions (``--explain``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .runtime.apply import Decision, TurnResult


def _short(value: Any, width: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."


def _at(at: str | None) -> str:
    if not at:
        return "-"
    try:
        file, rest = at.rsplit(":", 2)[0], ":".join(at.rsplit(":", 2)[1:])
        rel = Path(file).resolve().relative_to(Path.cwd().resolve())
        return f"{rel}:{rest}"
    except (ValueError, OSError):
        return at


def explain_decisions(decisions: list[Decision]) -> str:
    """One line per decision: stage, rule, where the policy says so, inputs → result."""
    rows = []
    for d in decisions:
        flag = "!" if d.severity == "warning" else " "
        inputs = ", ".join(f"{k}={_short(v, 24)}" for k, v in d.inputs.items())
        rows.append((f"{flag}{d.stage}", d.rule, _at(d.at), inputs, _short(d.result)))
    w0 = max((len(r[0]) for r in rows), default=5)
    w1 = max((len(r[1]) for r in rows), default=4)
    w2 = max((len(r[2]) for r in rows), default=2)
    lines = [f"{'stage':<{w0}}  {'rule':<{w1}}  {'policy':<{w2}}  inputs -> result"]
    for stage, rule, at, inputs, result in rows:
        arrow = f"{inputs} -> {result}" if inputs else result
        lines.append(f"{stage:<{w0}}  {rule:<{w1}}  {at:<{w2}}  {arrow}")
    return "\n".join(lines)


def explain_turn(result: TurnResult) -> str:
    """The decisions, then a summary of the request and the mutations."""
    req = result.model_request
    lines = [explain_decisions(result.decisions), ""]
    lines.append(
        f"request: {result.provider} wire format, {len(req.system)} system block(s), "
        f"{len(req.conversation)} message(s), {len(req.tools)} tool(s), "
        f"max_tokens {req.max_tokens}, {len(result.body()):,} bytes"
    )
    if result.compaction_needed:
        lines.append(f"compaction needed before this step: {result.compaction_needed}")
    ops: dict[str, int] = {}
    for m in result.mutations:
        ops[m["op"]] = ops.get(m["op"], 0) + 1
    lines.append(
        "mutations to persist: "
        + (", ".join(f"{n} {op}" for op, n in sorted(ops.items())) or "none")
    )
    return "\n".join(lines)
