r"""Per-step state shared by the runtime stages: the decisions trace and the settings.

A :class:`StepRun` is made once per ``apply_plan`` call. It records :class:`Decision`\ s
with the policy location of the rule behind each, reads the effective policy, and holds
the plan-level caches (token counter, per-message JSON, lowering, rendered wire text).

The plan-level caches (:class:`PlanCaches`) are the runtime's, not the plan's: a compiled
plan is frozen and holds no mutable state, so :func:`plan_caches` keeps them in a map of
its own, keyed by the plan's identity and held only as long as the plan lives (a weak
reference drops the entry when the plan is collected). The map is thus bounded by the
plans alive, which the compiler's bounded plan cache bounds in turn, and each cache in
it is bounded itself. A lock makes building a plan's caches happen once, whichever
threads step on it first; the caches themselves are thread-safe.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.errors import Location
from kilo_rules.engine.formats.session import Message, Session, TokenUsage
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.lower import lowering_key
from kilo_rules.engine.runtime.measure import JsonCache
from kilo_rules.engine.runtime.memo import ContentMemo, FactsMemo, Fragments, PrefixMemo
from kilo_rules.engine.runtime.ondemand import OnDemandMemo
from kilo_rules.engine.text.tokens import CountCache, EstimateCounter, TokenCounter, counter_for

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan


@dataclass(frozen=True, slots=True)
class Decision:
    """One entry of the decisions trace."""

    stage: str
    rule: str
    at: Location | None  # where the rule is written in the policy
    inputs: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    severity: str = "info"

    def to_json(self) -> dict[str, Any]:
        at = str(self.at) if self.at is not None else None
        out: dict[str, Any] = {"stage": self.stage, "rule": self.rule, "at": at}
        if self.inputs:
            out["inputs"] = self.inputs
        out["result"] = self.result
        if self.severity != "info":
            out["severity"] = self.severity
        return out


def usage_count(tokens: TokenUsage | None, fields: Sequence[str]) -> int:
    """Kilo's overflow count: the listed usage fields, or the provider total if they sum
    to 0 (``kilocode/session/overflow.ts@030412e:71-74``)."""
    if tokens is None:
        return 0
    values = {
        "input": tokens.input,
        "output": tokens.output,
        "reasoning": tokens.reasoning,
        "cache_read": tokens.cache.read,
        "cache_write": tokens.cache.write,
    }
    total = sum(values[f] for f in fields)
    return total or (tokens.total or 0)


def last_finished(messages: Sequence[Message]) -> Message | None:
    """The chronologically newest finished assistant message, summaries included (Kilo's
    ``lastFinished``). After a compaction it is the summary, whose usage is not checked
    for overflow nor reported to the output cap: it describes the old, larger context."""
    done = [m for m in messages if m.role == "assistant" and m.finish is not None]
    return max(done, key=lambda m: (m.created, m.id)) if done else None


def plan_counter(plan: Plan) -> tuple[TokenCounter, str | None]:
    """The counter ``tokens.*`` names (``model``: the model's catalog tokenizer), and a
    warning when it falls back to the estimate."""
    t = plan.settings.tokens
    spec = plan.model.tokenizer if t.counter == "model" else t.counter
    return counter_for(spec, factor=t.safety_factor, chars_per_token=t.chars_per_token)


@dataclass(frozen=True, slots=True)
class PlanCaches:
    """What one step leaves for the next on the same plan (see :func:`plan_caches`)."""

    counter: TokenCounter  # a CountCache around an exact counter
    warning: str | None  # why the policy's counter could not be used
    json: JsonCache  # per-message JSON and token counts
    lower: ContentMemo[Any, Any]  # lowered messages per session message
    lower_lists: PrefixMemo[Any, Any]  # the same, along the message list lowered last
    marks: PrefixMemo[Any, Any]  # the cache marks in each message of the request
    fragments: Fragments  # rendered wire text per lowered message and wire API
    facts: FactsMemo  # the session-wide facts, read on from the list seen last
    ondemand: OnDemandMemo  # the on-demand instruction walk, carried on from the last step


# id(plan) -> (a weak reference to the plan, its caches). Keyed by identity: two equal
# plans are still two plans, and a plan's hash would read every field.
_PLAN_CACHES: dict[int, tuple[weakref.ref[Plan], PlanCaches]] = {}
_PLAN_CACHES_LOCK = threading.Lock()


def _forget(key: int) -> None:
    # No lock: the collector may call this while this very thread holds it, and one
    # dict.pop is atomic. It runs before the plan's memory (and so its id) is reused.
    _PLAN_CACHES.pop(key, None)


def plan_caches(plan: Plan) -> PlanCaches:
    """The caches steps on ``plan`` share: built on first use, kept while the plan lives."""
    key = id(plan)
    hit = _PLAN_CACHES.get(key)
    if hit is not None and hit[0]() is plan:
        return hit[1]
    with _PLAN_CACHES_LOCK:
        hit = _PLAN_CACHES.get(key)
        if hit is not None and hit[0]() is plan:
            return hit[1]
        counter, warning = plan_counter(plan)
        if not isinstance(counter, EstimateCounter):
            counter = CountCache(counter)  # count each message once, not every step
        caches = PlanCaches(
            counter,
            warning,
            JsonCache(counter.count),
            ContentMemo(lowering_key),
            PrefixMemo(),
            PrefixMemo(),
            Fragments(),
            FactsMemo(),
            OnDemandMemo(),
        )
        _PLAN_CACHES[key] = (weakref.ref(plan, lambda _: _forget(key)), caches)
        return caches


def cached_plans() -> int:
    """How many plans have caches kept (each a plan still alive)."""
    return len(_PLAN_CACHES)


class StepRun:
    """State of one apply call."""

    def __init__(self, plan: Plan, session: Session, step: StepInput) -> None:
        self.plan = plan
        self.session = session
        self.step = step
        self.decisions: list[Decision] = []
        #: Lookups shared by several stages of this step (e.g. instruction files).
        self.cached: dict[str, Any] = {}
        self.mutations: list[dict[str, Any]] = []
        caches = plan_caches(plan)
        self.counter = caches.counter
        warning = caches.warning
        self.json = caches.json
        self.lower_cache = caches.lower
        self.lower_lists = caches.lower_lists
        self.marks = caches.marks
        self.fragments = caches.fragments
        self.ondemand = caches.ondemand
        #: The session-wide facts (``session.*`` values, the newest time), read once.
        self.facts = caches.facts.facts(session.messages)
        #: Where the per-session memos (lowering, on-demand, marks) keep this session's list.
        self.memo_key = ("session", session.id)
        if warning:
            self.decide("lower", "tokens.counter", "tokens.counter", {}, warning, "warning")

    def decide(
        self,
        stage: str,
        rule: str,
        setting: str | None,
        inputs: dict[str, Any],
        result: Any,
        severity: str = "info",
    ) -> None:
        self.decisions.append(
            Decision(stage, rule, self.plan.where(setting), inputs, result, severity)
        )
