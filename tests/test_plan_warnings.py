"""Compile warns, once and located, about a window a policy leaves no room in for a model:
`plan` prints the warnings, `check --model` reports them for CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.tools.cli import main

from .runtime.helpers import model

TIGHT = model(limits={"context": 32_000, "output": 128_000})  # output cap = the window


def _policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f"version: 1\nname: p\nextends: kilo-default\n{body}", encoding="utf-8")
    return path


def test_a_window_with_no_room_for_input_is_a_located_warning() -> None:
    plan = compile_policy("kilo-default", TIGHT)
    (w,) = plan.warnings
    assert (w.code, w.severity) == ("plan.no-window", "warning")
    assert "after 32,000 tokens for the answer" in w.message
    assert w.location == plan.values["budget.usable"].location
    assert compile_policy("kilo-default", model()).warnings == ()


def test_reserved_at_the_window_and_a_tail_over_usable_are_warned(tmp_path: Path) -> None:
    reserved = compile_policy(_policy(tmp_path, "budget: {reserved: 40_000}\n"), TIGHT)
    assert "plan.reserved" in [w.code for w in reserved.warnings]
    tail = _policy(tmp_path, "compaction: {preserve_recent_tokens: 190_000}\n")
    (w,) = compile_policy(tail, model()).warnings
    assert w.code == "plan.tail" and "more than the 168,000 usable tokens" in w.message
    assert w.location.line == 4


def test_check_with_models_reports_the_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = tmp_path / "tight.yaml"
    entry.write_text(
        "id: test/tight\nprovider: openai\nfamily: gpt\napi_id: gpt-tight\napi: openai\n"
        "limits: {context: 32000, output: 128000}\n",
        encoding="utf-8",
    )
    policy = _policy(tmp_path, "")
    assert main(["check", str(policy), "--model", str(entry), "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert "plan.no-window" in out and "test/tight" in out
    assert main(["check", str(policy)]) == 0  # without --model, nothing is compiled
    assert "plan.no-window" not in capsys.readouterr().out


def test_plan_prints_the_warnings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    entry = tmp_path / "tight.yaml"
    entry.write_text(
        "id: test/tight\nprovider: openai\nfamily: gpt\napi_id: gpt-tight\napi: openai\n"
        "limits: {context: 32000, output: 128000}\n",
        encoding="utf-8",
    )
    assert main(["plan", "--model", str(entry)]) == 0
    assert "warning[plan.no-window]" in capsys.readouterr().err
