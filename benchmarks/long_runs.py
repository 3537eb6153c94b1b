"""Long autonomous runs: kilo-default against long-run on the recorded sessions.

Run on demand::

    .venv/bin/python benchmarks/long_runs.py [--markdown]

Each recorded session is replayed request by request (``kilo_rules.tools.simulation.simulate``, the
offline extractive summarizer, the chars/4 estimate) on a catalog model whose window is cut to 32k
or 100k tokens, under both policies. The table gives the requests each replay built (of
those the session made), the compactions, the input tokens sent, the largest request
against the window, whether the task statement (the first user message) is in every
request verbatim, and the cost. ``--markdown`` prints the table docs/long-runs.md shows.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog
from kilo_rules.engine.formats.session import Session, TextPart
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.mutations import missing
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.tools.simulation.simulate import (
    SimulationReport,
    simulate,
    without_recorded_compactions,
)

ROOT = Path(__file__).resolve().parent.parent
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"
POLICIES = ["kilo-default", "long-run"]


@dataclass(frozen=True)
class Case:
    session: str
    model: str
    window: int
    output: int


CASES = (
    Case(
        "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json",
        "deepseek/deepseek-chat",
        32_000,
        8_192,
    ),
    Case("claude-code-opus46-spotter-8463c716.jsonl", "anthropic/claude-opus-4-6", 32_000, 8_000),
    Case("claude-code-opus46-spotter-8463c716.jsonl", "anthropic/claude-opus-4-6", 100_000, 32_000),
)


def cut(model: ModelInfo, window: int, output: int) -> ModelInfo:
    """``model`` with its window cut to ``window`` tokens and its output to ``output``."""
    limits = model.limits.model_copy(update={"context": window, "input": None, "output": output})
    return model.model_copy(update={"limits": limits, "id": f"{model.id}@{window // 1000}k"})


def task_text(session: Session) -> str:
    """The first user message's text: the task an autonomous run was given."""
    first = next(m for m in session.messages if m.role == "user")
    return "\n".join(p.text for p in first.parts if isinstance(p, TextPart)).strip()


def texts(node: object) -> list[str]:
    """Every string of a request body (as sent, before JSON escaping)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [t for v in node.values() for t in texts(v)]
    if isinstance(node, list):
        return [t for v in node for t in texts(v)]
    return []


def task_everywhere(plan_ref: str, model: ModelInfo, session: Session) -> tuple[bool, bool]:
    """(the task is in every request verbatim, nothing of the session was lost), replaying
    the session step by step as an agent would."""
    plan = compile_policy(plan_ref, model)
    runtime = Runtime(plan, ExtractiveSummarizer())
    task = task_text(session)
    live = session.model_copy(update={"messages": []})
    everywhere = True
    for msg in session.messages:
        if msg.role == "assistant":
            try:
                result = runtime.step(live)
            except Exception:  # the run stopped: the table says so
                return everywhere, True
            everywhere = everywhere and any(task in t for t in texts(result.request))
            live = result.session
        live = live.model_copy(update={"messages": [*live.messages, msg]})
    return everywhere, missing(session, live) == []


def row(case: Case, report: SimulationReport, task: bool, intact: bool) -> list[str]:
    done = f"{len(report.steps)} of {report.requests_total}"
    return [
        f"{case.session.split('-')[0]}-{case.session.split('-')[1]} @ {case.window // 1000}k",
        report.policy,
        done + (" (stopped)" if report.stopped else ""),
        str(report.compactions),
        f"{report.input:,}",
        f"{report.max_request:,}",
        "yes" if task else "no",
        "yes" if intact else "no",
        "-" if report.cost is None else f"${report.cost:.2f}",
    ]


HEADERS = [
    "session @ window",
    "policy",
    "requests",
    "compactions",
    "input",
    "largest",
    "task kept",
    "nothing lost",
    "cost",
]


def main(argv: list[str]) -> int:
    if not TRAJECTORIES.is_dir():
        print(f"the recorded sessions are not in {TRAJECTORIES}", file=sys.stderr)
        return 2
    # --policy PATH (repeatable) compares more policies, e.g. variants of long-run's knobs.
    POLICIES.extend(argv[i + 1] for i, a in enumerate(argv) if a == "--policy")
    rows = []
    for case in CASES:
        start = time.perf_counter()
        base = bundled_catalog().get(case.model)
        model = cut(base, case.window, case.output)
        session = without_recorded_compactions(read_session(TRAJECTORIES / case.session))
        plans = [compile_policy(p, model) for p in POLICIES]
        for ref, report in zip(POLICIES, simulate(session, plans), strict=True):
            task, intact = task_everywhere(ref, model, session)
            rows.append(row(case, report, task, intact))
        print(
            f"({case.session} @ {case.window:,}: {time.perf_counter() - start:.0f} s)",
            file=sys.stderr,
        )
    if "--markdown" in argv:
        print("| " + " | ".join(HEADERS) + " |")
        print("|" + "---|" * len(HEADERS))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        for line in [HEADERS, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
