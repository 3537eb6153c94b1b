"""The provider's own context management, as the simulator plays it on wire bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.providers.serversim import CLEARED, ServerEdits
from kilo_rules.tools.simulation.simulate import simulate

from .conftest import SHARED

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
OPUS = SHARED / "data/trajectories/claude-code-opus46-spotter-8463c716.jsonl"


def count(text: str) -> int:
    return max(1, len(text) // 4)


def _body(uses: int, size: int = 4000) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for i in range(uses):
        name = "skill" if i == 1 else "bash"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"plan {i}", "signature": "s"},
                    {"type": "tool_use", "id": f"t{i}", "name": name, "input": {"cmd": f"c{i}"}},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "x" * size}],
            }
        )
    return {"model": "m", "max_tokens": 10, "messages": messages}


def _results(body: dict[str, Any]) -> list[str]:
    return [
        b["content"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


def test_old_tool_results_are_cleared_past_the_trigger_the_recent_and_excluded_kept() -> None:
    edit = {"edit": "clear_tool_uses", "trigger": 3000, "keep": 2, "exclude_tools": ["skill"]}
    server = ServerEdits([edit | {"clear_tool_inputs": True}], "anthropic", count)
    body = _body(6)
    edited, done = server.apply(body)
    results = _results(edited)
    # t0, t2, t3 cleared; t1 (skill) excluded; t4, t5 the last two kept
    assert [r == CLEARED for r in results] == [True, False, True, True, False, False]
    assert done.cleared_tool_uses == 3
    uses = [b for m in edited["messages"] for b in m["content"] if isinstance(m["content"], list)]
    inputs = {b["id"]: b["input"] for b in uses if b.get("type") == "tool_use"}
    assert inputs["t0"] == {} and inputs["t1"] == {"cmd": "c1"} and inputs["t5"] == {"cmd": "c5"}
    assert _results(body)[0] == "x" * 4000  # the client's body is not touched


def test_nothing_is_cleared_under_the_trigger_or_when_too_little_would_go() -> None:
    under = ServerEdits(
        [{"edit": "clear_tool_uses", "trigger": 10**6, "keep": 1}], "anthropic", count
    )
    assert under.apply(_body(4))[1].cleared_tool_uses == 0
    small = ServerEdits(
        [{"edit": "clear_tool_uses", "trigger": 100, "keep": 1, "clear_at_least": 50_000}],
        "anthropic",
        count,
    )
    edited, done = small.apply(_body(4))
    assert done.cleared_tool_uses == 0 and CLEARED not in _results(edited)


def test_thinking_of_older_turns_is_dropped() -> None:
    server = ServerEdits([{"edit": "clear_thinking", "keep": 2}], "anthropic", count)
    edited, done = server.apply(_body(5))
    kinds = [
        [b["type"] for b in m["content"]] for m in edited["messages"] if m["role"] == "assistant"
    ]
    assert kinds[:3] == [["tool_use"]] * 3
    assert kinds[3:] == [["thinking", "tool_use"]] * 2
    assert done.cleared_thinking == 3
    keep_all = ServerEdits([{"edit": "clear_thinking", "keep": "all"}], "anthropic", count)
    assert keep_all.apply(_body(5))[1].cleared_thinking == 0


def test_compaction_replaces_all_but_the_last_two_items_and_stays_compacted() -> None:
    server = ServerEdits([{"edit": "compaction", "trigger": 5000}], "anthropic", count)
    first, done = server.apply(_body(4))  # 9 items, ~4,000 tokens of results
    assert not done.compacted
    body = _body(8)
    second, done = server.apply(body)
    assert done.compacted and done.summary_input > 5000 and done.summary_output >= 1000
    assert len(second["messages"]) == 3  # the summary, then the last two items
    assert second["messages"][1:] == body["messages"][-2:]
    # The next request holds everything again, plus one new exchange: the provider reads
    # the summary and what came after it.
    third_body = _body(9)
    third, done = server.apply(third_body)
    assert not done.compacted
    assert third["messages"][0] == second["messages"][0]
    assert third["messages"][1:] == third_body["messages"][len(body["messages"]) - 2 :]
    assert len(first["messages"]) == 9


def test_the_responses_api_compacts_its_input_items() -> None:
    server = ServerEdits([{"edit": "compaction", "trigger": 10}], "openai-responses", count)
    body = {"model": "m", "input": [{"role": "user", "content": "x" * 400}] * 5}
    edited, done = server.apply(body)
    assert done.compacted and len(edited["input"]) == 3
    assert edited["input"][0]["content"][0]["type"] == "input_text"


def test_other_wire_formats_play_nothing() -> None:
    server = ServerEdits([{"edit": "compaction", "trigger": 1}], "openai", count)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 5}
    assert server.apply(body) == (body, server.apply(body)[1])
    assert not server.active


def _policy(tmp_path: Path, name: str, server: str, extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"version: 1\nname: {name}\nextends: kilo-default\n{extra}server:\n{server}",
        encoding="utf-8",
    )
    return path


def test_simulate_reports_the_edits_on_a_recorded_session(tmp_path: Path) -> None:
    session = read_session(str(EXAMPLE))
    clear = _policy(
        tmp_path,
        "clear",
        "  clear_tool_uses: {enabled: true, trigger_tokens: 20000, keep_tool_uses: 2}\n",
    )
    compact = _policy(
        tmp_path,
        "compact",
        "  compaction: {enabled: true, trigger_tokens: 30000}\n",
        "compaction: {auto: false}\n",
    )
    model = "anthropic/claude-sonnet-4-6"
    plans = [compile_policy(p, model) for p in ("kilo-default", clear, compact)]
    base, cleared, compacted = simulate(session, plans)
    assert base.server_compactions == 0 and not any(s.server_cleared for s in base.steps)
    assert any(s.server_cleared for s in cleared.steps)
    assert cleared.input < base.input  # the provider reads less...
    assert compacted.server_compactions >= 1 and compacted.summary_input > 30000
    assert compacted.max_request < base.max_request
    assert all(s.cache.input < 60000 for s in compacted.steps)
    # ...and the model without the capability is sent (and simulated with) nothing
    (plain,) = simulate(session, [compile_policy(compact, "anthropic/claude-sonnet-4-5")])
    assert plain.server_compactions == 0


@pytest.mark.slow
@pytest.mark.skipif(not OPUS.is_file(), reason="shared trajectories absent")
def test_server_compaction_on_the_long_session_is_cheaper_than_never_compacting(
    tmp_path: Path,
) -> None:
    session = read_session(str(OPUS))
    compact = _policy(
        tmp_path,
        "compact",
        "  compaction: {enabled: true, trigger_tokens: 150000}\n",
        "compaction: {auto: false}\n",
    )
    model = "anthropic/claude-sonnet-4-6"  # a 1M window: kilo-default never compacts
    base, server = simulate(session, [compile_policy(p, model) for p in ("kilo-default", compact)])
    assert base.compactions == 0 and base.max_request > 150_000
    assert server.server_compactions == 1 and server.max_request < 150_000
    assert server.cost is not None and base.cost is not None and server.cost < base.cost
