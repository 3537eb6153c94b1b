"""``kilo-rules check`` on 100 small policies that extend kilo-default.

Run on demand::

    .venv/bin/python benchmarks/bench_check.py [N]

The policies are written to a temporary directory; each sets a few values and one
expression of its own over the bundled base. The figure that matters is the command as a
user runs it, ``kilo-rules check DIR`` in a fresh process (target: at most 2 s for 100
files), the median of three runs. Its baseline is a fresh interpreter importing the
libraries a check needs (pydantic, PyYAML, jsonschema, lark): no check can start faster.
In process, the first ``check_paths`` is compared with parsing the same files once.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
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


def _wall(argv: list[str]) -> float:
    """Median wall time of three runs of ``argv``."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(argv, check=False, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


FLOOR = "import pydantic, pydantic_settings, yaml, jsonschema, lark"


def main(n: int = 100) -> int:
    cli = str(Path(sys.executable).parent / "kilo-rules")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = write_policies(root, n)

        command = _wall([cli, "check", str(root)])
        floor = _wall([sys.executable, "-c", FLOOR])

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
    print(f"kilo-rules check DIR, {n} policies:    {command:7.3f} s  (median of 3)")
    print(
        f"  ratio to the {TARGET_SECONDS:.0f} s target:           {command / TARGET_SECONDS:7.2f}"
    )
    print(f"  baseline: python importing the libs:{floor:7.3f} s  (ratio {command / floor:.2f})")
    print(f"check_paths in process (first run): {first:7.3f} s")
    print(f"  CPU time of this process:         {first_cpu:7.3f} s")
    print(f"  per file:                         {first / n * 1000:7.2f} ms")
    print(f"check_paths again (warm caches):    {second:7.3f} s")
    print(f"baseline: load_yaml_file x {n}:       {parse_once:7.3f} s")
    return 0 if command <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
