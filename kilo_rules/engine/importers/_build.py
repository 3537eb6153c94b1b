"""Building a Session v1 from a foreign log: ids, tool call/result pairing, usage, times.

Converters append messages and parts as plain dicts through :class:`SessionBuilder` and the
whole session is validated once at the end, which is much faster than building frozen models
part by part and lets a tool result land on a part created many lines earlier.

Ids are derived from positions in the log (line numbers or message indexes), zero-padded so
that message ids sort in log order, as Session v1 asks. Part ids extend their message id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

from pydantic import ValidationError

from kilo_rules.engine.base.errors import Diagnostic, ImportFormatError, Location
from kilo_rules.engine.base.source import JsonPath
from kilo_rules.engine.formats.session import Session, first_duplicate_id
from kilo_rules.engine.importers._source import Record

# Finish reasons as the providers spell them → the names Session v1 (and Kilo) use.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "stop": "stop",
    "tool_use": "tool-calls",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "max_tokens": "length",
    "length": "length",
    "refusal": "content-filter",
    "content_filter": "content-filter",
    "pause_turn": "other",
}


def key(n: int, suffix: str = "") -> str:
    """A sortable id stem from a line number or index: ``key(42) == "000042"``."""
    return f"{n:06d}{suffix}"


class SessionBuilder:
    """Collects messages for one session and pairs each tool call with its result."""

    def __init__(self, fmt: str, file: str) -> None:
        self.fmt = fmt
        self.file = file
        self.messages: list[dict[str, Any]] = []
        self.tool_defs: dict[str, dict[str, Any]] = {}
        self._used_tools: dict[str, None] = {}
        self._pending: dict[str, dict[str, Any]] = {}
        self._calls: set[str] = set()
        self._ids: set[str] = set()
        self.last_user_id: str | None = None

    # -- messages ---------------------------------------------------------------------------
    def message(
        self, role: str, stem: str, *, created: int | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Append a message; an assistant answers the latest user message (``parent_id``)."""
        mid = f"msg_{stem}"
        n = 1
        while mid in self._ids:  # a second message from the same line or index
            n += 1
            mid = f"msg_{stem}_{n}"
        self._ids.add(mid)
        msg: dict[str, Any] = {"id": mid, "role": role, "created": created or 0, "parts": []}
        if role == "assistant" and self.last_user_id is not None:
            msg["parent_id"] = self.last_user_id
        msg.update({k: v for k, v in fields.items() if v is not None})
        self.messages.append(msg)
        if role == "user":
            self.last_user_id = mid
        return msg

    def user_text(
        self,
        stem: str,
        text: str,
        *,
        created: int | None = None,
        synthetic: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append a user message holding one text part."""
        msg = self.message("user", stem, created=created)
        self.text(msg, text, synthetic=synthetic, metadata=metadata)
        return msg

    # -- parts ------------------------------------------------------------------------------
    def part(self, msg: dict[str, Any], type_: str, **fields: Any) -> dict[str, Any]:
        """Append a part of ``type_`` to ``msg``; ``None`` fields and empty metadata are left
        out so the dump stays small."""
        part: dict[str, Any] = {"type": type_, "id": f"prt_{msg['id'][4:]}_{len(msg['parts']):03d}"}
        part.update({k: v for k, v in fields.items() if v is not None and v != {}})
        msg["parts"].append(part)
        return part

    def text(
        self,
        msg: dict[str, Any],
        text: str,
        *,
        synthetic: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append a text part."""
        return self.part(
            msg, "text", text=text, synthetic=synthetic or None, metadata=dict(metadata or {})
        )

    def tool_call(
        self,
        msg: dict[str, Any],
        call_id: str,
        tool: str,
        input_: Any,
        *,
        start: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        at: tuple[Record, JsonPath] | None = None,
    ) -> dict[str, Any]:
        """Append a tool call; it stays ``pending`` until :meth:`tool_result` finds it.

        Arguments that are not a JSON object (a model can emit anything) are kept under
        ``input["arguments"]`` since Session v1 inputs are objects. ``at`` is where the log
        wrote ``call_id``: a log that uses one id for two calls is refused there, since a
        result could not tell which call it answers and providers refuse repeated ids."""
        if call_id in self._calls:
            message = f"tool call id {call_id!r} is used by an earlier call"
            if at is None:
                raise ImportFormatError(
                    Diagnostic("import.duplicate-id", message, Location(self.file, 1, 1))
                )
            at[0].fail(at[1], message, code="import.duplicate-id")
        self._calls.add(call_id)
        args = input_ if isinstance(input_, dict) else {"arguments": input_}
        part = self.part(
            msg,
            "tool",
            call_id=call_id,
            tool=tool,
            input=args,
            status="pending",
            metadata=dict(metadata or {}),
        )
        if start:
            part["time"] = {"start": start}
        self._pending[call_id] = part
        self._used_tools.setdefault(tool, None)
        return part

    def tool_result(
        self,
        call_id: str,
        output: str,
        *,
        error: bool = False,
        end: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        attachments: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Complete the pending call ``call_id``; False when no such call is waiting."""
        part = self._pending.pop(call_id, None)
        if part is None:
            return False
        if error:
            part.update(status="error", error=output)
        else:
            part.update(status="completed", output=output)
        if end:
            part.setdefault("time", {})["end"] = end
        if attachments:
            part["attachments"] = [
                {**att, "id": f"{part['id']}_a{k}"} for k, att in enumerate(attachments)
            ]
        if metadata:
            part.setdefault("metadata", {}).update(
                {k: v for k, v in metadata.items() if v is not None}
            )
        return True

    def new_call_id(self, stem: str) -> str:
        """A call id for a log that records none: ``call_<stem>``, made unique."""
        cid, n = f"call_{stem}", 1
        while cid in self._calls:
            n += 1
            cid = f"call_{stem}_{n}"
        return cid

    def pending_calls(self) -> list[str]:
        """Call ids still waiting for a result, oldest first."""
        return list(self._pending)

    def finish(self, msg: dict[str, Any], raw: str | None) -> None:
        """Set ``finish``. A message that issued tool calls finished for ``tool-calls`` even
        when the provider said otherwise (some report ``stop``), which is what a runtime
        loop checks; the provider's own word is kept in ``metadata.finish_reason``."""
        if raw is not None:
            msg.setdefault("metadata", {})["finish_reason"] = raw
        if any(p["type"] == "tool" for p in msg["parts"]):
            msg["finish"] = "tool-calls"
        else:
            msg["finish"] = _FINISH.get(raw or "stop", "other")

    # -- session ----------------------------------------------------------------------------
    def build(self, session_id: str, **fields: Any) -> Session:
        """Validate and return the session. Tools come from explicit definitions when the log
        has them, otherwise from the names used (generic object schema)."""
        tools = list(self.tool_defs.values()) or [{"name": n} for n in self._used_tools]
        data: dict[str, Any] = {"id": session_id, "tools": tools, "messages": self.messages}
        data.update({k: v for k, v in fields.items() if v is not None})
        # The converters check every value they copy where the log holds it, so that errors
        # carry a line and column; what still fails here is a converter's own mistake.
        try:
            session = Session.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            self._invalid(".".join(str(p) for p in err["loc"]), err["msg"])
        duplicate = first_duplicate_id(session)
        if duplicate is not None:
            self._invalid(".".join(str(p) for p in duplicate[0]), duplicate[1])
        return session

    def _invalid(self, path: str, message: str) -> NoReturn:
        raise ImportFormatError(
            Diagnostic(
                "import.invalid",
                f"the imported session is not valid Session v1 ({path}: {message})",
                Location(self.file, 1, 1),
            )
        )


# -- token usage ----------------------------------------------------------------------------
def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def anthropic_tokens(usage: Any) -> dict[str, Any] | None:
    """Anthropic ``usage`` → TokenUsage (input excludes cache reads and writes there too)."""
    if not isinstance(usage, dict):
        return None
    return {
        "input": _int(usage.get("input_tokens")),
        "output": _int(usage.get("output_tokens")),
        "cache": {
            "read": _int(usage.get("cache_read_input_tokens")),
            "write": _int(usage.get("cache_creation_input_tokens")),
        },
    }


def openai_tokens(usage: Any) -> dict[str, Any] | None:
    """OpenAI-style ``usage`` → TokenUsage. OpenAI counts cached tokens inside
    ``prompt_tokens`` and reasoning inside ``completion_tokens``; Session v1 keeps them apart."""
    if not isinstance(usage, dict):
        return None
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    cached = _int(
        prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    ) or _int(usage.get("prompt_cache_hit_tokens"))
    reasoning = _int(
        completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    )
    out: dict[str, Any] = {
        "input": max(_int(usage.get("prompt_tokens")) - cached, 0),
        "output": max(_int(usage.get("completion_tokens")) - reasoning, 0),
        "reasoning": reasoning,
        "cache": {"read": cached, "write": 0},
    }
    if _int(usage.get("total_tokens")):
        out["total"] = usage["total_tokens"]
    return out


# -- times ----------------------------------------------------------------------------------
def iso_ms(value: Any) -> int | None:
    """ISO 8601 → epoch milliseconds; a time without a zone is taken as UTC."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    ms = round(parsed.timestamp() * 1000)
    return ms if ms >= 0 else None


def epoch_ms(value: Any) -> int | None:
    """Epoch seconds (int or float) → milliseconds."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        ms = value * 1000
        # A float can overflow to infinity here, and round() refuses infinity.
        return round(ms) if math.isfinite(ms) else None
    return None
