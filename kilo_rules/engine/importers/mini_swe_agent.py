"""mini-swe-agent trajectories (``*.traj.json``) → Session v1.

Two generations share the envelope ``{info, messages, trajectory_format, instance_id}``:

* ``mini-swe-agent-1`` (text actions). The model's action is the single ```` ```bash ````
  block in an assistant message; it becomes a ``bash`` tool part with input ``{"command": …}``
  and the rest of the message (the THOUGHT) a text part; the verbatim message stays in
  ``metadata.raw_content``. The next user message (``<returncode>…</returncode><output>…``,
  or the timeout text) is the tool output. An assistant message without exactly one block was
  rejected by the agent; it stays plain text and the agent's format-error reply is a
  synthetic user message (``metadata.mini_swe_agent == "format_error"``).
* ``mini-swe-agent-1.1`` (v2): OpenAI ``tool_calls`` and ``role: "tool"`` messages, read by
  the OpenAI chat importer, plus per-message ``extra`` (usage, cost, times, return codes).

In both, the last message is the submitted diff: mini-swe-agent takes it from the output of
the final command, so it completes that command's tool part (``metadata.submission``); it was
never shown to the model. The system message goes to ``Session.metadata["system_prompt"]``:
Session v1 has no system role, and a runtime builds its own system prompt. Usage and cost
come from the raw provider response in ``extra.response``.
"""

from __future__ import annotations

import re
from typing import Any

from kilo_rules.engine.base.source import JsonPath
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers._build import SessionBuilder, epoch_ms, key, openai_tokens
from kilo_rules.engine.importers._source import (
    Record,
    Source,
    need_dict,
    need_list,
    obj,
    opt_str,
    opt_str_at,
)
from kilo_rules.engine.importers.openai_chat import ChatImporter, content_text

NAME = "mini_swe_agent"
DESCRIPTION = "mini-swe-agent trajectory (*.traj.json), v1 text actions and v2 tool_calls"

_ACTION = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)  # mini-swe-agent 1.x's own regex
# An exit status is a small number; a longer run of digits (a command's output can say
# anything) is no return code, and int() of thousands of digits raises ValueError.
_RETURNCODE = re.compile(r"<returncode>(-?\d{1,20})</returncode>")


def sniff(src: Source) -> bool:
    """A document whose ``trajectory_format`` names mini-swe-agent."""
    doc = src.records[0].value if len(src.records) == 1 else None
    return isinstance(doc, dict) and str(doc.get("trajectory_format", "")).startswith(
        "mini-swe-agent"
    )


def _response(m: dict[str, Any]) -> dict[str, Any]:
    extra = m.get("extra")
    response = extra.get("response") if isinstance(extra, dict) else None
    return response if isinstance(response, dict) else {}


def _fill_from_response(
    msg: dict[str, Any], m: dict[str, Any], rec: Record, path: JsonPath
) -> str | None:
    """Model, time, usage and cost of an assistant message (``m``, at ``path``) from its raw
    response; returns the provider's finish reason."""
    resp = _response(m)
    extra = obj(m.get("extra"))
    msg["model"] = opt_str(resp.get("model"))
    msg["created"] = epoch_ms(extra.get("timestamp")) or epoch_ms(resp.get("created")) or 0
    usage = resp.get("usage")
    msg["tokens"] = openai_tokens(usage)
    cost = extra.get("cost", usage.get("cost") if isinstance(usage, dict) else None)
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
        msg["cost"] = cost
    if isinstance(resp.get("id"), str):
        msg.setdefault("metadata", {})["response_id"] = resp["id"]
    choices = resp.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        at = (*path, "extra", "response", "choices", 0, "finish_reason")
        return opt_str_at(rec, at, choices[0].get("finish_reason"))
    return None


def observation_meta(text: str) -> dict[str, Any]:
    """What the agent's observation template tells about a command's run."""
    meta: dict[str, Any] = {}
    found = _RETURNCODE.match(text)
    if found:
        meta["returncode"] = int(found.group(1))
    elif text.startswith("The last command <command>") and "timed out" in text[:2000]:
        meta["timeout"] = True
    if "<elided_chars>" in text:
        meta["truncated"] = True
    return meta


class _V2(ChatImporter):
    def assistant_extra(self, msg: dict[str, Any], m: dict[str, Any], path: JsonPath) -> str | None:
        return _fill_from_response(msg, m, self.rec, path)

    def tool_extra(self, m: dict[str, Any]) -> dict[str, Any]:
        extra = obj(m.get("extra"))
        meta = {"end": epoch_ms(extra.get("timestamp"))}
        if isinstance(extra.get("returncode"), int):
            meta["returncode"] = extra["returncode"]
        if extra.get("exception_info"):
            meta["exception_info"] = extra["exception_info"]
        if "<elided_chars>" in content_text(m.get("content")):
            # The model saw head and tail only; the full output is kept, not shown.
            meta.update(truncated=True, raw_output=extra.get("raw_output"))
        return meta

    def other_role(self, i: int, m: dict[str, Any], path: JsonPath) -> bool:
        if m.get("role") != "exit":
            return False
        extra = obj(m.get("extra"))
        text = content_text(m.get("content"))
        pending = self.b.pending_calls()
        meta = {"submission": True, "exit_status": extra.get("exit_status")}
        if not pending or not self.b.tool_result(pending[-1], text, metadata=meta):
            self.meta["exit"] = {"content": text, **meta}
        return True


def _v1(
    b: SessionBuilder, rec: Record, messages: list[Any], meta: dict[str, Any], exit_status: Any
) -> None:
    waiting: str | None = None  # call id of the last action, until its observation
    rejected = False  # the last assistant message had no single action
    for i, raw in enumerate(messages):
        path = ("messages", i)
        m = need_dict(rec, path, raw)
        role = m.get("role")
        text = content_text(m.get("content"))
        if role == "system" and not b.messages and "system_prompt" not in meta:
            meta["system_prompt"] = text
        elif role == "assistant":
            msg = b.message("assistant", key(i))
            finish = _fill_from_response(msg, m, rec, path)
            choices = _response(m).get("choices")
            choice = obj(choices[0]) if isinstance(choices, list) and choices else {}
            reasoning = obj(choice.get("message")).get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                b.part(msg, "reasoning", text=reasoning)
            actions = list(_ACTION.finditer(text))
            if len(actions) == 1:
                span = actions[0].span()
                thought = (text[: span[0]] + text[span[1] :]).strip()
                if thought:
                    b.text(msg, thought)
                msg.setdefault("metadata", {})["raw_content"] = text
                waiting = b.new_call_id(key(i))
                b.tool_call(msg, waiting, "bash", {"command": actions[0].group(1)})
            else:
                b.text(msg, text, metadata={"actions_found": len(actions)})
            rejected = len(actions) != 1
            b.finish(msg, finish)
        elif role == "user" and waiting is not None:
            obs = observation_meta(text)
            if i == len(messages) - 1 and exit_status == "Submitted" and not obs:
                obs = {"submission": True}
            b.tool_result(waiting, text, metadata=obs)
            waiting = None
        elif role in ("user", "system"):
            b.user_text(
                key(i),
                text,
                synthetic=rejected or role == "system",
                metadata={"mini_swe_agent": "format_error"} if rejected else None,
            )
            rejected = False
        else:
            rec.fail((*path, "role"), f"unknown role {role!r}")


def convert(src: Source, run: int) -> Session:
    """Import one mini-swe-agent trajectory (v1 or v2)."""
    rec = src.records[0]
    doc = need_dict(rec, (), rec.value)
    messages = need_list(rec, ("messages",), doc.get("messages"))
    info = obj(doc.get("info"))
    fmt = str(doc.get("trajectory_format"))
    b = SessionBuilder(NAME, src.file)
    meta: dict[str, Any] = {}
    if fmt == "mini-swe-agent-1":
        _v1(b, rec, messages, meta, info.get("exit_status"))
    else:  # 1.1 and later use OpenAI tool calls
        _V2(b, rec, meta).add_all(messages, ("messages",))
    config = obj(info.get("config"))
    model_cfg = obj(config.get("model"))
    meta["import"] = {"format": NAME, "messages": len(messages)}
    meta["mini_swe_agent"] = {
        "trajectory_format": fmt,
        "instance_id": doc.get("instance_id"),
        **{k: v for k, v in info.items() if k != "submission"},
    }
    model = model_cfg.get("model_name")
    return b.build(
        str(doc.get("instance_id") or "mini-swe-agent"),
        model=model if isinstance(model, str) else None,
        metadata=meta,
    )
