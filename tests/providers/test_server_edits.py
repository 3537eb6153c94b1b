"""The server section: context editing and compaction asked of the provider, in the exact
shapes the official SDK types accept, gated by the catalog, with their beta headers."""

from __future__ import annotations

from pathlib import Path

import pytest
from wire_checks import check

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput
from tests.runtime.helpers import assistant, session, tool, user

POLICY = """\
version: 1
name: server-edits
extends: kilo-default
server:
  clear_tool_uses:
    enabled: true
    trigger_tokens: 80000
    keep_tool_uses: 4
    clear_at_least_tokens: 20000
    exclude_tools: [skill]
    clear_tool_inputs: true
  clear_thinking:
    enabled: true
    keep_turns: 2
  compaction:
    enabled: true
    trigger_tokens: 120000
    instructions: Keep file paths.
"""


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "server-edits.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


def _session() -> Session:
    return session(
        user("u1", "Fix the failing test."),
        assistant("a1", tool("p1", output="FAILED test_x")),
        user("u2", "Go on."),
    )


def test_anthropic_gets_every_edit_thinking_first_and_the_sdk_accepts_it(policy: Path) -> None:
    plan = compile_policy(policy, "anthropic/claude-sonnet-4-6")
    turn = apply_plan(plan, _session(), StepInput())
    edits = turn.request["context_management"]["edits"]
    assert [e["type"] for e in edits] == [
        "clear_thinking_20251015",
        "clear_tool_uses_20250919",
        "compact_20260112",
    ]
    assert edits[0]["keep"] == {"type": "thinking_turns", "value": 2}
    assert edits[1] == {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 80000},
        "keep": {"type": "tool_uses", "value": 4},
        "clear_at_least": {"type": "input_tokens", "value": 20000},
        "exclude_tools": ["skill"],
        "clear_tool_inputs": True,
    }
    assert edits[2]["instructions"] == "Keep file paths."
    check(turn.request, "anthropic")  # the beta MessageCreateParams, unknown keys refused
    assert turn.headers == {"anthropic-beta": "compact-2026-01-12,context-management-2025-06-27"}
    assert turn.to_json()["headers"] == turn.headers
    sent = [d for d in turn.decisions if d.rule.startswith("server.") and d.rule.endswith(".send")]
    assert len(sent) == 3
    assert all("cached prefix is written again" in str(d.result) for d in sent)
    assert all(d.at is not None and d.at.file == str(policy) for d in sent)


def test_a_model_without_the_capability_gets_a_warning_not_the_edit(policy: Path) -> None:
    plan = compile_policy(policy, "anthropic/claude-sonnet-4-5")  # no server compaction
    turn = apply_plan(plan, _session(), StepInput())
    edits = turn.request["context_management"]["edits"]
    assert [e["type"] for e in edits] == ["clear_thinking_20251015", "clear_tool_uses_20250919"]
    assert turn.headers == {"anthropic-beta": "context-management-2025-06-27"}
    (warning,) = [d for d in turn.decisions if d.rule == "server.compaction.unsupported"]
    assert warning.severity == "warning"
    check(turn.request, "anthropic")

    plan = compile_policy(policy, "openai/gpt-5")  # chat completions: none of them
    turn = apply_plan(plan, _session(), StepInput())
    assert "context_management" not in turn.request and turn.headers == {}
    assert len([d for d in turn.decisions if d.rule.endswith(".unsupported")]) == 3


def test_the_responses_api_gets_its_compaction_and_the_sdk_accepts_it(policy: Path) -> None:
    plan = compile_policy(policy, "openai/gpt-5-codex")
    turn = apply_plan(plan, _session(), StepInput())
    assert turn.request["context_management"] == [
        {"type": "compaction", "compact_threshold": 120000}
    ]
    assert turn.headers == {}
    check(turn.request, "openai-responses")


def test_kilo_default_asks_for_nothing() -> None:
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-6")
    turn = apply_plan(plan, _session(), StepInput())
    assert "context_management" not in turn.request and turn.headers == {}
    assert not [d for d in turn.decisions if d.rule.startswith("server.")]


def test_keep_all_thinking(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nname: p\nextends: kilo-default\n"
        "server: {clear_thinking: {enabled: true, keep_turns: all}}\n",
        encoding="utf-8",
    )
    turn = apply_plan(compile_policy(path, "anthropic/claude-opus-4-6"), _session(), StepInput())
    assert turn.request["context_management"] == {
        "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]
    }
    check(turn.request, "anthropic")


def test_a_bad_server_section_is_a_located_error(tmp_path: Path) -> None:
    from kilo_rules.tools.checking.check import check_paths

    path = tmp_path / "bad.yaml"
    path.write_text(
        "version: 1\nname: bad\nextends: kilo-default\n"
        "server:\n  clear_tool_uses:\n    keep_tool_uses: -1\n    tirgger_tokens: 5\n",
        encoding="utf-8",
    )
    report = check_paths([str(path)])
    found = {(d.location.line, d.location.col, d.code) for d in report.diagnostics}
    assert found == {(6, 21, "schema.range"), (7, 5, "schema.unknown-key")}


def test_a_misspelled_edit_is_refused_by_the_sdk_type(policy: Path) -> None:
    import copy

    plan = compile_policy(policy, "anthropic/claude-sonnet-4-6")
    body = copy.deepcopy(apply_plan(plan, _session(), StepInput()).request)
    body["context_management"]["edits"][1]["trigger"]["valeu"] = 1
    with pytest.raises(Exception, match="valeu"):
        check(body, "anthropic")
