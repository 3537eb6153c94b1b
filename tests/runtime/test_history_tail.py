"""The history projection after a compaction reads only what follows the compaction's tail
start, and sees what the full scan (``completed_compactions``) sees."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from hypothesis import given, settings
from hypothesis import strategies as st

from kilo_rules.engine.formats.session import CompactionPart, Message
from kilo_rules.engine.runtime.history import (
    compaction_part,
    completed_compactions,
    last_completed_compaction,
    newest_summary,
    project,
)

from .helpers import assistant, text, user


class Watched(Sequence[Message]):
    """A message list that records every index read through it."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            found = range(len(self.messages))[index]
            self.read.update(found)
            return self.messages[index]
        self.read.add(index % len(self.messages))
        return self.messages[index]


def _compaction(mid: str, tail: str | None) -> Message:
    part = CompactionPart(id=f"{mid}-p", tail_start_id=tail)
    return Message(id=mid, role="user", parts=[part])


def _summary(mid: str, parent: str) -> Message:
    return assistant(mid, text(f"{mid}-t", "summary"), summary=True, parent_id=parent)


def _history(turns: int) -> list[Message]:
    out: list[Message] = []
    for k in range(turns):
        out += [user(f"u{k:04}", f"turn {k}"), assistant(f"a{k:04}", text(f"t{k:04}", "ok"))]
    return out


def test_a_step_after_a_compaction_reads_nothing_before_its_tail() -> None:
    old = _history(500)
    tail = _history(3)
    tail = [m.model_copy(update={"id": "tail-" + m.id}) for m in tail]
    after = [user("next", "go on"), assistant("answer", text("x", "done"))]
    messages = Watched([*old, *tail, _compaction("c", tail[0].id), _summary("s", "c"), *after])
    view = project(messages)
    assert [m.id for m in view] == ["c", "s", *(m.id for m in tail), "next", "answer"]
    assert min(messages.read) == len(old)  # the tail's first message, nothing before


def _reference_project(messages: Sequence[Message]) -> list[Message]:
    """The projection as a scan of every message computes it."""
    pairs = completed_compactions(messages)
    if pairs:
        parent_i, summary_i = pairs[-1]
        part = compaction_part(messages[parent_i])
        start = parent_i
        if part is not None and part.tail_start_id is not None:
            for k in range(parent_i - 1, -1, -1):
                if messages[k].id == part.tail_start_id:
                    start = k
                    break
        tail = list(messages[start:parent_i])
        later = [m for k, m in enumerate(messages) if k > parent_i and k != summary_i]
        view = [messages[parent_i], messages[summary_i], *tail, *later]
    else:
        view = list(messages)
    j = newest_summary(view)
    if j is not None:
        parent = view[j].parent_id
        for k in range(j - 1, -1, -1):
            if view[k].id == parent:
                return view[k:]
    return view


IDS = [f"m{k}" for k in range(6)]


def _message(kind: str, mid: str, other: str, finished: bool) -> Message:
    if kind == "user":
        return user(mid, "hi")
    if kind == "compaction":
        return _compaction(mid, other)
    if kind == "summary":
        extra: dict[str, Any] = {} if finished else {"finish": None}
        return assistant(mid, text(f"{mid}-t", "s"), summary=True, parent_id=other, **extra)
    return assistant(mid, text(f"{mid}-t", "a"))


messages_strategy = st.lists(
    st.builds(
        _message,
        st.sampled_from(["user", "assistant", "compaction", "summary"]),
        st.sampled_from(IDS),  # duplicate ids on purpose
        st.sampled_from(IDS),
        st.booleans(),
    ),
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(messages=messages_strategy)
def test_the_projection_is_that_of_the_full_scan(messages: list[Message]) -> None:
    pairs = completed_compactions(messages)
    assert last_completed_compaction(messages) == (pairs[-1] if pairs else None)
    assert project(messages) == _reference_project(messages)
