"""The runtime facade (spec §3 trigger, §8 loop order and attempt cap) and mutations."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import ContextOverflowError
from kilo_rules.engine.formats.session import Session, TokenUsage
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.history import project
from kilo_rules.engine.runtime.mutations import MutationError, apply_mutations, missing, restore

from .helpers import (
    FakeSummarizer,
    assistant,
    chars,
    derived,
    plan_for,
    session,
    text,
    three_turns,
    tool,
    user,
)

PLAN = plan_for(20_000, 10_000, output_token_max=2_000)  # usable = limit = 18 000


def test_spec_3_runtime_compacts_when_the_count_reaches_the_limit() -> None:
    runtime = Runtime(PLAN, FakeSummarizer())
    below = runtime.step(three_turns(17_999))
    assert below.compactions == 0 and below.compaction_needed is None
    at = runtime.step(three_turns(18_000))  # count >= limit
    assert at.compactions == 1
    first = at.request["messages"][0]["content"][0]["text"]
    assert first == "What did we do so far?"
    assert at.request["messages"][1]["content"][0]["text"] == "SUMMARY 1"


def test_spec_7_5_usage_compaction_is_not_rechecked_against_the_tail() -> None:
    # After the compaction the newest finished assistant is the summary, so Kilo does not
    # check the (pre-compaction) usage of the tail's assistant again.
    result = Runtime(PLAN, FakeSummarizer()).step(three_turns(18_000))
    assert result.compactions == 1
    again = apply_plan(PLAN, result.session)
    assert again.compaction_needed is None
    assert not any(d.rule == "overflow" for d in again.decisions)


def test_step_result_session_is_the_session_with_the_mutations() -> None:
    s = three_turns(18_000)
    result = Runtime(PLAN, FakeSummarizer()).step(s)
    assert result.session == apply_mutations(s, result.mutations)
    assert missing(s, result.session) == []


def test_spec_8_max_compaction_attempts() -> None:
    # Kilo's test: 4 overflow errors and 3 summaries, then "Compaction exhausted".
    runtime = Runtime(PLAN, FakeSummarizer())
    s = three_turns(100)
    for attempt in range(3):
        runtime.overflowed(s)
        result = runtime.step(s)
        assert result.compactions == 1
        s = result.session
        assert runtime.attempts(s) == attempt + 1
    runtime.overflowed(s)
    with pytest.raises(ContextOverflowError) as err:
        runtime.step(s)
    diag = err.value.diagnostic
    assert diag.message.startswith("Compaction exhausted: ")
    assert diag.location == PLAN.locate("compaction.max_attempts")


def test_spec_8_attempts_are_counted_per_user_turn() -> None:
    runtime = Runtime(PLAN, FakeSummarizer())
    s = three_turns(100)
    for _ in range(3):
        runtime.overflowed(s)
        s = runtime.step(s).session
    s = s.model_copy(update={"messages": [*s.messages, user("u9", "a new request")]})
    assert runtime.attempts(s) == 0
    runtime.overflowed(s)
    assert runtime.step(s).compactions == 1


def test_provider_overflow_compacts_in_overflow_mode_and_replays() -> None:
    runtime = Runtime(PLAN, FakeSummarizer())
    s = three_turns(100)
    runtime.overflowed(s)
    result = runtime.step(s)
    added = [m["message"] for m in result.mutations if m["op"] == "add_message"]
    assert added[0]["parts"][0]["overflow"] is True
    assert added[-1]["metadata"]["compaction_replay_of"] == "u3"


def test_runtime_runs_normal_prune_when_the_policy_enables_it(tmp_path: Path) -> None:
    plan = derived(tmp_path, "prune:\n  reasons:\n    normal: true\n", context=400_000)
    outputs = [tool(f"t{k}", chars(10_000)) for k in range(8)]
    s = session(user("u1", "old"), assistant("a1", *outputs), user("u2", "b"), user("u3", "c"))
    result = Runtime(plan, FakeSummarizer()).step(s)
    marks = [m for m in result.mutations if m["op"] == "mark_compacted"]
    assert {m["part_id"] for m in marks} == {"t0", "t1", "t2", "t3"}
    assert all(m["reason"] == "normal" for m in marks)
    assert "[Old tool result content cleared]" in result.body()
    nothing = Runtime(PLAN, FakeSummarizer()).step(s)  # kilo-default: normal prune is opt-in
    assert not [m for m in nothing.mutations if m["op"] == "mark_compacted"]


def test_apply_mutations_rejects_unknown_ops_and_missing_targets() -> None:
    s = three_turns(100)
    with pytest.raises(MutationError) as err:
        apply_mutations(s, [{"op": "delete_message", "message_id": "u1"}])
    assert err.value.diagnostic.code == "mutation.op"
    with pytest.raises(MutationError) as err:
        apply_mutations(s, [{"op": "mark_compacted", "part_id": "nope", "time": 1}])
    assert err.value.diagnostic.code == "mutation.target"


def test_apply_mutations_is_idempotent_and_restore_recovers_the_original() -> None:
    s = three_turns(18_000)
    result = Runtime(PLAN, FakeSummarizer()).step(s)
    twice = apply_mutations(result.session, result.mutations)
    assert twice == result.session
    back = restore(result.session)
    assert [m.id for m in back.messages] == [m.id for m in s.messages]
    assert missing(s, back) == []


def test_missing_reports_a_changed_or_dropped_message() -> None:
    s = three_turns(100)
    changed = s.model_copy(update={"messages": [user("u1", "edited"), *s.messages[1:5]]})
    assert missing(s, changed) == ["message u1 changed", "message a3"]


def test_view_after_step_has_the_summary_first() -> None:
    result = Runtime(PLAN, FakeSummarizer()).step(three_turns(18_000))
    view = project(result.session.messages)
    assert view[1].summary and view[0].metadata["kilo_rules"] == "compaction-request"


def _grown_by_a_tool(output_tokens: int) -> Session:
    """A tool loop whose last result is big: the previous step's usage was small, so
    neither the usage count nor (mid tool loop) the preflight estimate asks to compact."""
    return session(
        user("u1", "first"),
        assistant("a1", text("a1t", chars(3_000))),
        user("u2", "second"),
        assistant(
            "a2",
            text("a2t", "reading"),
            tool("t1", chars(output_tokens)),
            tokens=TokenUsage(input=8_000, output=100),
        ),
    )


def test_a_request_that_cannot_fit_is_compacted_before_it_is_sent() -> None:
    runtime = Runtime(PLAN, FakeSummarizer())
    fits = runtime.step(_grown_by_a_tool(4_000))
    assert fits.compactions == 0 and fits.fits
    assert not any(d.rule == "window" for d in fits.decisions)
    first = apply_plan(PLAN, _grown_by_a_tool(16_000))
    assert first.compaction_needed == "window" and not first.fits
    window = next(d for d in first.decisions if d.rule == "window")
    assert window.result == "compact" and window.severity == "warning"
    assert window.inputs["input"] + window.inputs["output"] > window.inputs["context"] == 20_000
    assert window.at == PLAN.locate("overflow.unfit")
    step = runtime.step(_grown_by_a_tool(16_000))
    assert step.compactions == 1 and step.fits
    # The compaction is the one a provider's refusal would cause: overflow mode.
    part = next(p for m in step.session.messages for p in m.parts if p.type == "compaction")
    assert part.overflow is True


def test_overflow_unfit_send_leaves_it_to_the_provider(tmp_path: Path) -> None:
    plan = derived(tmp_path, "overflow: {unfit: send}")
    result = apply_plan(plan, _grown_by_a_tool(16_000))
    assert result.compaction_needed is None and not result.fits
    assert next(d for d in result.decisions if d.rule == "window").result == "send"
    assert Runtime(plan, FakeSummarizer()).step(_grown_by_a_tool(16_000)).compactions == 0
