"""``simulate`` over a corpus: the process pool against a serial run of the same work.

Run on demand::

    .venv/bin/python benchmarks/bench_simulate_corpus.py [N]

N copies (default 24) of the example Claude Code session are replayed under kilo-default
and cache-max on Claude Sonnet 4.5 with the job the command sends to its workers
(``SessionJob``, which compiles the policies in each worker), once in this process one
after the other (the baseline) and once through ``run_corpus`` on every core. The figure
is the ratio of the two wall times: on a machine with C free cores the ideal is 1/C, and
what is left above it is the start of the workers and their first compilation.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.tools.simulation.fleet import run_corpus
from kilo_rules.tools.simulation.simulate import SessionJob

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"


def main(n: int = 24) -> int:
    job = SessionJob(
        policies=("kilo-default", "cache-max"),
        model=bundled_catalog().get("anthropic/claude-sonnet-4-5"),
        steps=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(n):
            path = Path(tmp) / f"s{i:03d}.jsonl"
            shutil.copy(EXAMPLE, path)
            paths.append(path)

        start = time.perf_counter()
        serial = run_corpus(paths, job, executor="serial")
        serial_s = time.perf_counter() - start

        cores = os.cpu_count() or 1
        start = time.perf_counter()
        pooled = run_corpus(paths, job, executor="process", workers=cores)
        pooled_s = time.perf_counter() - start

    bad = [o for o in [*serial, *pooled] if o.error is not None]
    if bad:
        print(f"{len(bad)} sessions failed: {bad[0].error}", file=sys.stderr)
        return 1
    same = [o.value for o in serial] == [o.value for o in pooled]
    print(f"{n} sessions, 2 policies each, {cores} cores")
    print(f"serial, in process (baseline):  {serial_s:7.2f} s  ({serial_s / n * 1000:.0f} ms each)")
    print(f"process pool:                   {pooled_s:7.2f} s")
    print(f"  ratio to the baseline:        {pooled_s / serial_s:7.2f}  (ideal {1 / cores:.2f})")
    print(f"  same documents as serial:     {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 24))
