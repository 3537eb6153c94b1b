"""Work a step reuses from the steps before: the rendered wire text of unchanged messages,
and a request the caller owns, whatever it does with it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.request import Approval, CacheMark, ModelMessage, Text
from kilo_rules.engine.formats.session import Message, Session
from kilo_rules.engine.providers import APIS, render, render_json
from kilo_rules.engine.providers import anthropic as anthropic_wire
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.memo import Fragments

from ..providers.provider_samples import sample_request
from .helpers import assistant, model, session, text, tool, user

NOWHERE = "/nonexistent/kilo-rules-step-reuse"
STEP = StepInput(workspace=Workspace(cwd=NOWHERE, root=NOWHERE, home=f"{NOWHERE}/home"))


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _conversation(turns: int) -> list[Message]:
    out: list[Message] = []
    for k in range(turns):
        out.append(user(f"u{k}", f"question {k} \u00e9\u4e2d"))
        out.append(
            assistant(
                f"a{k}",
                text(f"a{k}-t", f"answer {k}"),
                tool(f"a{k}-c", output=f"output {k}"),
                text(f"a{k}-d", "done"),
            )
        )
    return out


def _plan(api: str = "anthropic") -> Any:
    return compile_policy("kilo-default", model(api=api))


def _requests() -> list[Any]:
    base = sample_request()
    marked = replace(
        base,
        messages=tuple(
            replace(m, cache=CacheMark(ttl="1h")) if i in (2, 5) else m
            for i, m in enumerate(base.messages)
        ),
    )
    approval = replace(
        base,
        messages=(
            *base.messages,
            ModelMessage("assistant", (Approval("ap1", "call9"),)),
            ModelMessage("assistant", (Text("after"), Approval("ap2", "call8"))),
        ),
    )
    edits = replace(
        base,
        options={"automatic_cache": "1h", "server_edits": [{"edit": "clear_thinking", "keep": 1}]},
    )
    return [base, marked, approval, edits]


@pytest.mark.parametrize("api", APIS)
def test_the_wire_text_is_the_rendered_body_byte_for_byte(api: str) -> None:
    fragments = Fragments()
    for request in _requests():
        expected = _dumps(render(request, api))
        assert render_json(request, api).decode() == expected
        assert render_json(request, api, fragments).decode() == expected
        assert render_json(request, api, fragments).decode() == expected  # from fragments


def test_a_step_renders_only_the_messages_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan()
    history = _conversation(30)
    apply_plan(plan, session(*history), STEP)
    rendered: list[ModelMessage] = []
    real = anthropic_wire._message

    def counting(msg: ModelMessage) -> dict[str, Any]:
        rendered.append(msg)
        return real(msg)

    monkeypatch.setattr(anthropic_wire, "_message", counting)
    nxt = [*history, user("u-new", "one more"), assistant("a-new", text("a-new-t", "ok"))]
    result = apply_plan(plan, session(*nxt), STEP)
    # The new messages, and those whose cache marks moved (kilo-default marks the last two
    # non-system messages): nowhere near the 90 messages the request holds.
    assert 2 <= len(rendered) <= 6
    assert len(result.model_request.conversation) >= 90
    monkeypatch.setattr(anthropic_wire, "_message", real)
    assert result.body() == _dumps(render(result.model_request, "anthropic"))


def test_changing_a_returned_request_does_not_change_the_next_one() -> None:
    plan = _plan()
    s = session(*_conversation(5))
    first = apply_plan(plan, s, STEP)
    expected = first.body()
    request = first.request
    for message in request["messages"]:
        for block in message["content"]:
            if block.get("type") == "tool_use":
                block["input"]["path"] = "/etc/passwd"
            if block.get("type") == "text":
                block["text"] = "changed"
    request["system"].clear()
    again = apply_plan(plan, s, STEP)
    assert again.body() == expected
    assert again.request == json.loads(expected)
    assert first.body() == expected  # the result's own text is not its decoded dict


def test_the_request_is_the_body_decoded_and_the_result_compares_by_it() -> None:
    plan = _plan()
    s = session(*_conversation(3))
    one, two = apply_plan(plan, s, STEP), apply_plan(plan, s, STEP)
    assert one.request == json.loads(one.body())
    assert one.request is one.request  # decoded once per result
    assert one.request is not two.request
    assert one == two
    assert one.to_json()["request"] == one.request


def test_a_session_read_back_from_json_reuses_the_rendered_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = _plan()
    s = session(*_conversation(20))
    apply_plan(plan, s, STEP)
    rendered: list[ModelMessage] = []
    real = anthropic_wire._message

    def counting(msg: ModelMessage) -> dict[str, Any]:
        rendered.append(msg)
        return real(msg)

    monkeypatch.setattr(anthropic_wire, "_message", counting)
    again = apply_plan(plan, Session.model_validate_json(s.model_dump_json()), STEP)
    assert len(rendered) <= 4  # only the marked messages: the others are the same objects
    monkeypatch.setattr(anthropic_wire, "_message", real)
    assert again.body() == _dumps(render(again.model_request, "anthropic"))


def _facts_by_history(messages: list[Message]) -> tuple[int, int, int, bool, int]:
    from kilo_rules.engine.runtime.history import completed_compactions, turns

    return (
        len(messages),
        len(turns(messages)),
        len(completed_compactions(messages)),
        any(m.summary and m.finish for m in messages),
        max((m.created for m in messages), default=0),
    )


def _compacted_history() -> list[Message]:
    from kilo_rules.engine.formats.session import CompactionPart

    history = _conversation(4)
    request = Message(
        id="c1", role="user", created=9, parts=[CompactionPart(id="c1-p", tail_start_id="u3")]
    )
    summary = assistant("s1", text("s1-t", "summary"), summary=True, parent_id="c1", created=10)
    return [*history, request, summary, *_conversation(2)[:1]]


def test_session_facts_are_read_on_from_the_list_seen_before() -> None:
    from kilo_rules.engine.runtime.memo import FactsMemo

    memo = FactsMemo()
    full = _compacted_history()
    for end in range(len(full) + 1):  # each step one message more, the objects reused
        got = memo.facts(full[:end])
        assert (got.messages, got.turns, got.compactions, got.has_summary, got.latest) == (
            _facts_by_history(full[:end])
        )
    # A list that does not extend the one seen: an earlier message changed, or gone.
    edited = [*full[:3], full[3].model_copy(update={"summary": True}), *full[4:]]
    dropped = full[:5] + full[6:]
    for other in (edited, dropped, full[:4], tuple(full)):
        got = memo.facts(other)
        expected = _facts_by_history(list(other))
        assert (got.messages, got.turns, got.compactions, got.has_summary, got.latest) == expected


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ([], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3, 4], [1, 2], 2),
        ([1, 2, 3], [9, 2, 3], 0),
        (list(range(100)), [*range(57), -1, *range(58, 100)], 57),
        (list(range(100)), [*range(99), -1], 99),
    ],
)
def test_common_prefix(a: list[int], b: list[int], shared: int) -> None:
    from kilo_rules.engine.runtime.memo import common_prefix

    assert common_prefix(a, b) == common_prefix(b, a) == shared


def test_a_prefix_memo_makes_only_what_follows_the_shared_prefix() -> None:
    from kilo_rules.engine.runtime.memo import PrefixMemo

    memo: PrefixMemo[object, tuple[int, object]] = PrefixMemo()
    made: list[object] = []

    def make(i: int, item: object) -> tuple[int, object]:
        made.append(item)
        return (i, item)

    items = [object() for _ in range(10)]
    assert memo.values(items, make) == list(enumerate(items))
    made.clear()
    changed = [*items[:6], object(), *items[7:], object()]
    assert memo.values(changed, make) == list(enumerate(changed))
    assert made == changed[6:]  # from the first item that is not the one seen
    made.clear()
    assert memo.values(changed, make, context="other") == list(enumerate(changed))
    assert made == changed  # another context shares nothing


def test_a_prefix_memo_shares_between_a_tuple_and_a_list_and_under_a_key() -> None:
    from kilo_rules.engine.runtime.memo import PrefixMemo

    memo: PrefixMemo[object, int] = PrefixMemo()
    made: list[int] = []

    def make(i: int, _: object) -> int:
        made.append(i)
        return i

    items = [object() for _ in range(5)]
    memo.values(tuple(items), make)
    made.clear()
    memo.values([*items, object()], make)
    assert made == [5]
    # Under a key, the first item may be another (equal) object.
    memo.values(["head", *items], make, key="s")
    made.clear()
    memo.values(["he" + "ad", *items, object()], make, key="s")
    assert made == [6]


def test_the_wire_is_utf8_and_body_its_text_whatever_the_characters() -> None:
    plan = _plan()
    s = session(user("u0", "plain"), assistant("a0", text("a0-t", "wide \U0001f600 \u00e9")))
    result = apply_plan(plan, s, STEP)
    assert result.wire == result.body().encode("utf-8")
    assert result.body() == _dumps(render(result.model_request, "anthropic"))
    # A lone surrogate (valid in JSON text, not in UTF-8) keeps its three bytes.
    lone = replace(
        sample_request(), messages=(ModelMessage("user", (Text("half \ud800 of a pair"),)),)
    )
    for api in APIS:
        wire = render_json(lone, api, Fragments())
        assert wire.decode("utf-8", "surrogatepass") == _dumps(render(lone, api))


def test_session_facts_count_the_last_message_of_an_id() -> None:
    from kilo_rules.engine.formats.session import CompactionPart
    from kilo_rules.engine.runtime.memo import FactsMemo

    request = Message(id="c1", role="user", parts=[CompactionPart(id="c1-p")])
    summary = assistant("s1", text("s1-t", "summary"), summary=True, parent_id="c1")
    later = user("c1", "the same id, no compaction part")  # completed_compactions reads this
    memo = FactsMemo()  # the second list extends the first: only ``later`` is read
    for messages in ([request, summary], [request, summary, later]):
        got = memo.facts(messages)
        assert (got.messages, got.turns, got.compactions, got.has_summary, got.latest) == (
            _facts_by_history(messages)
        )


def test_an_empty_fragment_store_is_still_truthy() -> None:
    # `if fragments:` on a fresh store must not read as "no store" and turn reuse off.
    from kilo_rules.engine.runtime.memo import Fragments

    store = Fragments()
    assert len(store) == 0
    assert store
