"""simulate replays what a provider refuses, and reports the limit a plan compacts at.

A provider refuses a request whose input plus the output cap it asks for exceed the
window (not only one whose input alone does); the replay counts that refusal and sends the
step again after the runtime compacts in overflow mode. The compaction limit a report shows
is the one the runtime compares the usage with (``overflow.limit``), not ``budget.usable``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.engine.formats.session import Session, TokenUsage
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.providers.acceptance import BodyContext, check_body
from kilo_rules.engine.providers.serversim import refuses
from kilo_rules.tools.simulation.simulate import Calibration, SimulationReport, replay, simulate

from .conftest import SHARED
from .runtime.helpers import assistant, model, session, text, tool, user

ROOT = Path(__file__).resolve().parents[1]
TUNED = str(ROOT / "examples" / "tune" / "kilo-default-tuned.yaml")
OPUS = SHARED / "data" / "trajectories" / "claude-code-opus46-spotter-8463c716.jsonl"
SONNET = "anthropic/claude-sonnet-4-5"

needs_shared = pytest.mark.skipif(not OPUS.is_file(), reason="shared trajectories absent")


@pytest.mark.parametrize(
    ("input_tokens", "output", "context", "input_limit", "refused"),
    [
        (171_477, 32_000, 200_000, None, True),  # the request a 200k window refuses
        (168_000, 32_000, 200_000, None, False),  # exactly the window: accepted
        (168_001, 32_000, 200_000, None, True),
        (199_999, None, 200_000, None, False),  # no cap asked: nothing reserved
        (200_001, None, 200_000, None, True),
        (10**9, 32_000, 0, None, False),  # an unknown window refuses nothing
        (272_001, 1_000, 400_000, 272_000, True),  # over a separate input limit
        (272_000, 128_000, 400_000, 272_000, False),
    ],
)
def test_a_provider_refuses_input_plus_the_output_cap_over_the_window(
    input_tokens: int, output: int | None, context: int, input_limit: int | None, refused: bool
) -> None:
    assert refuses(input_tokens, output, context, input_limit) is refused


def test_the_acceptance_rule_is_the_same_rule() -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32_000,
        "messages": [{"role": "user", "content": "hello"}],
    }
    for input_tokens in (100_000, 167_999, 168_000, 168_001, 171_477, 199_999, 200_001):
        ctx = BodyContext(context_window=200_000, input_tokens=input_tokens)
        broken = {v.rule for v in check_body(body, "anthropic", ctx)}
        assert ("output-within-window" in broken) is refuses(input_tokens, 32_000, 200_000)


def _by_index(report: SimulationReport, index: int) -> int:
    return next(k for k, s in enumerate(report.steps) if s.index == index)


@pytest.mark.slow
@needs_shared
def test_a_request_over_the_window_with_its_output_cap_is_counted_and_retried() -> None:
    """On the long Claude Code session with a hidden prefix 500 tokens above the fitted one,
    kilo-default's request 71 is 168,200 tokens as the provider counts them; the runtime,
    counting 166,032, caps the output at 31,920: 200,120 tokens on a 200k window. The
    provider refuses it, the runtime compacts in overflow mode, and the step is sent again."""
    sess = read_session(str(OPUS))
    plan = compile_policy("kilo-default", SONNET)
    (report,) = simulate(sess, [plan], calibration=Calibration(1.1059, 45_577))
    assert report.error is None and not report.stopped
    assert report.provider_overflows == 1
    step = report.steps[_by_index(report, 71)]
    assert (step.provider_overflows, step.compactions) == (1, 1)
    assert step.cache.input < 100_000  # what was sent after the compaction
    # Nothing the provider would refuse was billed as if it had been answered.
    window = plan.model.limits.context
    assert not [s.index for s in report.steps if refuses(s.cache.input, s.max_tokens, window)]
    assert report.to_json()["steps"][_by_index(report, 71)]["max_tokens"] == step.max_tokens


def _growing() -> Session:
    """Four user turns of a few thousand tokens each, answered with recorded usage."""
    words = " ".join(f"w{i}" for i in range(3000))
    msgs = []
    for t in range(4):
        msgs.append(user(f"u{t}", f"part {t}: {words}", created=1_700_000_000_000 + t))
        msgs.append(assistant(f"a{t}", tool(f"p{t}", output=words), tokens=TokenUsage(output=50)))
        msgs.append(assistant(f"b{t}", text(f"q{t}", "done"), tokens=TokenUsage(output=5)))
    return session(*msgs)


def test_the_report_shows_the_limit_the_runtime_compacts_at() -> None:
    m = bundled_catalog().get(SONNET)
    kilo = compile_policy("kilo-default", m)
    tuned = compile_policy(TUNED, m)  # threshold_percent 50
    off = compile_policy("kilo-default", m, config={"compaction.auto": False})
    reports = simulate(_growing(), [kilo, tuned, off])
    assert [r.compaction_limit for r in reports] == [168_000, 100_000, None]
    assert kilo.usable() == tuned.usable() == 168_000  # what the report used to show
    # The limit shown is the one each overflow check of the replay compared against.
    for plan, r in zip((kilo, tuned), reports[:2], strict=True):
        seen = {
            d.inputs["limit"]
            for step in replay(plan, _growing())
            for d in step.result.decisions
            if d.stage == "guards" and d.rule == "overflow"
        }
        assert seen == {r.compaction_limit}


def test_a_small_window_compacts_at_its_threshold() -> None:
    """A policy with threshold_percent on a 20k window: the report's limit is 70 % of it
    (budget.usable, the limit shown before, is 15,904)."""
    plan = compile_policy("local-small", model(limits={"context": 20_000, "output": 4_000}))
    (report,) = simulate(_growing(), [plan])
    assert report.compaction_limit == 14_000


def test_the_runtime_window_stage_is_the_same_rule() -> None:
    from kilo_rules.engine.runtime.apply import exceeds

    for input_tokens, output in ((168_000, 32_000), (168_001, 32_000), (200_001, None)):
        assert exceeds(input_tokens, output, 200_000) is refuses(input_tokens, output, 200_000)
