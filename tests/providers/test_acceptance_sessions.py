"""Real sessions replayed step by step: no body the runtime builds breaks an acceptance rule.

Every recorded session is replayed the way an agent drives the engine (``Runtime.step``
before each recorded assistant message, compaction included; see
``tests/compaction/replay.py``) under kilo-default, for every wire API, at a small and at
a very large window. Each body sent is run through :func:`check_body` (with the window,
the model and where each signature came from) and through the SDK/schema check; a body
the runtime built and dropped (it compacted instead) gets the check every test's bodies
get (``tests/conftest.py``).

One replay per (session, model, window): the runtime's decisions depend on the model and
not only on the window (the cache gate and placement, media in tool results and the
system prompt follow the model's provider and id, and they change the measured size and
so where compaction happens), so a replay's requests cannot be re-rendered for another
API without changing what is being tested.

A test reports every violation of its (model, window) at once, grouped by rule with a
few examples, before it fails. Steps where the runtime raises a typed error
(``ContextOverflowError``, e.g. compaction exhausted), or that are still over the window
after ``simulate.MAX_OVERFLOW_RETRIES`` overflows, are counted, not hidden: the step is
skipped, the recorded message is appended without usage (no provider answered) and the
replay goes on. Bodies over the window are checked too, except for the window rule. The
counts of every run are also kept in pytest's cache under ``acceptance/<model>/<window>``
(``pytest --cache-show 'acceptance/*/*'``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from wire_checks import check

from kilo_rules.engine.base.errors import ContextOverflowError, Diagnostic
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.session import Message, Session, TokenUsage
from kilo_rules.engine.importers import import_file
from kilo_rules.engine.providers import signature_issuer
from kilo_rules.engine.providers.acceptance import BodyContext, check_body
from kilo_rules.engine.runtime.facade import Runtime, StepResult
from kilo_rules.engine.runtime.measure import JsonCache, measure
from kilo_rules.engine.summarizers import ExtractiveSummarizer
from kilo_rules.engine.text.tokens import estimate
from kilo_rules.tools.simulation.simulate import MAX_OVERFLOW_RETRIES, without_recorded_compactions
from tests.runtime.helpers import model

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "trajectories"
OPENHANDS = SHARED / "openhands-llama4-multiswebench-output.jsonl"
SESSIONS: list[tuple[Path, int | None]] = [
    (ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl", None),
    (ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj", None),
    (SHARED / "claude-code-opus46-spotter-8463c716.jsonl", None),
    (OPENHANDS, 0),
    (OPENHANDS, 1),
    (OPENHANDS, 2),
    (SHARED / "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json", None),
    (SHARED / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json", None),
]
WINDOWS = {
    "32k": {"context": 32_000, "output": 4_096},
    "2M": {"context": 2_000_000, "output": 64_000},
}
# As in tests/runtime/test_trajectories.py, plus Gemini 3 (its calls need signatures).
MODELS: dict[str, dict[str, Any]] = {
    "anthropic": {},
    "bedrock": {
        "id": "b/m",
        "provider": "amazon-bedrock",
        "api": "bedrock",
        "api_id": "anthropic.claude-sonnet-4-5",
    },
    "openai": {
        "id": "o/m",
        "provider": "openai",
        "api": "openai",
        "api_id": "gpt-4.1",
        "family": "gpt",
    },
    "gemini": {
        "id": "g/m",
        "provider": "google",
        "api": "gemini",
        "api_id": "gemini-2.5-pro",
        "family": "gemini",
    },
    "gemini-3": {
        "id": "g3/m",
        "provider": "google",
        "api": "gemini",
        "api_id": "gemini-3-pro-preview",
        "family": "gemini",
    },
    "openai-compatible": {
        "id": "r/m",
        "provider": "openrouter",
        "api": "openai-compatible",
        "api_id": "anthropic/claude-sonnet-4.5",
    },
    "openai-responses": {
        "id": "or/m",
        "provider": "openai",
        "api": "openai-responses",
        "api_id": "gpt-5-codex",
        "family": "gpt",
    },
    "copilot": {
        "id": "c/m",
        "provider": "github-copilot",
        "api": "copilot",
        "api_id": "claude-sonnet-4.5",
    },
}
EXAMPLES = 3  # per rule in a report


def _name(log: tuple[Path, int | None]) -> str:
    path, run = log
    return path.name if run is None else f"{path.name}#run{run}"


@cache
def _session(path: Path, run: int | None) -> Session:
    return without_recorded_compactions(import_file(path, run=run))


def _issuers(session: Session) -> dict[str, str]:
    """Signature (or encrypted reasoning) → the vendor of the model that wrote it."""
    out: dict[str, str] = {}
    for msg in session.messages:
        issuer = signature_issuer(msg.model)
        if issuer is None:
            continue
        for part in msg.parts:
            held = [getattr(part, "signature", None), getattr(part, "encrypted", None)]
            held.append(getattr(part, "metadata", {}).get("thought_signature"))
            out.update((s, issuer) for s in held if isinstance(s, str) and s)
    return out


@dataclass(frozen=True)
class Sent:
    """A body the runtime built for step ``step`` (the recorded assistant message it
    answers, counted from 1); ``rejected``: larger than the window, so the replay's
    provider refuses it (an overflow, handled by compaction) and the step is built again."""

    step: int
    message_id: str
    result: StepResult
    input_tokens: int
    rejected: bool = False


@dataclass(frozen=True)
class Failed:
    """A step the runtime refused with a typed error."""

    step: int
    message_id: str
    code: str


def request_tokens(result: StepResult, cache: JsonCache) -> int:
    """``tests/compaction/replay.py::request_tokens`` (the runtime's own measure of the
    built request, raw estimate), with the JSON of each message cached across steps."""
    req = result.model_request
    return measure(req.messages, req.tools, factor=1.0, counter=estimate, cache=cache).raw


def _append(session: Session, msg: Message) -> Session:
    return session.model_copy(update={"messages": [*session.messages, msg]})


def sent_bodies(original: Session, plan: Plan) -> Iterator[Sent | Failed]:
    """Every request body an agent would send while replaying ``original`` under ``plan``,
    step by step (the loop of ``tests/compaction/replay.py``, yielding each step)."""
    window = plan.model.limits.context
    runtime = Runtime(plan, ExtractiveSummarizer())
    cache = JsonCache(estimate)
    live = original.model_copy(update={"messages": []})
    step = 0
    for msg in original.messages:
        if msg.role != "assistant":
            live = _append(live, msg)
            continue
        step += 1
        try:
            result = runtime.step(live)
            size = request_tokens(result, cache)
            overflows = 0
            while size > window:  # the provider rejects it: compact in overflow mode, retry
                yield Sent(step, msg.id, result, size, rejected=True)
                overflows += 1
                if overflows > MAX_OVERFLOW_RETRIES:  # stuck, as simulate() declares it
                    raise ContextOverflowError(Diagnostic("simulate.overflow-retries", msg.id))
                runtime.overflowed(result.session)
                result = runtime.step(result.session)
                size = request_tokens(result, cache)
        except ContextOverflowError as exc:
            code = exc.diagnostics[0].code if exc.diagnostics else "error"
            yield Failed(step, msg.id, code)
            live = _append(live, msg.model_copy(update={"tokens": None}))
            continue
        yield Sent(step, msg.id, result, size)
        output = msg.tokens.output if msg.tokens else 0
        usage = TokenUsage(input=size, output=output)
        live = _append(result.session, msg.model_copy(update={"tokens": usage}))


@dataclass
class Report:
    """What the replays of one (model, window) found."""

    bodies: int = 0
    rejected: int = 0
    dropped: int = 0  # built, then compacted instead of sent: checked without the window
    errors: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def render(self, title: str) -> str:
        lines = [
            f"{title}: {self.bodies} bodies, {self.rejected} over the window (provider "
            f"overflows), {self.dropped} built and dropped for a compaction, "
            f"{sum(self.errors.values())} steps refused with a typed error",
        ]
        lines.extend(f"  typed errors in {where}: {n}" for where, n in sorted(self.errors.items()))
        for rule, found in sorted(self.violations.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {rule}: {len(found)}")
            lines.extend(f"    {example}" for example in found[:EXAMPLES])
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "bodies": self.bodies,
            "rejected": self.rejected,
            "dropped": self.dropped,
            "errors": dict(self.errors),
            "violations": {rule: len(found) for rule, found in sorted(self.violations.items())},
        }


# The key of the conversation list in each wire API's body.
TURNS_KEY = {"gemini": "contents", "openai-responses": "input"}


class WireCheck:
    """``wire_checks.check`` over the bodies of one replay, each distinct message once.

    The SDK types and the schemas constrain each message on its own (no rule spans two
    messages), so a body is valid exactly when its top level is valid with each of its
    messages; a step's body is checked with only the messages no earlier body had (or
    its last one). That keeps the check linear in the session instead of quadratic."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, body: dict[str, Any], api: str) -> None:
        key = TURNS_KEY.get(api, "messages")
        turns = body.get(key) or []
        fresh = []
        for turn in turns:
            text = json.dumps(turn, sort_keys=True)
            if text not in self.seen:
                self.seen.add(text)
                fresh.append(turn)
        check({**body, key: fresh or turns[-1:]}, api)


def _check(
    report: Report, where: str, sent: Sent, plan: Plan, issuers: dict[str, str], wire: WireCheck
) -> None:
    body, api = sent.result.request, sent.result.provider
    report.bodies += 1
    report.rejected += sent.rejected
    context = BodyContext(
        model=plan.model.api_id,
        # A rejected body is over the window by construction (that is the overflow the
        # replay models); every other rule still holds for it.
        context_window=None if sent.rejected else plan.model.limits.context,
        input_tokens=sent.input_tokens,
        signature_issuers=issuers,
    )
    for v in check_body(body, api, context):
        report.violations[v.rule].append(f"{where} {v.path}: {v.message}")
    try:
        wire(body, api)
    except Exception as exc:  # the SDK types and the JSON Schemas raise different types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        report.violations["wire-schema"].append(f"{where}: {first}")


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, str, str]]:
    """Every body rendered from now on, as (body, wire API, model), in order.

    The test takes the conftest's check of every body over: a body a step returns gets
    :func:`_check` (the window, the token count, the signature issuers: a stricter
    context), and one the runtime built and dropped (the request it compacted instead of
    sending) gets the conftest's check, so no body goes unchecked and none twice."""
    import kilo_rules.engine.providers as providers

    render_json = providers.render_json
    built: list[tuple[bytes, str, str]] = []

    def recorded(model_request: Any, api: str, fragments: Any = None) -> bytes:
        text = render_json(model_request, api, fragments)
        built.append((text, api, model_request.model))
        return text

    monkeypatch.setattr(providers, "render_json", recorded)
    return built


def _check_dropped(
    report: Report, where: str, built: list[tuple[bytes, str, str]], sent: Sent | Failed
) -> None:
    """The conftest's check on the bodies built since the last step but not returned."""
    returned = sent.result.wire if isinstance(sent, Sent) else None
    for text, api, model_id in built:
        if text is returned:
            continue
        report.dropped += 1
        for v in check_body(json.loads(text), api, BodyContext(model_id)):
            report.violations[v.rule].append(f"{where} (a dropped body) {v.path}: {v.message}")
    built.clear()


@pytest.mark.checks_every_body
@pytest.mark.slow
@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("name", list(MODELS))
def test_replayed_sessions_send_only_acceptable_bodies(
    name: str, window: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    present = [log for log in SESSIONS if log[0].exists()]
    if not present:
        pytest.skip("no recorded sessions available")
    plan = compile_policy("kilo-default", model(limits=WINDOWS[window], **MODELS[name]))
    report = Report()
    built = _recording(monkeypatch)
    for log in present:
        session = _session(*log)
        issuers, wire = _issuers(session), WireCheck()
        for item in sent_bodies(session, plan):
            _check_dropped(report, f"{_name(log)} step {item.step}", built, item)
            if isinstance(item, Failed):
                report.errors[f"{_name(log)}: {item.code}"] += 1
                continue
            retry = " (over the window)" if item.rejected else ""
            where = f"{_name(log)} step {item.step}{retry} [{item.message_id}]"
            _check(report, where, item, plan, issuers, wire)
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        cache.set(f"acceptance/{name}/{window}", report.to_json())
    assert report.bodies > 0
    if report.violations:
        pytest.fail(report.render(f"{name} at {window}"), pytrace=False)


def test_a_dropped_body_is_checked_and_a_returned_one_left_to_check() -> None:
    # A tool result with no call before it breaks result-has-call on every API.
    bad = json.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
            ],
        }
    ).encode()
    report = Report()
    _check_dropped(
        report, "s step 1", [(bad, "anthropic", "claude-sonnet-4-5")], Failed(1, "m", "x")
    )
    assert report.dropped == 1 and "result-has-call" in report.violations
    returned = Sent(1, "m", cast(StepResult, SimpleNamespace(wire=bad)), 0)
    again, built = Report(), [(bad, "anthropic", "claude-sonnet-4-5")]
    _check_dropped(again, "s step 1", built, returned)
    assert again.dropped == 0 and not again.violations and built == []
