"""A compiled Plan holds its settings in one typed form: no expression text where the policy
model says a number or a switch, a per-step knob compiled into a typed setting, the cache
decision typed, and no mutable state in the frozen plan."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base.frozen import FrozenDict
from kilo_rules.engine.compiler.compile import Compiler, compile_policy
from kilo_rules.engine.compiler.knobs import KNOBS, Setting
from kilo_rules.engine.compiler.plan import CachePlan, CacheSettings, Plan
from kilo_rules.engine.formats.policy import PolicyBody, expression_fields
from kilo_rules.engine.frontend.resolve import bundled_policy_names
from kilo_rules.engine.runtime.apply import run
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.trace import cached_plans, plan_caches

from .runtime.helpers import assistant, model, session, text, user

MODELS = (
    "anthropic/claude-sonnet-4-5",
    "openai/gpt-5",
    "google/gemini-2.5-pro",
    "amazon-bedrock/amazon.nova-pro",
    "openrouter/qwen/qwen3-coder",
)

#: Knob kind → the types a value of it may have (bool is an int in Python: kept apart).
TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "number": (int, float),
    "number?": (int, float),
    "bool": (bool,),
}

PER_STEP = """\
version: 1
name: per-step
extends: kilo-default
output:
  send: "session.turns < 100"
overflow:
  preflight:
    enabled: "session.turns > 1"
  limit: "budget.usable - 1000 * session.turns"
payload:
  max_bytes: "1000000 + request.media"
prune:
  protect_tokens: "1000 if session.turns > 3 else 2000"
  minimum_tokens: "10000 + session.compactions"
compaction:
  preserve_recent_tokens: "4000 if session.has_summary else 8000"
"""


def _typed(kind: str, value: Any) -> bool:
    if value is None:  # a knob the policy leaves out (and the model has no default for)
        return True
    if kind != "bool" and isinstance(value, bool):
        return False
    return isinstance(value, TYPES[kind])


def _no_text_in_settings(plan: Plan) -> None:
    """No expression field of the settings holds text where it takes a number or a switch,
    except the conditions the plan already holds compiled: system layers (``plan.layers``)
    and the prompt rules (decided, ``plan.prompt``)."""
    data = plan.settings.model_dump(mode="python")
    for path, kind in expression_fields(data):
        if kind == "str":  # a text knob (cache.placement): its value is text
            continue
        assert path[:2] in (("system", "layers"), ("prompts", "rules")), (plan.policy, path)


@pytest.mark.parametrize("policy", bundled_policy_names())
def test_no_setting_of_a_bundled_plan_is_expression_text(policy: str) -> None:
    for m in MODELS:
        plan = compile_policy(policy, m)
        _no_text_in_settings(plan)
        for attr, setting in plan.knobs.settings().items():
            kind = KNOBS[attr][1] if attr in KNOBS else "int"
            assert _typed(kind, setting.value), (policy, m, setting)
            assert not isinstance(setting.value, str)
        # and the knobs are the values the plan prints
        for attr, (name, _) in KNOBS.items():
            if name in plan.values and not plan.values[name].dynamic:
                assert getattr(plan.knobs, attr).value == plan.values[name].value, name


def test_a_per_step_knob_is_compiled_and_evaluates_to_its_type(tmp_path: Path) -> None:
    path = tmp_path / "per-step.yaml"
    path.write_text(PER_STEP)
    plan = compile_policy(path, model())
    _no_text_in_settings(plan)
    knobs = plan.knobs
    per_step = {attr for attr, s in knobs.settings().items() if s.per_step}
    assert per_step == {
        "output_send",
        "preflight_enabled",
        "overflow_limit",
        "payload_max_bytes",
        "prune_protect_tokens",
        "prune_minimum_tokens",
        "preserve_recent_tokens",
        "compaction_limit",
    }
    # the settings keep the policy model's default where the knob is per step
    assert plan.settings.prune.protect_tokens == PolicyBody().prune.protect_tokens
    assert plan.settings.payload.max_bytes is None
    s = session(user("u1", "hi"), assistant("a1", text("a1-t", "hello")), user("u2", "more"))
    ctx = run(plan, s, StepInput(), until="guards").context
    for attr, setting in knobs.settings().items():
        kind = KNOBS[attr][1] if attr in KNOBS else "int"
        got = setting.at(ctx)
        assert _typed(kind, got) and (got is not None or attr not in per_step), (attr, got)
    assert knobs.prune_protect_tokens.at(ctx) == 2000
    assert knobs.payload_max_bytes.at(ctx) == 1_000_000
    assert knobs.output_send.at(ctx) is True
    usable = knobs.budget_usable.value
    assert usable is not None and knobs.compaction_limit.at(ctx) == usable - 1000 * 2


def test_a_setting_converts_what_its_expression_gives(tmp_path: Path) -> None:
    path = tmp_path / "per-step.yaml"
    path.write_text(PER_STEP)
    knob = compile_policy(path, model()).knobs.prune_minimum_tokens
    assert knob.at({"prune.minimum_tokens": 12.0}) == 12
    assert type(knob.at({"prune.minimum_tokens": 12.0})) is int
    # a null result, or no step at all, stands at the policy model's default
    assert knob.at({"prune.minimum_tokens": None}) == knob.value == 20_000
    fixed: Setting[int] = Setting("prune.minimum_tokens", 5)
    assert fixed.at({"prune.minimum_tokens": 7}) == 5 and not fixed.per_step


def test_the_cache_decision_is_typed() -> None:
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    assert isinstance(plan.caching, CachePlan) and isinstance(plan.caching.marks, CacheSettings)
    assert plan.cache_settings() is plan.caching.marks
    assert plan.cache_settings(automatic_enabled=True).automatic_enabled is True
    assert plan.caching.marks.automatic_enabled is False
    # the dict form is still there, read-only, for callers that read it by key
    assert plan.cache == plan.caching.to_json() == plan.to_json()["cache"]
    assert plan.cache["provider_limit"] == plan.caching.provider_limit
    with pytest.raises(TypeError):
        plan.cache["budget"] = 1


def _mutable(value: Any) -> bool:
    if isinstance(value, FrozenDict):
        return any(_mutable(v) for v in value.values())
    if isinstance(value, tuple):
        return any(_mutable(v) for v in value)
    return isinstance(value, dict | list | set | bytearray)


def test_a_plan_has_no_mutable_field() -> None:
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    names = [f.name for f in dataclasses.fields(plan)]
    assert "memo" not in names
    for name in names:
        assert not _mutable(getattr(plan, name)), name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(plan, name, None)
    knob = plan.knobs.budget_usable
    with pytest.raises(dataclasses.FrozenInstanceError):
        knob.value = 1  # type: ignore[misc]


def test_the_runtime_keeps_a_plans_caches_only_while_the_plan_lives() -> None:
    compiler = Compiler()
    plan = compiler.compile("kilo-default", "anthropic/claude-sonnet-4-5")
    other = Compiler().compile("kilo-default", "anthropic/claude-sonnet-4-5")
    assert plan is not other
    caches = plan_caches(plan)
    assert plan_caches(plan) is caches  # one store per plan, reused by every step
    assert plan_caches(other) is not caches  # two plans of one policy, two stores
    before = cached_plans()
    ref = weakref.ref(plan)
    del plan, other
    compiler.clear()
    gc.collect()
    assert ref() is None
    assert cached_plans() == before - 2


def test_the_evaluation_context_is_derived_from_the_values(tmp_path: Path) -> None:
    path = tmp_path / "per-step.yaml"
    path.write_text(PER_STEP)
    plan = compile_policy(path, model())
    names = [f.name for f in dataclasses.fields(plan) if f.init]
    assert "static_context" not in names and "dynamic" not in names  # one source: values
    per_step = [v.name for v in plan.values.values() if v.dynamic]
    assert [name for name, _ in plan.dynamic] == per_step
    assert "prune.protect_tokens" in per_step
    for v in plan.values.values():
        assert (v.name in plan.static_context) is (not v.dynamic)
        if not v.dynamic:
            assert plan.static_context[v.name] == v.value
    assert plan.static_context["model.limits.context"] == plan.model.limits.context
    step = {"session.turns": 5, "session.compactions": 0, "session.has_summary": False}
    ctx = plan.context({**step, "request.media": 0})
    assert ctx["prune.protect_tokens"] == 1000 == plan.value("prune.protect_tokens", ctx)
