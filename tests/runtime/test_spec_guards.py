"""kilo-default's token estimate (§1), preflight measure (§4) and payload guard (§8 step 6),
plus truncation through the plan (§11.1) and cached counting with a real tokenizer."""

from __future__ import annotations

import math
from pathlib import Path

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import Agent, StepInput
from kilo_rules.engine.runtime.measure import MESSAGE_OVERHEAD, measure, messages_json
from kilo_rules.engine.runtime.trace import plan_caches
from kilo_rules.engine.text.tokens import CountCache, EstimateCounter, TiktokenCounter, estimate

from .helpers import assistant, model, session, text, tool, user


def test_spec_1_estimate_is_chars_over_four_rounded_half_up() -> None:
    assert estimate("x" * 4000) == 1000
    assert estimate("x" * 20000) == 5000
    assert estimate("") == 0
    assert estimate("xx") == 1 and estimate("x") == 0  # 0.5 rounds up, 0.25 down
    assert estimate("😀" * 2) == 1  # UTF-16 units, as JavaScript counts them


def test_spec_1_message_estimate_counts_json_punctuation() -> None:
    msgs = [ModelMessage("user", (Text("x" * 400),))]
    j = messages_json(msgs)
    assert j == '[{"role":"user","content":[{"type":"text","text":"' + "x" * 400 + '"}]}]'
    assert estimate(j) == round((400 + len(j) - 400) / 4 + 0.001)


def test_spec_4_measure_swaps_media_and_opaque_reasoning_for_placeholders() -> None:
    big = "A" * 40_000
    msgs = [
        ModelMessage("system", (Text("sys" * 100),)),
        ModelMessage("user", (Text("look"), Media("image/png", data=big))),
        ModelMessage("assistant", (Reasoning("", encrypted="E" * 8000), ToolCall("c", "read", {}))),
        ModelMessage("tool", (ToolResult("c", "read", (Text("out"),)),)),
    ]
    m = measure(msgs, (), factor=1.3, counter=estimate)
    assert m.media == 1
    assert m.extra == (10_000 - estimate("[encoded media]")) + (
        2000 - estimate("[opaque reasoning state]")
    )
    assert m.normalized < 1000 < m.raw
    assert m.continuation  # a tool result follows the last user message
    assert m.tools == estimate("[]") == 1
    assert m.overhead == -(-(1 + round(300 / 4)) * 13 // 10)


def test_spec_4_preflight_compacts_at_the_threshold_but_not_mid_tool_loop(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nname: p\nextends: kilo-default\noverflow:\n  threshold_percent: 50\n")
    plan = compile_policy(p, model(limits={"context": 20_000, "output": 4_000}))
    assert plan.value("overflow.limit") == 10_000
    long = session(user("u1", "y" * 60_000))
    assert apply_plan(plan, long, StepInput()).compaction_needed == "preflight"
    mid = session(user("u1", "y" * 60_000), assistant("a1", tool("t1", "z"), finish=None))
    result = apply_plan(plan, mid, StepInput())
    assert result.compaction_needed is None
    assert any(d.rule == "preflight" and "mid tool loop" in str(d.result) for d in result.decisions)
    kilo = compile_policy("kilo-default", model(limits={"context": 20_000, "output": 4_000}))
    assert (
        apply_plan(kilo, long, StepInput()).compaction_needed is None
    )  # no threshold: no preflight


def _big_tool_session(n: int, size: int) -> list:  # type: ignore[type-arg]
    msgs = []
    for i in range(n):
        msgs.append(user(f"u{i:02d}", f"turn {i}"))
        msgs.append(assistant(f"a{i:02d}", tool(f"t{i:02d}", "o" * size)))
    return msgs


def test_spec_8_payload_guard_prunes_once_then_sends(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nname: p\nextends: kilo-default\npayload:\n  max_bytes: 400_000\n")
    plan = compile_policy(p, model(limits={"context": 2_000_000, "output": 8_000}))
    s = session(*_big_tool_session(8, 100_000))
    result = apply_plan(plan, s, StepInput())
    marks = [m for m in result.mutations if m["op"] == "mark_compacted"]
    assert marks and all(m["reason"] == "payload-limit" for m in marks)
    guard = next(d for d in result.decisions if d.rule == "payload-limit")
    assert guard.inputs["bytes"] > 400_000
    assert guard.result["bytes_after"] < guard.inputs["bytes"]
    assert "[Old tool result content cleared]" in result.body()
    assert s.messages[1].parts[0].time.compacted is None  # the session itself is untouched


def test_spec_8_payload_guard_skips_the_rebuild_when_pruning_cannot_help(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nname: p\nextends: kilo-default\npayload:\n  max_bytes: 1_000\n")
    plan = compile_policy(p, model())
    s = session(user("u1", "q" * 5_000))  # only the current turn: nothing prunable
    result = apply_plan(plan, s, StepInput())
    guard = next(d for d in result.decisions if d.rule == "payload-limit")
    assert guard.severity == "warning" and guard.result["why"] == "pruning cannot help"
    assert not [m for m in result.mutations if m["op"] == "mark_compacted"]


def test_spec_11_1_truncation_through_the_plan(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    spill = tmp_path / "spill"
    p.write_text(
        "version: 1\nname: p\nextends: kilo-default\n"
        f"tool_output:\n  max_lines: 10\n  spill_dir: '{spill}'\n  direction: tail\n"
    )
    plan = compile_policy(p, model())
    out = plan.truncate_tool_output("\n".join(f"line {i}" for i in range(100)), call_id="c1")
    assert out.truncated and out.unit == "lines" and out.removed == 90
    assert out.content.startswith("...90 lines truncated...")
    assert out.content.endswith("line 99")
    assert out.spill_path == spill / "tool_c1"
    assert (spill / "tool_c1").read_text().count("\n") == 99


def test_tiktoken_counts_are_cached_per_message(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "version: 1\nname: p\nextends: kilo-default\ntokens:\n  counter: 'tiktoken:cl100k_base'\n"
    )
    plan = compile_policy(p, model())
    s = session(*_big_tool_session(3, 2_000))
    first = apply_plan(plan, s, StepInput())
    counter = plan_caches(plan).counter
    assert isinstance(counter, CountCache)
    stats = counter.stats()
    again = apply_plan(plan, s, StepInput())
    after = counter.stats()
    assert after.misses == stats.misses  # nothing recounted on the next step
    assert after.hits > stats.hits
    assert first.body() == again.body()
    assert not [d for d in first.decisions if d.rule == "tokens.counter"]  # offline, no fallback
    s2 = s.model_copy(update={"messages": [*s.messages, assistant("a9", text("t", "done"))]})
    apply_plan(plan, s2, StepInput())
    assert plan_caches(plan).counter is counter  # one store for the plan's every step
    assert counter.stats().misses > after.misses  # only the new parts


def test_unknown_encoding_falls_back_to_the_estimate_with_a_warning(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nname: p\nextends: kilo-default\ntokens:\n  counter: model\n")
    # A policy naming the encoding is refused by check (and so by compile); a model may
    # still name one this installation lacks, and the runtime falls back for it.
    m = model(tokenizer="tiktoken:o200k_base")
    result = apply_plan(compile_policy(p, m), session(user("u", "hi")), StepInput())
    warning = next(d for d in result.decisions if d.rule == "tokens.counter")
    assert warning.severity == "warning"


def test_a_tokenizer_counts_the_text_the_model_reads_not_its_json() -> None:
    """An estimate measures the JSON (Kilo's rule); a tokenizer counts texts, tool names
    and inputs, plus MESSAGE_OVERHEAD per message, so escapes do not inflate the count."""
    counter = TiktokenCounter("cl100k_base")
    ansi = '\x1b[1mbold\x1b[22m "quoted"\n' * 200
    msgs = [
        ModelMessage("user", (Text("run it"),)),
        ModelMessage("assistant", (ToolCall("c1", "bash", {"cmd": "ls"}),)),
        ModelMessage("tool", (ToolResult("c1", "bash", (Text(ansi),)),)),
    ]
    got = measure(msgs, (), factor=1.0, counter=counter.count).chars
    content = sum(counter.count(t) for t in ("run it", "bash", '{"cmd":"ls"}', ansi))
    assert got == content + 3 * MESSAGE_OVERHEAD
    assert counter.count(messages_json(msgs)) > 1.5 * got  # the JSON escapes every byte
    kilo = measure(msgs, (), factor=1.0, counter=EstimateCounter().count).chars
    assert kilo == estimate(messages_json(msgs))  # the estimate still reads the JSON


def test_spec_4_preflight_measures_the_leading_system_messages(tmp_path: Path) -> None:
    """Kilo's ``measure({messages, tools})`` serialises the model messages, the system
    messages in front included (overflow.ts@030412e:100-125). Here the conversation alone
    is under the 10,000-token limit, and the system prompt (an agent prompt of 20,000
    characters, ~5,000 tokens) takes the request over it."""
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nname: p\nextends: kilo-default\noverflow:\n  threshold_percent: 50\n")
    plan = compile_policy(p, model(limits={"context": 20_000, "output": 4_000}))
    s = session(user("u1", "y" * 24_000))  # ceil(6,000 × 1.3) = 7,800 < 10,000 alone
    assert apply_plan(plan, s, StepInput()).compaction_needed is None
    agent = Agent(name="code", prompt="p" * 20_000)
    result = apply_plan(plan, s, StepInput(agent=agent))
    assert result.compaction_needed == "preflight"
    verdict = next(d for d in result.decisions if d.rule == "preflight")
    assert verdict.inputs["normalized"] >= math.ceil((6_000 + 5_000) * 1.3)
    assert verdict.inputs["limit"] == 10_000
