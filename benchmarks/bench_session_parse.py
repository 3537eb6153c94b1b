"""Cost of reading a resent session: Session v1 JSON parsed and validated, vs json.loads.

Run with ``python benchmarks/bench_session_parse.py [session ...]``. The sessions default
to every recorded trajectory in ``../shared/data/trajectories`` (each imported, then
written as Session v1), or the small example in ``examples/sessions`` when that is absent.
A caller that resends the whole session each step (the sidecar, a stateless service) reads
it again every step; each figure is a ratio to ``json.loads`` of the same text, measured in
the same run, interleaved with it round by round so that a noisy machine slows both:

* from scratch: every message parsed and validated (the read before reuse), for reference;
* cold: a :class:`~kilo_rules.engine.formats.session.SessionReader` that saw nothing yet;
* warm: the same text read again by a reader that read it before;
* warm+1: the text with its last message, read by a reader that read it without —
  the ordinary step of a resending caller; target ≤ 1.3×.

``--profile`` prints the functions that dominate a cold read of the first session.
"""

from __future__ import annotations

import cProfile
import gc
import json
import pstats
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kilo_rules.engine.formats.session import (
    SessionReader,
    _session_from_json_cold,
    dump_session,
)
from kilo_rules.engine.importers import read_session

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT.parent / "shared/data/trajectories"
FALLBACK = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
TARGET_WARM_NEXT = 1.3
ROUNDS = 15


def sessions(argv: list[str]) -> list[Path]:
    """The sessions named, or every recorded one (largest first)."""
    named = [Path(a) for a in argv if not a.startswith("--")]
    if named:
        return named
    if RECORDED.is_dir():
        found = [p for p in RECORDED.iterdir() if p.name != "SOURCES.md"]
        return sorted(found, key=lambda p: p.stat().st_size, reverse=True)
    return [FALLBACK]


def interleaved(
    cases: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]],
) -> dict[str, float]:
    """The fastest of :data:`ROUNDS` runs of each case, in seconds, the cases taking turns
    within each round. A case is (setup, run): ``setup()`` is not timed, its value is what
    ``run`` is given."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(ROUNDS):
        for name, (setup, fn) in cases.items():
            arg = setup()
            gc.collect()  # a collection left over from the last run is not this run's cost
            start = time.perf_counter()
            fn(arg)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def measure(path: Path) -> tuple[int, int, dict[str, float]]:
    """(bytes, messages, seconds per case) for the session at ``path``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a log of many runs: its first is read, and fine
        session = read_session(path)
    text = dump_session(session)
    before = dump_session(session.model_copy(update={"messages": session.messages[:-1]}))
    warm = SessionReader()
    warm.read(text)

    def primed() -> SessionReader:
        reader = SessionReader()
        reader.read(before)
        return reader

    times = interleaved(
        {
            "json.loads": (lambda: None, lambda _: json.loads(text)),
            "from scratch": (lambda: None, lambda _: _session_from_json_cold(text, "<bench>")),
            "cold": (SessionReader, lambda r: r.read(text)),
            "warm": (lambda: warm, lambda r: r.read(text)),
            "warm+1": (primed, lambda r: r.read(text)),
        }
    )
    return len(text.encode()), len(session.messages), times


def main(argv: list[str]) -> int:
    """Print one row per session; exit 1 when a warm+1 read misses its target."""
    missed = 0
    print(f"{'session':<44} {'MB':>5} {'msgs':>5} {'loads ms':>9}  ratio to json.loads")
    for path in sessions(argv):
        size, n, t = measure(path)
        base = t["json.loads"]
        ratios = {k: v / base for k, v in t.items() if k != "json.loads"}
        ok = ratios["warm+1"] <= TARGET_WARM_NEXT
        missed += not ok
        shown = "  ".join(f"{k} {r:5.2f}x" for k, r in ratios.items())
        print(
            f"{path.name[:44]:<44} {size / 1e6:5.2f} {n:5d} {base * 1e3:9.2f}  {shown}"
            f"  {'ok' if ok else 'MISSED'} (warm+1 target <= {TARGET_WARM_NEXT}x)"
        )
    if "--profile" in argv:
        text = dump_session(read_session(sessions(argv)[0]))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            SessionReader().read(text)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
