"""Context management the provider runs, asked for in the request (``server`` section).

The policy says which edits it wants; the model's catalog entry says which its provider
runs (``server_edits``). What both allow goes into ``options["server_edits"]`` in a
provider-neutral form, and each wire format renders its own shape: Anthropic's
``context_management.edits`` (with the beta headers they need), the OpenAI Responses API's
``context_management`` compaction. An edit rewrites the context from the first thing it
clears, so the provider writes the cached prefix again from there: each edit's decision
says so.
"""

from __future__ import annotations

from typing import Any

from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.runtime.trace import StepRun

#: Edit name → (policy path, what the provider does; for the decision).
_WHAT = {
    "clear_thinking": "drops the thinking of assistant turns older than the last {keep}",
    "clear_tool_uses": "clears tool results older than the last {keep} tool uses once the "
    "input exceeds {trigger:,} tokens",
    "compaction": "summarises the context once the input reaches {trigger:,} tokens",
}


def requested(plan: Plan) -> list[dict[str, Any]]:
    """The edits the policy enables, provider-neutral, in the order providers want them
    (Anthropic requires clear_thinking first)."""
    s = plan.settings.server
    out: list[dict[str, Any]] = []
    if s.clear_thinking.enabled:
        out.append({"edit": "clear_thinking", "keep": s.clear_thinking.keep_turns})
    if s.clear_tool_uses.enabled:
        c = s.clear_tool_uses
        out.append(
            {
                "edit": "clear_tool_uses",
                "trigger": c.trigger_tokens,
                "keep": c.keep_tool_uses,
                "clear_at_least": c.clear_at_least_tokens,
                "exclude_tools": list(c.exclude_tools),
                "clear_tool_inputs": c.clear_tool_inputs,
            }
        )
    if s.compaction.enabled:
        out.append(
            {
                "edit": "compaction",
                "trigger": s.compaction.trigger_tokens,
                "instructions": s.compaction.instructions,
            }
        )
    return out


def gated(plan: Plan) -> list[tuple[dict[str, Any], bool]]:
    """Each edit the policy asks for, in order, with whether the model's provider runs it:
    the one place the catalog's ``server_edits`` decides (runtime, simulate, verify)."""
    supported = set(plan.model.server_edits)
    return [(e, e["edit"] in supported) for e in requested(plan)]


def server_edits(run: StepRun) -> list[dict[str, Any]]:
    """The edits this step sends: the policy's, where the model's provider runs them. Each
    is a decision; an edit the model lacks is a warning and is not sent."""
    plan = run.plan
    sent = []
    for edit, runs in gated(plan):
        name = edit["edit"]
        setting = f"server.{name}"
        if not runs:
            run.decide(
                "cache",
                f"server.{name}.unsupported",
                setting,
                {"model": plan.model.id, "server_edits": sorted(plan.model.server_edits)},
                f"not sent: {plan.model.id} does not run {name} (catalog server_edits)",
                "warning",
            )
            continue
        what = _WHAT[name].format(keep=edit.get("keep"), trigger=edit.get("trigger") or 0)
        run.decide(
            "cache",
            f"server.{name}.send",
            setting,
            {k: v for k, v in edit.items() if k != "edit"},
            f"the provider {what}; the cached prefix is written again from the first "
            "thing it changes",
        )
        sent.append(edit)
    return sent
