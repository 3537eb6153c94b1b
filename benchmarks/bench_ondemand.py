"""On-demand instruction discovery per step: carried on by the plan's memo vs walked from
scratch, on the largest recorded session.

Run with ``python benchmarks/bench_ondemand.py``. The session's read paths are moved under
a workspace made in a temporary directory, its directories created, with instruction files
at the root, in ``lib`` and in ``test`` (old enough that their status is trusted); each
step's lowered messages are attached both ways and the medians of the last steps printed,
with their ratio (measured in the same run, so it holds across machines).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_step import SESSIONS, fresh_plan, load

from kilo_rules.engine.formats.session import ToolPart, session_from_json
from kilo_rules.engine.runtime.apply import run
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.ondemand import PATH_KEYS, OnDemandMemo, attach

NOWHERE = StepInput(workspace=Workspace(cwd="/nonexistent/k", root="/nonexistent/k"))
LAST = 20  # steps whose times count


def main(path: Path = SESSIONS[0]) -> None:
    recorded = load(path)
    reads = [
        p.input[k]
        for m in recorded.messages
        for p in m.parts
        if isinstance(p, ToolPart)
        for k in PATH_KEYS
        if isinstance(p.input.get(k), str) and str(p.input[k]).startswith("/")
    ]
    base = os.path.commonpath(reads) if reads else "/none"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        ses = session_from_json(recorded.model_dump_json().replace(base, str(root)))
        for r in reads:
            Path(str(r).replace(base, str(root), 1)).parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(exist_ok=True)
        for name in ("AGENTS.md", "lib/AGENTS.md", "test/CLAUDE.md"):
            (root / name).parent.mkdir(exist_ok=True)
            (root / name).write_text(f"rules of {name}\n")
            os.utime(root / name, ns=(10**18, 10**18))
        ws = Workspace(cwd=str(root), root=str(root))
        plan = fresh_plan()
        names = plan.settings.system.instructions.project_files
        memo = OnDemandMemo()
        ends = [i for i, m in enumerate(ses.messages) if m.role == "assistant" and i > 0]
        carried: list[float] = []
        scratch: list[float] = []
        for end in ends:
            cut = ses.model_copy(update={"messages": ses.messages[:end]})
            lowered = run(plan, cut, NOWHERE, until="lower").lowered
            for times, use in ((carried, memo), (scratch, None)):
                gc.collect()
                start = time.perf_counter()
                attach(lowered, names, (), ws, use, "bench")
                times.append(time.perf_counter() - start)
    a, b = statistics.median(carried[-LAST:]), statistics.median(scratch[-LAST:])
    print(f"session: {path.name}: {len(ends)} steps, {len(reads)} reads")
    print(f"  per step, last {LAST}: carried {a * 1e3:.3f} ms, from scratch {b * 1e3:.3f} ms")
    print(f"  carried / from scratch: {a / b:.2f}")


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:2]))
