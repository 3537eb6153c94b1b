"""kilo-default places cache breakpoints as Kilo does (§10), end to end through apply."""

from __future__ import annotations

import json

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import ApprovalPart
from kilo_rules.engine.providers import count_markers
from kilo_rules.engine.providers.acceptance import check_body
from kilo_rules.engine.runtime.apply import apply_plan, run
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.measure import messages_json

from .helpers import assistant, model, session, text, tool, user


def _conversation():  # type: ignore[no-untyped-def]
    return session(
        user("u1", "one"),
        assistant("a1", tool("t1", "x"), finish="tool-calls"),
        user("u2", "two"),
        assistant("a2", text("t", "done")),
        user("u3", "three"),
    )


def test_spec_10_1_anthropic_message_level_first_system_last_two() -> None:
    result = apply_plan(compile_policy("kilo-default", model()), _conversation(), StepInput())
    body = result.request
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    marked = [i for i, m in enumerate(body["messages"]) if "cache_control" in str(m)]
    assert marked == [len(body["messages"]) - 2, len(body["messages"]) - 1]
    assert count_markers(body, "anthropic") == 3


def test_spec_10_1_openrouter_claude_last_part_skips_trailing_environment() -> None:
    m = model(provider="openrouter", api="openai-compatible", api_id="anthropic/claude-sonnet-4.5")
    body = apply_plan(compile_policy("kilo-default", m), _conversation(), StepInput()).request
    last = body["messages"][-1]["content"]
    assert last[-1]["text"].startswith("<environment_details>")
    assert "cache_control" not in last[-1]
    assert last[0]["cache_control"] == {"type": "ephemeral"}


def test_spec_10_1_gate_closed_for_non_claude_models() -> None:
    m = model(
        provider="openrouter", api="openai-compatible", api_id="qwen/qwen3-coder", family="qwen"
    )
    body = apply_plan(compile_policy("kilo-default", m), _conversation(), StepInput()).request
    assert count_markers(body, "openai-compatible") == 0


def test_spec_10_1_no_explicit_breakpoints_under_automatic_caching() -> None:
    result = apply_plan(
        compile_policy("kilo-default", model()), _conversation(), StepInput(automatic_caching=True)
    )
    assert count_markers(result.request, "anthropic") == 0


@pytest.mark.parametrize(
    ("api_id", "prices", "explicit"),
    [
        ("gpt-5.6", {"input": 1.0, "output": 1.0}, True),
        ("gpt-6", {"input": 2.0, "output": 1.0}, True),
        ("gpt-5.6-mini", {"input": 0.0, "output": 0.0}, False),  # a subscription: all zero
        ("gpt-5.6-mini", {"input": 0.0, "output": 1.0}, True),  # not all zero
        ("gpt-5.6", None, True),  # unknown prices are not a zero cost
        ("gpt-5", {"input": 1.0, "output": 1.0}, False),
        ("gpt-4o", {"input": 1.0, "output": 1.0}, False),
    ],
)
def test_spec_10_1_openai_explicit_breakpoints_from_gpt_5_6(
    api_id: str, prices: dict[str, float] | None, explicit: bool
) -> None:
    m = model(
        id=f"openai/{api_id}",
        provider="openai",
        api="openai",
        api_id=api_id,
        family="gpt",
        prices=prices,
        cache={"kind": "automatic", "max_breakpoints": 0, "min_cacheable_tokens": 1024},
    )
    plan = compile_policy("kilo-default", m)
    body = apply_plan(plan, _conversation(), StepInput()).request
    assert (count_markers(body, "openai") > 0) is explicit
    assert ("openai-explicit-breakpoints" in plan.overrides) is explicit


@pytest.mark.parametrize(
    ("entry", "api", "marked"),
    [
        # transform.ts@006a344:423-433: the gateway's SDK closes the gate, though its api id
        # names Anthropic.
        (
            {"provider": "vercel", "api_id": "anthropic/claude-sonnet-4.5"},
            "openai-compatible",
            0,
        ),
        # the Alibaba SDK opens it (no anthropic/claude in any id)
        (
            {"provider": "alibaba", "api_id": "qwen3-coder-plus", "family": "qwen"},
            "openai-compatible",
            3,
        ),
        # the Kilo gateway's openai/gpt-5.6 is marked, under the openrouter namespace
        (
            {"provider": "kilo", "api_id": "openai/gpt-5.6", "family": "gpt"},
            "openai-compatible",
            3,
        ),
        # a custom provider id on the OpenAI SDK gets no prompt_cache_breakpoint
        (
            {"provider": "my-proxy", "sdk": "@ai-sdk/openai", "api_id": "gpt-5.6", "family": "gpt"},
            "openai",
            0,
        ),
        # the same model on OpenAI itself does
        ({"provider": "openai", "api_id": "gpt-5.6", "family": "gpt"}, "openai", 3),
    ],
    ids=["vercel-gateway", "alibaba", "kilo-gateway-gpt-5.6", "custom-openai-sdk", "openai"],
)
def test_spec_10_1_gate_keys_on_the_sdk_package_and_provider_id(
    entry: dict[str, str], api: str, marked: int
) -> None:
    m = model(
        id=f"{entry['provider']}/{entry['api_id']}",
        api=api,
        prices={"input": 1.0, "output": 2.0},
        cache={"kind": "automatic", "max_breakpoints": 0, "min_cacheable_tokens": 1024},
        **entry,
    )
    body = apply_plan(compile_policy("kilo-default", m), _conversation(), StepInput()).request
    assert count_markers(body, api) == marked


def test_a_model_entry_takes_its_providers_sdk_package() -> None:
    assert model(provider="anthropic").sdk == "@ai-sdk/anthropic"
    assert model(provider="vercel").sdk == "@ai-sdk/gateway"
    assert model(provider="some-proxy").sdk == "@ai-sdk/openai-compatible"
    assert model(provider="some-proxy", sdk="@ai-sdk/anthropic").sdk == "@ai-sdk/anthropic"


def test_spec_10_2_auto_rule_marks_last_tool_last_system_latest_user(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "p.yaml"
    # Switching the rule is enough: kilo-default's kilo-rule selection (first 2 system,
    # last 2 others) is not inherited by the auto rule (cache-policy.ts AUTO).
    p.write_text("version: 1\nname: p\nextends: kilo-default\ncache:\n  rule: auto\n  ttl: 1h\n")
    body = apply_plan(compile_policy(p, model()), _conversation(), StepInput()).request
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    last_user = body["messages"][-1]["content"]
    assert last_user[0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert count_markers(body, "anthropic") == 3


SPLIT_TTLS = """\
version: 1
name: split-ttls
extends: kilo-default
cache:
  rule: auto
  breakpoints: {last_tool: true, last_system: true, latest_user_message: false, rolling: 2}
  budget: 4
  ttl: 1h
  message_ttl: 5m
"""


def test_auto_rule_with_rolling_tail_and_split_ttls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "split-ttls.yaml"
    p.write_text(SPLIT_TTLS)
    body = apply_plan(compile_policy(p, model()), _conversation(), StepInput()).request
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    marks = [
        b["cache_control"]
        for m in body["messages"]
        for b in m["content"]
        if isinstance(b, dict) and "cache_control" in b
    ]
    assert marks == [{"type": "ephemeral"}, {"type": "ephemeral"}]  # rolling, 5 minutes
    assert "cache_control" in str(body["messages"][-1]) and "cache_control" in str(
        body["messages"][-2]
    )
    assert count_markers(body, "anthropic") == 4


def test_cache_max_marks_the_conversation_for_an_hour() -> None:
    # Tools and system alone are below every Claude cache minimum (docs/verify.md).
    body = apply_plan(compile_policy("cache-max", model()), _conversation(), StepInput()).request
    assert "cache_control" not in body["tools"][-1]
    assert "cache_control" not in body["system"][-1]
    marks = [
        b["cache_control"]
        for m in body["messages"]
        for b in m["content"]
        if isinstance(b, dict) and "cache_control" in b
    ]
    assert marks and all(m == {"type": "ephemeral", "ttl": "1h"} for m in marks)
    assert count_markers(body, "anthropic") <= 3


def test_one_hour_message_marks_need_a_one_hour_ttl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kilo_rules.tools.checking.check import check_paths

    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nname: p\ncache:\n  ttl: 5m\n  message_ttl: 1h\n")
    (d,) = check_paths([str(p)]).errors
    assert d.code == "policy.contradiction" and d.location.line == 5


def test_spec_10_2_latest_assistant_selector(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The native policy's ``messages: "latest-assistant"``: the newest assistant message
    is marked on its last stable text part (markMessageAt)."""
    p = tmp_path / "p.yaml"
    p.write_text(
        "version: 1\nname: p\nextends: kilo-default\ncache:\n  rule: auto\n"
        "  breakpoints: {last_tool: false, last_system: false, latest_user_message: false,"
        " latest_assistant: true}\n"
    )
    result = apply_plan(compile_policy(p, model()), _conversation(), StepInput())
    body = result.request
    assert count_markers(body, "anthropic") == 1
    (assistant_turn,) = [m for m in body["messages"] if "cache_control" in str(m)]
    assert assistant_turn["role"] == "assistant"
    assert assistant_turn["content"][-1] == {
        "type": "text",
        "text": "done",
        "cache_control": {"type": "ephemeral"},
    }
    assert any("latest assistant message" in str(d.result) for d in result.decisions)


@pytest.mark.parametrize(
    "step",
    [
        StepInput(automatic_caching=True),
        StepInput(options={"automatic_cache": True}),
    ],
    ids=["step-switch", "option"],
)
def test_spec_10_1_automatic_caching_is_one_switch(step: StepInput) -> None:
    """Either switch alone turns Anthropic's automatic caching on (the top-level
    ``cache_control``) and keeps the explicit breakpoints out (transform.test.ts@03fd0bb)."""
    body = apply_plan(compile_policy("kilo-default", model()), _conversation(), step).request
    assert body["cache_control"] == {"type": "ephemeral"}
    assert count_markers(body, "anthropic") == 0


def test_automatic_caching_for_an_hour_keeps_the_callers_bucket() -> None:
    step = StepInput(automatic_caching=True, options={"automatic_cache": "1h"})
    body = apply_plan(compile_policy("kilo-default", model()), _conversation(), step).request
    assert body["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def _awaiting_approval(answered: bool | None):  # type: ignore[no-untyped-def]
    call = tool("t2", "listing")
    approval = ApprovalPart(id="ap", approval_id="ap-1", call_id=call.call_id, approved=answered)
    return session(
        user("u1", "one"),
        assistant("a1", text("t1", "let me look"), call, approval, finish="tool-calls"),
    )


def test_spec_10_1_a_message_ending_in_a_tool_approval_is_marked_whole() -> None:
    """transform.ts@006a344:361-373: on a last-part provider the mark goes on the last
    content part, unless that part is a tool-approval request or response; then the
    message itself is marked. No wire carries approval parts, so the body leaves them out
    and the message-level mark lands on the message's last block."""
    m = model(provider="openrouter", api="openai-compatible", api_id="anthropic/claude-sonnet-4.5")
    result = apply_plan(compile_policy("kilo-default", m), _awaiting_approval(None), StepInput())
    marks = {
        d.inputs["role"]: d.inputs["target"] for d in result.decisions if d.rule == "kilo.mark"
    }
    assert marks == {
        "system": "messages[0].parts[0]",
        "assistant": "messages[2]",  # the message, not its last part (the approval request)
        "tool": "messages[3].parts[0]",
    }
    body = result.request
    assert "approval" not in json.dumps(body)
    turn = next(m for m in body["messages"] if m["role"] == "assistant")
    assert turn["tool_calls"][0]["id"] == "call_t2"


def test_an_answered_approval_sits_beside_the_tool_results_and_is_never_sent() -> None:
    plan = compile_policy("kilo-default", model())
    st = run(plan, _awaiting_approval(True), StepInput(), until="lower")
    kinds = [(m.role, [p.kind for p in m.parts]) for m in st.lowered]
    assert ("assistant", ["text", "tool-call", "approval-request"]) in kinds
    assert ("tool", ["tool-result", "approval-response"]) in kinds
    # Kilo measures the AI SDK messages, approval parts included (the estimate's JSON).
    assert '"type":"tool-approval-response","approvalId":"ap-1","approved":true' in (
        messages_json(st.lowered)
    )
    body = apply_plan(plan, _awaiting_approval(True), StepInput()).request
    assert "approv" not in json.dumps(body)
    assert check_body(body, "anthropic") == []
