"""Typed settings: compile validates the merged policy into the one pydantic model, every knob
has one default (the model's), and the engine reads typed fields, never a string path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.policy import Lowering, PolicyBody, Prune, Summary, default
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.chunks import ChunkSettings
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.lower import LowerSettings, lower_settings
from kilo_rules.engine.runtime.prune import prune_settings
from kilo_rules.engine.runtime.trace import plan_counter

from .runtime.helpers import assistant, model, session, tool, user

PACKAGE = Path(__file__).resolve().parent.parent / "kilo_rules"


def _policy(tmp_path: Path, body: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text("version: 1\nname: p\n" + body, encoding="utf-8")
    return path


def test_a_policy_that_states_nothing_gets_the_models_defaults(tmp_path: Path) -> None:
    plan = compile_policy(_policy(tmp_path, ""), model())
    s = plan.settings
    assert s == PolicyBody()
    assert s.tokens.preflight_factor == 1.3
    assert s.compaction.tail_turns == 2 and s.compaction.max_attempts == 3
    assert s.prune.placeholder == "[Old tool result content cleared]"
    assert s.overflow.count == ("input", "output", "reasoning", "cache_read", "cache_write")
    assert s.cache.rule == "none" and plan.cache["enabled"] is False
    # one default: the runtime's value types take theirs from the model
    media = plan.model.media_in_tool_results  # what the model says, with no table to ask
    assert LowerSettings(media_in_tool_results=media) == lower_settings(plan)
    assert LowerSettings().placeholder == default(Prune, "placeholder")
    assert LowerSettings().compaction_request == default(Summary, "request_text")
    assert LowerSettings().media_placeholder == default(Lowering, "media_placeholder")


def test_a_bare_policy_builds_a_request(tmp_path: Path) -> None:
    plan = compile_policy(_policy(tmp_path, ""), model())
    msgs = (user("u1", "hi"), assistant("a1", tool("t1", "x" * 100)), user("u2", "next"))
    result = apply_plan(plan, session(*msgs), StepInput())
    assert [m["role"] for m in result.request["messages"]] == ["user", "assistant", "user"]
    assert "system" not in result.request  # no layers: no prose of the engine's own


def test_the_preflight_factor_is_one_setting_for_preflight_and_chunking(tmp_path: Path) -> None:
    bare = compile_policy(_policy(tmp_path, ""), model())
    assert ChunkSettings.from_plan(bare).factor == bare.settings.tokens.preflight_factor == 1.3
    set_ = compile_policy(_policy(tmp_path, "tokens: {preflight_factor: 2}\n", "q.yaml"), model())
    assert ChunkSettings.from_plan(set_).factor == 2.0


def test_a_partial_section_keeps_the_defaults_of_the_rest(tmp_path: Path) -> None:
    body = "prune:\n  reasons: {normal: true}\n  protect_turns: 5\n"
    plan = compile_policy(_policy(tmp_path, body), model())
    p = prune_settings(plan)
    assert (p.normal, p.protect_turns) == (True, 5)
    assert (p.post_compaction, p.payload_limit, p.protect_tokens) == (True, True, 40_000)


def test_model_only_expressions_are_evaluated_into_the_settings() -> None:
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    s = plan.settings
    assert s.budget.usable == plan.usable() == 200_000 - 32_000
    assert s.output.configured == 32_000 and s.output.send is True
    assert s.cache.placement == "message" and s.cache.when is True
    assert s.overflow.threshold_percent is None


def test_a_per_step_expression_is_a_typed_knob(tmp_path: Path) -> None:
    body = 'prune:\n  protect_tokens: "1000 if session.turns > 3 else 2000"\n'
    plan = compile_policy(_policy(tmp_path, body), model())
    knob = plan.knobs.prune_protect_tokens
    assert knob.per_step and knob.at({"session.turns": 4}) == 1000
    # the settings hold no expression text: the knob is at its default there
    assert plan.settings.prune.protect_tokens == default(Prune, "protect_tokens")
    assert prune_settings(plan, {"prune.protect_tokens": 1000}).protect_tokens == 1000
    # without a step's values the model's default stands in
    assert prune_settings(plan).protect_tokens == default(Prune, "protect_tokens")


def test_the_settings_cannot_be_changed() -> None:
    s = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5").settings
    with pytest.raises(ValueError, match="frozen"):
        s.compaction.tail_turns = 9  # type: ignore[misc]
    with pytest.raises(AttributeError):
        s.overflow.count.append("input")  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="immutable"):
        s.lowering.media_in_tool_results["openai"] = True
    with pytest.raises(TypeError, match="immutable"):
        PolicyBody().cache.shapes["openai"] = "explicit"


def test_chars_per_token_sets_the_estimate(tmp_path: Path) -> None:
    plan = compile_policy(_policy(tmp_path, "tokens: {chars_per_token: 2}\n"), model())
    counter, warning = plan_counter(plan)
    assert warning is None and counter.count("x" * 40) == 20
    four = compile_policy(_policy(tmp_path, "", "four.yaml"), model())
    assert plan_counter(four)[0].count("x" * 40) == 10


def test_the_engine_reads_no_setting_by_string_path() -> None:
    lookups = re.compile(r"\.setting\(")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for folder in ("runtime", "providers", "summarizers")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if lookups.search(line)
    ]
    assert found == []


def test_a_bare_policy_compacts(tmp_path: Path) -> None:
    from kilo_rules.engine.runtime.compaction import compact

    from .compaction.helpers import FakeSummarizer

    plan = compile_policy(_policy(tmp_path, ""), model())
    msgs = [user("u1", "first"), assistant("a1", tool("t1", "x" * 400)), user("u2", "next")]
    result = compact(plan, session(*msgs), FakeSummarizer(), overflow=None, count=len)
    select = next(d for d in result.decisions if d.rule == "select")
    assert select.inputs["tail_turns"] == 2 and select.inputs["budget"] == 0
    assert result.mutations  # the summary was written, nothing was lost


def test_a_per_step_payload_limit_is_honoured(tmp_path: Path) -> None:
    body = 'payload:\n  max_bytes: "100 if request.step > 0 else 1_000_000"\n  on_exceed: warn\n'
    plan = compile_policy(_policy(tmp_path, body), model())
    msgs = (user("u1", "hi " * 200),)
    quiet = apply_plan(plan, session(*msgs), StepInput(step=0))
    loud = apply_plan(plan, session(*msgs), StepInput(step=1))
    assert not [d for d in quiet.decisions if d.rule == "payload-limit"]
    assert [d.result for d in loud.decisions if d.rule == "payload-limit"] == ["sent anyway"]
