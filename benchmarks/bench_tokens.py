"""Token-counting throughput: the estimate, offline tiktoken, and the per-part count cache.

Run with ``python benchmarks/bench_tokens.py``. The cache rows show what a turn costs when
only the newest parts are new: the session is counted once cold, then recounted warm.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kilo_rules.engine.text.tokens import CountCache, EstimateCounter, TiktokenCounter, TokenCounter


def _session(parts: int = 400) -> list[str]:
    """Parts shaped like an agent session: prose, code and tool output."""
    prose = "The build failed because the fixture path is relative to the wrong directory. "
    code = "def handler(event):\n    return {'status': 200, 'body': event['id']}\n"
    tool = "src/app/module_{i}.py:{i}: error: Incompatible return value type\n"
    return [
        (prose * 20) if i % 3 == 0 else (code * 30) if i % 3 == 1 else (tool * 60).format(i=i)
        for i in range(parts)
    ]


def _time(label: str, fn: Callable[[], int], chars: int, repeat: int = 3) -> None:
    best = float("inf")
    tokens = 0
    for _ in range(repeat):
        start = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - start)
    rate = chars / best / 1e6 if best else float("inf")
    print(f"{label:<34} {best * 1e3:9.2f} ms  {rate:8.1f} Mchar/s  {tokens:>10} tokens")


def main() -> None:
    """Print one line per counter and cache state."""
    parts = _session()
    chars = sum(len(p) for p in parts)
    counters: list[TokenCounter] = [EstimateCounter(), TiktokenCounter("cl100k_base")]
    print(f"{len(parts)} parts, {chars} chars")
    for counter in counters:
        cache = CountCache(counter, maxsize=len(parts) * 2)

        def plain(c: TokenCounter = counter) -> int:
            return sum(c.count(p) for p in parts)

        def cold(c: CountCache = cache) -> int:
            c.clear()
            return sum(c.count(p) for p in parts)

        def warm(c: CountCache = cache) -> int:
            return sum(c.count(p) for p in parts)

        _time(counter.name, plain, chars)
        _time(f"{counter.name} cached (cold)", cold, chars, repeat=1)
        _time(f"{counter.name} cached (warm)", warm, chars)


if __name__ == "__main__":
    main()
