"""compaction.attempt_rule: Kilo counts compactions per user turn; ``no-progress`` counts
only consecutive compactions that freed too little, so a long single-prompt run goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import ContextOverflowError
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session, TextPart, TokenUsage
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.mutations import missing

from .helpers import FakeSummarizer, assistant, chars, derived, model, session, text, user

NO_PROGRESS = "compaction:\n  attempt_rule: no-progress\n"


def _work(s: Session, k: int) -> Session:
    """One more step of an autonomous run: a long answer whose usage is over the limit."""
    answer = assistant(
        f"a{k}",
        text(f"a{k}t", chars(4_000)),
        tokens=TokenUsage(input=17_900, output=100),
        created=max(m.created for m in s.messages) + 1,  # newer than any summary so far
    )
    return s.model_copy(update={"messages": [*s.messages, answer]})


def _run(runtime: Runtime, steps: int) -> tuple[Session, int]:
    s = session(user("u1", "the task"), assistant("a0", text("a0t", chars(4_000))))
    original = s
    compactions = 0
    for k in range(1, steps + 1):
        result = runtime.step(_work(s, k))
        compactions += result.compactions
        assert missing(original, result.session) == []
        s = result.session
    return s, compactions


def test_kilo_stops_a_single_prompt_run_after_three_compactions(tmp_path: Path) -> None:
    runtime = Runtime(derived(tmp_path, ""), FakeSummarizer())
    with pytest.raises(ContextOverflowError) as err:
        _run(runtime, 6)
    d = err.value.diagnostic
    assert d.code == "runtime.compaction_exhausted" and d.details["attempt_rule"] == "turn"
    assert "attempt_rule: no-progress" in (d.hint or "")


def test_no_progress_lets_a_long_run_compact_as_often_as_it_needs(tmp_path: Path) -> None:
    runtime = Runtime(derived(tmp_path, NO_PROGRESS), FakeSummarizer())
    _, compactions = _run(runtime, 8)
    assert compactions == 8  # every step was over the limit and was compacted
    assert runtime.attempts(session(user("u1", "the task"))) == 0


def test_compactions_that_free_nothing_still_run_out(tmp_path: Path) -> None:
    plan = derived(tmp_path, NO_PROGRESS)
    runtime = Runtime(plan, FakeSummarizer(reply=chars(2_000)))  # summaries as big as it
    s = session(user("u1", "short"), assistant("a1", text("a1t", "ok")))
    for _ in range(3):
        runtime.overflowed(s)
        s = runtime.step(s).session
    assert runtime.attempts(s) == 3
    runtime.overflowed(s)
    with pytest.raises(ContextOverflowError) as err:
        runtime.step(s)
    d = err.value.diagnostic
    assert "freed less than 10% of the request" in d.message
    assert d.location == plan.locate("compaction.max_attempts")


TASK = "Fix the failing import in src/app.py. " + "Context: " + chars(1_500)


def test_long_run_keeps_the_task_verbatim_in_every_request() -> None:
    plan = compile_policy(
        "long-run",
        model(limits={"context": 20_000, "output": 10_000}),
        config={"output_token_max": 2000},
    )
    runtime = Runtime(plan, FakeSummarizer())
    s = session(user("u1", TASK), assistant("a0", text("a0t", chars(4_000))))
    original, compactions = s, 0
    for k in range(1, 9):
        result = runtime.step(_work(s, k))
        compactions += result.compactions
        assert TASK in result.body()  # verbatim, whatever was compacted before
        assert missing(original, result.session) == []
        s = result.session
    assert compactions >= 4  # more than Kilo's three per turn
    pinned = [
        p
        for m in s.messages
        for p in m.parts
        if isinstance(p, TextPart) and p.metadata.get("kilo_rules") == "pinned"
    ]
    assert pinned and pinned[-1].metadata["pins"][0] == {"id": "u1", "text": TASK, "kind": "task"}
    assert f'<task from="u1">\n{TASK}\n</task>' in pinned[-1].text


def test_only_the_first_user_message_is_pinned_as_the_task(tmp_path: Path) -> None:
    plan = derived(tmp_path, "compaction:\n  pin: [{task: true}]\n")
    s = session(
        user("u1", "first task"),
        assistant("a1", text("a1t", chars(3_000))),
        user("u2", "second"),
        assistant("a2", text("a2t", "ok"), tokens=TokenUsage(input=17_900, output=100)),
    )
    result = Runtime(plan, FakeSummarizer()).step(s)
    # a tail was kept and a summary written: the first user message went to the summarizer
    pins = [d for d in result.decisions if d.rule == "pin"]
    assert [d.result for d in pins] == [{"messages": ["u1"]}]
