"""The figures benchmarks/bench_peers.py reports rest on its chat conversion and its orphan
count: both checked here on small sessions (LiteLLM and LangChain are not needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kilo_rules.engine.formats.session import Message, Session, TextPart, ToolPart

BENCH = Path(__file__).resolve().parent.parent / "benchmarks/bench_peers.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peers", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_peers", module)
    spec.loader.exec_module(module)
    return module


def _session() -> Session:
    return Session(
        id="s",
        messages=[
            Message(id="m1", role="user", parts=[TextPart(id="p1", text="fix it")]),
            Message(
                id="m2",
                role="assistant",
                parts=[
                    TextPart(id="p2", text="looking"),
                    ToolPart(
                        id="p3",
                        call_id="c1",
                        tool="read",
                        input={"path": "a.py"},
                        status="completed",
                        output="print(1)",
                    ),
                    ToolPart(id="p4", call_id="c2", tool="bash", status="error", error="exit 1"),
                ],
            ),
            Message(id="m3", role="assistant", parts=[TextPart(id="p5", text="done")]),
        ],
    )


def test_chat_form_pairs_each_call_with_its_result(bench: ModuleType) -> None:
    chat, starts = bench.to_openai(_session())
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in chat[1]["tool_calls"]] == ["c1", "c2"]
    assert chat[2] == {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}
    assert chat[3]["content"] == "exit 1"
    # The history before message i is chat[: starts[i]]: before m3, both results are in.
    assert starts == [0, 1, 4, 5]
    assert bench.orphans_openai(chat[: starts[2]]) == 0


def test_orphans_count_calls_without_results_and_results_without_calls(
    bench: ModuleType,
) -> None:
    chat, _ = bench.to_openai(_session())
    assert bench.orphans_openai(chat[:3]) == 1  # c2's result is cut off
    assert bench.orphans_openai(chat[2:]) == 2  # both results, their calls cut off
    request = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "r"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c9"}]},
        ]
    }
    assert bench.orphans_anthropic(request) == 2


def test_langchain_orphans_match_the_chat_form(bench: ModuleType) -> None:
    pytest.importorskip("langchain_core")  # the bench extra
    lc = bench.to_langchain(bench.to_openai(_session())[0])
    assert bench.orphans_langchain(lc[:3]) == 1
    assert bench.orphans_langchain(lc) == 0


def test_sampled_steps_spread_over_the_session(bench: ModuleType) -> None:
    assert bench.sampled(100, 5) == [0, 25, 50, 74, 99]
    assert bench.sampled(3, 10) == [0, 1, 2]
    assert bench.sampled(7, 1) == [6]
