"""``apply_plan``: one step of one turn → the provider request, the decisions, the mutations.

The stages run in Kilo's order (docs/architecture.md, "Apply"): project history, inject
per-turn content, lower parts, guards (payload bytes, overflow), system prompt, cache
markers, output cap, render. The function is pure: the session is never changed; what
should be persisted is returned as ``mutations``. Every stage records what it decided, with
the policy location of the rule, in ``decisions`` (``schemas/decisions.v1.json``).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.cancel import checkpoint
from kilo_rules.engine.compiler.plan import CapDecision
from kilo_rules.engine.formats.request import ModelMessage, ModelRequest, Text, ToolSpec
from kilo_rules.engine.formats.session import Message, Session
from kilo_rules.engine.providers.serversim import refuses
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.guards import json_list_bytes, overflow, preflight, saving, unfit
from kilo_rules.engine.runtime.history import completed_compactions, project
from kilo_rules.engine.runtime.inject import InjectSettings, inject
from kilo_rules.engine.runtime.lower import lower, lower_settings
from kilo_rules.engine.runtime.measure import Measure, Piece, last_of_role, measure
from kilo_rules.engine.runtime.mutations import apply_mutations
from kilo_rules.engine.runtime.output import cap_output
from kilo_rules.engine.runtime.prune import apply_marks, prune, prune_settings
from kilo_rules.engine.runtime.system import build_system, step_instructions
from kilo_rules.engine.runtime.trace import Decision, StepRun, last_finished, usage_count

__all__ = [
    "STAGES",
    "Decision",
    "StepResult",
    "StepState",
    "apply_plan",
    "last_finished",
    "run",
    "usage_count",
]

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan


def exceeds(input_tokens: int, output: int | None, window: int) -> bool:
    """Input plus the output cap over a known window: the test providers apply
    (:func:`~kilo_rules.engine.providers.serversim.refuses`, the one rule simulate replays too)."""
    return refuses(input_tokens, output, window)


@dataclass(frozen=True)
class StepResult:
    """What one step produces, from :func:`apply_plan` or
    :meth:`~kilo_rules.engine.runtime.facade.Runtime.step` alike: the request to send, every
    decision and mutation of the step, and ``session`` with those mutations applied.

    From :meth:`Runtime.step <kilo_rules.engine.runtime.facade.Runtime.step>`, ``decisions`` and
    ``mutations`` include those of the normal prune and of every compaction the step ran
    (counted in ``compactions``); the other fields describe the request finally built.

    The request is held as the bytes it is sent as (``wire``: compact JSON in UTF-8),
    assembled from immutable message fragments the plan keeps across steps; :meth:`body`
    is those bytes decoded, and ``request`` that text parsed, each on first use, into
    objects of this result's own. So nothing a caller does to ``request`` reaches the
    plan's caches or the next step's request, and a caller that sends ``wire`` pays for
    neither a text nor a dict."""

    wire: bytes  # the provider's wire JSON, compact, UTF-8: the bytes sent
    provider: str
    decisions: list[Decision]
    mutations: list[dict[str, Any]]
    model_request: ModelRequest
    # "overflow" / "preflight" when Kilo would compact, "window" when the request cannot fit
    compaction_needed: str | None = None
    #: The request's input as the plan's counter measures it (system and tools included,
    #: no safety factor) or, when larger, the usage the provider reported for the last step;
    #: and the model's context window (0: unknown).
    input_tokens: int = 0
    context: int = 0
    counter: str = "estimate"  # the token counter that measured it
    #: The policy revision the step ran on, when a
    #: :class:`~kilo_rules.tools.serving.store.PolicyStore` built it (one snapshot for the whole
    #: step); None for a plan applied directly.
    revision: str | None = None
    #: HTTP headers the request needs besides the usual ones (``anthropic-beta`` for the
    #: context edits it asks for); empty for most requests.
    headers: dict[str, str] = field(default_factory=dict)
    #: The session handed in with ``mutations`` applied: what to persist, and the session
    #: to pass to the next step once the model's answer is appended.
    session: Session = field(kw_only=True, repr=False, compare=False)
    #: Compactions run before the request was built (only :meth:`Runtime.step` runs them).
    compactions: int = field(default=0, kw_only=True)
    _decoded: dict[str, Any] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )
    _text: str | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    @property
    def request(self) -> dict[str, Any]:
        """The provider's wire JSON as a dict: ``wire`` decoded once per result (this
        result's own objects, which the caller may change freely)."""
        decoded = self._decoded
        if decoded is None:
            decoded = json.loads(self.body())
            object.__setattr__(self, "_decoded", decoded)  # a frozen result's lazy cache
        return decoded

    @property
    def turn(self) -> StepResult:
        """Deprecated: the result itself, which carries the final request's fields
        (``provider``, ``model_request``, ``input_tokens``, ``fits``…)."""
        warnings.warn(
            "StepResult.turn is deprecated: read the fields on the result itself "
            "(result.provider, result.model_request, result.fits)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self

    @property
    def fits(self) -> bool:
        """False when input plus the output cap sent exceed the context window.

        Providers refuse such a request as too long (Anthropic and OpenAI count the output
        cap against the window), so sending it only costs a round trip."""
        return not exceeds(self.input_tokens, self.model_request.max_tokens, self.context)

    @property
    def warnings(self) -> list[Decision]:
        """Decisions of severity warning."""
        return [d for d in self.decisions if d.severity == "warning"]

    def body(self) -> str:
        """The request as the text sent over HTTP (compact JSON; ``wire`` decoded once)."""
        text = self._text
        if text is None:
            text = self.wire.decode("utf-8", "surrogatepass")
            object.__setattr__(self, "_text", text)  # a frozen result's lazy cache
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "provider": self.provider,
            "request": self.request,
            "decisions": [d.to_json() for d in self.decisions],
            "mutations": self.mutations,
            "compaction_needed": self.compaction_needed,
            # Only when set: a plan applied directly gives the same document as before.
            **({"revision": self.revision} if self.revision is not None else {}),
            **({"headers": self.headers} if self.headers else {}),
        }


@dataclass
class StepState:
    """What the stages of one step hand on to each other, in the order they fill it in.

    ``run(plan, session, step, until="lower")`` stops after a named stage and returns this
    state, so a test can pin what one stage produced."""

    run: StepRun
    now: int
    messages: list[Message]
    view: list[Message] = field(default_factory=list)
    has_summary: bool = False
    lowered: list[ModelMessage] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)  # the lowered messages' JSON
    size: int = 0  # bytes of the message JSON
    tools: tuple[ToolSpec, ...] = ()
    context: dict[str, Any] = field(default_factory=dict)  # per-step policy values
    compaction_needed: str | None = None
    system: list[ModelMessage] = field(default_factory=list)
    conversation: list[ModelMessage] = field(default_factory=list)
    measured: Measure | None = None
    reported: int | None = None  # usage the provider reported for the last step
    cap: CapDecision | None = None
    request: ModelRequest | None = None
    input_tokens: int = 0
    provider: str = ""
    wire: bytes = b""  # the rendered body, compact JSON in UTF-8
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> dict[str, Any]:
        """The rendered body as a dict of its own (``wire`` decoded; empty before render)."""
        return json.loads(self.wire.decode("utf-8", "surrogatepass")) if self.wire else {}


def _project(st: StepState) -> None:
    st.view = project(st.messages)
    st.has_summary = bool(completed_compactions(st.view)) or any(
        m.summary and m.finish for m in st.view
    )


def _inject(st: StepState) -> list[dict[str, Any]]:
    r = st.run
    env, reminders = r.plan.settings.environment, r.plan.settings.reminders
    settings = InjectSettings(
        dynamic_fields=env.dynamic,
        tag=env.tag,
        plan_mode=reminders.plan_mode,
        build_switch=reminders.build_switch,
        interjection=reminders.interjection,
    )
    st.view, mutations, decided = inject(st.view, r.step, settings)
    r.mutations.extend(mutations)
    return decided


def _lower(st: StepState) -> list[dict[str, Any]]:
    r = st.run
    settings = lower_settings(r.plan, has_summary=st.has_summary)
    st.lowered = lower(st.view, settings, r.lower_cache, r.lower_lists, r.memo_key)
    ins, files = step_instructions(r)
    found: list[dict[str, Any]] = []
    if ins.on_demand and ins.project_files:
        from kilo_rules.engine.runtime.ondemand import attach

        loaded = {f.path for f in files}
        st.lowered, found = attach(
            st.lowered, ins.project_files, loaded, r.step.workspace, r.ondemand, r.memo_key
        )
    st.pieces = r.json.plain_list(st.lowered)
    st.size = json_list_bytes(st.pieces)
    return found


def _record_injected(r: StepRun, decided: Sequence[dict[str, Any]]) -> None:
    for d in decided:
        rule = str(d.pop("rule"))
        severity = "warning" if "warning" in d else "info"
        r.decide("inject", rule, _INJECT_SETTINGS.get(rule.split(".")[0]), {}, d, severity)


def stage_history(st: StepState) -> None:
    """Drop what precedes the last completed summary; the summary before the tail."""
    _project(st)
    st.run.decide(
        "history",
        "project",
        None,
        {"messages": len(st.messages)},
        {"visible": len(st.view), "summary": st.has_summary},
    )


def stage_inject(st: StepState) -> None:
    """The per-turn environment block, mode reminders, interjections."""
    _record_injected(st.run, _inject(st))


def stage_lower(st: StepState) -> None:
    """Session parts → provider-neutral messages; on-demand instruction files."""
    _record_injected(st.run, _lower(st))


def stage_guards(st: StepState) -> None:
    """The payload byte limit (prune once and rebuild), then the overflow checks."""
    r, plan = st.run, st.run.plan
    # The step's values, evaluated on the request as lowered; again only if the payload
    # guard rebuilt it.
    ctx = plan.context(_dynamic_names(r, st.view, st.lowered, st.pieces, st.size))
    max_bytes = plan.knobs.payload_max_bytes.at(ctx) or 0
    if max_bytes and st.size > max_bytes and _payload_limit(st, max_bytes, ctx):
        ctx = plan.context(_dynamic_names(r, st.view, st.lowered, st.pieces, st.size))
    st.tools = tuple(ToolSpec(t.name, t.description, dict(t.input_schema)) for t in r.session.tools)
    st.context = ctx
    st.compaction_needed = overflow(r, st.view, st.context)


def _payload_limit(st: StepState, max_bytes: int, ctx: Mapping[str, Any]) -> bool:
    """The payload guard's action; True when it pruned and rebuilt the request."""
    r, plan = st.run, st.run.plan
    action = plan.settings.payload.on_exceed
    decided = {"bytes": st.size, "limit": max_bytes}
    if action == "error":
        from kilo_rules.engine.base.errors import ContextOverflowError, Diagnostic

        raise ContextOverflowError(
            Diagnostic(
                "runtime.payload",
                f"request messages are {st.size:,} bytes, over the limit of {max_bytes:,}",
                plan.locate("payload.on_exceed"),
                hint="raise payload.max_bytes, or use on_exceed: prune-once",
            )
        )
    if action != "prune-once":
        r.decide("guards", "payload-limit", "payload.max_bytes", decided, "sent anyway", "warning")
        return False
    settings = prune_settings(plan, ctx)
    result = prune(st.messages, settings, r.counter.count, "payload-limit")
    saved = saving(st.messages, set(result.parts), r)
    if not result.applied or saved <= 0:
        r.decide(
            "guards",
            "payload-limit",
            "payload.max_bytes",
            decided,
            {"pruned": 0, "why": "pruning cannot help", "notes": result.notes},
            "warning",
        )
        return False
    st.messages = apply_marks(st.messages, dict.fromkeys(result.parts, st.now))
    r.mutations.extend(result.mutations(st.now))
    # Rebuilt without a second trace or second environment mutations: this step has them.
    mutations = len(r.mutations)
    _project(st)
    _inject(st)
    _lower(st)
    del r.mutations[mutations:]
    r.decide(
        "guards",
        "payload-limit",
        "payload.max_bytes",
        decided,
        {"pruned_parts": len(result.parts), "bytes_after": st.size},
        "warning" if st.size > max_bytes else "info",
    )
    return True


def stage_system(st: StepState) -> None:
    """The system prompt layers; the max-steps prompt at the end of the conversation."""
    r, step = st.run, st.run.step
    st.system = [ModelMessage("system", (Text(b),)) for b in build_system(r, st.view, st.context)]
    st.conversation = list(st.lowered)
    reminders = r.plan.settings.reminders
    if step.max_steps is not None and step.step >= step.max_steps and reminders.max_steps:
        role = reminders.max_steps_role
        st.conversation.append(ModelMessage(role, (Text(reminders.max_steps),)))
        r.decide(
            "inject",
            "max_steps",
            "reminders.max_steps",
            {"step": step.step, "max_steps": step.max_steps},
            role,
        )


def stage_output(st: StepState) -> None:
    """The output cap, measured on the whole message list, system included."""
    r, plan = st.run, st.run.plan
    configured = _configured_output(r, st.context)
    st.measured = m = measure(
        [*st.system, *st.conversation],
        st.tools,
        factor=plan.settings.tokens.preflight_factor,
        counter=r.counter.count,
        cache=r.json,
    )
    if st.compaction_needed is None:  # Kilo measures with the system prompt (spec §4)
        st.compaction_needed = preflight(r, m, st.context)
    last = last_finished(st.view)
    if last and not last.summary:
        st.reported = usage_count(last.tokens, plan.settings.overflow.count)
    st.cap = cap = cap_output(
        configured,
        context=plan.model.limits.context,
        normalized=m.normalized,
        media=m.media,
        reported=st.reported or None,
        settings=plan.cap_settings(),
    )
    r.decide(
        "output",
        f"cap.{cap.rule}",
        "output.cap",
        {
            "configured": configured,
            "context": plan.model.limits.context,
            "normalized": m.normalized,
            "media": m.media,
            "reported": st.reported,
        },
        cap.value,
    )
    # The provider's view of the size: the plain count, without the preflight factor, or
    # what the provider reported for the last step when that is more (this request holds
    # all of that one and its answer).
    st.input_tokens = max(m.chars + m.extra + m.tools, st.reported or 0)


def stage_cache(st: StepState) -> None:
    """The request, with the cache breakpoints the policy places for this provider and
    the context management it asks the provider to run."""
    from kilo_rules.engine.runtime.cache import place_markers
    from kilo_rules.engine.runtime.server import server_edits

    r, plan, step = st.run, st.run.plan, st.run.step
    assert st.cap is not None
    # One switch: automatic caching asked either way turns on the top-level field and
    # keeps explicit breakpoints out (Kilo: the merged options' cacheControl).
    automatic = step.automatic_caching or bool(step.options.get("automatic_cache"))
    edits = server_edits(r)
    request = ModelRequest(
        model=plan.model.api_id,
        messages=(*st.system, *st.conversation),
        tools=st.tools,
        max_tokens=st.cap.value,
        options={
            "output_limit": plan.model.limits.output or None,
            **({"reasoning": True} if plan.model.reasoning else {}),
            **({"prompt_cache_breakpoints": True} if plan.caching.shape == "explicit" else {}),
            **({"automatic_cache": True} if automatic else {}),
            **({"server_edits": edits} if edits else {}),
            **step.options,
        },
    )
    settings = plan.cache_settings(automatic_enabled=automatic)
    st.request, decided = place_markers(request, settings, r.marks, r.memo_key)
    for d in decided:
        rest = {k: v for k, v in d.items() if k not in ("rule", "action", "reason")}
        severity = "warning" if d.get("action") == "warn" else "info"
        rule = f"{d.get('rule', 'cache')}.{d.get('action', 'mark')}"
        r.decide("cache", rule, "cache.rule", rest, d.get("reason"), severity)


def stage_window(st: StepState) -> None:
    """A request whose input and output cap exceed the window is not sent as it is."""
    window = st.run.plan.model.limits.context
    output = st.cap.value if st.cap is not None else None
    if st.compaction_needed is None and exceeds(st.input_tokens, output, window):
        st.compaction_needed = unfit(st.run, st.input_tokens, output, window)


def stage_render(st: StepState) -> None:
    """The provider's wire JSON, and the headers it needs."""
    from kilo_rules.engine.providers import headers, render_json

    assert st.request is not None
    st.provider = st.run.step.provider or st.run.plan.model.api
    st.wire = render_json(st.request, st.provider, st.run.fragments)
    st.headers = headers(st.request, st.provider)
    st.run.decide("render", st.provider, None, {"messages": len(st.request.messages)}, "rendered")


#: The runtime's stages by name; the plan's ``stages`` (compile's ``RUNTIME_STAGES``) say
#: in which order ``apply`` runs them.
STAGES: Mapping[str, Callable[[StepState], None]] = MappingProxyType(
    {
        "history": stage_history,
        "inject": stage_inject,
        "lower": stage_lower,
        "guards": stage_guards,
        "system": stage_system,
        "output": stage_output,
        "cache": stage_cache,
        "window": stage_window,
        "render": stage_render,
    }
)


def run(
    plan: Plan, session: Session, step: StepInput | None = None, *, until: str | None = None
) -> StepState:
    """Run the plan's stages for the next step of ``session``, stopping after ``until``."""
    if until is not None and until not in plan.stages:
        raise ValueError(f"unknown stage {until!r}; stages: {', '.join(plan.stages)}")
    step = step or StepInput()
    r = StepRun(plan, session, step)
    now = r.facts.latest or int(time.time() * 1000)
    st = StepState(r, now, list(session.messages))
    for name in plan.stages:
        checkpoint()  # a build its caller gave up on stops here (kilo_rules.engine.base.cancel)
        STAGES[name](st)
        if name == until:
            break
    return st


def apply_plan(plan: Plan, session: Session, step: StepInput | None = None) -> StepResult:
    """Run every stage of ``plan`` for the next step of ``session``: the request, and
    whether Kilo would compact first (``compaction_needed``), without compacting
    (:class:`~kilo_rules.engine.runtime.facade.Runtime` closes that loop)."""
    st = run(plan, session, step)
    r = st.run
    assert st.request is not None
    return StepResult(
        st.wire,
        st.provider,
        r.decisions,
        r.mutations,
        st.request,
        st.compaction_needed,
        st.input_tokens,
        r.plan.model.limits.context,
        str(getattr(r.counter, "name", "estimate")),
        headers=st.headers,
        session=apply_mutations(session, r.mutations),
    )


def __getattr__(name: str) -> Any:
    # The name of StepResult before apply_plan and Runtime.step shared one result type.
    if name == "TurnResult":
        warnings.warn(
            "TurnResult is deprecated: use StepResult (kilo_rules.StepResult)",
            DeprecationWarning,
            stacklevel=2,
        )
        return StepResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_INJECT_SETTINGS = {
    "environment": "environment.dynamic",
    "on_demand": "system.instructions.on_demand",
    "reminder": "reminders",
    "interjection": "reminders.interjection",
}


def _dynamic_names(
    r: StepRun,
    view: Sequence[Message],
    lowered: Sequence[ModelMessage],
    pieces: Sequence[Piece],
    size: int,
) -> dict[str, Any]:
    last = last_finished(view)
    t = last.tokens if last else None
    step = r.step
    last_user = last_of_role(lowered, "user")
    return {
        "session.turns": r.facts.turns,
        "session.messages": r.facts.messages,
        "session.compactions": r.facts.compactions,
        "session.has_summary": r.facts.has_summary,
        "session.last.input": t.input if t else 0,
        "session.last.output": t.output if t else 0,
        "session.last.reasoning": t.reasoning if t else 0,
        "session.last.cache_read": t.cache.read if t else 0,
        "session.last.cache_write": t.cache.write if t else 0,
        "session.last.total": (t.total or 0) if t else 0,
        "session.last.count": usage_count(t, r.plan.settings.overflow.count),
        "request.estimated_tokens": r.json.count(pieces),
        "request.bytes": size,
        "request.media": sum(1 for m in lowered for p in m.parts if p.kind == "media"),
        "request.mid_tool_loop": any(m.role == "tool" for m in lowered[last_user + 1 :]),
        "request.step": step.step,
        "request.max_steps": step.max_steps,
        "agent.name": step.agent.name,
        "agent.has_prompt": bool(step.agent.prompt),
        "agent.skills_enabled": step.agent.skills_enabled,
        "agent.task_enabled": step.agent.task_enabled,
        "env.platform": step.workspace.platform,
        "env.cwd": step.workspace.cwd,
    }


def _configured_output(r: StepRun, ctx: dict[str, Any]) -> int | None:
    knobs = r.plan.knobs
    if knobs.output_send.at(ctx) is False:
        r.decide("output", "send", "output.send", {}, "no cap is sent")
        return None
    return knobs.output_configured.at(ctx)
