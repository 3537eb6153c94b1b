"""A compiled Plan is shared, so nobody can change it; it holds everything a step needs, so a
step reads no policy file; and the compile cache is bounded and notices changed files."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import Compiler, compile_policy
from kilo_rules.engine.compiler.plan import FrozenDict, freeze
from kilo_rules.engine.formats.load import resource_root
from kilo_rules.engine.formats.session import TokenUsage
from kilo_rules.engine.runtime.facade import Runtime

from .compaction.helpers import FakeSummarizer, assistant, chars, model, session, text, user

SONNET = "anthropic/claude-sonnet-4-5"


def test_a_cached_plan_cannot_be_changed() -> None:
    plan = compile_policy("kilo-default", SONNET)
    with pytest.raises(TypeError, match="immutable"):
        plan.data["compaction"]["tail_turns"] = 99
    with pytest.raises(TypeError):
        plan.data["compaction"].update(tail_turns=99)
    with pytest.raises(TypeError):
        del plan.cache["budget"]
    with pytest.raises(TypeError):
        plan.static_context["model.limits.context"] = 1
    with pytest.raises(TypeError):
        plan.values.pop("budget.usable")
    with pytest.raises(TypeError):
        plan.config.setdefault("config.output_token_max", 1)
    with pytest.raises(AttributeError):  # lists became tuples
        plan.data["overflow"]["count"].append("input")  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):  # and the fields themselves are frozen
        plan.data = {}  # type: ignore[misc]
    again = compile_policy("kilo-default", SONNET)
    assert again is plan and again.settings.compaction.tail_turns == 2


def test_frozen_data_still_reads_and_serialises_as_plain_data() -> None:
    frozen = freeze({"a": [1, {"b": 2}], "c": "x"})
    assert isinstance(frozen, dict) and frozen == {"a": (1, {"b": 2}), "c": "x"}
    assert json.dumps(frozen) == '{"a": [1, {"b": 2}], "c": "x"}'
    thawed = copy.deepcopy(frozen)
    thawed["c"] = "y"  # a copy is the caller's own, and plain
    assert type(thawed) is dict and frozen["c"] == "x"
    assert isinstance(copy.copy(frozen), dict) and not isinstance(copy.copy(frozen), FrozenDict)


def _own_copy(tmp_path: Path) -> Path:
    """kilo-default and its prompt files, copied where the test may delete them."""
    root = Path(str(resource_root()))
    shutil.copy(root / "kilo-default.yaml", tmp_path / "kilo-default.yaml")
    shutil.copytree(root / "prompts", tmp_path / "prompts")
    return tmp_path / "kilo-default.yaml"


def test_a_step_reads_no_policy_or_prompt_file(tmp_path: Path) -> None:
    (tmp_path / "policy").mkdir()
    policy = _own_copy(tmp_path / "policy")
    window = model(limits={"context": 20_000, "output": 10_000})
    plan = compile_policy(policy, window, config={"output_token_max": 2000})
    assert plan.summary_template and plan.chunk_model is not None
    shutil.rmtree(policy.parent)  # every file the policy named is gone
    # A session that must compact, with a head too big for one summary request, so the
    # chunked path (model', the template) runs too.
    big = session(
        user("u1", "first"),
        assistant("a1", text("a1t", chars(9_000))),
        user("u2", "second"),
        assistant("a2", text("a2t", chars(9_000))),
        user("u3", "third"),
        assistant("a3", text("a3t", "ok"), tokens=TokenUsage(input=18_000, output=100)),
    )
    summarizer = FakeSummarizer()
    result = Runtime(plan, summarizer).step(big)
    assert result.compactions == 1 and summarizer.requests
    summary = next(d for d in result.decisions if d.rule == "summary")
    assert isinstance(summary.result, dict) and summary.result["mode"] == "chunked"
    # the template travelled with the plan into the summary request
    assert summarizer.requests[0].template == plan.summary_template


@pytest.fixture
def compiler() -> Compiler:
    """A compiler of the test's own: its caches start empty and no other test sees them."""
    return Compiler()


def test_the_cache_is_bounded_and_notices_a_changed_file(
    tmp_path: Path, compiler: Compiler
) -> None:
    policy = _own_copy(tmp_path)
    first = compiler.compile(policy, SONNET)
    assert compiler.compile(policy, SONNET) is first  # a hit
    prompt = tmp_path / "prompts" / "anthropic.txt"
    prompt.write_text(prompt.read_text(encoding="utf-8") + "\nOne more rule.", encoding="utf-8")
    changed = compiler.compile(policy, SONNET)
    assert changed is not first and changed.prompt is not None
    assert changed.prompt.text.endswith("One more rule.")
    # A change of size as well as time: two writes may share a clock tick.
    text = policy.read_text(encoding="utf-8").replace("tail_turns: 2", "tail_turns: 3 # three")
    policy.write_text(text, encoding="utf-8")
    assert compiler.compile(policy, SONNET).settings.compaction.tail_turns == 3
    small = Compiler(2)
    plans = [small.compile(policy, SONNET, config={"output_token_max": n}) for n in (1, 2, 3)]
    assert small.stats()["plans"].size == 2
    assert small.compile(policy, SONNET, config={"output_token_max": 3}) is plans[2]
    assert small.compile(policy, SONNET, config={"output_token_max": 1}) is not plans[0]
