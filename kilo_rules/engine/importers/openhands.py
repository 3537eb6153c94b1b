"""OpenHands event streams → Session v1.

Accepts OpenHands evaluation output (JSON Lines, one run per line:
``{instance_id, instruction, metadata, history, metrics, error, test_result}``), a single
such run, or a bare array of events. ``run=N`` picks the run (0-based).

OpenHands does not store the messages it sends; it rebuilds them from events, and so does
this importer:

* the ``system`` action → ``Session.metadata["system_prompt"]``, and its ``tools`` (full
  OpenAI function definitions) → ``Session.tools``;
* a user ``message`` action → a user message; an agent ``message`` action without a tool
  call → an assistant text message;
* an action with ``tool_call_metadata`` → a tool part named after the function. Actions of
  one model response (same ``model_response.id``) share one assistant message, whose text is
  the response's ``content`` (the thought), whose tokens are the response's ``usage`` and
  whose tool input is the raw ``arguments`` the model sent;
* the observation with the same ``tool_call_id`` completes that part (an ``error``
  observation → status ``error``), with ``extras`` (exit code, cwd…) in its metadata;
* observations the runtime sends without a tool call (an ``error`` from a malformed call,
  the ``recall`` workspace context) → synthetic user messages, as OpenHands does;
* the ``recall`` action repeats the user's text as a query and is skipped, like any event of
  another kind (counts in ``metadata.import.skipped``).

A ``finish`` call has no observation (the run ends on it): it stays ``pending`` and is
listed in ``metadata.import.unanswered``. Naive timestamps are taken as UTC.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kilo_rules.engine.base.errors import Location
from kilo_rules.engine.base.source import JsonPath
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers._build import SessionBuilder, iso_ms, key, openai_tokens
from kilo_rules.engine.importers._source import (
    Record,
    Source,
    fail,
    need_dict,
    need_list,
    obj,
    opt_dict_at,
    opt_str,
    opt_str_at,
    parse_embedded,
)
from kilo_rules.engine.importers.openai_chat import parse_arguments

NAME = "openhands"
DESCRIPTION = "OpenHands event stream (eval output.jsonl, one run per line; or [events])"

# Action arguments OpenHands adds for itself; dropped when the raw call is not available.
_BOOKKEEPING = {
    "thought",
    "is_input",
    "blocking",
    "is_static",
    "cwd",
    "hidden",
    "confirmation_state",
    "impl_source",
    "security_risk",
}


def _is_event(e: Any) -> bool:
    return isinstance(e, dict) and "source" in e and ("action" in e or "observation" in e)


def sniff(src: Source) -> bool:
    """Runs with a ``history`` of events, or a bare array of events."""
    first = src.records[0].value
    if isinstance(first, dict) and isinstance(first.get("history"), list):
        return "instance_id" in first or any(_is_event(e) for e in first["history"][:5])
    return isinstance(first, list) and bool(first) and all(_is_event(e) for e in first[:5])


class _Importer:
    def __init__(self, b: SessionBuilder, rec: Record) -> None:
        self.b = b
        self.rec = rec
        self.meta: dict[str, Any] = {}
        self.skipped: Counter[str] = Counter()
        self.current: dict[str, Any] | None = None
        self.current_response: str | None = None
        self.assistants: list[tuple[dict[str, Any], str | None]] = []

    def event(self, i: int, e: dict[str, Any], path: JsonPath) -> None:
        eid = e.get("id")
        stem = key(eid if isinstance(eid, int) and eid >= 0 else i)
        ts = iso_ms(e.get("timestamp"))
        tcm = e.get("tool_call_metadata")
        tcm = tcm if isinstance(tcm, dict) and isinstance(tcm.get("tool_call_id"), str) else None
        args = obj(e.get("args"))
        text = opt_str(e.get("content")) or ""
        if "action" in e:
            action = e["action"]
            if action == "system":
                self.system(args, path)
            elif tcm is not None:
                self.call(stem, e, tcm, ts, path)
            elif action == "message":
                self.message(stem, e, args, ts, path)
            else:
                self.skipped[f"action:{action}"] += 1
        elif "observation" in e:
            obs = e["observation"]
            meta = {"event": eid, "observation": obs, "extras": e.get("extras")}
            if tcm is not None and self.b.tool_result(
                tcm["tool_call_id"], text, error=obs == "error", end=ts, metadata=meta
            ):
                return
            if obs in ("error", "recall") or (text and obs not in ("agent_state_changed", "null")):
                self.b.user_text(
                    stem, text, created=ts, synthetic=True, metadata={"openhands": meta}
                )
                self.current = None
            else:
                self.skipped[f"observation:{obs}"] += 1
        else:
            self.skipped["other"] += 1

    def system(self, args: dict[str, Any], path: JsonPath) -> None:
        if isinstance(args.get("content"), str):
            self.meta["system_prompt"] = args["content"]
        for k in ("openhands_version", "agent_class"):
            if k in args:
                self.meta.setdefault("openhands", {})[k] = args[k]
        for j, raw in enumerate(
            need_list(self.rec, (*path, "args", "tools"), args.get("tools") or [])
        ):
            tool = need_dict(self.rec, (*path, "args", "tools", j), raw)
            fn = obj(tool.get("function"))
            at = (*path, "args", "tools", j, "function")
            if isinstance(fn.get("name"), str):
                self.b.tool_defs[fn["name"]] = {
                    "name": fn["name"],
                    "description": opt_str_at(self.rec, (*at, "description"), fn.get("description"))
                    or "",
                    "input_schema": opt_dict_at(self.rec, (*at, "parameters"), fn.get("parameters"))
                    or {"type": "object", "properties": {}},
                }

    def message(
        self, stem: str, e: dict[str, Any], args: dict[str, Any], ts: int | None, path: JsonPath
    ) -> None:
        text = opt_str(args.get("content")) or e.get("message", "")
        if e.get("source") == "user":
            msg = self.b.user_text(stem, str(text), created=ts)
            urls = args.get("image_urls") or []
            for url in need_list(self.rec, (*path, "args", "image_urls"), urls):
                if isinstance(url, str):
                    mime = url[5:].split(";")[0] if url.startswith("data:") else "image/*"
                    self.b.part(msg, "file", mime=mime, url=url)
            self.current = None
        else:
            msg = self.b.message("assistant", stem, created=ts)
            self.b.text(msg, str(text))
            self.assistants.append((msg, None))
            self.current = None

    def call(
        self, stem: str, e: dict[str, Any], tcm: dict[str, Any], ts: int | None, path: JsonPath
    ) -> None:
        resp = tcm.get("model_response")
        at: JsonPath = (*path, "tool_call_metadata", "model_response")
        if isinstance(resp, str):  # some OpenHands versions store the response as JSON text
            resp = parse_embedded(resp)[0]
            # Values inside the text are located at the text.
            at_choice = at_message = at
        else:
            at_choice = (*at, "choices", 0)
            at_message = (*at_choice, "message")
        resp = resp if isinstance(resp, dict) else {}
        choices = resp.get("choices") if isinstance(resp.get("choices"), list) else []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        rmsg = obj(choice.get("message"))
        rid = opt_str(resp.get("id"))
        if self.current is None or rid is None or rid != self.current_response:
            self.current = self.b.message(
                "assistant",
                stem,
                created=ts,
                model=opt_str(resp.get("model")),
                tokens=openai_tokens(resp.get("usage")),
                metadata={"response_id": rid} if rid else None,
            )
            self.current_response = rid
            if isinstance(rmsg.get("content"), str) and rmsg["content"]:
                self.b.text(self.current, rmsg["content"])
            finish = opt_str_at(
                self.rec, (*at_choice, "finish_reason"), choice.get("finish_reason")
            )
            self.assistants.append((self.current, finish))
        call_id = tcm["tool_call_id"]
        args: Any = None
        for tc in need_list(self.rec, (*at_message, "tool_calls"), rmsg.get("tool_calls") or []):
            if isinstance(tc, dict) and tc.get("id") == call_id:
                fn = obj(tc.get("function"))
                args = parse_arguments(fn.get("arguments"))[0]
        if args is None:  # no raw call recorded: the action's own arguments
            raw_args = obj(e.get("args"))
            args = {k: v for k, v in raw_args.items() if k not in _BOOKKEEPING}
        name = opt_str(tcm.get("function_name")) or str(e.get("action"))
        self.b.tool_call(
            self.current,
            call_id,
            name,
            args,
            start=ts,
            metadata={"event": e.get("id"), "action": e.get("action")},
            at=(self.rec, (*path, "tool_call_metadata", "tool_call_id")),
        )


def convert(src: Source, run: int) -> Session:
    """Import run ``run`` of an OpenHands file."""
    first = src.records[0].value
    runs = [src.records[0]] if isinstance(first, list) else src.records
    if not 0 <= run < len(runs):
        fail(
            "import.run",
            f"run {run} is out of range: the file holds {len(runs)} run"
            f"{'s' if len(runs) != 1 else ''} (0–{len(runs) - 1})",
            Location(src.file, 1, 1),
        )
    rec = runs[run]
    doc = rec.value
    top: dict[str, Any] = {}
    base: JsonPath = ()
    if isinstance(doc, dict):
        top, base = doc, ("history",)
        doc = doc.get("history")
    events = need_list(rec, base, doc)
    b = SessionBuilder(NAME, src.file)
    imp = _Importer(b, rec)
    for i, raw in enumerate(events):
        imp.event(i, need_dict(rec, (*base, i), raw), (*base, i))
    for msg, finish in imp.assistants:
        b.finish(msg, finish)
    meta = imp.meta
    md = obj(top.get("metadata"))
    llm = obj(md.get("llm_config"))
    metrics = obj(top.get("metrics"))
    test_result = obj(top.get("test_result"))
    meta["import"] = {
        "format": NAME,
        "run": run,
        "runs": len(runs),
        "line": rec.line,
        "events": len(events),
        "skipped": dict(imp.skipped),
        "unanswered": b.pending_calls(),
    }
    meta.setdefault("openhands", {}).update(
        {
            k: v
            for k, v in {
                "instance_id": top.get("instance_id"),
                "error": top.get("error"),
                "max_iterations": md.get("max_iterations"),
                "accumulated_cost": metrics.get("accumulated_cost"),
                "accumulated_token_usage": metrics.get("accumulated_token_usage"),
                "git_patch": test_result.get("git_patch"),
            }.items()
            if v is not None
        }
    )
    agent = md.get("agent_class")
    return b.build(
        str(top.get("instance_id") or "openhands"),
        model=opt_str(llm.get("model")),
        agent=agent if isinstance(agent, str) else None,
        metadata=meta,
    )
