"""simulate's calibration against recorded usage, and the cost floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog
from kilo_rules.engine.formats.session import CacheTokens, Session, TokenUsage
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.providers.cachesim import Block
from kilo_rules.engine.runtime.measure import messages_json
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.engine.summarizers.protocol import SummaryRequest
from kilo_rules.tools.simulation.simulate import (
    Calibration,
    SimulationReport,
    _PerfectCache,
    default_counter,
    fit_calibration,
    recorded_summary,
    session_document,
    simulate,
)

from .conftest import SHARED
from .runtime.helpers import assistant, model, session, text, tool, user

TRAJECTORIES = SHARED / "data" / "trajectories"
TUNED = str(Path(__file__).resolve().parents[1] / "examples" / "tune" / "kilo-default-tuned.yaml")
OPUS = TRAJECTORIES / "claude-code-opus46-spotter-8463c716.jsonl"
SONNET = TRAJECTORIES / "claude-code-sonnet45-subagent-a2898e3.jsonl"
PRICES = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}

needs_shared = pytest.mark.skipif(not OPUS.is_file(), reason="shared trajectories absent")


def _opus_200k() -> ModelInfo:
    """Opus 4.6 with the 200k window Claude Code ran it with (the catalog's is 1M)."""
    m = bundled_catalog().get("anthropic/claude-opus-4-6")
    return m.model_copy(update={"limits": m.limits.model_copy(update={"context": 200_000})})


def _pre_compaction_error(report: SimulationReport, session: Session) -> float:
    """Median |simulated − recorded| / recorded over the steps before the agent's own
    compaction (after it, the recorded context is a summary)."""
    kept_until = next(
        (i for i, m in enumerate(session.messages) if m.id == "msg_000714"), len(session.messages)
    )
    before = {m.id for m in session.messages[:kept_until]}
    errors = sorted(
        abs(s.cache.input - s.recorded_input) / s.recorded_input
        for s in report.steps
        if s.recorded_input and s.message_id in before
    )
    assert len(errors) >= 10
    return errors[len(errors) // 2]


@pytest.fixture(scope="module")
def opus() -> tuple[Session, ModelInfo, Calibration, SimulationReport, SimulationReport]:
    sess = read_session(str(OPUS))
    m = _opus_200k()
    plan = compile_policy("kilo-default", m)
    cal = fit_calibration(plan, sess)
    assert cal is not None
    (plain,) = simulate(sess, [plan])
    (calibrated,) = simulate(sess, [plan], calibration=cal)
    return sess, m, cal, plain, calibrated


@pytest.mark.slow
@needs_shared
def test_the_fit_explains_the_recorded_usage(
    opus: tuple[Session, ModelInfo, Calibration, SimulationReport, SimulationReport],
) -> None:
    sess, _, cal, plain, calibrated = opus
    # A tokenizer ratio a little over 1 and the hidden prefix of Claude Code's own system
    # prompt and tools (tens of thousands of tokens).
    assert 1.05 <= cal.factor <= 1.2
    assert 20_000 <= cal.offset <= 60_000
    assert cal.steps >= 60
    assert cal.median_abs_error is not None and cal.median_abs_error < 0.03
    assert _pre_compaction_error(plain, sess) > 0.2  # uncalibrated: off by a quarter or more
    assert _pre_compaction_error(calibrated, sess) < 0.03


@needs_shared
def test_the_calibrated_replay_compacts_where_the_agent_had_to(
    opus: tuple[Session, ModelInfo, Calibration, SimulationReport, SimulationReport],
) -> None:
    _, _, _, plain, calibrated = opus
    # The agent compacted (msg_000714/715) before the request the replay numbers 72.
    first_after = next(s.index for s in calibrated.steps if s.message_id > "msg_000715")
    assert first_after == 72
    assert [s.index for s in calibrated.steps if s.compactions] == [72]
    uncalibrated = [s.index for s in plain.steps if s.compactions]
    assert uncalibrated and uncalibrated[0] > 100  # the undercount compacts 40 requests late


@needs_shared
def test_the_small_session_is_calibrated_too() -> None:
    sess = read_session(str(SONNET))
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    cal = fit_calibration(plan, sess)
    assert cal is not None and cal.steps == 12
    assert cal.median_abs_error is not None and cal.median_abs_error < 0.03
    (report,) = simulate(sess, [plan], calibration=cal)
    errors = sorted(
        abs(s.cache.input - (s.recorded_input or 0)) / (s.recorded_input or 1) for s in report.steps
    )
    assert errors[len(errors) // 2] < 0.03


def _turns() -> Session:
    words = " ".join(f"w{i}" for i in range(1500))
    return session(
        user("u1", "Please review: " + words),
        assistant("a1", tool("p1", output=words), tokens=TokenUsage(output=40)),
        assistant("a2", text("p2", "Done."), tokens=TokenUsage(output=10)),
        user("u2", "And now this: " + words),
        assistant("a3", text("p3", "Fine."), tokens=TokenUsage(output=5)),
    )


def test_a_declared_calibration_scales_counts_and_caches_the_hidden_prefix() -> None:
    plan = compile_policy("kilo-default", model(prices=PRICES))
    (plain,) = simulate(_turns(), [plan])
    cal = Calibration(factor=1.25, offset=5000)
    (scaled,) = simulate(_turns(), [plan], calibration=cal)
    # each block is scaled and rounded on its own: a few tokens of rounding at most
    for s, p in zip(scaled.steps, plain.steps, strict=True):
        assert abs(s.cache.input - (1.25 * p.cache.input + 5000)) <= 8
    # the hidden prefix sits in front of the first breakpoint: written once, then read
    assert scaled.steps[0].cache.write >= 5000
    assert scaled.steps[1].cache.read >= 5000
    assert scaled.cost is not None and plain.cost is not None and scaled.cost > plain.cost


@pytest.mark.parametrize(("factor", "offset"), [(0.0, 0), (11.0, 0), (1.0, -1), (1.0, 10**8)])
def test_a_calibration_out_of_range_is_refused(factor: float, offset: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        Calibration(factor, offset)


def test_a_log_without_usage_cannot_be_calibrated() -> None:
    plan = compile_policy("kilo-default", model(prices=PRICES))
    sess = session(
        user("u1", "hello " * 50),
        assistant("a1", text("p1", "hi")),
        user("u2", "again " * 50),
        assistant("a2", text("p2", "yes")),
    )
    assert fit_calibration(plan, sess) is None
    doc = session_document(sess, [plan], name="s.json")
    assert doc["calibration"] is None and doc["notes"] == []
    # --calibrate on such a log is no failure: the replay is reported uncalibrated, and says so.
    asked = session_document(sess, [plan], name="s.json", calibrate=True)
    assert asked["calibration"] is None
    assert asked["reports"] == doc["reports"]
    (note,) = asked["notes"]
    assert note.startswith("not calibrated: the log records no usage")
    declared = session_document(sess, [plan], name="s.json", declared=Calibration(1.1, 100))
    assert declared["calibration"]["applied"] is True
    assert declared["calibration"]["declared"] is True


def test_a_perfect_cache_writes_each_prefix_once_and_reads_it_after() -> None:
    cache = _PerfectCache()
    assert cache.step([Block("t", 100), Block("m0", 50)]) == (0, 150)
    assert cache.step([Block("t", 100), Block("m0", 50), Block("m1", 30)]) == (150, 30)
    # a changed block breaks the prefix: everything after it is written again
    assert cache.step([Block("t", 100), Block("x", 50), Block("m1", 30)]) == (100, 80)
    # any earlier request's prefix is still there (no expiry, no breakpoint limit)
    assert cache.step([Block("t", 100), Block("m0", 50), Block("y", 5)]) == (150, 5)


def test_no_policy_beats_its_own_perfect_cache() -> None:
    plans = [
        compile_policy(name, model(prices=PRICES))
        for name in ("kilo-default", "cache-max", "local-small")
    ]
    for report in simulate(_turns(), plans):
        assert report.cost is not None and report.floor_cost is not None
        assert report.floor_cost <= report.cost + 1e-12
        assert report.perfect_read + report.perfect_write == report.input


@needs_shared
def test_the_floor_of_a_long_session_is_the_cheapest_replay_under_a_perfect_cache(
    opus: tuple[Session, ModelInfo, Calibration, SimulationReport, SimulationReport],
) -> None:
    _, _, _, plain, calibrated = opus
    for r in (plain, calibrated):
        assert r.floor_cost is not None and r.cost is not None
        # kilo-default's rolling breakpoints already read everything a perfect cache would
        assert r.floor_cost <= r.cost <= r.floor_cost * 1.01


def test_the_session_document_holds_the_floor_and_each_ratio() -> None:
    plans = [compile_policy(name, model(prices=PRICES)) for name in ("kilo-default", "local-small")]
    doc = session_document(_turns(), plans, name="turns.json")
    floor = doc["floor"]
    assert floor["cost_usd"] == min(r["floor_cost_usd"] for r in doc["reports"])
    assert floor["policy"] in ("kilo-default", "local-small")
    assert floor["input"] == floor["cache_read"] + floor["cache_write"]
    for r in doc["reports"]:
        assert r["floor_ratio"] == pytest.approx(r["cost_usd"] / floor["cost_usd"])
        assert r["floor_ratio"] >= 1.0
        assert all("prunes" in s and "recorded_input" in s for s in r["steps"])
    kilo = next(r for r in doc["reports"] if r["policy"] == "kilo-default")
    assert kilo["compaction_limit"] == plans[0].usable()


def test_plans_for_different_models_are_refused(tmp_path: Path) -> None:
    a = compile_policy("kilo-default", model(prices=PRICES))
    b = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    with pytest.raises(ValueError, match="same model"):
        session_document(_turns(), [a, b], name="x")


@pytest.mark.slow
@needs_shared
def test_the_fit_uses_every_request_before_the_agents_compaction_whatever_the_plan() -> None:
    """The tuned policy compacts at request 15 of the long session; the fit is made on
    the un-compacted replay, so it still sees the 71 requests the log and the replay share."""
    sess = read_session(str(OPUS))
    m = bundled_catalog().get("anthropic/claude-sonnet-4-5")
    kilo = fit_calibration(compile_policy("kilo-default", m), sess)
    tuned = fit_calibration(compile_policy(TUNED, m), sess)
    assert kilo is not None and tuned is not None
    assert kilo.steps == tuned.steps == 71


@pytest.mark.slow
@needs_shared
def test_each_report_is_the_same_whatever_the_order_of_the_policies() -> None:
    sess = read_session(str(OPUS))
    m = bundled_catalog().get("anthropic/claude-sonnet-4-5")
    plans = [compile_policy("kilo-default", m), compile_policy(TUNED, m)]
    one = session_document(sess, plans, name="opus", calibrate=True, steps=True)
    two = session_document(sess, plans[::-1], name="opus", calibrate=True, steps=True)
    assert one["calibration"] == two["calibration"]
    assert one["calibration"]["steps"] == 71 and one["calibration"]["applied"] is True
    assert [r["policy"] for r in one["reports"]] == ["kilo-default", "kilo-default-tuned"]
    assert {r["policy"]: r for r in one["reports"]} == {r["policy"]: r for r in two["reports"]}
    assert one["floor"] == two["floor"]


class _Recording:
    """The extractive summarizer, keeping every request and summary it was given."""

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.calls: list[tuple[SummaryRequest, str]] = []

    def summarize(self, request: SummaryRequest) -> str:
        out = self.inner.summarize(request)
        self.calls.append((request, out))
        return out


def test_summary_calls_are_metered_calibrated() -> None:
    """The summarizer's request and summary are counted as the provider would count them:
    the factor applies (the summary call carries no hidden prefix)."""
    plan = compile_policy("kilo-default", model(limits={"context": 8_000, "output": 1_000}))
    cal = Calibration(factor=1.5, offset=300)
    summarizer = _Recording()
    (report,) = simulate(_turns(), [plan], calibration=cal, summarizer=summarizer)
    assert report.compactions >= 1 and summarizer.calls
    count = default_counter().count
    sent = sum(
        cal.scale(count(r.instruction)) + cal.scale(count(messages_json(r.messages)))
        for r, _ in summarizer.calls
    )
    written = sum(cal.scale(count(out)) for _, out in summarizer.calls)
    assert (report.summary_input, report.summary_output) == (sent, written)


def _usage(read: int, write: int, uncached: int, output: int) -> TokenUsage:
    return TokenUsage(input=uncached, output=output, cache=CacheTokens(read=read, write=write))


def test_the_session_as_recorded_is_priced_from_its_usage() -> None:
    from kilo_rules.engine.formats.catalog import Prices
    from kilo_rules.engine.formats.session import CompactionPart

    prices = Prices(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3)
    compaction = user("c1", "")
    compaction = compaction.model_copy(
        update={"parts": [CompactionPart(id="cp", auto=True, overflow=False)]}
    )
    summary = assistant(
        "s1", text("sp", "summary"), tokens=_usage(0, 0, 1_000_000, 0), finish="stop"
    ).model_copy(update={"summary": True, "parent_id": "c1"})
    sess = session(
        user("u1", "hi"),
        assistant("a1", text("p1", "x"), tokens=_usage(0, 1_000_000, 0, 0)),
        compaction,
        summary,
        assistant("a2", text("p2", "y"), tokens=_usage(1_000_000, 0, 0, 1_000_000)),
        assistant("a3", text("p3", "z")),  # no usage logged
    )
    rec = recorded_summary(sess, prices)
    assert rec["requests"] == 4 and rec["with_usage"] == 3
    # the agent's summary call ($3 of uncached input) is billed with the request after it
    assert rec["request_costs_usd"] == [pytest.approx(3.75), pytest.approx(0.3 + 15 + 3), None]
    assert rec["cost_usd"] == pytest.approx(3.75 + 0.3 + 15 + 3)
    assert rec["compactions"] == [2]
    assert recorded_summary(sess, None)["cost_usd"] is None


@pytest.mark.slow
@needs_shared
def test_the_long_session_as_recorded() -> None:
    sess = read_session(str(OPUS))
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    doc = session_document(sess, [plan], name="opus", steps=False)
    rec = doc["recorded"]
    assert rec["compactions"] == [72]  # the agent compacted before the replay's request 72
    assert len(rec["request_costs_usd"]) == doc["reports"][0]["requests_total"] == 143
    assert rec["cost_usd"] == pytest.approx(sum(c or 0 for c in rec["request_costs_usd"]))


def test_simulate_prints_why_a_calibrate_run_is_uncalibrated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kilo_rules.tools.cli import main

    traj = Path(__file__).parent.parent / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj"
    code = main(
        [
            "simulate",
            "--model",
            "anthropic/claude-sonnet-4-5",
            "--session",
            str(traj),
            "--calibrate",
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 0
    assert "note: not calibrated: the log records no usage" in out
