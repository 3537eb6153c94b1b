"""Work per step against what changed, on the largest recorded sessions.

Run with ``python benchmarks/bench_step.py [session ...]``; the sessions default to the two
largest recorded trajectories in ``../shared/data/trajectories`` (Claude Code on Opus, and
mini-SWE-agent on DeepSeek). Their recorded compactions are left out, so a request carries
the whole history. Every figure is a ratio against a yardstick measured in the same run, so
it holds across machines:

* **warm step** (the session kept in memory, as an agent keeps it: step k+1 on a plan that
  built step k) vs the floor: ``json.dumps`` of the request plus counting only the new
  messages with the plan's counter. The step is ``apply_plan`` and ``body()`` (the bytes
  sent) — target <= 1.3x;
* **re-read step** (a stateless service: the session parsed from its JSON every step,
  parse included, by a ``SessionReader`` that read step k) vs the floor plus
  ``json.loads`` of the session text — target <= 1.5x;
* **after a compaction**: the session repeated 1x..10x, then a completed summary and a
  short tail; a warm step on the tail, fitted as ``time ~ history**k`` — target k <= 0.1;
* **compaction step** (the runtime compacts with the extractive summarizer on a 100k
  window, then builds again) vs a cold apply of the same session — target <= 1.5x.

Each figure is one function taking the session, so another script can call it;
:func:`main` prints them all with ok/MISSED against the targets.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilo_rules.engine.compiler import compile as compile_module
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import model_from_data
from kilo_rules.engine.formats.session import (
    CompactionPart,
    Message,
    Session,
    SessionReader,
    TextPart,
    ToolPart,
    session_from_json,
)
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.trace import plan_caches
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared/data/trajectories"
SESSIONS = (
    DATA / "claude-code-opus46-spotter-8463c716.jsonl",
    DATA / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json",
)
MODEL = {
    "id": "bench/claude",
    "provider": "anthropic",
    "family": "claude",
    "api_id": "claude-bench",
    "api": "anthropic",
    "limits": {"context": 1_000_000, "output": 64_000},  # no compaction: measure a step alone
    "cache": {"kind": "explicit", "max_breakpoints": 4, "min_cacheable_tokens": 1024},
}
# A workspace that exists nowhere: no instruction file of this machine reaches the request.
NOWHERE = "/nonexistent/kilo-rules-bench"
STEP = StepInput(workspace=Workspace(cwd=NOWHERE, root=NOWHERE, home=f"{NOWHERE}/home"))
STEPS = 6  # successive steps measured per figure (the last ones of the session)
REPEAT = 5  # fresh plans per step; the fastest counts

TARGETS = {"warm": 1.3, "reread": 1.5, "exponent": 0.1, "compaction": 1.5}


@dataclass(frozen=True)
class Figure:
    """One measured figure: the value compared with its target (lower is better)."""

    label: str
    value: float
    target: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.value <= self.target

    def line(self) -> str:
        verdict = "ok" if self.ok else "MISSED"
        shown = f"{self.value:6.2f}  (target <= {self.target})"
        return f"{self.label:<44} {shown} {verdict}  {self.detail}"


def fresh_plan(model: dict[str, Any] = MODEL) -> Plan:
    """kilo-default compiled from scratch: a plan whose caches are empty."""
    compile_module.clear_cache()
    return compile_policy("kilo-default", model_from_data(model))


def load(path: Path) -> Session:
    """The recorded session without the compactions its agent made."""
    return without_recorded_compactions(read_session(path))


def boundaries(session: Session, n: int = STEPS) -> list[int]:
    """Message counts of the last ``n`` step requests: each is built just before an
    assistant message, so step k+1 adds that answer and whatever followed it."""
    ends = [i for i, m in enumerate(session.messages) if m.role == "assistant" and i > 0]
    return ends[-n:]


def cut(session: Session, end: int) -> Session:
    return session.model_copy(update={"messages": session.messages[:end]})


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()  # a collection left over from the set-up is not this step's cost
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _best(fn: Callable[[], Any], repeat: int = REPEAT) -> float:
    return min(_timed(fn) for _ in range(repeat))


def _count_new(plan: Plan, new: Sequence[Message]) -> Callable[[], int]:
    """Counting only the new messages with the plan's counter (its cache left out: the
    floor counts them once)."""
    count = plan_caches(plan).counter.count
    texts = [m.model_dump_json() for m in new]

    def run() -> int:
        return sum(count(t) for t in texts)

    return run


def _step(plan: Plan, session: Session) -> str:
    return apply_plan(plan, session, STEP).body()


def warm_step(session: Session) -> Figure:
    """The in-memory warm step vs json.dumps of its request + counting the new messages."""
    ratios = []
    for end in boundaries(session)[1:]:
        before = boundaries(cut(session, end), 2)[0]
        prev, nxt = cut(session, before), cut(session, end)

        def one(prev: Session = prev, nxt: Session = nxt) -> float:
            plan = fresh_plan()
            _step(plan, prev)
            return _timed(lambda: _step(plan, nxt))

        took = min(one() for _ in range(REPEAT))
        request = apply_plan(fresh_plan(), nxt, STEP).request
        count = _count_new(fresh_plan(), session.messages[before:end])

        def floor_once(request: Any = request, count: Any = count) -> None:
            json.dumps(request)
            count()

        ratios.append(took / _best(floor_once))
    return Figure("warm step vs floor", statistics.median(ratios), TARGETS["warm"], _spread(ratios))


def reread_step(session: Session) -> Figure:
    """A step on the session parsed from its JSON (parse included) vs the floor plus
    json.loads of the session text."""
    ratios = []
    for end in boundaries(session)[1:]:
        before = boundaries(cut(session, end), 2)[0]
        prev_text = cut(session, before).model_dump_json()
        text = cut(session, end).model_dump_json()

        def one(prev_text: str = prev_text, text: str = text) -> float:
            # A reader and a plan of their own, both of which have seen step k only: the
            # new messages of step k+1 are parsed, lowered and rendered for the first time.
            plan, reader = fresh_plan(), SessionReader()
            _step(plan, reader.read(prev_text))
            return _timed(lambda: _step(plan, reader.read(text)))

        took = min(one() for _ in range(REPEAT))
        request = apply_plan(fresh_plan(), session_from_json(text), STEP).request
        count = _count_new(fresh_plan(), session.messages[before:end])

        def floor_once(request: Any = request, count: Any = count, text: str = text) -> None:
            json.loads(text)
            json.dumps(request)
            count()

        ratios.append(took / _best(floor_once))
    return Figure(
        "re-read step (parse included) vs floor",
        statistics.median(ratios),
        TARGETS["reread"],
        _spread(ratios),
    )


def _spread(ratios: Sequence[float]) -> str:
    return f"[{min(ratios):.2f}..{max(ratios):.2f} over {len(ratios)} steps]"


def _renamed(messages: Sequence[Message], tag: str) -> list[Message]:
    """Copies of ``messages`` whose message, part and call ids carry ``tag`` (a session
    uses each id once)."""
    out = []
    for m in messages:
        parts = []
        for p in m.parts:
            update: dict[str, Any] = {"id": f"{p.id}{tag}"}
            if isinstance(p, ToolPart):
                update["call_id"] = f"{p.call_id}{tag}"
            parts.append(p.model_copy(update=update))
        parent = f"{m.parent_id}{tag}" if m.parent_id else None
        out.append(m.model_copy(update={"id": f"{m.id}{tag}", "parts": parts, "parent_id": parent}))
    return out


TAIL = 12  # messages after the summary


def compacted(session: Session, times: int) -> tuple[list[Message], list[Message]]:
    """(the session repeated ``times`` times then a completed summary, the tail after it)."""
    history = [m for k in range(times) for m in _renamed(session.messages, f"-r{k}")]
    last = max(m.created for m in history)
    request = Message(
        id="zz-compaction",
        role="user",
        created=last + 1,
        parts=[CompactionPart(id="zz-compaction-part")],
    )
    summary = Message(
        id="zz-summary",
        role="assistant",
        created=last + 2,
        parent_id=request.id,
        summary=True,
        finish="stop",
        parts=[TextPart(id="zz-summary-text", text="The work so far, summarised. " * 40)],
    )
    tail = _renamed(session.messages[-TAIL:], "-tail")
    tail = [m.model_copy(update={"created": last + 3 + i}) for i, m in enumerate(tail)]
    return [*history, request, summary], tail


def after_compaction(session: Session, sizes: Sequence[int] = (1, 2, 4, 7, 10)) -> Figure:
    """A warm step after a compaction with 1x..10x the history before the summary: the
    growth exponent of its time with the history's length (0: independent of it)."""
    points = []
    for times in sizes:
        head, tail = compacted(session, times)
        base = session.model_copy(update={"messages": head})
        ends = [i for i, m in enumerate(tail) if m.role == "assistant" and i > 0][-STEPS:]
        took = []
        for a, b in itertools.pairwise(ends):
            prev = base.model_copy(update={"messages": [*head, *tail[:a]]})
            nxt = base.model_copy(update={"messages": [*head, *tail[:b]]})

            def one(prev: Session = prev, nxt: Session = nxt) -> float:
                plan = fresh_plan()
                _step(plan, prev)
                return _timed(lambda: _step(plan, nxt))

            took.append(min(one() for _ in range(REPEAT)))
        points.append((len(head), statistics.median(took)))
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    shown = ", ".join(f"{n}: {t * 1e3:.2f} ms" for n, t in points)
    return Figure("after a compaction: growth exponent", slope, TARGETS["exponent"], shown)


def compaction_step(session: Session) -> Figure:
    """A step that compacts (100k window, extractive summarizer) and builds again, with
    the plan warm from the step before, vs a cold apply of the same session."""
    small = {**MODEL, "limits": {"context": 100_000, "output": 32_000}}
    ends = boundaries(session, 2)
    prev, nxt = cut(session, ends[0]), cut(session, ends[1])

    def cold() -> None:
        apply_plan(fresh_plan(small), nxt, STEP)

    cold_time = _best(cold, 3)
    times = []
    for _ in range(3):
        plan = fresh_plan(small)
        apply_plan(plan, prev, STEP)
        runtime = Runtime(plan, ExtractiveSummarizer())
        start = time.perf_counter()
        result = runtime.step(nxt, STEP)
        result.body()
        times.append(time.perf_counter() - start)
        if result.compactions < 1:
            raise SystemExit("the 100k window must force a compaction")
    return Figure(
        "compaction step vs cold apply",
        min(times) / cold_time,
        TARGETS["compaction"],
        f"[{min(times) * 1e3:.1f} ms vs {cold_time * 1e3:.1f} ms]",
    )


FIGURES: tuple[Callable[[Session], Figure], ...] = (
    warm_step,
    reread_step,
    after_compaction,
    compaction_step,
)


def run(paths: Sequence[Path]) -> list[tuple[str, Figure]]:
    """Every figure on every session, printed as it is measured."""
    out = []
    for path in paths:
        session = load(path)
        size = len(session.model_dump_json().encode())
        print(f"session: {path.name}: {len(session.messages)} messages, {size / 1e6:.2f} MB")
        for figure in FIGURES:
            got = figure(session)
            print("  " + got.line(), flush=True)
            out.append((path.name, got))
    return out


def _options(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The positional arguments and the options of ``argv``: ``--api`` and ``--figures``
    take a value (``--api NAME`` or ``--api=NAME``), any other ``--flag`` is ignored."""
    args: list[str] = []
    options: dict[str, str] = {}
    items = iter(argv)
    for a in items:
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if name in ("api", "figures"):
                options[name] = value if eq else next(items, "")
        else:
            args.append(a)
    return args, options


def main(argv: Sequence[str]) -> int:
    """Print every figure; 0 when all meet their targets, 1 otherwise.

    ``--api NAME`` builds for that wire API instead of Anthropic's (the model is otherwise
    the same); ``--figures warm,reread`` measures only the figures named (by the start of
    their function's name)."""
    args, options = _options(argv)
    if options.get("api"):
        MODEL["api"] = options["api"]  # fresh_plan's default is this dict
        print(f"wire API: {MODEL['api']}")
    chosen = [f for f in options.get("figures", "").split(",") if f]
    if chosen:
        global FIGURES
        FIGURES = tuple(f for f in FIGURES if any(f.__name__.startswith(c) for c in chosen))
    paths = [Path(a) for a in args] or [p for p in SESSIONS if p.exists()]
    if not paths:
        print(f"no sessions: {DATA} is absent; name session files to measure")
        return 2
    figures = run(paths)
    missed = [f"{name}: {f.label}" for name, f in figures if not f.ok]
    print("all targets met" if not missed else f"missed: {'; '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
