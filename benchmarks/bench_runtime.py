"""Runtime cost of one step on the largest recorded session.

Run with ``python benchmarks/bench_runtime.py [session.jsonl]``. The session defaults to the
largest Claude Code trajectory in ``../shared/data/trajectories`` (or the small example in
``examples/sessions`` when that is absent). Its recorded compaction (the original agent's
own summary) is left out, so that the request carries the whole history; the step measured
is the largest, i.e. the request built before the last assistant message. Each figure is
compared with a yardstick measured in the same run, so the ratios hold across machines:

* cold apply (a freshly compiled plan, nothing cached) vs tiktoken-encoding all of the
  request's text once (system prompt, tool definitions, every text, reasoning, tool
  input, output and error of the session) — target ≤ 1.5×;
* warm apply (the same step again, then the next step) vs ``json.dumps`` of the request it
  produced — target ≤ 3×;
* peak traced memory of one apply vs the session's size as JSON — target ≤ 3×;
* with tiktoken counts: cold apply vs tiktoken (≤ 1.5×) and warm apply vs ``json.dumps``
  (≤ 3×); and, with either counter, a step on a session read back from JSON (all message
  objects new, as in a stateless service) vs ``json.dumps`` (≤ 3×);
* a compaction step (a 100k window the recorded usage overflows: compact with the
  extractive summarizer, build again) vs a cold apply of the same session, with the
  estimate and with tiktoken — target ≤ 2×.

``--profile`` prints the functions that dominate a warm apply.
"""

from __future__ import annotations

import cProfile
import gc
import json
import pstats
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kilo_rules.engine.compiler import compile as compile_module
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import model_from_data
from kilo_rules.engine.formats.request import Text
from kilo_rules.engine.formats.session import (
    ReasoningPart,
    Session,
    TextPart,
    ToolPart,
    session_from_json,
)
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan, run
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.engine.text.tokens import TiktokenCounter
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

ROOT = Path(__file__).resolve().parent.parent
LARGEST = ROOT.parent / "shared/data/trajectories/claude-code-opus46-spotter-8463c716.jsonl"
FALLBACK = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
MODEL = {
    "id": "bench/claude",
    "provider": "anthropic",
    "family": "claude",
    "api_id": "claude-bench",
    "api": "anthropic",
    "limits": {"context": 1_000_000, "output": 64_000},  # no compaction: measure apply alone
    "cache": {"kind": "explicit", "max_breakpoints": 4, "min_cacheable_tokens": 1024},
}


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    """The fastest of ``repeat`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()  # a collection left over from the last run is not this run's cost
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def request_texts(session: Session, plan: Plan) -> list[str]:
    """Every text of the request a tokenizer would see: the system prompt, the tool
    definitions, and the session's texts, reasoning, tool inputs, outputs and errors."""
    st = run(plan, session, StepInput(), until="system")
    out = [p.text for m in st.system for p in m.parts if isinstance(p, Text)]
    out += [
        json.dumps([t.input_schema for t in session.tools]),
        *(t.description for t in session.tools),
    ]
    for m in session.messages:
        for p in m.parts:
            if isinstance(p, TextPart | ReasoningPart):
                out.append(p.text)
            elif isinstance(p, ToolPart):
                out.append(json.dumps(p.input, ensure_ascii=False))
                out.append(p.output if p.status != "error" else p.error or "")
    return out


def fresh_plan() -> Plan:
    """A plan compiled from scratch (the compile cache is emptied first)."""
    compile_module.clear_cache()
    return compile_policy("kilo-default", model_from_data(MODEL))


def counted_plan(policy_dir: Path, counter: str, model: dict[str, Any] = MODEL) -> Plan:
    """kilo-default with ``tokens.counter: counter``, compiled from scratch."""
    policy = policy_dir / "bench.yaml"
    policy.write_text(
        f"version: 1\nname: bench\nextends: kilo-default\ntokens: {{counter: '{counter}'}}\n",
        encoding="utf-8",
    )
    compile_module.clear_cache()
    return compile_policy(policy, model_from_data(model))


def apply_with_counter(step: Session, counter: str) -> tuple[float, float]:
    """(cold apply, warm apply) of ``step`` under ``counter``."""
    with tempfile.TemporaryDirectory() as tmp:
        colds = []
        for _ in range(3):
            plan = counted_plan(Path(tmp), counter)
            start = time.perf_counter()
            apply_plan(plan, step, StepInput())
            colds.append(time.perf_counter() - start)
        plan = counted_plan(Path(tmp), counter)
        apply_plan(plan, step, StepInput())
        warm = best_of(lambda: apply_plan(plan, step, StepInput()), repeat=5)
    return min(colds), warm


def reloaded_step(step: Session, counter: str) -> float:
    """A step on a session read back from its JSON, as a stateless service does each step
    (the parse itself not timed): the plan is warm, the message objects are all new."""
    text = step.model_dump_json()
    with tempfile.TemporaryDirectory() as tmp:
        plan = counted_plan(Path(tmp), counter)
        apply_plan(plan, session_from_json(text), StepInput())
        times = []
        for _ in range(9):
            fresh = session_from_json(text)
            gc.collect()
            start = time.perf_counter()
            apply_plan(plan, fresh, StepInput())
            times.append(time.perf_counter() - start)
    return min(times)


def compaction_step(step: Session, before: list[Any], counter: str) -> tuple[float, float]:
    """(cold apply, compaction step) of ``step`` on a 100k window, where its recorded usage
    is over the limit: the runtime compacts (extractive summarizer) and builds the request
    again. The plan's caches are warm from the step before, as an agent's would be."""
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "bench.yaml"
        policy.write_text(
            f"version: 1\nname: bench\nextends: kilo-default\ntokens: {{counter: '{counter}'}}\n",
            encoding="utf-8",
        )
        small = model_from_data({**MODEL, "limits": {"context": 100_000, "output": 32_000}})

        def cold_apply() -> None:
            compile_module.clear_cache()
            apply_plan(compile_policy(policy, small), step, StepInput())

        cold = best_of(cold_apply, repeat=3)
        times = []
        for _ in range(3):
            compile_module.clear_cache()
            plan = compile_policy(policy, small)
            apply_plan(plan, step.model_copy(update={"messages": before}), StepInput())
            runtime = Runtime(plan, ExtractiveSummarizer())
            start = time.perf_counter()
            result = runtime.step(step)
            times.append(time.perf_counter() - start)
            assert result.compactions >= 1, "the window must force a compaction"
    return cold, min(times)


def main(argv: list[str]) -> None:
    """Print the figures (and a profile with ``--profile``)."""
    args = [a for a in argv if not a.startswith("--")]
    path = Path(args[0]) if args else (LARGEST if LARGEST.exists() else FALLBACK)
    full = without_recorded_compactions(read_session(path))
    last_assistant = max(i for i, m in enumerate(full.messages) if m.role == "assistant")
    step = full.model_copy(update={"messages": full.messages[:last_assistant]})
    nxt = full.model_copy(update={"messages": full.messages[: last_assistant + 1]})
    size = len(step.model_dump_json().encode())
    print(f"session: {path.name}: {len(step.messages)} messages, {size / 1e6:.2f} MB as JSON")

    counter = TiktokenCounter("cl100k_base")
    texts = request_texts(step, fresh_plan())
    tik = best_of(lambda: sum(counter.count(t) for t in texts), repeat=3)

    colds = []
    for _ in range(3):
        plan = fresh_plan()
        start = time.perf_counter()
        apply_plan(plan, step, StepInput())
        colds.append(time.perf_counter() - start)
    cold = min(colds)
    plan = fresh_plan()
    result = apply_plan(plan, step, StepInput())
    warm = best_of(lambda: apply_plan(plan, step, StepInput()), repeat=9)
    warm_next = best_of(lambda: apply_plan(plan, nxt, StepInput()), repeat=9)
    dumps = best_of(lambda: json.dumps(result.request), repeat=25)

    # Peak of a cold apply (fresh plan, empty caches): everything the step allocates,
    # the caches it fills included.
    cold_plan = fresh_plan()
    tracemalloc.start()
    apply_plan(cold_plan, step, StepInput())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    def row(label: str, value: float, base: float, target: float, unit: str = "ms") -> None:
        ratio = value / base
        ok = "ok" if ratio <= target else "MISSED"
        shown = f"{value * 1e3:8.1f} ms" if unit == "ms" else f"{value / 1e6:8.1f} MB"
        print(f"{label:<30} {shown}  {ratio:5.2f}x  (target <= {target}x) {ok}")

    print(f"yardstick: tiktoken all text    {tik * 1e3:8.1f} ms")
    print(f"yardstick: json.dumps(request)  {dumps * 1e3:8.1f} ms")
    print(f"yardstick: session JSON         {size / 1e6:8.1f} MB")
    row("cold apply vs tiktoken", cold, tik, 1.5)
    row("warm apply (same step)", warm, dumps, 3.0)
    row("warm apply (next step)", warm_next, dumps, 3.0)
    for spec in ("estimate", "tiktoken:cl100k_base"):
        exact = spec != "estimate"
        if exact:
            cold_t, warm_t = apply_with_counter(step, spec)
            row("cold apply (tiktoken)", cold_t, tik, 1.5)
            row("warm apply (tiktoken)", warm_t, dumps, 3.0)
        row(f"reloaded step ({spec.split(':')[0]})", reloaded_step(step, spec), dumps, 3.0)
    row("peak memory vs session", float(peak), float(size), 3.0, unit="MB")

    for spec in ("estimate", "tiktoken:cl100k_base"):
        cold_c, step_c = compaction_step(step, full.messages[: last_assistant - 1], spec)
        row(f"compaction step ({spec.split(':')[0]})", step_c, cold_c, 2.0)

    if "--profile" in argv:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            apply_plan(plan, step, StepInput())
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main(sys.argv[1:])
