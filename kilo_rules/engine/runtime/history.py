"""Which messages the model sees: the history projection after a summary, and turns.

Kilo keeps every message in the record and projects a view for each request: once a
compaction has completed, the model sees the compaction request, the summary, the verbatim
tail kept by the compaction, and whatever came after (``filterCompacted`` +
``trimBeforeLastSummary``, spec §7.6). These helpers are pure functions of the message list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kilo_rules.engine.formats.session import CompactionPart, Message, TextPart


def compaction_part(msg: Message) -> CompactionPart | None:
    """The compaction part of a user message, if it has one."""
    if msg.role != "user":
        return None
    for p in msg.parts:
        if isinstance(p, CompactionPart):
            return p
    return None


def is_completed_summary(msg: Message) -> bool:
    """An assistant summary that finished without error."""
    return msg.role == "assistant" and msg.summary and msg.finish is not None and msg.error is None


@dataclass(frozen=True, slots=True)
class Turn:
    """A user turn: messages ``[start, end)``; ``start`` is the user message."""

    start: int
    end: int


def turns(messages: Sequence[Message]) -> list[Turn]:
    """Every user message without a compaction part starts a turn (spec §7.3)."""
    starts = [i for i, m in enumerate(messages) if m.role == "user" and compaction_part(m) is None]
    return [
        Turn(s, starts[k + 1] if k + 1 < len(starts) else len(messages))
        for k, s in enumerate(starts)
    ]


def completed_compactions(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """(compaction user index, summary index) pairs of completed compactions, oldest first."""
    index = {m.id: i for i, m in enumerate(messages)}
    out = []
    for j, m in enumerate(messages):
        if is_completed_summary(m) and m.parent_id in index:
            i = index[m.parent_id]
            if compaction_part(messages[i]) is not None:
                out.append((i, j))
    return out


def newest_summary(messages: Sequence[Message]) -> int | None:
    """Index of the newest completed summary (with any user parent), or None."""
    for j in range(len(messages) - 1, -1, -1):
        if is_completed_summary(messages[j]):
            return j
    return None


def last_index(messages: Sequence[Message], mid: str | None) -> int | None:
    """The index of the last message with id ``mid`` (as an id -> index map built over
    all of ``messages`` gives it), searched from the end: the ids a step looks up are
    those of its newest messages."""
    for k in range(len(messages) - 1, -1, -1):
        if messages[k].id == mid:
            return k
    return None


def last_completed_compaction(messages: Sequence[Message]) -> tuple[int, int] | None:
    """The newest pair of :func:`completed_compactions`, found from the end: a step after
    a compaction looks at what follows it (and the pair), not at the history before."""
    for j in range(len(messages) - 1, -1, -1):
        m = messages[j]
        if is_completed_summary(m) and m.parent_id is not None:
            i = last_index(messages, m.parent_id)
            if i is not None and compaction_part(messages[i]) is not None:
                return i, j
    return None


def project(messages: Sequence[Message]) -> list[Message]:
    """The messages the model sees: Kilo's ``filterCompacted`` then
    ``trimBeforeLastSummary``. Without a completed summary, everything.

    After a compaction only the messages from its tail on are read (the newest pair is
    found from the end, the tail's first message from the compaction backwards), so a
    step costs what followed the compaction, however long the history before it."""
    pair = last_completed_compaction(messages)
    if pair is not None:
        parent_i, summary_i = pair
        part = compaction_part(messages[parent_i])
        start = parent_i
        if part is not None and part.tail_start_id is not None:
            for k in range(parent_i - 1, -1, -1):
                if messages[k].id == part.tail_start_id:
                    start = k
                    break
        tail = messages[start:parent_i]
        if summary_i > parent_i:
            later = [*messages[parent_i + 1 : summary_i], *messages[summary_i + 1 :]]
        else:  # a summary recorded before its request: everything after the request
            later = list(messages[parent_i + 1 :])
        view = [messages[parent_i], messages[summary_i], *tail, *later]
    else:
        view = list(messages)
    # trimBeforeLastSummary: a manual summary's parent may be a plain user message.
    j = newest_summary(view)
    if j is not None:
        parent = view[j].parent_id
        for k in range(j - 1, -1, -1):
            if view[k].id == parent:
                return view[k:]
    return view


def has_non_synthetic_part(msg: Message) -> bool:
    """A user message with something a person wrote (not only injected text)."""
    return any(not (isinstance(p, TextPart) and p.synthetic) for p in msg.parts)
