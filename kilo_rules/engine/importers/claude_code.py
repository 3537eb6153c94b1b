"""Claude Code session logs (``~/.claude/projects/**/*.jsonl``) → Session v1.

Each line is a record with a ``type``. ``user`` and ``assistant`` records carry an Anthropic
Messages ``message``; the rest is bookkeeping that the model never saw:

* ``progress`` (hook and tool progress), ``file-history-snapshot`` and ``queue-operation``
  are skipped, and so are ``system`` records other than ``compact_boundary`` (hook summaries,
  turn durations). Their counts are kept in ``metadata.import.skipped``.
* Claude Code writes one line per content block, so one API response is spread over several
  ``assistant`` lines sharing ``message.id``, with tool-result lines in between when the
  tools of a parallel call ran while the response streamed. Those lines are merged into one
  assistant message; its ``usage`` is the one on the last line (each line repeats the
  running total of the response).
* A tool result completes the tool part of its call (``is_error`` → status ``error``); the
  structured sidecar ``toolUseResult`` goes to the part's ``metadata.tool_use_result``.
* The ``compact_boundary`` record and the ``isCompactSummary`` user message that follows it
  become a Session v1 compaction: a user message with a compaction part (``auto`` unless the
  trigger was ``manual``; ``overflow`` false, since Claude Code compacts on its own estimate
  before the provider refuses) and an assistant ``summary`` message holding the summary text.
* The log has no tool definitions, so ``Session.tools`` lists the tool names used.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers._build import SessionBuilder, anthropic_tokens, iso_ms, key
from kilo_rules.engine.importers._source import Record, Source, need_dict, need_str, obj, opt_str_at
from kilo_rules.engine.importers.anthropic_messages import add_assistant_blocks, add_user
from kilo_rules.engine.importers.openai_chat import content_text

NAME = "claude_code"
DESCRIPTION = "Claude Code session JSONL (~/.claude/projects/…/*.jsonl, also subagent logs)"

_SKIPPED = {"progress", "file-history-snapshot", "queue-operation"}
_KNOWN = {"user", "assistant", "system", "summary", *_SKIPPED}


def sniff(src: Source) -> bool:
    """Records with a Claude Code ``type`` and the session bookkeeping keys."""
    for rec in src.records[:20]:
        v = rec.value
        if (
            isinstance(v, dict)
            and isinstance(v.get("type"), str)
            and v["type"] in _KNOWN
            and any(k in v for k in ("sessionId", "uuid", "messageId", "leafUuid"))
        ):
            return True
    return False


class _Importer:
    def __init__(self, src: Source) -> None:
        self.b = SessionBuilder(NAME, src.file)
        self.records: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.current: dict[str, Any] | None = None  # assistant message being merged
        self.current_id: str | None = None
        self.assistants: list[tuple[dict[str, Any], str | None]] = []
        self.compaction: dict[str, Any] | None = None  # boundary awaiting its summary
        self.first: dict[str, Any] = {}
        self.first_rec: Record | None = None
        self.title: str | None = None

    def line(self, rec: Record) -> None:
        v = need_dict(rec, (), rec.value)
        if "type" not in v:
            rec.fail((), 'not a Claude Code record (it has no "type")')
        kind = need_str(rec, ("type",), v["type"])
        self.records[str(kind)] += 1
        if kind in ("user", "assistant") and not self.first:
            self.first, self.first_rec = v, rec
        if kind == "user":
            if v.get("isCompactSummary"):
                self.summary(rec, v)
            else:
                self.user(rec, v)
        elif kind == "assistant":
            self.assistant(rec, v)
        elif kind == "system" and v.get("subtype") == "compact_boundary":
            self.boundary(rec, v)
        elif kind == "summary" and isinstance(v.get("summary"), str):
            self.title = v["summary"]  # older Claude Code: a session title line
        else:
            self.skipped[str(kind) + (f":{v['subtype']}" if "subtype" in v else "")] += 1

    def user(self, rec: Record, v: dict[str, Any]) -> None:
        m = need_dict(rec, ("message",), v.get("message"))
        result_meta: dict[str, Any] = {"result_line": rec.line}
        if "toolUseResult" in v:
            result_meta["tool_use_result"] = v["toolUseResult"]
        msg = add_user(
            self.b,
            key(rec.line),
            m.get("content"),
            rec,
            ("message", "content"),
            created=iso_ms(v.get("timestamp")),
            synthetic=v.get("isMeta") is True,
            result_meta=result_meta,
        )
        if msg is not None:  # a real user turn ends the response being merged
            msg["metadata"] = {**msg.get("metadata", {}), "uuid": v.get("uuid"), "line": rec.line}
            self.current = self.current_id = None

    def assistant(self, rec: Record, v: dict[str, Any]) -> None:
        m = need_dict(rec, ("message",), v.get("message"))
        mid = m.get("id")
        if self.current is None or mid is None or mid != self.current_id:
            self.current = self.b.message(
                "assistant",
                key(rec.line),
                created=iso_ms(v.get("timestamp")),
                model=opt_str_at(rec, ("message", "model"), m.get("model")),
                metadata={"message_id": mid, "request_id": v.get("requestId"), "lines": []},
            )
            self.current_id = mid
            self.assistants.append((self.current, None))
        msg = self.current
        msg["metadata"]["lines"].append(rec.line)
        add_assistant_blocks(
            self.b,
            msg,
            m.get("content"),
            rec,
            ("message", "content"),
            start=iso_ms(v.get("timestamp")),
        )
        if "usage" in m:
            msg["tokens"] = anthropic_tokens(m["usage"])
        stop = opt_str_at(rec, ("message", "stop_reason"), m.get("stop_reason"))
        if stop:
            self.assistants[-1] = (msg, stop)
        if v.get("isApiErrorMessage"):
            text = " ".join(p["text"] for p in msg["parts"] if p["type"] == "text")
            msg["error"] = {"name": "APIError", "message": text}

    def boundary(self, rec: Record, v: dict[str, Any]) -> None:
        self.current = self.current_id = None
        meta = obj(v.get("compactMetadata"))
        self.compaction = self._compaction(rec, v, meta, key(rec.line))

    def _compaction(
        self, rec: Record, v: dict[str, Any], meta: dict[str, Any], stem: str
    ) -> dict[str, Any]:
        auto = meta.get("trigger") != "manual"
        msg = self.b.message(
            "user",
            stem,
            created=iso_ms(v.get("timestamp")),
            metadata={"compact_boundary": {"line": rec.line, "uuid": v.get("uuid"), **meta}},
        )
        self.b.part(msg, "compaction", auto=auto, overflow=False if auto else None)
        return msg

    def summary(self, rec: Record, v: dict[str, Any]) -> None:
        self.current = self.current_id = None
        if self.compaction is None:  # a summary without its boundary line: still a compaction
            self._compaction(rec, v, {}, key(rec.line, "c"))
        self.compaction = None
        m = need_dict(rec, ("message",), v.get("message"))
        content = content_text(m.get("content"))
        msg = self.b.message(
            "assistant",
            key(rec.line),
            created=iso_ms(v.get("timestamp")),
            summary=True,
            finish="stop",
            metadata={
                "uuid": v.get("uuid"),
                "line": rec.line,
                "visible_in_transcript_only": v.get("isVisibleInTranscriptOnly"),
            },
        )
        self.b.text(msg, content)

    def session(self, src: Source) -> Session:
        for msg, stop in self.assistants:
            self.b.finish(msg, stop)
        f = self.first
        at = self.first_rec
        sid = (opt_str_at(at, ("sessionId",), f.get("sessionId")) if at else None) or "claude-code"
        if f.get("isSidechain") and f.get("agentId"):
            sid = f"{sid}/agent-{f['agentId']}"
        models = [m["model"] for m, _ in self.assistants if isinstance(m.get("model"), str)]
        origin = {
            k: f[k]
            for k in (
                "sessionId",
                "version",
                "gitBranch",
                "slug",
                "agentId",
                "isSidechain",
                "userType",
            )
            if k in f
        }
        meta = {
            "import": {
                "format": NAME,
                "lines": src.records[-1].line if src.records else 0,
                "records": dict(self.records),
                "skipped": dict(self.skipped),
            },
            "claude_code": origin,
        }
        return self.b.build(
            sid,
            title=self.title,
            directory=opt_str_at(at, ("cwd",), f.get("cwd")) if at else None,
            model=models[0] if models else None,
            metadata=meta,
        )


def convert(src: Source, run: int) -> Session:
    """Import one Claude Code session log."""
    imp = _Importer(src)
    for rec in src.records:
        imp.line(rec)
    return imp.session(src)
