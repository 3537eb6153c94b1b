"""The runtime is a table of named stages that the plan's stage list drives; ``until=``
stops after one of them, so a test can pin what that stage produced."""

from __future__ import annotations

import pytest

from kilo_rules.engine.compiler.compile import RUNTIME_STAGES, compile_policy
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.runtime.apply import STAGES, apply_plan, run
from kilo_rules.engine.runtime.context import StepInput

from .helpers import assistant, model, session, text, tool, user

PLAN = compile_policy("kilo-default", model())


def _session() -> Session:
    return session(
        user("u1", "fix the test"),
        assistant("a1", text("a1t", "reading"), tool("t1", "def test(): ...")),
        user("u2", "go on"),
    )


def test_the_plan_names_every_stage_the_runtime_has_in_order() -> None:
    assert PLAN.stages == RUNTIME_STAGES
    assert tuple(STAGES) == RUNTIME_STAGES


def test_until_stops_after_a_stage_and_keeps_what_it_made() -> None:
    lowered = run(PLAN, _session(), StepInput(), until="lower")
    assert [m.role for m in lowered.lowered] == ["user", "assistant", "tool", "user"]
    assert lowered.size > 0 and lowered.request is None and not lowered.system
    assert [d.stage for d in lowered.run.decisions][-1] in ("history", "inject")
    system = run(PLAN, _session(), StepInput(), until="system")
    assert system.system and system.cap is None
    output = run(PLAN, _session(), StepInput(), until="output")
    assert output.cap is not None and output.run.decisions[-1].rule == f"cap.{output.cap.rule}"
    assert output.input_tokens > 0 and output.request is None
    done = run(PLAN, _session(), StepInput())
    assert done.body == apply_plan(PLAN, _session(), StepInput()).request


def test_an_unknown_stage_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown stage 'lowering'; stages: history, inject"):
        run(PLAN, _session(), StepInput(), until="lowering")
