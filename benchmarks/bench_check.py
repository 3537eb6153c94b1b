"""``kilo-rules check`` on 100 small policies that extend kilo-default.

Run on demand::

    .venv/bin/python benchmarks/bench_check.py [N]

The policies are written to a temporary directory; each sets a few values and one
expression of its own over the bundled base. The figure that matters is the command as a
user runs it, ``kilo-rules check DIR`` in a fresh process (target: at most 2 s for 100
files), the median of five runs, with the fastest and slowest to show the spread, and the
CPU time the runs took (less shaken than wall time by other work on the machine). Its
baseline is a fresh interpreter importing the libraries a check needs (pydantic, PyYAML,
jsonschema, lark), measured the same way: no check can start faster.

When the environment forbids writing bytecode (``PYTHONDONTWRITEBYTECODE``, as in a
shared checkout), every run compiles the package's sources again, which an installed
wheel never does; the command is then also timed with a private bytecode cache
(``PYTHONPYCACHEPREFIX`` in a temporary directory, filled by one run first), so the two
costs can be told apart. In process, the first ``check_paths`` is compared with parsing
the same files once.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kilo_rules.engine.formats.load import load_yaml_file
from kilo_rules.tools.checking.check import check_paths

TARGET_SECONDS = 2.0

POLICY = """\
version: 1
name: team-{i}
description: generated policy {i} for the check benchmark
extends: kilo-default
compaction:
  tail_turns: {tail}
prune:
  reasons:
    normal: {normal}
output:
  max_tokens: "config.output_token_max ?? {cap}"
"""


def write_policies(root: Path, n: int) -> list[Path]:
    """``n`` small policies extending kilo-default, each a little different."""
    paths = []
    for i in range(n):
        path = root / f"team-{i:03d}.yaml"
        text = POLICY.format(i=i, tail=1 + i % 4, normal=str(i % 2 == 0).lower(), cap=8000 + i)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


#: Runs of each command; the median is the figure.
RUNS = 5


@dataclass(frozen=True)
class Runs:
    """Wall and CPU seconds (user + system, the child's own) of each run of a command."""

    wall: list[float]
    cpu: list[float]

    @property
    def median(self) -> float:
        """The median wall time: the figure compared with the target."""
        return statistics.median(self.wall)

    def line(self) -> str:
        """median, (min–max), and the median CPU time."""
        return (
            f"{self.median:6.3f} s (min {min(self.wall):.3f}, max {max(self.wall):.3f}; "
            f"CPU {statistics.median(self.cpu):.3f} s)"
        )


def _runs(argv: list[str], env: dict[str, str] | None = None) -> Runs:
    """``argv`` run :data:`RUNS` times, one after the other."""
    wall, cpu = [], []
    for _ in range(RUNS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, check=False, capture_output=True, env=env)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return Runs(wall, cpu)


FLOOR = "import pydantic, yaml, jsonschema, lark"


def main(n: int = 100) -> int:
    cli = str(Path(sys.executable).parent / "kilo-rules")
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as pyc:
        root = Path(tmp)
        paths = write_policies(root, n)

        command = _runs([cli, "check", str(root)])
        floor = _runs([sys.executable, "-c", FLOOR])
        cached: Runs | None = None
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = pyc
            subprocess.run([cli, "check", str(root)], check=False, capture_output=True, env=env)
            cached = _runs([cli, "check", str(root)], env)

        start = time.perf_counter()
        for p in paths:
            load_yaml_file(p)
        parse_once = time.perf_counter() - start

        start, cpu = time.perf_counter(), time.process_time()
        report = check_paths([str(root)])
        first, first_cpu = time.perf_counter() - start, time.process_time() - cpu

        start = time.perf_counter()
        check_paths([str(root)])
        second = time.perf_counter() - start

    if report.diagnostics or report.usage_errors or len(report.files) != n:
        print("the generated policies do not check clean:", file=sys.stderr)
        for d in report.diagnostics[:10]:
            print(f"  {d}", file=sys.stderr)
        return 1
    print(f"kilo-rules check DIR, {n} policies:   {command.line()}  (median of {RUNS})")
    print(
        f"  ratio to the {TARGET_SECONDS:.0f} s target:          "
        f"{command.median / TARGET_SECONDS:6.2f}"
    )
    print(f"  baseline: python importing the libs:{floor.line()}")
    print(f"    ratio to the baseline:            {command.median / floor.median:6.2f}")
    if cached is not None:
        print(f"  with a bytecode cache (installed):  {cached.line()}")
    print(f"check_paths in process (first run): {first:7.3f} s")
    print(f"  CPU time of this process:         {first_cpu:7.3f} s")
    print(f"  per file:                         {first / n * 1000:7.2f} ms")
    print(f"check_paths again (warm caches):    {second:7.3f} s")
    print(f"baseline: load_yaml_file x {n}:       {parse_once:7.3f} s")
    return 0 if command.median <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
