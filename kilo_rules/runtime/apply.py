"""``Plan.apply``: one step of one turn → the provider request, the decisions, the mutations.

The stages run in Kilo's order (DESIGN.md §2): project history, inject per-turn content,
lower parts, guards (payload bytes, overflow), system prompt, cache markers, output cap,
render. The function is pure: the session is never changed; what should be persisted is
returned as ``mutations``. Every stage records what it decided, with the policy location
of the rule, in ``decisions`` (``schemas/decisions.v1.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..request import ModelMessage, ModelRequest, Text, ToolSpec
from ..session import Message, Session
from .context import StepInput
from .guards import json_list_bytes, overflow, saving, unfit
from .history import completed_compactions, project
from .inject import InjectSettings, inject
from .lower import LowerSettings, lower
from .measure import count_json_list, measure
from .output import cap_output
from .prune import apply_marks, prune, prune_settings
from .system import build_system, step_instructions
from .trace import Decision, StepRun, count_fields, last_finished, usage_count

__all__ = ["Decision", "TurnResult", "apply_plan", "last_finished", "usage_count"]

if TYPE_CHECKING:
    from ..plan import Plan


@dataclass(frozen=True)
class TurnResult:
    """What one step produces."""

    request: dict[str, Any]  # the provider's wire JSON
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

    @property
    def fits(self) -> bool:
        """False when input plus the output cap sent exceed the context window.

        Providers refuse such a request as too long (Anthropic and OpenAI count the output
        cap against the window), so sending it only costs a round trip."""
        output = self.model_request.max_tokens or 0
        return not self.context or self.input_tokens + output <= self.context

    @property
    def warnings(self) -> list[Decision]:
        """Decisions of severity warning."""
        return [d for d in self.decisions if d.severity == "warning"]

    def body(self) -> str:
        """The request as the bytes sent over HTTP (compact JSON)."""
        return json.dumps(self.request, ensure_ascii=False, separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "provider": self.provider,
            "request": self.request,
            "decisions": [d.to_json() for d in self.decisions],
            "mutations": self.mutations,
            "compaction_needed": self.compaction_needed,
        }


def _lower_settings(r: StepRun, has_summary: bool) -> LowerSettings:
    plan = r.plan
    table = r.setting("lowering.media_in_tool_results", {}) or {}
    media_ok = table.get(plan.model.provider, plan.model.media_in_tool_results)
    return LowerSettings(
        placeholder=r.setting("prune.placeholder", "[Old tool result content cleared]"),
        compaction_request=r.setting("compaction.summary.request_text", "What did we do so far?"),
        media_in_tool_results=bool(media_ok),
        strip_historical_media=has_summary
        and bool(r.setting("lowering.strip_media_after_summary")),
        media_placeholder=r.setting("lowering.media_placeholder", "[Attached {mime}: {name}]"),
        drop_errored_assistant=bool(r.setting("lowering.drop_errored_assistant", True)),
    )


def _build_messages(
    r: StepRun, messages: Sequence[Message]
) -> tuple[list[ModelMessage], list[Message], bool, list[dict[str, Any]], list[dict[str, Any]]]:
    view = project(messages)
    has_summary = bool(completed_compactions(view)) or any(m.summary and m.finish for m in view)
    inject_settings = InjectSettings(
        dynamic_fields=tuple(r.setting("environment.dynamic", [])),
        tag=r.setting("environment.tag", "environment_details"),
        plan_mode=r.setting("reminders.plan_mode"),
        build_switch=r.setting("reminders.build_switch"),
        interjection=r.setting("reminders.interjection"),
    )
    view, muts, ds = inject(view, r.step, inject_settings)
    lowered = lower(view, _lower_settings(r, has_summary), r.lower_cache)
    ins, files = step_instructions(r)
    if ins.on_demand and ins.project_files:
        from .ondemand import attach

        lowered, found = attach(lowered, ins.project_files, set(files), r.step.workspace)
        ds = [*ds, *found]
    return lowered, view, has_summary, muts, ds


def apply_plan(plan: Plan, session: Session, step: StepInput | None = None) -> TurnResult:
    """Run every stage of ``plan`` for the next step of ``session``."""
    step = step or StepInput()
    r = StepRun(plan, session, step)
    now = max((m.created for m in session.messages), default=0) or int(time.time() * 1000)

    # 1-3. history, injection, lowering
    messages = list(session.messages)
    lowered, view, has_summary, env_muts, inject_ds = _build_messages(r, messages)
    r.decide(
        "history",
        "project",
        None,
        {"messages": len(messages)},
        {"visible": len(view), "summary": has_summary},
    )
    r.mutations.extend(env_muts)
    for d in inject_ds:
        rule = str(d.pop("rule"))
        r.decide("inject", rule, _INJECT_SETTINGS.get(rule.split(".")[0]), {}, d)

    # 4. guards: payload bytes
    max_bytes = int(plan.static_context.get("payload.max_bytes") or 0)
    pieces = [r.json.plain(m) for m in lowered]
    size = json_list_bytes(pieces)
    if max_bytes and size > max_bytes:
        action = r.setting("payload.on_exceed", "prune-once")
        decided = {"bytes": size, "limit": max_bytes}
        if action == "error":
            from ..errors import ContextOverflowError, Diagnostic

            raise ContextOverflowError(
                Diagnostic(
                    "runtime.payload",
                    f"request messages are {size:,} bytes, over the limit of {max_bytes:,}",
                    plan.locate("payload.on_exceed"),
                    hint="raise payload.max_bytes, or use on_exceed: prune-once",
                )
            )
        if action == "prune-once":
            early = plan.context(_dynamic_names(r, view, lowered, pieces, size))
            settings = prune_settings(plan, early)
            result = prune(messages, settings, r.counter.count, "payload-limit")
            saved = saving(messages, set(result.parts), r)
            if not result.applied or saved <= 0:
                r.decide(
                    "guards",
                    "payload-limit",
                    "payload.max_bytes",
                    decided,
                    {"pruned": 0, "why": "pruning cannot help", "notes": result.notes},
                    "warning",
                )
            else:
                marks = dict.fromkeys(result.parts, now)
                messages = apply_marks(messages, marks)
                r.mutations.extend(result.mutations(now))
                lowered, view, has_summary, env_muts, _ = _build_messages(r, messages)
                pieces = [r.json.plain(m) for m in lowered]
                size = json_list_bytes(pieces)
                r.decide(
                    "guards",
                    "payload-limit",
                    "payload.max_bytes",
                    decided,
                    {"pruned_parts": len(result.parts), "bytes_after": size},
                    "warning" if size > max_bytes else "info",
                )
        else:
            r.decide(
                "guards", "payload-limit", "payload.max_bytes", decided, "sent anyway", "warning"
            )

    # 4b. guards: overflow on the last finished assistant, preflight estimate
    tools = tuple(ToolSpec(t.name, t.description, dict(t.input_schema)) for t in session.tools)
    dynamic = _dynamic_names(r, view, lowered, pieces, size)
    ctx = plan.context(dynamic)
    compaction_needed = overflow(r, view, lowered, tools, ctx)

    # 5. system prompt
    system_blocks = build_system(r, view, ctx)
    system_msgs = [ModelMessage("system", (Text(b),)) for b in system_blocks]
    conversation = list(lowered)
    if (
        step.max_steps is not None
        and step.step >= step.max_steps
        and r.setting("reminders.max_steps")
    ):
        role = r.setting("reminders.max_steps_role", "assistant")
        conversation.append(ModelMessage(role, (Text(r.setting("reminders.max_steps")),)))
        r.decide(
            "inject",
            "max_steps",
            "reminders.max_steps",
            {"step": step.step, "max_steps": step.max_steps},
            role,
        )

    # 7. output cap (measured on the whole message list, system included)
    all_msgs = [*system_msgs, *conversation]
    configured = _configured_output(r, ctx)
    m = measure(
        all_msgs,
        tools,
        factor=float(r.setting("tokens.preflight_factor", 1.3)),
        counter=r.counter.count,
        cache=r.json,
    )
    last = last_finished(view)
    reported = usage_count(last.tokens, count_fields(r)) if last and not last.summary else None
    cap = cap_output(
        configured,
        context=plan.model.limits.context,
        normalized=m.normalized,
        media=m.media,
        reported=reported or None,
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
            "reported": reported,
        },
        cap.value,
    )

    # 6. cache markers
    from .cache import place_markers

    request = ModelRequest(
        model=plan.model.api_id,
        messages=tuple(all_msgs),
        tools=tools,
        max_tokens=cap.value,
        options={
            "output_limit": plan.model.limits.output or None,
            **({"prompt_cache_breakpoints": True} if plan.cache.get("shape") == "explicit" else {}),
            **step.options,
        },
    )
    request, cache_ds = place_markers(
        request, plan.cache_settings(automatic_enabled=step.automatic_caching)
    )
    for d in cache_ds:
        rest = {k: v for k, v in d.items() if k not in ("rule", "action", "reason")}
        severity = "warning" if d.get("action") == "warn" else "info"
        rule = f"{d.get('rule', 'cache')}.{d.get('action', 'mark')}"
        r.decide("cache", rule, "cache.rule", rest, d.get("reason"), severity)

    # The provider's view of the size: the plain count, without the preflight factor, or
    # what the provider reported for the last step when that is more (this request holds
    # all of that one and its answer).
    input_tokens = max(m.chars + m.extra + m.tools, reported or 0)
    window = plan.model.limits.context
    if compaction_needed is None and window and input_tokens + (cap.value or 0) > window:
        compaction_needed = unfit(r, input_tokens, cap.value, window)

    # 8. render
    from ..providers import render

    provider = step.provider or plan.model.api
    body = render(request, provider)
    r.decide("render", provider, None, {"messages": len(request.messages)}, "rendered")
    return TurnResult(
        body,
        provider,
        r.decisions,
        r.mutations,
        request,
        compaction_needed,
        input_tokens,
        window,
        str(getattr(r.counter, "name", "estimate")),
    )


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
    pieces: Sequence[str],
    size: int,
) -> dict[str, Any]:
    from .history import turns

    last = last_finished(view)
    t = last.tokens if last else None
    step = r.step
    last_user = max((i for i, m in enumerate(lowered) if m.role == "user"), default=-1)
    return {
        "session.turns": len(turns(r.session.messages)),
        "session.messages": len(r.session.messages),
        "session.compactions": len(completed_compactions(r.session.messages)),
        "session.has_summary": any(m.summary and m.finish for m in r.session.messages),
        "session.last.input": t.input if t else 0,
        "session.last.output": t.output if t else 0,
        "session.last.reasoning": t.reasoning if t else 0,
        "session.last.cache_read": t.cache.read if t else 0,
        "session.last.cache_write": t.cache.write if t else 0,
        "session.last.total": (t.total or 0) if t else 0,
        "session.last.count": usage_count(t, count_fields(r)),
        "request.estimated_tokens": count_json_list(pieces, r.counter.count),
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
    send = ctx.get("output.send", True)
    if send is False:
        r.decide("output", "send", "output.send", {}, "no cap is sent")
        return None
    value = ctx.get("output.configured")
    return int(value) if value is not None else None
