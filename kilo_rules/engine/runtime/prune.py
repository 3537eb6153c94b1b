"""Pruning old tool outputs (spec §6, Kilo's ``compaction.prune``).

Pruning never deletes: it returns the ids of tool parts to mark ``time.compacted``; the
output stays in the session and can be restored, and the model sees a placeholder instead.
:func:`prune_session` is the public call: one prune of a session for a given reason, behind
the plan's gates, as the runtime runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from kilo_rules.engine.formats.session import Message, Session, ToolPart
from kilo_rules.engine.runtime.history import project
from kilo_rules.engine.runtime.trace import plan_caches

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan

Reason = Literal["normal", "post-compaction", "payload-limit"]
REASONS: tuple[Reason, ...] = get_args(Reason)


@dataclass(frozen=True, slots=True)
class PruneSettings:
    """``prune.*`` of the plan, per-step values evaluated."""

    enabled: bool
    normal: bool
    post_compaction: bool
    payload_limit: bool
    protect_turns: int
    protect_tokens: int
    minimum_tokens: int
    protected_tools: tuple[str, ...]

    def allows(self, reason: Reason) -> bool:
        """The gate (``compaction.ts@02bc3f2:326-327``): nothing when pruning is off, then
        the reason's own switch (kilo-default: normal only with ``config.compaction.prune:
        true``)."""
        if not self.enabled:
            return False
        return {
            "normal": self.normal,
            "post-compaction": self.post_compaction,
            "payload-limit": self.payload_limit,
        }[reason]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune pass decided.

    ``allowed`` is false when the reason's gate is closed (nothing was walked); ``parts``
    are the tool part ids to mark compacted, newest first (empty when the pass would free
    no more than the minimum); ``pruned_tokens`` is what marking them frees and
    ``protected_tokens`` what the walk kept. ``time`` is the mark time
    :func:`prune_session` chose, used by :meth:`mutations` when it is given none.
    """

    reason: Reason
    allowed: bool
    parts: tuple[str, ...] = ()
    pruned_tokens: int = 0
    protected_tokens: int = 0
    stopped_at: str | None = None
    notes: list[str] = field(default_factory=list)
    time: int | None = None

    @property
    def applied(self) -> bool:
        """Whether anything is marked."""
        return bool(self.parts)

    def mutations(self, now: int | None = None) -> list[dict[str, Any]]:
        """The ``mark_compacted`` mutations that persist this result, at ``now`` (default:
        :attr:`time`), as the runtime emits them."""
        at = self.time if now is None else now
        if at is None and self.parts:
            raise ValueError("a mark time is needed: pass now, or prune with prune_session")
        return [
            {"op": "mark_compacted", "part_id": pid, "time": at, "reason": self.reason}
            for pid in self.parts
        ]


def prune_settings(plan: Plan, context: Mapping[str, Any] | None = None) -> PruneSettings:
    """``prune.*`` of the plan. Values decided per step come from ``context`` (a step's
    evaluation context); without one they fall back to the policy model's defaults. The gates
    (``prune.enabled``, ``prune.reasons.*``) are decided when the plan compiles. A
    configured ``config.compaction.prune: false`` (``KILO_DISABLE_PRUNE``) switches pruning
    off, as Kilo's first gate does, whatever the policy says."""
    p, knobs = plan.settings.prune, plan.knobs
    protect, minimum = knobs.prune_protect_tokens, knobs.prune_minimum_tokens
    r = p.reasons
    return PruneSettings(
        enabled=p.enabled is True and plan.config.get("config.compaction.prune") is not False,
        normal=r.normal is True,
        post_compaction=r.post_compaction is True,
        payload_limit=r.payload_limit is True,
        protect_turns=p.protect_turns,
        protect_tokens=protect.value if context is None else protect.at(context),
        minimum_tokens=minimum.value if context is None else minimum.at(context),
        protected_tools=p.protected_tools,
    )


def prune(
    messages: Sequence[Message],
    settings: PruneSettings,
    count: Callable[[str], int],
    reason: Reason = "normal",
    *,
    exclude: frozenset[str] = frozenset(),
) -> PruneResult:
    """Walk newest → oldest and choose the tool outputs to mark (all or nothing).

    ``exclude`` lists part ids already chosen earlier in the same step."""
    if not settings.allows(reason):
        return PruneResult(reason, False, notes=[f"prune gate closed for reason {reason}"])
    turns = 0
    total = 0
    pruned = 0
    queued: list[str] = []
    stopped: str | None = None
    for msg in reversed(messages):
        if msg.role == "user":
            turns += 1
        if turns < settings.protect_turns:
            continue
        if msg.role == "assistant" and msg.summary:
            stopped = f"summary {msg.id}"
            break
        hit_compacted = False
        for part in reversed(msg.parts):
            if not isinstance(part, ToolPart) or part.status != "completed":
                continue
            if part.tool in settings.protected_tools:
                continue
            if part.time.compacted is not None or part.id in exclude:
                hit_compacted = True
                stopped = f"already compacted {part.id}"
                break
            tokens = count(part.output)
            total += tokens
            if total <= settings.protect_tokens:
                continue
            pruned += tokens
            queued.append(part.id)
        if hit_compacted:
            break
    if pruned > settings.minimum_tokens:
        return PruneResult(reason, True, tuple(queued), pruned, total - pruned, stopped)
    return PruneResult(
        reason,
        True,
        (),
        0,
        total,
        stopped,
        notes=[f"would free {pruned} tokens, not more than the minimum {settings.minimum_tokens}"],
    )


def prune_session(
    plan: Plan,
    session: Session,
    reason: Reason = "normal",
    *,
    now: int | None = None,
    count: Callable[[str], int] | None = None,
) -> PruneResult:
    """Prune ``session`` for ``reason`` as the runtime would, and return what to mark.

    The plan's gates decide first (``prune.enabled``, ``prune.reasons.*``, and
    ``config.compaction.prune: false``): a closed gate gives ``allowed=False`` and no parts.
    ``normal`` and ``payload-limit`` walk the stored messages, ``post-compaction`` the view
    the model sees after the newest summary, as the runtime does. Nothing is changed:
    ``result.mutations()`` are the ``mark_compacted`` mutations the runtime emits, to
    persist or to pass to :func:`~kilo_rules.apply_mutations`. ``now`` is the mark time in
    ms (default: the newest message's ``created``, else the clock, as ``apply_plan``
    chooses it); ``count`` the token counter (default: the plan's ``tokens.counter``).
    """
    if reason not in REASONS:
        raise ValueError(f"reason must be one of {', '.join(REASONS)}, not {reason!r}")
    messages = project(session.messages) if reason == "post-compaction" else session.messages
    if now is None:
        now = max((m.created for m in session.messages), default=0) or int(time.time() * 1000)
    counter = count if count is not None else plan_caches(plan).counter.count
    result = prune(messages, prune_settings(plan), counter, reason)
    return replace(result, time=now)


def apply_marks(messages: Sequence[Message], marks: dict[str, int]) -> list[Message]:
    """Copies of ``messages`` with the given tool parts marked compacted at their time."""
    if not marks:
        return list(messages)
    out = []
    for msg in messages:
        if not any(p.id in marks for p in msg.parts):
            out.append(msg)
            continue
        parts = []
        for p in msg.parts:
            if isinstance(p, ToolPart) and p.id in marks and p.time.compacted is None:
                p = p.model_copy(
                    update={"time": p.time.model_copy(update={"compacted": marks[p.id]})}
                )
            parts.append(p)
        out.append(msg.model_copy(update={"parts": parts}))
    return out
