"""A summarizer that fails neither uses up a compaction attempt nor loses the provider's
overflow report, and the session is intact after any failure."""

from __future__ import annotations

import copy

import pytest

from kilo_rules.engine.base.errors import ContextOverflowError
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.mutations import missing
from kilo_rules.engine.summarizers.protocol import SummarizerError, SummaryRequest

from .helpers import FakeSummarizer, plan_for, three_turns

PLAN = plan_for(20_000, 10_000, output_token_max=2_000)  # usable = limit = 18 000


class Flaky(FakeSummarizer):
    """Fails its first ``failures`` calls with a transient error, then summarises."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise SummarizerError("HTTP 500 from the summarizer", retryable=True)
        return super().summarize(request)


def test_failed_summaries_use_up_no_attempt() -> None:
    summarizer = Flaky(failures=3)
    runtime = Runtime(PLAN, summarizer)
    s = three_turns(18_000)  # over the limit: every step must compact
    for _ in range(3):  # three transient failures, as many as max_attempts
        with pytest.raises(SummarizerError):
            runtime.step(s)
        assert runtime.attempts(s) == 0
    result = runtime.step(s)  # not "Compaction exhausted": nothing was compacted yet
    assert result.compactions == 1 and runtime.attempts(result.session) == 1


def test_a_failed_summary_keeps_the_overflow_report() -> None:
    runtime = Runtime(PLAN, Flaky(failures=1))
    s = three_turns(100)
    runtime.overflowed(s)
    with pytest.raises(SummarizerError):
        runtime.step(s)
    result = runtime.step(s)  # the provider's report still stands
    added = [m["message"] for m in result.mutations if m["op"] == "add_message"]
    assert added[0]["parts"][0]["overflow"] is True
    assert added[-1]["metadata"]["compaction_replay_of"] == "u3"
    # consumed by the compaction that answered it
    assert runtime.step(result.session).compactions == 0


def test_the_session_is_intact_after_a_failure() -> None:
    s = three_turns(18_000)
    before = copy.deepcopy(s)
    runtime = Runtime(PLAN, Flaky(failures=1))
    with pytest.raises(SummarizerError):
        runtime.step(s)
    assert s == before
    result = runtime.step(s)
    assert missing(before, result.session) == []


def test_attempts_still_run_out_when_compaction_cannot_help() -> None:
    runtime = Runtime(PLAN, FakeSummarizer())
    s = three_turns(100)
    for _ in range(3):
        runtime.overflowed(s)
        s = runtime.step(s).session
    runtime.overflowed(s)
    with pytest.raises(ContextOverflowError, match="Compaction exhausted"):
        runtime.step(s)
