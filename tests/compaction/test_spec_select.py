"""kilo-default splits head and tail as Kilo's ``select`` does (spec §7.2–§7.4)."""

from __future__ import annotations

import base64
from pathlib import Path

from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.session import FilePart, Message, TextPart
from kilo_rules.engine.runtime.compaction import lower_settings, preserve_budget, select, split_turn
from kilo_rules.engine.runtime.history import turns
from kilo_rules.engine.runtime.lower import lower
from kilo_rules.engine.runtime.measure import messages_json
from kilo_rules.engine.text.tokens import estimate

from .helpers import assistant, chars, derived, plan_for, text, user


def test_spec_7_2_preserve_budget_threads_output_token_max() -> None:
    # compaction.test.ts@32389fd: context 20k, output 10k, outputTokenMax 2k → usable 18 000
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    assert plan.value("budget.usable") == 18_000
    assert preserve_budget(plan) == 4_500


def test_spec_7_2_preserve_budget_is_clamped_between_2000_and_8000() -> None:
    assert preserve_budget(plan_for(200_000, 64_000)) == 8_000  # usable 168 000 → 42 000
    assert preserve_budget(plan_for(8_000, 1_000)) == 2_000  # usable 7 000 → 1 750


def test_spec_7_2_explicit_preserve_recent_tokens_bypasses_the_clamp(tmp_path: Path) -> None:
    plan = derived(tmp_path, "compaction:\n  preserve_recent_tokens: 12_000\n")
    assert preserve_budget(plan) == 12_000


def _three_turns(size: int) -> list[Message]:
    return [
        user("u1", "first"),
        assistant("a1", text("a1t", chars(size))),
        user("u2", "second"),
        assistant("a2", text("a2t", chars(size))),
        user("u3", "third"),
        assistant("a3", text("a3t", "short")),
    ]


def test_spec_7_4_tail_is_the_last_turns_that_fit_newest_first() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)  # budget 4 500
    sel = select(_three_turns(2_000), plan, estimate)
    assert sel.tail_start_id == "u2"  # u3's turn and u2's turn fit; tail_turns = 2
    assert [m.id for m in sel.head] == ["u1", "a1"]


def test_spec_7_4_only_tail_turns_turns_are_considered() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    sel = select(_three_turns(10), plan, estimate)
    # all three turns would fit the budget, but only the newest 2 are candidates
    assert sel.tail_start_id == "u2"


def test_spec_7_4_split_turn_keeps_the_first_suffix_that_fits() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)  # budget 4 500
    msgs = [
        user("u1", "old"),
        assistant("a0", text("a0t", "done")),
        user("u2", "do it"),
        assistant("a1", text("a1t", chars(3_000))),
        assistant("a2", text("a2t", chars(2_000))),
        assistant("a3", text("a3t", chars(2_000))),
        assistant("a4", text("a4t", chars(100))),
    ]
    sel = select(msgs, plan, estimate)
    # u2's turn (~7 100 tokens) does not fit. Its suffixes, skipping u2 itself: from a1
    # (~7 100) no, from a2 (~4 100 + JSON) yes — the first fitting suffix wins, so the tail
    # starts at an assistant message and a3/a4 are not preferred although smaller.
    assert sel.tail_start_id == "a2"
    assert [m.id for m in sel.head] == ["u1", "a0", "u2", "a1"]
    assert _suffix(msgs, 4, plan) <= 4_500 < _suffix(msgs, 3, plan)


def _suffix(msgs: list[Message], start: int, plan: Plan) -> int:
    return estimate(messages_json(lower(msgs[start:], lower_settings(plan))))


def test_spec_7_4_split_turn_never_keeps_only_part_of_a_one_message_turn() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    msgs = [user("u1", "old"), assistant("a0", text("x", "ok")), user("u2", chars(6_000))]
    t = turns(msgs)[-1]
    assert split_turn(msgs, t, 4_500, lower_settings(plan), estimate) is None
    assert split_turn(msgs, turns(msgs)[0], 0, lower_settings(plan), estimate) is None
    assert select(msgs, plan, estimate).tail_start_id is None


def test_spec_7_4_no_tail_at_index_0() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    msgs = [user("u1", "a"), assistant("a1", text("t1", "b")), user("u2", "c")]
    sel = select(msgs, plan, estimate)
    # both turns fit, so keep starts at index 0: Kilo summarises everything, no tail
    assert sel.tail_start_id is None
    assert [m.id for m in sel.head] == ["u1", "a1", "u2"]


def test_spec_7_4_tail_turns_zero_means_no_tail(tmp_path: Path) -> None:
    plan = derived(tmp_path, "compaction:\n  tail_turns: 0\n")
    sel = select(_three_turns(10), plan, estimate)
    assert sel.tail_start_id is None and len(sel.head) == 6


def test_spec_7_4_older_turns_are_not_considered_once_one_does_not_fit() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    msgs = [
        user("u1", "small"),
        assistant("a1", text("t1", "ok")),
        user("u2", chars(6_000)),  # a one-message turn bigger than the budget
    ]
    assert select(msgs, plan, estimate).tail_start_id is None


def test_spec_7_4_turn_size_counts_inline_media_at_full_size() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    png = "data:image/png;base64," + base64.b64encode(b"\0" * 30_000).decode()
    image = Message(
        id="u2",
        role="user",
        parts=[TextPart(id="u2t", text="look"), FilePart(id="f", mime="image/png", url=png)],
    )
    msgs = [user("u1", "a"), assistant("a1", text("t1", "b")), image]
    # 40 000 base64 chars ≈ 10 000 tokens: the newest turn does not fit, nothing is kept
    assert select(msgs, plan, estimate).tail_start_id is None
