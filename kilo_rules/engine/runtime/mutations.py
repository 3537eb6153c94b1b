"""Persisting what a step decided, and proving that nothing was lost.

``apply_plan`` and :func:`~kilo_rules.engine.runtime.compaction.compact` never change a session:
they return *mutations* (``schemas/decisions.v1.json``). :func:`apply_mutations` is the
reference way to persist them on a Session v1 value; an agent with its own store applies
the same four operations to its rows.

Every operation only adds or marks, so the original record can always be recovered:
:func:`restore` undoes prunes and drops what compactions added, and :func:`missing` lists
anything of an original session that a later session no longer holds (the test of DESIGN
§4 "nothing is lost").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location
from kilo_rules.engine.formats.session import CompactionPart, Message, Part, Session, ToolPart
from kilo_rules.engine.runtime.history import last_index

__all__ = ["OPS", "MutationError", "apply_mutations", "missing", "restore"]

#: The operations a mutation may name.
OPS = ("add_part", "mark_compacted", "add_message", "set_tail_start")

#: ``metadata["kilo_rules"]`` values of messages added by compaction.
_ADDED_KINDS = frozenset(
    {"compaction-request", "compaction-summary", "compaction-continue", "compaction-replay"}
)


_PART: TypeAdapter[Any] = TypeAdapter(Part)


class MutationError(KiloRulesError):
    """A mutation names an unknown operation or a target the session does not hold."""


def _error(code: str, message: str, index: int) -> MutationError:
    return MutationError(Diagnostic(code, message, Location("<mutations>", index + 1, 1)))


def _mark(msg: Message, part_id: str, time: int) -> Message | None:
    parts = list(msg.parts)
    for k, p in enumerate(parts):
        if p.id == part_id:
            if not isinstance(p, ToolPart):
                return None
            if p.time.compacted is None:  # the first mark wins: it is when the output went
                parts[k] = p.model_copy(
                    update={"time": p.time.model_copy(update={"compacted": time})}
                )
            return msg.model_copy(update={"parts": parts})
    return None


class _Index:
    """Where the last message with an id is. A step's mutations target its newest
    messages, so a lookup searches from the end; the map of every id is built only when a
    message is added (it must then be new anywhere in the history)."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.ids: dict[str, int] | None = None

    def get(self, mid: str) -> int | None:
        if self.ids is not None:
            return self.ids.get(mid)
        return last_index(self.messages, mid)

    def add(self, mid: str) -> bool:
        """Record a message about to be appended; False when its id is taken."""
        if self.ids is None:
            self.ids = {m.id: i for i, m in enumerate(self.messages)}
        if mid in self.ids:
            return False
        self.ids[mid] = len(self.messages)
        return True


def apply_mutations(session: Session, mutations: Sequence[Mapping[str, Any]]) -> Session:
    """A copy of ``session`` with ``mutations`` applied in order (pure).

    Re-applying a mutation already applied is harmless (an added part or message with the
    same id is not added twice; a part already marked keeps its first time). An unknown
    ``op`` or a missing target raises :class:`MutationError` located at the mutation's
    position (line = index + 1 in ``<mutations>``)."""
    if not mutations:
        return session
    messages = list(session.messages)
    index = _Index(messages)
    part_owner: dict[str, int] | None = None
    for n, mut in enumerate(mutations):
        op = mut.get("op")
        if op == "add_message":
            msg = Message.model_validate(mut["message"])
            if index.add(msg.id):
                messages.append(msg)
                part_owner = None
        elif op == "add_part":
            i = index.get(str(mut.get("message_id")))
            if i is None:
                raise _error(
                    "mutation.target", f"add_part: no message {mut.get('message_id')!r}", n
                )
            msg = messages[i]
            part = _PART.validate_python(mut["part"])
            if all(p.id != part.id for p in msg.parts):
                messages[i] = msg.model_copy(update={"parts": [*msg.parts, part]})
                part_owner = None
        elif op == "mark_compacted":
            if part_owner is None:
                part_owner = {p.id: i for i, m in enumerate(messages) for p in m.parts}
            pid = str(mut.get("part_id"))
            i = part_owner.get(pid, -1)
            marked = _mark(messages[i], pid, int(mut.get("time") or 0)) if i >= 0 else None
            if marked is None:
                raise _error("mutation.target", f"mark_compacted: no tool part {pid!r}", n)
            messages[i] = marked
        elif op == "set_tail_start":
            found = index.get(str(mut.get("message_id")))
            i = -1 if found is None else found
            target = messages[i] if i >= 0 else None
            if target is None or not any(isinstance(p, CompactionPart) for p in target.parts):
                raise _error(
                    "mutation.target", f"set_tail_start: no compaction {mut.get('message_id')!r}", n
                )
            tail = mut.get("tail_start_id")
            parts = [
                p.model_copy(update={"tail_start_id": tail}) if isinstance(p, CompactionPart) else p
                for p in target.parts
            ]
            messages[i] = target.model_copy(update={"parts": parts})
        else:
            raise _error(
                "mutation.op", f"unknown mutation op {op!r} (expected one of {', '.join(OPS)})", n
            )
    return session.model_copy(update={"messages": messages})


def restore(session: Session) -> Session:
    """The session as it was before any compaction or prune: marks cleared, and the
    messages compaction added (request, summary, continue, replay) left out."""
    messages = []
    for msg in session.messages:
        if msg.metadata.get("kilo_rules") in _ADDED_KINDS:
            continue
        if any(isinstance(p, ToolPart) and p.time.compacted is not None for p in msg.parts):
            parts = [
                p.model_copy(update={"time": p.time.model_copy(update={"compacted": None})})
                if isinstance(p, ToolPart)
                else p
                for p in msg.parts
            ]
            msg = msg.model_copy(update={"parts": parts})
        messages.append(msg)
    return session.model_copy(update={"messages": messages})


def _comparable(msg: Message, ignore_parts: Iterable[str]) -> dict[str, Any]:
    skip = set(ignore_parts)
    data = msg.model_dump(mode="json")
    data["parts"] = [p for p in data["parts"] if p["id"] not in skip]
    for p in data["parts"]:
        if p.get("type") == "tool":
            p["time"]["compacted"] = None  # a mark hides the output from the model only
    return data


def missing(original: Session, later: Session) -> list[str]:
    """What of ``original`` is not held, unchanged, by ``later`` (empty: nothing lost).

    Each message must still be stored with the same content; tool outputs may be marked
    compacted (they are still stored), and parts a step added (environment blocks) are
    allowed."""
    held = {m.id: m for m in later.messages}
    lost: list[str] = []
    for msg in original.messages:
        now = held.get(msg.id)
        if now is None:
            lost.append(f"message {msg.id}")
            continue
        before_ids = {p.id for p in msg.parts}
        extra = [p.id for p in now.parts if p.id not in before_ids]
        if _comparable(msg, ()) != _comparable(now, extra):
            lost.append(f"message {msg.id} changed")
    return lost
