"""A body scanned by resuming from an earlier body of its conversation is scanned exactly as
if it were parsed whole."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kilo_rules.tools.serving.gateway.jsonspan import scan

texts = st.text(alphabet=st.sampled_from('aé€𝄞\n"\\ {}[],:'), max_size=12)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": texts}),
    min_size=1,
    max_size=8,
)


def _body(head: dict[str, Any], items: list[Any], tail: dict[str, Any], ascii_: bool) -> bytes:
    doc = {**head, "messages": items, **tail}
    return json.dumps(doc, ensure_ascii=ascii_).encode("utf-8", "surrogatepass")


def _same(a: Any, b: Any) -> None:
    assert a.value == b.value
    assert a.members == b.members
    assert a.items == b.items
    assert a.byte_ends == b.byte_ends


@settings(max_examples=300, deadline=None)
@given(
    messages,
    messages,
    st.integers(0, 8),
    st.dictionaries(st.sampled_from(["model", "system"]), texts, max_size=2),
    st.dictionaries(st.sampled_from(["tools", "stream", "max_tokens"]), texts, max_size=2),
    st.booleans(),
    st.booleans(),
)
def test_a_resumed_scan_equals_a_whole_one(
    old: list[Any],
    added: list[Any],
    keep: int,
    head: dict[str, Any],
    tail: dict[str, Any],
    ascii_: bool,
    marked: bool,
) -> None:
    first = _body(head, old, tail, ascii_)
    items = [*old[:keep], *added]
    if marked and items:  # the client moved its cache mark onto the newest message
        items[-1] = {**items[-1], "cache_control": {"type": "ephemeral"}}
    second = _body(head, items, tail, ascii_)
    previous = scan(first.decode(), "messages", raw=first)
    resumed = scan(second.decode(), "messages", raw=second, previous=previous)
    whole = scan(second.decode(), "messages", raw=second)
    _same(resumed, whole)
    # Every message the second body repeats is reused (the newest may carry a moved mark).
    assert resumed.reused >= min(keep, len(old)) - 1
    for span, end in zip(resumed.items or (), resumed.byte_ends, strict=True):
        assert len(second.decode()[: span.end].encode("utf-8", "surrogatepass")) == end


def test_an_appended_turn_reuses_every_earlier_message() -> None:
    history = [{"role": "user", "content": f"m{i} é"} for i in range(50)]
    first = _body({"model": "m"}, history, {"tools": []}, False)
    second = _body({"model": "m"}, [*history, {"role": "assistant", "content": "ok"}], {}, False)
    resumed = scan(
        second.decode(),
        "messages",
        raw=second,
        previous=scan(first.decode(), "messages", raw=first),
    )
    assert resumed.reused == 50
    _same(resumed, scan(second.decode(), "messages", raw=second))
