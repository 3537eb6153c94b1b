"""``config.compaction.prune`` gates pruning as Kilo's ``prune({reason})`` does (spec §6, §12).

Kilo (``compaction.ts@02bc3f2:326-327``): ``cfg.compaction.prune === false`` returns for every
reason; reason ``normal`` also returns unless ``cfg.compaction.prune === true``; reasons
``post-compaction`` and ``payload-limit`` prune by default. kilo-default states the normal
gate as ``config.compaction.prune == true``; the engine closes every gate on ``false``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilo_rules import Runtime, apply_mutations, compile_policy, prune_session
from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.base.settings import Settings
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.session import Session, ToolPart
from kilo_rules.engine.runtime.prune import REASONS

from .helpers import assistant, model, session, tool, user

NOW = 1_700_000_000_000
LATER = NOW + 60_000


def _chars(tokens: int) -> str:
    return "x" * (4 * tokens)  # the estimate counts 4 characters a token


def _history() -> Session:
    """Kilo's inputs: an old turn with seven 10 000-token reads, then the previous turn and
    the current one (never pruned: the walk skips them while fewer than 2 user messages
    were seen), each with a 30 000-token read."""
    old = [tool(f"t{k}", _chars(10_000)) for k in range(7)]
    return session(
        user("u1", "old", created=NOW),
        assistant("a1", *old, created=NOW),
        user("u2", "previous", created=NOW),
        assistant("a2", tool("p1", _chars(30_000)), created=NOW),
        user("u3", "current", created=LATER),
        assistant("a3", tool("c1", _chars(30_000)), created=LATER),
    )


# Walking a1's parts newest first: t6..t3 fill the 40 000-token protect window, t2, t1, t0
# would free 30 000 > 20 000, so all three are marked, at the newest message's time.
MARKED = ("t2", "t1", "t0")


def _marks(reason: str) -> list[dict[str, Any]]:
    return [
        {"op": "mark_compacted", "part_id": pid, "time": LATER, "reason": reason} for pid in MARKED
    ]


def _plan(**config: Any) -> Plan:
    return compile_policy("kilo-default", model(), config=config or None)


def _derived(tmp_path: Path, body: str, **config: Any) -> Plan:
    path = tmp_path / "derived.yaml"
    path.write_text(f"version: 1\nname: derived\nextends: kilo-default\n{body}", encoding="utf-8")
    return compile_policy(path, model(), config=config or None)


def test_spec_6_config_prune_true_enables_normal_prune() -> None:
    plan = _plan(**{"compaction.prune": True})
    result = prune_session(plan, _history(), reason="normal")
    assert result.allowed
    assert result.parts == MARKED
    assert (result.pruned_tokens, result.protected_tokens) == (30_000, 40_000)
    assert result.time == LATER
    assert result.mutations() == _marks("normal")


def test_spec_6_config_prune_true_keeps_the_other_reasons_on() -> None:
    plan = _plan(**{"compaction.prune": True})
    for reason in ("post-compaction", "payload-limit"):
        assert prune_session(plan, _history(), reason=reason).mutations() == _marks(reason)


def test_spec_6_config_prune_false_disables_every_reason() -> None:
    plan = _plan(**{"compaction.prune": False})
    for reason in REASONS:
        result = prune_session(plan, _history(), reason=reason)
        assert (result.allowed, result.parts, result.mutations()) == (False, (), [])


def test_spec_6_config_prune_unset_normal_off_post_compaction_and_payload_limit_on() -> None:
    plan = _plan()
    normal = prune_session(plan, _history(), reason="normal")
    assert (normal.allowed, normal.parts, normal.mutations()) == (False, (), [])
    for reason in ("post-compaction", "payload-limit"):
        result = prune_session(plan, _history(), reason=reason)
        assert result.allowed and result.mutations() == _marks(reason)


def test_spec_6_kilo_default_states_the_gates_on_the_config() -> None:
    enabled, normal = (_plan().values[f"prune.{n}"] for n in ("enabled", "reasons.normal"))
    assert enabled.expression == "config.compaction.prune != false"  # :326
    assert normal.expression == "config.compaction.prune == true"  # :327
    # what `kilo-rules plan` shows per config: (enabled, normal)
    for config, want in ((None, (True, False)), (True, (True, True)), (False, (False, False))):
        plan = _plan(**{"compaction.prune": config}) if config is not None else _plan()
        assert (plan.settings.prune.enabled, plan.settings.prune.reasons.normal) == want


def test_spec_12_kilo_disable_prune_forces_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILO_DISABLE_PRUNE", "1")
    config = Settings().config()
    assert config["config.compaction.prune"] is False
    plan = compile_policy("kilo-default", model(), config=config)
    assert not any(prune_session(plan, _history(), reason=r).allowed for r in REASONS)


def test_spec_6_config_false_wins_over_a_policy_that_prunes_every_step(tmp_path: Path) -> None:
    body = "prune:\n  reasons:\n    normal: true\n"
    assert prune_session(_derived(tmp_path, body), _history()).parts == MARKED
    off = _derived(tmp_path, body, **{"compaction.prune": False})
    assert not prune_session(off, _history()).allowed


def test_spec_6_a_reason_may_be_a_condition_on_the_model(tmp_path: Path) -> None:
    body = "prune:\n  reasons:\n    payload_limit: model.limits.context > 500_000\n"
    plan = _derived(tmp_path, body)  # a 200 000-token window
    assert plan.settings.prune.reasons.payload_limit is False
    assert not prune_session(plan, _history(), reason="payload-limit").allowed
    assert prune_session(plan, _history(), reason="post-compaction").parts == MARKED


def test_spec_6_a_reason_that_reads_the_session_is_refused_at_compile(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as err:
        _derived(tmp_path, 'prune:\n  reasons:\n    normal: "session.turns > 3"\n')
    diag = err.value.diagnostics[0]
    assert diag.code == "plan.value"
    assert "decided once per model" in diag.message
    assert (diag.location.line, diag.location.col) == (6, 13)


def test_spec_6_prune_session_changes_nothing_and_its_mutations_apply() -> None:
    before = _history()
    result = prune_session(_plan(**{"compaction.prune": True}), before, now=5)
    assert before == _history()
    after = apply_mutations(before, result.mutations())
    compacted = {
        p.id: p.time.compacted
        for m in after.messages
        for p in m.parts
        if isinstance(p, ToolPart) and p.time.compacted is not None
    }
    assert compacted == dict.fromkeys(MARKED, 5)


def test_spec_6_prune_session_rejects_an_unknown_reason() -> None:
    with pytest.raises(ValueError, match="reason must be one of"):
        prune_session(_plan(), _history(), reason="sometimes")  # type: ignore[arg-type]


def test_spec_8_runtime_step_prunes_normally_only_when_the_config_says_true() -> None:
    on = Runtime(_plan(**{"compaction.prune": True})).step(_history())
    assert [m for m in on.mutations if m["op"] == "mark_compacted"] == _marks("normal")
    decision = next(d for d in on.decisions if d.rule == "prune.normal")
    assert decision.result == {"parts": 3, "tokens": 30_000}
    off = Runtime(_plan()).step(_history())
    assert not [m for m in off.mutations if m["op"] == "mark_compacted"]
    assert not [d for d in off.decisions if d.rule == "prune.normal"]
