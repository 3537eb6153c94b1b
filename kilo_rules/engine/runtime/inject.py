"""Per-step content injected at the tail (spec §8 steps 3–4, 8).

* The dynamic environment block: a synthetic ``<environment_details>`` text part on every
  user message that lacks one, built from that message's own creation time and agent, so
  the block of a message never changes afterwards (Kilo's ``EnvCache``). New blocks come
  back as mutations so the agent can persist them; a persisted block is reused verbatim.
* Mode reminders on the last user message (plan mode, the switch from plan to build).
* Interjection wrapping of a user message sent while the agent was in a tool loop.
* The max-steps prompt as a trailing message on the last allowed step.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kilo_rules.engine.formats.session import Message, TextPart
from kilo_rules.engine.runtime.context import StepInput

ENV_MARK = "environment"


@dataclass(frozen=True, slots=True)
class InjectSettings:
    """What injection needs from the plan."""

    dynamic_fields: tuple[str, ...] = ()
    tag: str = "environment_details"
    plan_mode: str | None = None
    build_switch: str | None = None
    interjection: str | None = None


def is_env_part(part: object) -> bool:
    """A persisted (or injected) environment block."""
    return (
        isinstance(part, TextPart)
        and part.synthetic
        and part.metadata.get("kilo_rules") == ENV_MARK
    )


def _stamp(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def env_block(msg: Message, step: StepInput, settings: InjectSettings) -> str:
    """The environment block of ``msg``: only facts fixed when the message was written."""
    ws = step.workspace
    lines = []
    for f in settings.dynamic_fields:
        if f == "time" or f == "date":
            lines.append(f"Current time: {_stamp(msg.created)}")
        elif f == "mode":
            lines.append(f"Current mode: {msg.agent or step.agent.name}")
        elif f == "visible_files":
            lines.append("Visible files: " + (", ".join(ws.visible_files) or "(none)"))
        elif f == "open_files":
            lines.append("Open tabs: " + (", ".join(ws.open_files) or "(none)"))
        elif f == "working_directory":
            lines.append(f"Working directory: {ws.cwd}")
        elif f == "platform":
            lines.append(f"Platform: {ws.platform}")
        elif f == "shell" and ws.shell:
            lines.append(f"Shell: {ws.shell}")
        elif f == "model" and msg.model:
            lines.append(f"Model: {msg.model}")
    body = "\n".join(lines)
    return f"<{settings.tag}>\n{body}\n</{settings.tag}>"


def inject(
    messages: Sequence[Message], step: StepInput, settings: InjectSettings
) -> tuple[list[Message], list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages with injections, mutations to persist, decisions)."""
    out: list[Message] = []
    mutations: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    for i, msg in enumerate(messages):
        if msg.role != "user":
            out.append(msg)
            continue
        parts = list(msg.parts)
        if settings.interjection and i > 0:
            prev = messages[i - 1]
            if prev.role == "assistant" and prev.finish in (None, "tool-calls"):
                parts = [
                    p.model_copy(update={"text": settings.interjection.format(message=p.text)})
                    if isinstance(p, TextPart) and not p.synthetic
                    else p
                    for p in parts
                ]
                decisions.append({"rule": "interjection", "message": msg.id})
        if i == last_user:
            reminder = None
            if step.agent.name == "plan" and settings.plan_mode:
                reminder = ("plan_mode", settings.plan_mode)
            elif (
                step.previous_agent == "plan"
                and step.agent.name != "plan"
                and settings.build_switch
            ):
                reminder = ("build_switch", settings.build_switch)
            if reminder:
                parts.append(TextPart(id=f"{msg.id}-reminder", text=reminder[1], synthetic=True))
                decisions.append({"rule": f"reminder.{reminder[0]}", "message": msg.id})
        if settings.dynamic_fields and not any(is_env_part(p) for p in parts):
            part = TextPart(
                id=f"{msg.id}-env",
                text=env_block(msg, step, settings),
                synthetic=True,
                metadata={"kilo_rules": ENV_MARK},
            )
            parts.append(part)
            mutations.append(
                {"op": "add_part", "message_id": msg.id, "part": part.model_dump(mode="json")}
            )
        out.append(msg.model_copy(update={"parts": parts}) if parts != list(msg.parts) else msg)
    if mutations:
        decisions.append({"rule": "environment", "added": [m["message_id"] for m in mutations]})
    return out, mutations, decisions
