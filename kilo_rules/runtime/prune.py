"""Pruning old tool outputs (spec §6, Kilo's ``compaction.prune``).

Pruning never deletes: it returns the ids of tool parts to mark ``time.compacted``; the
output stays in the session and can be restored, and the model sees a placeholder instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..policy import Prune, default
from ..session import Message, ToolPart

if TYPE_CHECKING:
    from ..plan import Plan

Reason = Literal["normal", "post-compaction", "payload-limit"]


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
        """The gate (``compaction.ts@02bc3f2:326-327``): normal pruning is opt-in."""
        if not self.enabled:
            return False
        return {
            "normal": self.normal,
            "post-compaction": self.post_compaction,
            "payload-limit": self.payload_limit,
        }[reason]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune pass decided."""

    reason: Reason
    allowed: bool
    parts: tuple[str, ...] = ()  # tool part ids to mark compacted
    pruned_tokens: int = 0
    protected_tokens: int = 0
    stopped_at: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        """Whether anything is marked."""
        return bool(self.parts)

    def mutations(self, now: int) -> list[dict[str, Any]]:
        """The mutations that persist this result."""
        return [
            {"op": "mark_compacted", "part_id": pid, "time": now, "reason": self.reason}
            for pid in self.parts
        ]


def prune_settings(plan: Plan, context: Mapping[str, Any] | None = None) -> PruneSettings:
    """``prune.*`` of the plan. Values decided per step come from ``context`` (a step's
    evaluation context); without one they fall back to the model's defaults. A configured
    ``config.compaction.prune: false`` (``KILO_DISABLE_PRUNE``) switches pruning off."""
    p = plan.settings.prune

    def num(name: str) -> int:
        if context is not None and context.get(f"prune.{name}") is not None:
            return int(context[f"prune.{name}"])
        value = getattr(p, name)
        return value if isinstance(value, int) else int(default(Prune, name))

    return PruneSettings(
        enabled=p.enabled and plan.config.get("config.compaction.prune") is not False,
        normal=p.reasons.normal,
        post_compaction=p.reasons.post_compaction,
        payload_limit=p.reasons.payload_limit,
        protect_turns=p.protect_turns,
        protect_tokens=num("protect_tokens"),
        minimum_tokens=num("minimum_tokens"),
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
