"""Every wire API builds a step's body from the fragments of the steps before, and the body
is the one it renders from scratch, byte for byte.

The recorded sessions are replayed step by step (a request before each assistant message)
with one plan per wire API, so its fragments carry over as an agent's would; each body is
compared with ``render_json`` without fragments, and the messages rendered again at a
step are counted: the new ones and the few whose context changed (cache marks move to
the newest messages), never the history.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import Compiler
from kilo_rules.engine.formats.catalog import ModelInfo
from kilo_rules.engine.formats.request import (
    Approval,
    CacheMark,
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.providers import APIS, render, render_json
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.memo import Fragments

from .helpers import model

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "trajectories"
LOGS = [
    ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl",
    ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj",
    SHARED / "claude-code-opus46-spotter-8463c716.jsonl",
    SHARED / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json",
]
BIG = {"context": 2_000_000, "output": 64_000}  # no compaction: every step extends the last
MODELS: dict[str, ModelInfo] = {
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
    "openai-responses": model(
        id="o/r",
        provider="openai",
        api="openai-responses",
        api_id="gpt-5",
        family="gpt",
        limits=BIG,
    ),
    "gemini": model(
        id="g/m",
        provider="google",
        api="gemini",
        api_id="gemini-3-pro-preview",
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
    "copilot": model(
        id="c/m",
        provider="github-copilot",
        api="copilot",
        api_id="claude-sonnet-4.5",
        limits=BIG,
    ),
}
NOWHERE = "/nonexistent/kilo-rules-fragments"
STEP = StepInput(workspace=Workspace(cwd=NOWHERE, root=NOWHERE, home=f"{NOWHERE}/home"))
MAX_STEPS = 40  # the last steps of a session: where the history is longest
#: Messages rendered again at a step beyond the new ones: kilo-default's marks on the
#: newest messages move, and a message a mark leaves or reaches is a new object.
CONTEXT_CHANGED = 6


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


class Counting:
    """A fragment store that counts the messages it has rendered."""

    def __init__(self, inner: Any, made: list[int]) -> None:
        self._inner = inner
        self._made = made

    def turns(self, messages: Sequence[ModelMessage], api: str, make: Callable[[Any], Any]) -> Any:
        def counted(msg: ModelMessage) -> Any:
            self._made[0] += 1
            return make(msg)

        return self._inner.turns(messages, api, counted)


@cache
def _session(path: Path) -> Session:
    return read_session(path, run=0)


def _ends(session: Session) -> list[int]:
    ends = [i for i, m in enumerate(session.messages) if m.role == "assistant" and i > 0]
    return ends[-MAX_STEPS:]


def test_every_api_renders_from_fragments() -> None:
    assert set(MODELS) == set(APIS)


@pytest.mark.slow
@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name[:24])
@pytest.mark.parametrize("api", sorted(MODELS))
def test_a_replayed_session_renders_only_what_changed(
    api: str, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not log.exists():
        pytest.skip(f"{log} is not available (../shared is absent)")
    import kilo_rules.engine.providers as providers

    session = _session(log)
    # A compiler of its own: a plan another test warmed would hold fragments already.
    plan = Compiler().compile("kilo-default", MODELS[api])
    made = [0]
    real = providers.render_json

    def counting(request: ModelRequest, wire: str, fragments: Any = None) -> bytes:
        return real(request, wire, Counting(fragments, made) if fragments is not None else None)

    monkeypatch.setattr(providers, "render_json", counting)
    per_step: list[tuple[int, int, int]] = []  # (rendered, new messages, conversation)
    seen = 0
    for k, end in enumerate(_ends(session)):
        made[0] = 0
        result = apply_plan(
            plan, session.model_copy(update={"messages": session.messages[:end]}), STEP
        )
        request = result.model_request
        assert result.wire == render_json(request, api)
        assert result.body() == _dumps(render(request, api))
        conversation = len(request.conversation)
        if k:
            per_step.append((made[0], conversation - seen, conversation))
        else:  # the first step renders every message, once: the API keeps fragments
            assert conversation <= made[0] <= len(request.messages)
        seen = conversation
    assert per_step
    for rendered, new, conversation in per_step:
        assert rendered <= max(new, 0) + CONTEXT_CHANGED, (rendered, new, conversation)
    # The history is not among them: on a long conversation a step renders a fraction.
    assert all(
        rendered < conversation / 4 for rendered, _, conversation in per_step if conversation >= 100
    )


MARK = CacheMark()
HOUR = CacheMark(ttl="1h")
PDF = "JVBERi0xLjQK"


def _pool() -> list[ModelMessage]:
    """Messages with every kind of thing a renderer reads across messages: calls with and
    without signatures (Gemini signs the first call of a merged model turn), consecutive
    turns of one role (merged), approval parts and a message of no parts (the approval
    rule), documents of one name (Bedrock numbers them per request), marks, reasoning."""
    call = ToolCall("c1", "read", {"path": "a"})
    signed = ToolCall("c2", "read", {"path": "b"}, signature="sig-g", origin="google")
    return [
        ModelMessage("user", (Text("question \u00e9"),)),
        ModelMessage("user", ()),
        ModelMessage("user", (Text("marked", cache=MARK),), cache=HOUR),
        ModelMessage("assistant", (Text("hello"),)),
        ModelMessage("assistant", (Reasoning("think", signature="s", origin="anthropic"), call)),
        ModelMessage("assistant", (Text("  "), signed)),
        ModelMessage("assistant", (Text("ask"), Approval("ap1", "c1"))),
        ModelMessage("assistant", (Approval("ap2", "c2"),)),
        ModelMessage(
            "assistant",
            (Reasoning("r", encrypted="enc", origin="openai"), Text("after", cache=MARK)),
        ),
        ModelMessage("tool", (ToolResult("c1", "read", (Text("out"),)),)),
        ModelMessage(
            "tool",
            (ToolResult("c2", "read", (Media("application/pdf", data=PDF, filename="d.pdf"),)),),
            cache=MARK,
        ),
        ModelMessage("user", (Media("application/pdf", data=PDF, filename="d.pdf"),)),
        ModelMessage("user", (Media("image/png", data="iVBORw0KGgo="), Text("see"))),
    ]


#: Request variants per API: every option and model fact a renderer reads per message.
VARIANTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "anthropic": [("claude-x", {})],
    "bedrock": [("anthropic.claude-sonnet-4-5", {}), ("meta.llama4", {})],
    "openai": [("gpt-4.1", {}), ("gpt-5.6", {"prompt_cache_breakpoints": True})],
    "openai-compatible": [("m", {}), ("m", {"reasoning_field": "reasoning_content"})],
    "copilot": [("claude-sonnet-4.5", {})],
    "openai-responses": [
        ("gpt-5", {}),
        ("gpt-5.6", {"prompt_cache_breakpoints": True, "system_as_instructions": False}),
    ],
    "gemini": [("gemini-2.5-pro", {}), ("gemini-3-pro-preview", {})],
}


@pytest.mark.parametrize("api", sorted(VARIANTS))
def test_fragments_give_the_whole_render_for_any_neighbours(api: str) -> None:
    """The same message objects in many orders and neighbourhoods, and under every
    variant, with one fragment store: each body is the one rendered from scratch."""
    assert set(VARIANTS) == set(APIS)
    pool = _pool()
    system = ModelMessage("system", (Text("system prompt"), Approval("ap0", "c0")))
    rng = random.Random(30)
    fragments = Fragments()
    for _ in range(150):
        model_id, options = rng.choice(VARIANTS[api])
        messages = rng.sample(pool, rng.randint(1, len(pool)))
        if rng.random() < 0.5:
            messages.insert(0, system)
        request = ModelRequest(model=model_id, messages=tuple(messages), options=options)
        expected = _dumps(render(request, api))
        assert render_json(request, api, fragments).decode() == expected, messages
