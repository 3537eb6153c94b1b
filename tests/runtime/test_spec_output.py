"""kilo-default reproduces Kilo's output maximum (§2), usable window (§3) and output cap (§5)."""

from __future__ import annotations

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.policy import OutputCap
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.output import cap_output, max_output_tokens

from .helpers import assistant, model, session, text, user


def test_spec_2_max_output_tokens_takes_the_smaller_or_max_when_zero() -> None:
    assert max_output_tokens(64_000, 32_000) == 32_000
    assert max_output_tokens(8_192, 32_000) == 8_192
    assert max_output_tokens(0, 32_000) == 32_000
    assert (
        compile_policy("kilo-default", model(limits={"context": 100_000, "output": 0})).value(
            "output.configured"
        )
        == 32_000
    )
    assert (
        compile_policy("kilo-default", model(limits={"context": 100_000, "output": 8192})).value(
            "output.configured"
        )
        == 8192
    )


def test_spec_2_output_token_max_flag_overrides_the_maximum() -> None:
    plan = compile_policy("kilo-default", model(), config={"output_token_max": 8000})
    assert plan.value("output.max_tokens") == 8000
    assert plan.value("output.configured") == 8000


def test_spec_2_openai_compatible_gpt5_sends_no_cap() -> None:
    m = model(
        provider="openrouter", api="openai-compatible", api_id="openai/GPT-5-mini", family="gpt"
    )
    plan = compile_policy("kilo-default", m)
    assert plan.value("output.send") is False
    result = apply_plan(plan, session(user("u1", "hi")))
    assert "max_tokens" not in result.request and "max_completion_tokens" not in result.request
    other = compile_policy(
        "kilo-default",
        model(
            provider="openrouter", api="openai-compatible", api_id="qwen/qwen3-coder", family="qwen"
        ),
    )
    assert other.value("output.send") is True


@pytest.mark.parametrize(
    ("output_max", "usable"),
    [(8_000, 192_000), (64_000, 136_000)],  # session-overflow.test.ts@1716922
)
def test_spec_3_usable_without_input_limit_is_context_minus_output(
    output_max: int, usable: int
) -> None:
    m = model(limits={"context": 200_000, "output": 100_000})
    plan = compile_policy("kilo-default", m, config={"output_token_max": output_max})
    assert plan.value("budget.usable") == usable


def test_spec_3_usable_with_input_limit_subtracts_reserved() -> None:
    m = model(limits={"context": 400_000, "input": 272_000, "output": 128_000})
    plan = compile_policy("kilo-default", m)
    assert plan.value("budget.reserved") == 20_000
    assert plan.value("budget.usable") == 252_000
    small = compile_policy("kilo-default", m, config={"output_token_max": 8_000})
    assert small.value("budget.usable") == 264_000


def test_spec_3_zero_context_gives_zero_usable() -> None:
    plan = compile_policy("kilo-default", model(limits={"context": 0, "output": 0}))
    assert plan.value("budget.usable") == 0


CAP = OutputCap()


@pytest.mark.parametrize(
    ("configured", "context", "normalized", "media", "reported", "want", "rule"),
    [
        (None, 200_000, 0, 0, None, None, "configured-unset"),
        (0, 200_000, 0, 0, None, None, "configured-non-positive"),
        (-5, 200_000, 0, 0, None, None, "configured-non-positive"),
        (32_000, 0, 10, 0, None, 32_000, "no-context"),
        (32_000, 200_000, 199_000, 0, None, 32_000, "nothing-left"),
        (32_000, 200_000, 100_000, 0, None, 32_000, "fits"),
        (32_000, 200_000, 180_000, 0, None, 17_952, "capped"),
        (32_000, 200_000, 197_000, 0, None, 1_024, "capped"),  # never below MIN_OUTPUT
        (32_000, 200_000, 170_000, 2, None, 23_856, "capped"),  # 2×2048 media
        (32_000, 200_000, 10_000, 0, 190_000, 7_952, "capped"),  # max(reported, estimate)
    ],
)
def test_spec_5_cap_output_decision_table(
    configured: int | None,
    context: int,
    normalized: int,
    media: int,
    reported: int | None,
    want: int | None,
    rule: str,
) -> None:
    d = cap_output(
        configured,
        context=context,
        normalized=normalized,
        media=media,
        reported=reported,
        settings=CAP,
    )
    assert (d.value, d.rule) == (want, rule)


def test_spec_5_cap_uses_reported_usage_of_last_finished_assistant() -> None:
    from kilo_rules.engine.formats.session import CacheTokens, TokenUsage

    m = model(limits={"context": 200_000, "output": 64_000})
    plan = compile_policy("kilo-default", m)
    big = TokenUsage(
        input=150_000, output=10_000, reasoning=5_000, cache=CacheTokens(read=10_000, write=5_000)
    )
    s = session(user("u1", "hi"), assistant("a1", text("a1-t", "ok"), tokens=big), user("u2", "go"))
    result = apply_plan(plan, s, StepInput())
    cap = next(d for d in result.decisions if d.stage == "output")
    assert cap.inputs["reported"] == 180_000
    assert result.request["max_tokens"] == 200_000 - 180_000 - 2048


def test_single_decisions_are_callable_from_the_plan() -> None:
    plan = compile_policy("kilo-default", model(limits={"context": 200_000, "output": 64_000}))
    assert plan.usable() == 168_000
    d = cap_output(
        plan.value("output.configured"),
        context=plan.model.limits.context,
        normalized=180_000,
        media=0,
        reported=None,
        settings=plan.cap_settings(),
    )
    assert (d.value, d.rule) == (17_952, "capped")
    assert plan.prompt is not None and plan.prompt.rule == "anthropic"
