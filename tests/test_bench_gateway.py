"""The figures benchmarks/bench_gateway.py reports rest on its fast upstream, its repeated
histories, its pairing and its fit: each checked here on tiny inputs (no timing asserted)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("uvicorn")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks/bench_gateway.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gateway", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_gateway", module)
    spec.loader.exec_module(module)
    return module


def _body() -> dict[str, Any]:
    return {
        "model": "claude-bench",
        "max_tokens": 256,
        "system": "You fix bugs.",
        "messages": [
            {"role": "user", "content": "fix it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "looking"},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"p": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "print(1)",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }


def test_repeated_histories_alternate_with_unique_ids(bench: ModuleType) -> None:
    body = _body()
    out = bench.repeated(body, 3)
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["user", "assistant"] * 2 + ["user", "assistant", "user"]
    assert all(a != b for a, b in itertools.pairwise(roles))
    text = json.dumps(out)
    ids = [
        b["id"]
        for m in out["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    assert ids == ["toolu_1_c1", "toolu_1_c2", "toolu_1"]
    assert text.count("cache_control") == 1  # only the last copy keeps its marks
    assert out["messages"][-3:] == body["messages"]
    assert bench.repeated(body, 1) == body


def test_fit_and_percentile(bench: ModuleType) -> None:
    assert bench.loglog_slope([1, 2, 4, 10], [3, 6, 12, 30]) == pytest.approx(1.0)
    assert bench.loglog_slope([1, 2, 4, 10], [5, 5, 5, 5]) == pytest.approx(0.0)
    assert math.isnan(bench.loglog_slope([1, 2], [1, -1]))
    assert bench.percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert bench.percentile([0, 10], 0.99) == pytest.approx(9.9)


def test_in_process_baseline_runs(bench: ModuleType) -> None:
    times = bench.in_process(bench.encode(_body()), "anthropic", 200_000, 2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_pairs_through_the_gateway_and_the_fast_upstream(bench: ModuleType) -> None:
    raw = bench.encode(_body())
    with (
        bench.serving(bench.fast_app()) as upstream,
        tempfile.TemporaryDirectory() as tmp,
        bench.fast_gateway(upstream, Path(tmp), "anthropic", 200_000) as gateway,
    ):
        gw = bench.Target(gateway, "anthropic", managed=True)
        direct = bench.Target(upstream, "anthropic", managed=False)
        try:
            pairs = bench.paired(gw, direct, raw, 2)
            first = bench.paired(gw, direct, bench.encode(bench.streaming(_body())), 2, stream=True)
            rate = bench.throughput(gateway, "anthropic", raw, 2, 0.2, True)
        finally:
            gw.close()
            direct.close()
        decisions = [
            json.loads(line) for line in (Path(tmp) / "decisions.jsonl").read_text().splitlines()
        ]
    assert len(pairs.added) == 2 and len(first.gateway) == 2
    assert all(t > 0 for t in first.gateway + first.direct)
    assert rate > 0
    # Every request through the gateway was managed and its usage read back.
    assert decisions and all(d["status"] == 200 and d["passthrough"] is None for d in decisions)
    assert all(d["usage"]["input"] == len(raw) // 4 for d in decisions[:2])


def test_fast_upstream_streams_what_the_gateway_reads(bench: ModuleType) -> None:
    from kilo_rules.tools.serving.gateway.protocols import PROTOCOLS, SseUsage

    for protocol in PROTOCOLS.values():
        api = {"anthropic-messages": "anthropic", "openai-chat": "openai"}.get(
            protocol.name, "openai-responses"
        )
        events = {
            "anthropic": bench._anthropic_events,
            "openai": bench._chat_events,
            "openai-responses": bench._response_events,
        }[api](40)
        sse = SseUsage(protocol)
        sse.feed(events)
        usage = sse.usage()
        assert usage is not None and usage.input == 40, protocol.name
