"""The output-token cap (spec §2 and §5, Kilo's ``maxOutputTokens`` and ``capOutputTokens``)."""

from __future__ import annotations

from kilo_rules.engine.compiler.plan import CapDecision
from kilo_rules.engine.formats.policy import OutputCap


def max_output_tokens(limit_output: int, maximum: int) -> int:
    """``min(limit.output, max) || max``: a model with no output limit gets ``max``."""
    return min(limit_output, maximum) or maximum


def cap_output(
    configured: int | None,
    *,
    context: int,
    normalized: int,
    media: int,
    reported: int | None,
    settings: OutputCap,
) -> CapDecision:
    """Kilo's capOutputTokens decision table (``kilocode/session/llm.ts@1716922:58-81``)."""
    if configured is None:
        return CapDecision(None, "configured-unset")
    if configured <= 0:
        return CapDecision(None, "configured-non-positive")
    if not settings.enabled or not context:
        return CapDecision(configured, "no-context" if settings.enabled else "cap-disabled")
    estimated = normalized + media * settings.media_reserve
    tokens = max(reported or 0, estimated)
    available = context - tokens - settings.safety
    if available <= 0:
        # The provider should reject with an overflow, which triggers compaction.
        return CapDecision(configured, "nothing-left", estimated, tokens, available)
    if available >= configured:
        return CapDecision(configured, "fits", estimated, tokens, available)
    return CapDecision(max(settings.minimum, available), "capped", estimated, tokens, available)
