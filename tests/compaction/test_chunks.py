"""Kilo's chunked summary fallback (spec §7.5, ``compaction-chunks.ts``)."""

from __future__ import annotations

import threading
import time

import pytest

from kilo_rules.engine.formats.request import ModelMessage, Text, ToolCall, ToolResult
from kilo_rules.engine.runtime.chunks import (
    ChunkSettings,
    SmallModel,
    chunk_budget,
    needed,
    small_model,
    split,
    summarize_chunked,
)
from kilo_rules.engine.runtime.compaction import compact
from kilo_rules.engine.summarizers.protocol import SummarizerError, SummaryRequest
from kilo_rules.engine.text.tokens import estimate

from .helpers import FakeSummarizer, assistant, chars, plan_for, session, text, user


def test_chunk_small_model_caps_the_output_at_output_max() -> None:
    # model' = model with output maxOutputTokens(model, min(2048, outputTokenMax ?? 2048))
    assert small_model(plan_for(20_000, 10_000)) == SmallModel(17_952, 2048)
    assert small_model(plan_for(20_000, 10_000, output_token_max=1_000)) == SmallModel(
        19_000, 1_000
    )
    assert small_model(plan_for(20_000, 1_000)) == SmallModel(19_000, 1_000)


def test_chunk_needed_is_ceil_estimate_times_factor_plus_output_over_usable() -> None:
    model = SmallModel(usable=17_952, output=2048)
    msgs = [ModelMessage("user", (Text("x"),))]
    # ceil(12 233 × 1.3) + 2048 = 17 951 fits; ceil(12 234 × 1.3) + 2048 = 17 953 does not
    assert not needed(msgs, model, 1.3, lambda _: 12_233)
    assert needed(msgs, model, 1.3, lambda _: 12_234)


def test_chunk_budget_is_a_ratio_of_usable_with_a_floor() -> None:
    settings = ChunkSettings.from_plan(plan_for(20_000, 10_000))
    assert chunk_budget(settings, SmallModel(17_952, 2048)) == 10_771  # floor(17 952 × 0.6)
    assert chunk_budget(settings, SmallModel(1_000, 2048)) == 1_000  # min_budget


def _big_session(turns: int, size: int) -> list[object]:
    msgs: list[object] = []
    for k in range(turns):
        msgs += [user(f"u{k:02}", f"turn {k}"), assistant(f"a{k:02}", text(f"t{k}", chars(size)))]
    return msgs


def test_spec_7_5_chunked_fallback_when_the_head_does_not_fit() -> None:
    plan = plan_for(20_000, 10_000)
    s = session(*_big_session(12, 4_000), user("z", "last"))  # type: ignore[arg-type]
    fake = FakeSummarizer()
    result = compact(plan, s, fake, overflow=None, count=estimate)
    how = next(d for d in result.decisions if d.rule == "summary").result
    assert how["mode"] == "chunked" and how["budget"] == 10_771
    chunk_requests = [r for r in fake.requests if "partial-summary" not in str(r.messages)]
    assert len(chunk_requests) == how["chunks"] >= 4
    assert all(r.max_output_tokens == 2048 for r in fake.requests)
    assert all(r.previous_summary is None for r in chunk_requests)
    new = plan.settings.compaction.summary.new_instruction
    assert all(r.instruction.startswith(new) for r in chunk_requests)
    assert result.summary_text == f"SUMMARY {len(fake.requests)}"  # the final merge


def test_spec_7_5_chunked_fallback_when_the_summarizer_overflows() -> None:
    plan = plan_for(200_000, 10_000)
    s = session(*_big_session(4, 3_000), user("z", "last"))  # type: ignore[arg-type]
    result = compact(plan, s, FakeSummarizer(overflow_first=True), overflow=None, count=estimate)
    how = next(d for d in result.decisions if d.rule == "summary").result
    assert how["mode"] == "chunked" and how["why"].startswith("summarizer overflow")


def test_other_summarizer_errors_propagate() -> None:
    class Failing:
        def summarize(self, request: SummaryRequest) -> str:
            raise SummarizerError("503", retryable=True)

    s = session(*_big_session(4, 3_000), user("z", "last"))  # type: ignore[arg-type]
    with pytest.raises(SummarizerError):
        compact(plan_for(200_000, 10_000), s, Failing(), overflow=None, count=estimate)


def test_chunks_run_at_most_parallel_at_a_time() -> None:
    class Slow:
        def __init__(self) -> None:
            self.active = 0
            self.peak = 0
            self.lock = threading.Lock()

        def summarize(self, request: SummaryRequest) -> str:
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            time.sleep(0.02)
            with self.lock:
                self.active -= 1
            return "part"

    slow = Slow()
    s = session(*_big_session(16, 4_000), user("z", "last"))  # type: ignore[arg-type]
    compact(plan_for(20_000, 10_000), s, slow, overflow=None, count=estimate)
    assert slow.peak == 3  # compaction.chunking.parallel


def _settings(**kw: object) -> ChunkSettings:
    base = ChunkSettings.from_plan(plan_for(20_000, 10_000))
    return ChunkSettings(**{**{f: getattr(base, f) for f in base.__slots__}, **kw})  # type: ignore[arg-type]


def test_chunk_split_keeps_tool_calls_with_their_results() -> None:
    call = ModelMessage("assistant", (ToolCall("c1", "read", {"path": "a"}),))
    result = ModelMessage("tool", (ToolResult("c1", "read", (Text(chars(600)),)),))
    msgs = [ModelMessage("user", (Text(chars(600)),)), call, result]
    chunks = split(msgs, 1_000, _settings(), estimate)
    assert [len(c) for c in chunks] == [1, 2]


def test_chunk_oversized_unit_is_clipped() -> None:
    call = ModelMessage(
        "assistant", (Text("y" * 40_000), ToolCall("c1", "run", {"cmd": "z" * 5_000}))
    )
    result = ModelMessage("tool", (ToolResult("c1", "run", (Text("o" * 9_000),)),))
    (chunk,) = split([call, result], 1_000, _settings(), estimate)
    said, called = chunk[0].parts
    assert isinstance(said, Text) and said.text.startswith("y" * 16_000)
    assert said.text.endswith("\n[... 24000 chars clipped]")
    assert isinstance(called, ToolCall) and len(called.input["input"]) < 2_100
    out = chunk[1].parts[0]
    assert isinstance(out, ToolResult)
    assert out.content[0].text.endswith("omitted 7000 chars]")  # type: ignore[union-attr]


def test_chunk_reduce_depth_is_bounded() -> None:
    fake = FakeSummarizer(reply="r" * 400)  # every summary is bigger than the budget
    msgs = tuple(ModelMessage("user", (Text(chars(50)),)) for _ in range(5))
    base = SummaryRequest("instr", msgs, 100, None, "tmpl")
    settings = _settings(min_budget=60, budget_ratio=0.0)
    text_, info = summarize_chunked(
        base,
        new_request=base,
        update_instruction="update {previous}",
        summarizer=fake,
        settings=settings,
        model=SmallModel(1_000, 100),
        count=estimate,
    )
    assert info["reduce_depth"] == 3  # compaction.chunking.max_reduce_depth
    assert text_.count("r" * 400) == 5  # the partial summaries are kept, not dropped
