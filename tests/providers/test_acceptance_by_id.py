"""The Responses API pairs calls and results by id anywhere in the input: checked in one
pass over the turns (the sidecar checks every body it builds), with the verdicts of the
plain definition — a call needs a later result, a result an earlier call."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kilo_rules import check_body
from kilo_rules.engine.providers import _wireview as wire

IDS = st.sampled_from(["call_a", "call_b", "call_c"])
ITEM = st.one_of(
    st.builds(lambda: {"role": "user", "content": "go"}),
    st.builds(lambda: {"role": "assistant", "content": "ok"}),
    st.builds(
        lambda i: {"type": "function_call", "call_id": i, "name": "t", "arguments": "{}"}, IDS
    ),
    st.builds(lambda i: {"type": "function_call_output", "call_id": i, "output": "x"}, IDS),
)


def expected(items: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The pairing verdicts by their definition, quadratic and plain."""
    out = set()
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            later = {
                x["call_id"] for x in items[i + 1 :] if x.get("type") == "function_call_output"
            }
            if item["call_id"] not in later:
                out.add(("call-answered", f"input[{i}].call_id"))
        if item.get("type") == "function_call_output":
            earlier = [x for x in items[:i] if x.get("type") == "function_call"]
            if not earlier or item["call_id"] not in {x["call_id"] for x in earlier}:
                out.add(("result-has-call", f"input[{i}].call_id"))
    return out


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(ITEM, max_size=12))
def test_pairing_by_id_gives_the_plain_definitions_verdicts(items: list[dict[str, Any]]) -> None:
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "start"}, *items]}
    shifted = [{"role": "user", "content": "start"}, *items]
    found = {
        (v.rule, v.path)
        for v in check_body(body, "openai-responses")
        if v.rule in ("call-answered", "result-has-call")
    }
    assert found == expected(shifted)


def test_each_turn_is_read_a_bounded_number_of_times(monkeypatch: Any) -> None:
    n = 400
    items: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for k in range(n):
        items.append({"type": "function_call", "call_id": f"c{k}", "name": "t", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{k}", "output": "x"})
    reads = 0
    calls, results = wire.calls, wire.results

    def counted(fn: Any) -> Any:
        def inner(turn: Any) -> Any:
            nonlocal reads
            reads += 1
            return fn(turn)

        return inner

    monkeypatch.setattr(wire, "calls", counted(calls))
    monkeypatch.setattr(wire, "results", counted(results))
    violations = check_body({"model": "gpt-5", "input": items}, "openai-responses")
    assert [v for v in violations if v.rule in ("call-answered", "result-has-call")] == []
    turns = 2 * n + 1
    assert reads <= 8 * turns  # linear; the quadratic scan read ~turns²/2 times
