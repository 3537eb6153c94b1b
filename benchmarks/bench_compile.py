"""What a compile-cache hit costs, against resolving the policy (what a hit used to cost).

Run on demand::

    .venv/bin/python benchmarks/bench_compile.py

``compile_policy`` keeps compiled plans in a bounded cache and reuses a resolved policy
while its files keep their modification time and size, so a hit stats a few files and
hashes the policy text instead of parsing YAML again. The figures are the best of several
repeats; the ratio is hit ÷ resolve, measured in the same run (target: well under 1 ms a
hit, far below one resolve).

Every cache belongs to a ``Compiler``: a cold compile is one on a new compiler, which has
parsed nothing (the files, the expressions and the plan are all made again); "plans
cold" clears only the plan-level caches of a compiler whose parsed files and expressions
stay warm (what a changed config or a new model costs). The process's default compiler
is never touched.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from kilo_rules.engine.compiler.compile import Compiler
from kilo_rules.engine.frontend.resolve import ResolveCaches, resolve_policy

MODEL = "anthropic/claude-sonnet-4-5"


def best(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    """Seconds per call, the best of ``repeat`` runs of ``number`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return min(times)


def cold() -> object:
    return Compiler().compile("kilo-default", MODEL)


def main() -> int:
    quick = "--quick" in sys.argv
    n = 3 if quick else 20
    files = ResolveCaches()
    resolve_policy("kilo-default", caches=files)
    resolve = best(lambda: resolve_policy("kilo-default", caches=files), n)
    compile_cold = best(cold, n)
    warm_files = Compiler()
    warm_files.compile("kilo-default", MODEL)

    def plans_cold() -> object:
        for name in ("plans", "expressions", "checked", "resolved"):
            warm_files.caches()[name].clear()
        return warm_files.compile("kilo-default", MODEL)

    compile_plans_cold = best(plans_cold, n)
    warm = Compiler()
    warm.compile("kilo-default", MODEL)
    hit = best(lambda: warm.compile("kilo-default", MODEL), n * 50)
    rows = [
        ("resolve kilo-default (baseline)", resolve),
        ("compile, new compiler (cold)", compile_cold),
        ("compile, plans cold, files warm", compile_plans_cold),
        ("compile, cache hit", hit),
    ]
    for label, seconds in rows:
        print(f"{label:34} {seconds * 1e3:9.3f} ms  {seconds / resolve:8.4f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
