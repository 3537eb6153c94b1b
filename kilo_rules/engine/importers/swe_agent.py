"""SWE-agent trajectories (``*.traj``, SWE-agent 0.x) → Session v1.

A ``.traj`` holds ``history`` (the exact chat sent to the model) and ``trajectory`` (one
record per step: action, observation, response, state, thought). History is the source:

* the ``system`` message → ``Session.metadata["system_prompt"]`` (Session v1 has no system
  role);
* user messages stay user messages; the in-context demonstration (``is_demo``) keeps that
  flag in ``metadata.is_demo``;
* an assistant message with an ``action`` becomes a text part (its ``thought``) and a
  ``bash`` tool part with input ``{"command": action}``: SWE-agent commands (``open``,
  ``edit``, ``submit``…) are shell functions run in the agent's bash session. The verbatim
  message is kept in ``metadata.raw_content``;
* the next user message is that command's output. The last command (``submit``) has no
  such message; its observation (the diff) is taken from the last ``trajectory`` step and
  marked ``metadata.submission`` since the model never saw it.

The log holds totals only (``info.model_stats``: tokens sent/received, cost), kept in
``Session.metadata["swe_agent"]``; it has no timestamps.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers._build import SessionBuilder, key
from kilo_rules.engine.importers._source import Source, need_dict, need_list, need_str, obj, opt_str

NAME = "swe_agent"
DESCRIPTION = "SWE-agent 0.x trajectory (*.traj: history + trajectory)"


def sniff(src: Source) -> bool:
    """A document with both ``history`` and ``trajectory`` arrays."""
    doc = src.records[0].value if len(src.records) == 1 else None
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("history"), list)
        and isinstance(doc.get("trajectory"), list)
    )


def convert(src: Source, run: int) -> Session:
    """Import one SWE-agent trajectory."""
    rec = src.records[0]
    doc = need_dict(rec, (), rec.value)
    history = need_list(rec, ("history",), doc.get("history"))
    steps = need_list(rec, ("trajectory",), doc.get("trajectory"))
    b = SessionBuilder(NAME, src.file)
    meta: dict[str, Any] = {}
    waiting: str | None = None
    actions = 0
    for i, raw in enumerate(history):
        path = ("history", i)
        m = need_dict(rec, path, raw)
        role = m.get("role")
        content = need_str(rec, (*path, "content"), m.get("content"))
        agent = opt_str(m.get("agent"))
        if role == "system" and not b.messages and "system_prompt" not in meta:
            meta["system_prompt"] = content
        elif role == "assistant":
            msg = b.message("assistant", key(i), agent=agent)
            action = m.get("action")
            if isinstance(action, str):
                thought = opt_str(m.get("thought")) or ""
                if thought.strip():
                    b.text(msg, thought.strip())
                msg["metadata"] = {"raw_content": content}
                step = steps[actions] if actions < len(steps) else {}
                waiting = b.new_call_id(key(i))
                b.tool_call(
                    msg,
                    waiting,
                    "bash",
                    {"command": action},
                    metadata={"state": step.get("state")} if isinstance(step, dict) else None,
                )
                actions += 1
            else:
                b.text(msg, content)
            b.finish(msg, None)
        elif role in ("user", "system"):
            if waiting is not None and role == "user":
                b.tool_result(waiting, content)
                waiting = None
            else:
                msg = b.user_text(key(i), content, synthetic=role == "system")
                if agent:
                    msg["agent"] = agent
                if m.get("is_demo") in (True, "True", "true"):
                    msg["metadata"] = {"is_demo": True}
        else:
            rec.fail((*path, "role"), f"unknown role {role!r}")
    if waiting is not None and actions and actions <= len(steps):
        last = steps[actions - 1]
        if isinstance(last, dict) and isinstance(last.get("observation"), str):
            b.tool_result(waiting, last["observation"], metadata={"submission": True})
    info = obj(doc.get("info"))
    meta["import"] = {"format": NAME, "messages": len(history), "steps": len(steps)}
    meta["swe_agent"] = {
        "environment": doc.get("environment"),
        **{k: v for k, v in info.items() if k != "submission"},
    }
    # The file name is the only place the task id appears (…/pydicom__pydicom-1458.traj).
    name = PurePath(src.file).name
    sid = "swe-agent" if name.startswith("<") else name.removesuffix(".traj")
    return b.build(sid, metadata=meta)
