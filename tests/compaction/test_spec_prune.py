"""kilo-default prunes old tool outputs as Kilo's ``prune`` does (spec §6)."""

from __future__ import annotations

from pathlib import Path

from kilo_rules.engine.formats.session import Message, ToolPart, ToolTime
from kilo_rules.engine.runtime.prune import prune, prune_settings
from kilo_rules.engine.text.tokens import estimate

from .helpers import assistant, chars, derived, plan_for, text, tool, user

SETTINGS = prune_settings(plan_for(200_000, 32_000))


def _history(outputs: int, *, name: str = "read", size: int = 10_000) -> list[Message]:
    """One old turn with ``outputs`` tool results of ``size`` tokens, then two newer turns."""
    parts = [tool(f"t{k}", chars(size), name=name) for k in range(outputs)]
    return [
        user("u1", "old"),
        assistant("a1", *parts),
        user("u2", "previous"),
        assistant("a2", tool("p1", chars(30_000))),
        user("u3", "current"),
        assistant("a3", tool("c1", chars(30_000))),
    ]


def test_spec_6_prune_constants_come_from_the_policy() -> None:
    assert (SETTINGS.protect_tokens, SETTINGS.minimum_tokens) == (40_000, 20_000)
    assert (SETTINGS.protect_turns, SETTINGS.protected_tools) == (2, ("skill",))


def test_spec_6_prune_all_or_nothing_minimum_is_strict() -> None:
    # 6 × 10 000: the newest 40 000 are protected, 20 000 would be freed — not > 20 000
    result = prune(_history(6), SETTINGS, estimate, "post-compaction")
    assert result.parts == ()
    # 7 × 10 000: 30 000 would be freed → all three oldest parts are marked
    result = prune(_history(7), SETTINGS, estimate, "post-compaction")
    assert result.parts == ("t2", "t1", "t0") and result.pruned_tokens == 30_000


def test_spec_6_prune_protect_window_keeps_the_newest_40000_tokens() -> None:
    result = prune(_history(8), SETTINGS, estimate, "post-compaction")
    assert set(result.parts) == {"t0", "t1", "t2", "t3"}  # t4..t7 = 40 000 protected
    assert result.protected_tokens == 40_000


def test_spec_6_prune_skips_the_current_and_previous_turn() -> None:
    result = prune(_history(8), SETTINGS, estimate, "post-compaction")
    assert "p1" not in result.parts and "c1" not in result.parts


def test_spec_6_prune_skips_protected_tools() -> None:
    msgs = _history(8, name="skill")
    assert prune(msgs, SETTINGS, estimate, "post-compaction").parts == ()


def test_spec_6_prune_counts_only_completed_tool_output() -> None:
    msgs = _history(7)
    running = ToolPart(id="r", call_id="cr", tool="bash", status="running", output=chars(50_000))
    msgs[1] = msgs[1].model_copy(
        update={"parts": [text("big", chars(50_000)), running, *msgs[1].parts]}
    )
    result = prune(msgs, SETTINGS, estimate, "post-compaction")
    assert result.pruned_tokens == 30_000 and "r" not in result.parts


def test_spec_6_prune_stops_at_a_summary() -> None:
    msgs = _history(8)
    summary = assistant("s", text("st", "SUMMARY"), summary=True, parent_id="u1")
    msgs.insert(2, summary)  # between the old turn and the protected ones
    assert prune(msgs, SETTINGS, estimate, "post-compaction").parts == ()


def test_spec_6_prune_stops_at_an_already_compacted_part() -> None:
    msgs = _history(8)
    done = tool("t8", chars(10_000), time=ToolTime(compacted=1))
    msgs[1] = msgs[1].model_copy(update={"parts": [*msgs[1].parts[:4], done, *msgs[1].parts[4:]]})
    result = prune(msgs, SETTINGS, estimate, "post-compaction")
    # walking newest → oldest: t7..t4 are protected (40 000), then t8 stops the walk
    assert result.parts == () and result.stopped_at == "already compacted t8"


def test_spec_6_prune_gates_per_reason(tmp_path: Path) -> None:
    msgs = _history(8)
    assert prune(msgs, SETTINGS, estimate, "normal").allowed is False  # opt-in
    assert prune(msgs, SETTINGS, estimate, "post-compaction").applied
    assert prune(msgs, SETTINGS, estimate, "payload-limit").applied
    on = prune_settings(derived(tmp_path, "prune:\n  reasons:\n    normal: true\n"))
    assert prune(msgs, on, estimate, "normal").applied
    off = prune_settings(derived(tmp_path, "prune:\n  enabled: false\n"))
    assert not any(
        prune(msgs, off, estimate, r).allowed
        for r in ("normal", "post-compaction", "payload-limit")
    )


def test_spec_6_prune_protect_turns_is_a_policy_knob(tmp_path: Path) -> None:
    # Kilo hard-codes "the last 2 turns" (seed §11); here it is prune.protect_turns.
    one = prune_settings(derived(tmp_path, "prune:\n  protect_turns: 1\n"))
    result = prune(_history(8), one, estimate, "post-compaction")
    # the previous turn is no longer skipped: p1 (30 000) now fills most of the window
    assert result.parts == ("t6", "t5", "t4", "t3", "t2", "t1", "t0")
    assert "c1" not in result.parts
