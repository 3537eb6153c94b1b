"""Real recorded sessions through every provider: the requests kilo-default builds pass the
official SDK request types (Anthropic, OpenAI) and the documented shapes (Bedrock, Gemini),
and the turn result follows ``schemas/decisions.v1.json``."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema
import pytest

from kilo_rules import read_session
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput

from ..providers.wire_checks import check
from .helpers import model

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "trajectories"
LOGS = [
    ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl",
    ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj",
    SHARED / "claude-code-opus46-spotter-8463c716.jsonl",
    SHARED / "openhands-llama4-multiswebench-output.jsonl",
    SHARED / "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json",
    SHARED / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json",
]
BIG = {"context": 2_000_000, "output": 64_000}
MODELS = {
    "anthropic": model(limits=BIG),
    "bedrock": model(
        id="b/m",
        provider="amazon-bedrock",
        api="bedrock",
        api_id="anthropic.claude-sonnet-4-5",
        limits=BIG,
    ),
    "openai": model(
        id="o/m", provider="openai", api="openai", api_id="gpt-4.1", family="gpt", limits=BIG
    ),
    "gemini": model(
        id="g/m",
        provider="google",
        api="gemini",
        api_id="gemini-2.5-pro",
        family="gemini",
        limits=BIG,
    ),
    "openai-compatible": model(
        id="r/m",
        provider="openrouter",
        api="openai-compatible",
        api_id="anthropic/claude-sonnet-4.5",
        limits=BIG,
    ),
}
DECISIONS = json.loads((ROOT / "schemas" / "decisions.v1.json").read_text(encoding="utf-8"))


@cache
def _session(path: Path) -> Session:
    return read_session(path, run=0)  # run 0 of the OpenHands output, on purpose


@pytest.mark.slow
@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
@pytest.mark.parametrize("api", list(MODELS))
def test_real_session_renders_valid_requests(log: Path, api: str) -> None:
    if not log.exists():
        pytest.skip(f"{log} is not available (../shared is absent)")
    session = _session(log)
    plan = compile_policy("kilo-default", MODELS[api])
    result = apply_plan(plan, session, StepInput())
    check(result.request, api)
    jsonschema.validate(result.to_json(), DECISIONS)
    assert result.body() == apply_plan(plan, session, StepInput()).body()


@pytest.mark.parametrize("policy", ["local-small", "cache-max"])
def test_other_bundled_policies_render_valid_requests(policy: str) -> None:
    session = _session(LOGS[0])
    for api, m in MODELS.items():
        result = apply_plan(compile_policy(policy, m), session, StepInput())
        check(result.request, api)
        jsonschema.validate(result.to_json(), DECISIONS)
