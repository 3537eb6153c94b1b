"""Replaying a recorded session step by step under a plan, with the runtime facade.

The recorded messages are fed in the order the agent wrote them. Before each assistant
message the runtime builds the request the agent would have sent; the assistant message is
then appended with the usage a provider would have reported *for that request* (its
estimated input plus the recorded output), because the recorded usage belongs to the
original, uncompacted context. A request larger than the window is rejected the way a
provider would (``Runtime.overflowed``) and the step is retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.session import Message, Session, TokenUsage
from kilo_rules.engine.runtime.apply import last_finished, usage_count
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.runtime.history import project
from kilo_rules.engine.runtime.measure import measure
from kilo_rules.engine.runtime.mutations import apply_mutations
from kilo_rules.engine.summarizers.protocol import Summarizer
from kilo_rules.engine.text.tokens import estimate


@dataclass
class Replay:
    """What happened during a replay."""

    steps: int = 0
    compactions: int = 0
    provider_overflows: int = 0
    max_request: int = 0
    mutations: list[dict[str, Any]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)  # trigger disagreed with Kilo's rule
    recorded: list[Message] = field(default_factory=list)  # the log as this run wrote it
    session: Session | None = None


def request_tokens(result: Any) -> int:
    """Estimated input of a built request: messages (system included) and tools."""
    req = result.model_request
    return measure(req.messages, req.tools, factor=1.0, counter=estimate).raw


def preempted(result: Any) -> bool:
    """The step compacted because its request could not fit (``overflow.unfit: compact``)."""
    return any(
        d.stage == "guards" and d.rule == "window" and d.result == "compact"
        for d in result.decisions
    )


def _kilo_says_compact(plan: Plan, session: Session) -> bool:
    view = project(session.messages)
    done = [m for m in view if m.role == "assistant" and m.finish is not None]
    if not done or max(done, key=lambda m: (m.created, m.id)).summary:
        return False
    last = last_finished(view)
    fields = plan.settings.overflow.count
    return last is not None and usage_count(last.tokens, fields) >= plan.value("overflow.limit")


def replay(original: Session, plan: Plan, summarizer: Summarizer) -> Replay:
    """Grow ``original`` message by message under ``plan``; see the module docstring."""
    window = plan.model.limits.context
    runtime = Runtime(plan, summarizer)
    out = Replay()
    live = original.model_copy(update={"messages": []})
    for msg in original.messages:
        if msg.role == "user":
            live = live.model_copy(update={"messages": [*live.messages, msg]})
            out.recorded.append(msg)
            continue
        expected = _kilo_says_compact(plan, live)
        result = runtime.step(live)
        if preempted(result):
            # Kilo would have sent it, had it refused and compacted in overflow mode: the
            # runtime ran that compaction without the round trip.
            out.provider_overflows += 1
        elif (result.compactions > 0) != expected:
            out.mismatches.append(f"{msg.id}: compacted={result.compactions} expected={expected}")
        size = request_tokens(result)
        # A provider refuses a request whose input plus output cap exceed the window.
        while size + (result.model_request.max_tokens or 0) > window:
            out.provider_overflows += 1
            out.compactions += result.compactions
            out.mutations.extend(result.mutations)
            runtime.overflowed(result.session)
            result = runtime.step(result.session)
            size = request_tokens(result)
        out.steps += 1
        out.compactions += result.compactions
        out.mutations.extend(result.mutations)
        out.max_request = max(out.max_request, size)
        output = msg.tokens.output if msg.tokens else 0
        answered: Message = msg.model_copy(update={"tokens": TokenUsage(input=size, output=output)})
        out.recorded.append(answered)
        live = result.session.model_copy(update={"messages": [*result.session.messages, answered]})
    out.session = live
    return out


def persisted(original: Session, report: Replay) -> Session:
    """The final session rebuilt from nothing but the recorded messages and the mutations
    (proves the mutations alone persist everything the runtime decided)."""
    base = original.model_copy(update={"messages": report.recorded})
    return apply_mutations(base, report.mutations)
