"""Chunked compaction counts message lists from each message's JSON (``list_count``): the
decisions on every recorded session are those of counting each list's JSON whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.chunks import _units, list_count, message_jsons
from kilo_rules.engine.runtime.compaction import compact
from kilo_rules.engine.runtime.lower import lower, lower_settings
from kilo_rules.engine.runtime.measure import messages_json
from kilo_rules.engine.summarizers.protocol import SummaryRequest
from kilo_rules.engine.text.tokens import CountCache, EstimateCounter, TiktokenCounter
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

from .helpers import model

ROOT = Path(__file__).resolve().parents[2]
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"
SESSIONS = (
    sorted(p for p in TRAJECTORIES.iterdir() if p.suffix != ".md") if TRAJECTORIES.is_dir() else []
)


class Echo:
    """A summarizer whose answer depends on the request only (chunks run in threads)."""

    def summarize(self, request: SummaryRequest) -> str:
        return f"{len(request.messages)} messages, {len(messages_json(request.messages))} chars"


def _recorded(path: Path) -> Session:
    return without_recorded_compactions(read_session(path, run=0))


def _plan(tmp_path: Path, counter: str, context: int) -> object:
    policy = tmp_path / "counted.yaml"
    policy.write_text(
        f"version: 1\nname: counted\nextends: kilo-default\ntokens: {{counter: '{counter}'}}\n",
        encoding="utf-8",
    )
    return compile_policy(policy, model(limits={"context": context, "output": 8_000}))


@pytest.mark.slow
@pytest.mark.skipif(not SESSIONS, reason="the shared trajectories are absent")
@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.name[:40])
def test_list_counts_of_recorded_heads_equal_whole_counts(path: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "tiktoken:cl100k_base", 100_000)
    settings = lower_settings(plan, strip_all_media=True, tool_output_max_chars=2_000)  # type: ignore[arg-type]
    messages = lower(_recorded(path).messages, settings)
    jsons = message_jsons(messages)
    tiktoken = TiktokenCounter("cl100k_base")
    cache = CountCache(tiktoken)
    assert list_count(jsons, cache.count) == tiktoken.count(messages_json(messages))
    for unit in _units(messages):
        members = [messages[i] for i in unit]
        whole = tiktoken.count(messages_json(members))
        assert list_count([jsons[i] for i in unit], cache.count) == whole
    estimate = EstimateCounter()
    assert list_count(jsons, estimate.count) == estimate.count(messages_json(messages))


@pytest.mark.slow
@pytest.mark.skipif(not SESSIONS, reason="the shared trajectories are absent")
@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.name[:40])
def test_compaction_decisions_on_recorded_sessions_are_those_of_whole_counts(
    path: Path, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, "tiktoken:cl100k_base", 24_000)
    session = _recorded(path)
    tiktoken = TiktokenCounter("cl100k_base")
    joined = compact(
        plan,  # type: ignore[arg-type]
        session,
        Echo(),
        overflow=None,
        count=CountCache(tiktoken).count,
    )
    whole = compact(
        plan,  # type: ignore[arg-type]
        session,
        Echo(),
        overflow=None,
        count=lambda text: tiktoken.count(text),  # counts every list's JSON whole
    )
    assert joined.decisions == whole.decisions
    assert joined.mutations == whole.mutations
