"""Compiled expressions vs walking the lark tree, for the expressions of one policy step.

Run on demand::

    .venv/bin/python benchmarks/bench_expr.py [--quick]

Both evaluators run in the same process on the same context; the figures are the best of
several repeats, in microseconds per evaluation. The compiled side is
``CompiledExpr.evaluate`` (closures built once); the tree side is ``TreeInterpreter``, a
lark ``Interpreter`` that walks the parse tree on every call, dispatching on rule names.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from kilo_rules.engine.frontend.expr import (
    BOOL,
    INT,
    NUMBER,
    STR,
    TreeInterpreter,
    Type,
    compile_source,
    default_vocabulary,
    nullable,
)

VOCAB = default_vocabulary().extended(
    {
        "budget.usable": INT,
        "output.max_tokens": INT,
        "threshold.percent": nullable(NUMBER),
    }
)

#: (label, expression, result type): what a Kilo-like policy evaluates for one step.
POLICY: list[tuple[str, str, Type]] = [
    (
        "output cap",
        "min(model.limits.output, config.output_token_max ?? 32000) "
        "if model.limits.output > 0 else config.output_token_max ?? 32000",
        INT,
    ),
    (
        "usable window",
        "model.limits.input - min(20000, output.max_tokens) "
        "if model.limits.input != null "
        "else model.limits.context - output.max_tokens",
        INT,
    ),
    ("prune budget", "clamp(floor(budget.usable * 0.25), 2000, 8000)", INT),
    ("claude?", 'model.api_id contains "claude" or model.provider == "anthropic"', BOOL),
    ("kimi?", 'lower(model.api_id) contains "kimi"', BOOL),
    ("beast regex", 'model.api_id matches "gpt-(4|o1|o3)"', BOOL),
    (
        "threshold",
        "min(budget.usable, floor((model.limits.input ?? model.limits.context) "
        "* (threshold.percent ?? 100) / 100))",
        INT,
    ),
    ("overflow", "session.last.count >= budget.usable and not request.mid_tool_loop", BOOL),
    ("media reserve", "request.estimated_tokens + request.media * 2048", INT),
    ("prompt", '"anthropic" if model.api_id contains "claude" else model.prompt ?? "default"', STR),
    ("constant", "20_000 * 2", INT),
]

CONTEXT: Mapping[str, Any] = {
    "model.api_id": "claude-sonnet-4-5",
    "model.provider": "anthropic",
    "model.prompt": None,
    "model.limits.context": 200_000,
    "model.limits.input": None,
    "model.limits.output": 64_000,
    "config.output_token_max": None,
    "budget.usable": 168_000,
    "output.max_tokens": 32_000,
    "threshold.percent": 75,
    "session.last.count": 120_000,
    "request.mid_tool_loop": False,
    "request.estimated_tokens": 90_000,
    "request.media": 2,
}


def per_call_us(fn: Callable[[Mapping[str, Any]], Any], loops: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            fn(CONTEXT)
        best = min(best, time.perf_counter() - start)
    return best / loops * 1e6


def main(argv: list[str]) -> int:
    loops, repeats = (2_000, 3) if "--quick" in argv else (20_000, 5)
    print(f"{'expression':<16}{'compiled µs':>13}{'tree walk µs':>14}{'ratio':>9}")
    total_compiled = total_tree = 0.0
    for label, text, result_type in POLICY:
        compiled = compile_source(text, expected=result_type, vocab=VOCAB)
        tree = TreeInterpreter(compiled.expr)
        assert compiled(CONTEXT) == tree(CONTEXT), label
        fast = per_call_us(compiled.evaluate, loops, repeats)
        slow = per_call_us(tree, loops // 10, repeats)
        total_compiled += fast
        total_tree += slow
        print(f"{label:<16}{fast:>13.3f}{slow:>14.2f}{slow / fast:>8.1f}×")
    count = len(POLICY)
    print(
        f"{'one step':<16}{total_compiled:>13.3f}{total_tree:>14.2f}"
        f"{total_tree / total_compiled:>8.1f}×"
    )
    print(
        f"mean per expression: compiled {total_compiled / count:.3f} µs, "
        f"tree walk {total_tree / count:.2f} µs, ratio {total_tree / total_compiled:.1f}×"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
