"""The bundled long-run policy on real autonomous sessions: every request is built, none
over the window, nothing of the session is lost, and the task is in every request."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.engine.formats.session import TextPart
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.mutations import missing
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

TRAJECTORIES = Path(__file__).resolve().parents[2].parent / "shared/data/trajectories"
CASES = [
    ("mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json", "deepseek/deepseek-chat", 32_000, 8_192),
    ("claude-code-opus46-spotter-8463c716.jsonl", "anthropic/claude-opus-4-6", 32_000, 8_000),
    ("claude-code-opus46-spotter-8463c716.jsonl", "anthropic/claude-opus-4-6", 100_000, 32_000),
]


def _strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [t for v in node.values() for t in _strings(v)]
    if isinstance(node, list):
        return [t for v in node for t in _strings(v)]
    return []


@pytest.mark.slow
@pytest.mark.parametrize(("name", "model_id", "window", "output"), CASES)
def test_long_run_completes_real_autonomous_sessions(
    name: str, model_id: str, window: int, output: int
) -> None:
    path = TRAJECTORIES / name
    if not path.exists():
        pytest.skip("../shared/data/trajectories is not available")
    base = bundled_catalog().get(model_id)
    limits = base.limits.model_copy(update={"context": window, "input": None, "output": output})
    plan = compile_policy("long-run", base.model_copy(update={"limits": limits}))
    session = without_recorded_compactions(read_session(path))
    first = next(m for m in session.messages if m.role == "user")
    task = "\n".join(p.text for p in first.parts if isinstance(p, TextPart)).strip()
    runtime = Runtime(plan, ExtractiveSummarizer())
    live = session.model_copy(update={"messages": []})
    built = compactions = 0
    for msg in session.messages:
        if msg.role == "assistant":
            step = runtime.step(live)  # never "Compaction exhausted"
            built += 1
            compactions += step.compactions
            assert step.fits, f"request {built} is over the {window:,}-token window"
            assert any(task in t for t in _strings(step.request)), f"request {built}"
            live = step.session
        live = live.model_copy(update={"messages": [*live.messages, msg]})
    assert built == sum(1 for m in session.messages if m.role == "assistant")
    assert compactions >= 2
    assert missing(session, live) == []
