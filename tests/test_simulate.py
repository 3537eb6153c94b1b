"""kilo-rules simulate: the prompt-cache model, the replay, the costs and the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import Prices
from kilo_rules.engine.formats.session import Session, TokenUsage
from kilo_rules.engine.importers import import_file
from kilo_rules.engine.providers.cachesim import Block, CacheSimulator, blocks
from kilo_rules.tools.cli import main
from kilo_rules.tools.cli.simulate import format_table
from kilo_rules.tools.simulation.simulate import (
    SimulationReport,
    default_counter,
    simulate,
    step_cost,
    without_recorded_compactions,
)

from .runtime.helpers import assistant, model, session, text, tool, user

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
LARGEST = ROOT.parent / "shared/data/trajectories/claude-code-opus46-spotter-8463c716.jsonl"
SONNET = "anthropic/claude-sonnet-4-5"
POLICIES = ("kilo-default", "cache-max", "local-small")
PRICES = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_write_1h": 6.0}
PRICES |= {"cache_read": 0.3}


def b(name: str, tokens: int, mark: Any = None) -> Block:
    return Block(name, tokens, mark)


# ---------------------------------------------------------------- the cache model, exact


def test_explicit_write_then_read_of_the_shared_prefix_then_no_read_after_a_change() -> None:
    sim = CacheSimulator("explicit", 100)
    one = sim.step([b("A", 60), b("B", 60, "5m"), b("C", 30)])
    assert (one.input, one.read, one.write_5m, one.write_1h, one.uncached) == (150, 0, 120, 0, 30)
    two = sim.step([b("A", 60), b("B", 60), b("C", 30), b("D", 40, "5m")])
    # B's prefix was written by step 1: read it; C and D up to the breakpoint are written
    assert (two.read, two.write_5m, two.uncached) == (120, 70, 0)
    three = sim.step([b("A2", 60), b("B", 60), b("C", 30), b("D", 40, "5m")])
    assert (three.read, three.write_5m, three.uncached) == (0, 190, 0)


def test_a_prefix_under_the_minimum_is_not_cached() -> None:
    sim = CacheSimulator("explicit", 1024)
    steps = [sim.step([b("A", 500), b("B", 500, "5m")]) for _ in range(2)]
    assert [(s.read, s.write, s.uncached) for s in steps] == [(0, 0, 1000)] * 2
    # the same breakpoint once the prefix reaches the minimum
    grown = sim.step([b("A", 500), b("B", 524, "5m")])
    assert (grown.read, grown.write, grown.uncached) == (0, 1024, 0)


def test_write_segments_are_billed_at_the_bucket_of_the_breakpoint_that_closes_them() -> None:
    sim = CacheSimulator("explicit", 100)
    step = sim.step([b("T", 80), b("S", 120, "1h"), b("M", 50, "5m"), b("N", 10)])
    assert (step.write_1h, step.write_5m, step.uncached) == (200, 50, 10)
    again = sim.step([b("T", 80), b("S", 120, "1h"), b("M", 50), b("X", 5, "5m")])
    assert (again.read, again.write_1h, again.write_5m) == (250, 0, 5)


def test_a_hit_further_back_than_the_lookback_is_missed() -> None:
    prefix = [b("A", 200, "5m")]
    filler = [b(f"f{i}", 1) for i in range(25)]
    near, far = CacheSimulator("explicit", 100), CacheSimulator("explicit", 100, lookback=None)
    for sim in (near, far):
        sim.step(prefix)
    late = [b("A", 200), *filler[:-1], b("f24", 1, "5m")]  # only the rolling mark now
    assert near.step(late).read == 0  # 25 blocks back: beyond Anthropic's ~20
    assert far.step(late).read == 200


def test_entries_expire_after_their_ttl_when_time_is_modelled() -> None:
    for ttl, read in (("5m", 0), ("1h", 150)):
        sim = CacheSimulator("explicit", 100, seconds_per_step=400)
        sim.step([b("A", 150, ttl)])
        assert sim.step([b("A", 150, ttl)]).read == read


def test_automatic_caching_reads_the_common_prefix_in_128_token_steps() -> None:
    sim = CacheSimulator("automatic", 1024)
    first = sim.step([b("A", 1000), b("B", 500), b("C", 500)])
    assert (first.read, first.write, first.uncached) == (0, 0, 2000)
    second = sim.step([b("A", 1000), b("B", 500), b("D", 700)])
    shared = 1500  # A and B
    assert second.read == 1024 + (shared - 1024) // 128 * 128 == 1408
    assert (second.write, second.uncached) == (0, 2200 - 1408)
    short = CacheSimulator("automatic", 1024)
    short.step([b("A", 1000), b("B", 5)])
    assert short.step([b("A", 1000), b("C", 5)]).read == 0  # shared 1000 < minimum


def test_no_cache_reads_nothing() -> None:
    sim = CacheSimulator("none", 0)
    seq = [b("A", 5000, "5m")]
    assert [(s.read, s.write, s.uncached) for s in (sim.step(seq), sim.step(seq))] == [
        (0, 0, 5000)
    ] * 2


def test_blocks_follow_cache_order_and_ignore_where_the_marks_sit() -> None:
    count = default_counter().count
    mark = {"type": "ephemeral"}
    body = {
        "model": "m",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "sys", "cache_control": mark}],
        "tools": [{"name": "read", "description": "d", "input_schema": {}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    seq = blocks(body, count)
    assert [x.key.split(":")[0] for x in seq] == ["t", "s", "m0", "m0"]
    assert [x.mark for x in seq] == [None, "5m", None, None]
    moved = {**body, "system": [{"type": "text", "text": "sys"}], "cache_control": mark}
    assert [x.key for x in blocks(moved, count)] == [x.key for x in seq]
    assert blocks(moved, count)[-1].mark == "5m"  # automatic caching: the last block
    bedrock = {
        "system": [{"text": "sys"}, {"cachePoint": {"type": "default", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
    }
    assert [x.mark for x in blocks(bedrock, count)] == ["1h", None, None]
    compatible = {"messages": [{"role": "assistant", "tool_calls": [{}], "cache_control": mark}]}
    assert [x.mark for x in blocks(compatible, count)] == [None, "5m"]


# ---------------------------------------------------------------- a hand-made session


def _words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _one_turn() -> Session:
    """One user request answered in two steps (a tool call, then the answer)."""
    return session(
        user("u1", "Please review this code: " + _words(900, "a")),
        assistant("a1", tool("p1", output=_words(400, "b")), tokens=TokenUsage(output=40)),
        assistant("a2", text("p2", "Done."), tokens=TokenUsage(output=7, reasoning=3)),
    )


def _inline(**kw: Any) -> Any:
    return model(prices=PRICES, **kw)


def test_a_hand_made_session_writes_on_step_one_and_reads_it_on_step_two() -> None:
    plan = compile_policy("kilo-default", _inline())
    (report,) = simulate(_one_turn(), [plan])
    one, two = report.steps
    assert report.error is None and report.compactions == 0
    assert one.cache.input > 1024 and one.markers >= 1
    # the last block carries the rolling breakpoint: the whole request is written
    assert (one.cache.read, one.cache.write_5m, one.cache.uncached) == (0, one.cache.input, 0)
    # step 2 of the same user turn repeats step 1 byte for byte up to its breakpoint
    assert two.cache.read == one.cache.input
    assert two.cache.write_5m == two.cache.input - one.cache.input
    assert [s.output for s in report.steps] == [40, 10]  # reasoning counts as output
    want = (one.cache.input * 3.75 + 40 * 15.0) / 1e6
    assert one.cost == pytest.approx(want)
    assert report.cost == pytest.approx(sum(s.cost or 0 for s in report.steps))


def test_one_hour_writes_are_priced_at_cache_write_1h(tmp_path: Path) -> None:
    policy = tmp_path / "all-1h.yaml"
    policy.write_text(
        "version: 1\nname: all-1h\nextends: cache-max\ncache:\n  message_ttl: null\n",
        encoding="utf-8",
    )
    plan = compile_policy(policy, _inline())
    (report,) = simulate(_one_turn(), [plan])
    one = report.steps[0]
    assert one.cache.write_1h > 0 and one.cache.write_5m == 0
    p = one.cache
    want = (p.uncached * 3.0 + p.read * 0.3 + p.write_1h * 6.0 + one.output * 15.0) / 1e6
    assert one.cost == pytest.approx(want)
    prices = Prices(**PRICES)
    assert step_cost(prices, p, one.output) == pytest.approx(want)


def test_automatic_caching_reads_the_previous_request_and_none_reads_nothing() -> None:
    auto = _inline(
        api="openai",
        provider="openai",
        family="gpt",
        cache={"kind": "automatic", "max_breakpoints": 0, "min_cacheable_tokens": 1024},
    )
    (report,) = simulate(_one_turn(), [compile_policy("kilo-default", auto)])
    one, two = report.steps
    assert one.markers == 0 and one.cache.read == 0 and one.cache.write == 0
    assert two.cache.read == 1024 + (one.cache.input - 1024) // 128 * 128
    assert two.cache.write == 0 and two.cache.uncached == two.cache.input - two.cache.read
    none = _inline(cache={"kind": "none"})
    (report,) = simulate(_one_turn(), [compile_policy("kilo-default", none)])
    assert all(s.cache.read == s.cache.write == 0 for s in report.steps)


def test_a_small_session_is_under_the_minimum_and_a_model_without_prices_costs_null() -> None:
    tiny = session(user("u1", "hi"), assistant("a1", text("p1", "hello")))
    plan = compile_policy("kilo-default", model())  # no prices
    (report,) = simulate(tiny, [plan])
    assert report.steps[0].cache.input < 1024
    assert report.cache_read == report.cache_write == 0
    assert report.steps[0].cost is None and report.cost is None
    assert report.to_json()["cost_usd"] is None
    assert "-" in format_table([report.to_json(steps=False)]).splitlines()[-1].split()


# ---------------------------------------------------------------- the bundled example log


@pytest.fixture(scope="module")
def example() -> tuple[Session, list[SimulationReport]]:
    log = import_file(EXAMPLE)
    plans = [compile_policy(p, SONNET) for p in POLICIES]
    return log, simulate(log, plans)


def test_example_log_under_three_policies(example: tuple[Session, list[SimulationReport]]) -> None:
    log, reports = example
    replayed = without_recorded_compactions(log)
    answers = sum(m.role == "assistant" for m in replayed.messages)
    assert answers == 12
    assert [r.policy for r in reports] == list(POLICIES)
    for r in reports:
        assert len(r.steps) == answers and r.error is None
        assert r.max_request <= r.window
        for s in r.steps:
            c = s.cache
            assert c.read + c.write_5m + c.write_1h + c.uncached == c.input > 0
    default, cache_max, local_small = reports
    assert default.cache_read > 0 and cache_max.cache_read > 0
    assert default.cost is not None and cache_max.cost is not None
    assert local_small.cost is not None and local_small.cache_read == 0
    # both keep a rolling breakpoint on the newest messages, so both read the tool loop;
    # cache-max writes the same tokens into the 1-hour bucket (docs/verify.md)
    assert cache_max.cache_read == default.cache_read
    assert cache_max.to_json()["cache_write_1h"] == cache_max.cache_write > 0
    assert cache_max.cost <= default.cost * 2.0 / 1.25
    assert local_small.cost > 2 * default.cost  # no breakpoints at all


def test_same_input_same_report(example: tuple[Session, list[SimulationReport]]) -> None:
    log, reports = example
    again = simulate(log, [compile_policy("kilo-default", SONNET)])
    assert again[0].to_json() == reports[0].to_json()


@pytest.mark.slow
@pytest.mark.skipif(not LARGEST.exists(), reason="../shared/data/trajectories is not available")
def test_largest_claude_code_log_compacts_and_stays_under_the_window() -> None:
    plan = compile_policy("kilo-default", SONNET)
    (report,) = simulate(import_file(LARGEST), [plan])
    assert len(report.steps) == 143 and report.error is None
    assert report.compactions >= 1 and report.summary_input > 0
    assert report.max_request <= 200_000
    assert report.cache_read > 0.9 * report.input


# ---------------------------------------------------------------- the command


def _cli(*argv: str) -> int:
    return main(["simulate", *argv])


def _example_args(*policies: str) -> list[str]:
    args = ["--model", SONNET, "--session", str(EXAMPLE)]
    for p in policies:
        args += ["--policy", p]
    return args


def test_cli_table_has_one_row_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(*_example_args("kilo-default", "cache-max")) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    assert "cache read" in lines[header] and "vs floor" in lines[header]
    assert "vs first" in lines[header]
    assert any(line.startswith("cost floor $") for line in lines[:header])
    assert any(line.startswith("calibration (fitted on 12") for line in lines[:header])
    rows = {line.split()[0]: line.split() for line in lines[header + 2 :]}
    assert set(rows) == {"kilo-default", "cache-max"}
    assert rows["kilo-default"][-1] == "1.00x" and rows["kilo-default"][1] == "12"
    # kilo-default keeps the whole history of this short session: it is at the floor
    assert rows["kilo-default"][-2] == "1.00x"


def test_cli_json_parses_with_per_step_detail(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(*_example_args("kilo-default"), "--format", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    (report,) = doc["reports"]
    assert doc["model"] == SONNET and report["policy"] == "kilo-default"
    assert len(report["steps"]) == report["requests"] == 12
    assert report["cache_read"] == sum(s["cache_read"] for s in report["steps"]) > 0
    assert report["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in report["steps"]))


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("--model", SONNET, "--session", str(tmp_path / "missing.jsonl")) == 2
    assert _cli("--model", "no/such-model", "--session", str(EXAMPLE)) == 1
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "model.unknown" in err


def _autonomous_run(steps: int) -> Session:
    """One prompt, then ``steps`` tool calls with big outputs: one user turn throughout."""
    answers = [
        assistant(f"a{k}", tool(f"p{k}", output=_words(2_500, f"o{k}_")), created=k + 1)
        for k in range(1, steps + 1)
    ]
    return session(user("u1", "Fix the bug: " + _words(50, "t"), created=0), *answers)


def test_a_replay_that_stops_early_says_so(tmp_path: Path) -> None:
    inline = _inline(limits={"context": 40_000, "output": 8_000})
    long_run = tmp_path / "long.yaml"
    long_run.write_text(
        "version: 1\nname: long\nextends: kilo-default\ncompaction: {attempt_rule: no-progress}\n",
        encoding="utf-8",
    )
    plans = [compile_policy("kilo-default", inline), compile_policy(long_run, inline)]
    kilo, long = simulate(_autonomous_run(40), plans)
    assert kilo.stopped and kilo.error is not None and "Compaction exhausted" in kilo.error
    assert len(kilo.steps) < kilo.requests_total == 40
    assert not long.stopped and len(long.steps) == 40 and long.compactions > 3
    table = format_table([kilo.to_json(steps=False), long.to_json(steps=False)])
    row = next(line for line in table.splitlines() if line.startswith("kilo-default"))
    assert f"{len(kilo.steps)} of 40, stopped" in row
    assert row.split()[-1] == "-"  # no cost ratio against a run that stopped early
    assert kilo.to_json(steps=False)["stopped"] is True


def test_a_responses_api_body_is_cut_into_instructions_and_input_items() -> None:
    body = {
        "model": "gpt-5-codex",
        "instructions": "You are a coding agent.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "tools": [{"type": "function", "name": "bash", "parameters": {}}],
    }
    seq = blocks(body, lambda text: len(text))
    wheres = [b.key.split(":", 1)[0] for b in seq]
    assert wheres == ["t", "s", "m0", "m0", "m1", "m2"]
    assert all(b.tokens > 0 for b in seq)
