"""Guards before a request is sent (spec §3, §4, §8 step 6).

* The payload byte guard: when the message JSON is over ``payload.max_bytes``, prune with
  reason ``payload-limit`` once (after checking that pruning can help at all), rebuild,
  and send with a warning if it is still too big.
* The overflow check on the newest finished assistant's usage, and the preflight estimate
  of the request about to be sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.formats.session import Message
from kilo_rules.engine.runtime.measure import Measure, Piece
from kilo_rules.engine.runtime.trace import StepRun, last_finished, usage_count

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan


def json_list_bytes(pieces: Sequence[Piece]) -> int:
    """UTF-8 size of the JSON list of ``pieces`` (Kilo's payload measure), from the
    pieces' sizes, so the whole body is never built."""
    return sum(p.size for p in pieces) + max(len(pieces) - 1, 0) + 2


def saving(messages: Sequence[Message], parts: set[str], r: StepRun) -> int:
    from kilo_rules.engine.formats.session import ToolPart

    placeholder = len(r.plan.settings.prune.placeholder.encode())
    saved = 0
    for msg in messages:
        for p in msg.parts:
            if isinstance(p, ToolPart) and p.id in parts:
                saved += len(p.output.encode("utf-8", "surrogatepass")) - placeholder
    return saved


def compacts_automatically(r: StepRun) -> bool:
    """Whether the policy (and the environment) let the runtime compact on its own."""
    return _automatic(r.plan)


def _automatic(plan: Plan) -> bool:
    s = plan.settings
    if not s.overflow.auto or not s.compaction.auto:
        return False
    return plan.config.get("config.compaction.auto") is not False  # KILO_DISABLE_AUTOCOMPACT


def unfit(r: StepRun, input_tokens: int, output: int | None, window: int) -> str | None:
    """The request does not fit: ``"window"`` when the policy compacts before sending it.

    A provider refuses a request whose input plus output cap exceed the window, and Kilo
    then compacts in overflow mode; ``overflow.unfit: compact`` does that compaction
    without the round trip that cannot succeed, ``send`` sends it as Kilo does."""
    action = r.plan.settings.overflow.unfit
    auto = compacts_automatically(r)
    result = action if auto or action == "send" else "send: automatic compaction is off"
    r.decide(
        "guards",
        "window",
        "overflow.unfit",
        {"input": input_tokens, "output": output, "context": window},
        result,
        "warning",
    )
    return "window" if result == "compact" else None


def compaction_limit(plan: Plan, ctx: Mapping[str, Any]) -> int | None:
    """The context size at which ``plan`` compacts (``overflow.limit``, else
    ``budget.usable``, evaluated in ``ctx``), or None when it never compacts on its own.
    The overflow check and the preflight compare against it; reports show it."""
    if not _automatic(plan) or plan.model.limits.context == 0:
        return None
    return plan.knobs.compaction_limit.at(ctx)


def _limit(r: StepRun, ctx: dict[str, Any]) -> int | None:
    return compaction_limit(r.plan, ctx)


def overflow(r: StepRun, view: Sequence[Message], ctx: dict[str, Any]) -> str | None:
    """``"overflow"`` when the newest finished answer's usage reached the limit (Kilo's
    ``isOverflow``, spec §3), else None."""
    plan = r.plan
    limit = _limit(r, ctx)
    if limit is None:
        return None
    last = last_finished(view)
    if last is not None and not last.summary:
        count = usage_count(last.tokens, plan.settings.overflow.count)
        cmp = plan.settings.overflow.comparison
        over = count >= limit if cmp == ">=" else count > limit
        r.decide(
            "guards",
            "overflow",
            "overflow.limit",
            {"count": count, "limit": limit, "comparison": cmp, "message": last.id},
            over,
        )
        if over:
            return "overflow"
    return None


def preflight(r: StepRun, m: Measure, ctx: dict[str, Any]) -> str | None:
    """``"preflight"`` when the estimate of the request about to be sent reached the limit
    (Kilo's ``shouldCompact``, spec §4). ``m`` measures the whole message list, the
    leading system messages included, as Kilo's ``measure`` does."""
    limit = _limit(r, ctx)
    if limit is None or not r.plan.knobs.preflight_enabled.at(ctx):
        return None
    inputs = {"normalized": m.normalized, "limit": limit}
    if m.continuation and r.plan.settings.overflow.preflight.skip_mid_tool_loop:
        r.decide(
            "guards", "preflight", "overflow.preflight.enabled", inputs, "skipped: mid tool loop"
        )
        return None
    over = m.normalized >= limit
    r.decide("guards", "preflight", "overflow.preflight.enabled", inputs, over)
    return "preflight" if over else None
