"""A wire API defined in this one module is usable end to end: a catalog model names it,
kilo-default compiles for that model, a step renders through its renderer, and the cache
markers the runtime places are capped by its budget; the acceptance checks and the
simulator's server edits read its record too. Nothing outside this module knows it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kilo_rules.engine.base.errors import CatalogError
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import EXPLICIT_BREAKPOINTS, WIRE_BREAKPOINTS, known_values
from kilo_rules.engine.formats.request import ModelRequest, Text
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.providers import (
    WireApiSpec,
    count_markers,
    endpoint,
    headers,
    register,
    render,
    unregister,
)
from kilo_rules.engine.providers._api_rules import ApiRules
from kilo_rules.engine.providers.acceptance import RULES, check_body, rules_for
from kilo_rules.engine.providers.serversim import ServerEdits
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput
from tests.runtime.helpers import assistant, model, session, text, tool, user

NAME = "made-up-wire"
MARK = "made_up_mark"


def _render(request: ModelRequest) -> dict[str, Any]:
    """Chat Completions-like turns, one text each, a mark key on a marked message."""
    turns = []
    for m in request.messages:
        words = " ".join(p.text for p in m.parts if isinstance(p, Text))
        role = "user" if m.role == "tool" else m.role  # no tool calls on this wire
        turn: dict[str, Any] = {"role": role, "content": words or "(parts)"}
        if m.cache is not None or any(p.cache is not None for p in m.parts):
            turn[MARK] = {"ttl": "5m"}
        turns.append(turn)
    return {"model": request.model, "messages": turns}


def _record(budget: int, name: str = NAME) -> WireApiSpec:
    return WireApiSpec(
        facts=wireapi.WireFacts(
            name,
            marker_budget=budget,
            server=wireapi.ServerEditFacts(frozenset({"compaction"}), "messages"),
        ),
        render=_render,
        endpoint="/v9/made-up",
        marker_key=MARK,
        headers=lambda request: {"x-made-up": request.model},
        rules=ApiRules(shape="chat", pairing="tool-messages", output_cap=("max_tokens",)),
    )


@pytest.fixture
def made_up() -> Iterator[WireApiSpec]:
    record = register(_record(budget=2))
    try:
        yield record
    finally:
        unregister(NAME)


def _conversation() -> Session:
    return session(
        user("u1", "one"),
        assistant("a1", tool("t1", "x"), finish="tool-calls"),
        user("u2", "two"),
        assistant("a2", text("t", "done")),
        user("u3", "three"),
    )


def test_unregistered_name_is_refused_by_the_catalog_and_the_renderers() -> None:
    with pytest.raises(CatalogError, match=r"model\.invalid"):
        model(api=NAME)
    with pytest.raises(CatalogError, match="unknown wire API"):
        render(ModelRequest(model="m", messages=()), NAME)
    assert NAME not in WIRE_BREAKPOINTS
    assert NAME not in RULES


def test_made_up_api_end_to_end(made_up: WireApiSpec) -> None:
    m = model(api=NAME)  # a catalog model naming it validates
    assert m.api == NAME
    assert NAME in known_values(None)["model.api"]  # so `check` knows the name
    plan = compile_policy("kilo-default", m)
    assert plan.cache["provider_limit"] == 2

    result = apply_plan(plan, _conversation(), StepInput())
    assert result.provider == NAME
    body = result.request
    assert list(body) == ["model", "messages"]  # this module's renderer wrote it
    assert body["model"] == "claude-test"
    # kilo-default asks for three marks on an Anthropic-family model (system, last two
    # messages); this API's budget of 2 keeps two.
    assert count_markers(body, NAME) == 2
    assert result.headers == {"x-made-up": "claude-test"}
    assert check_body(body, NAME) == []


def test_the_budget_is_the_records() -> None:
    # Another made-up API, with a budget of 1 (a name's facts stay fixed in a process:
    # compiled plans are cached per model).
    name = "made-up-wire-one"
    register(_record(budget=1, name=name))
    try:
        plan = compile_policy("kilo-default", model(id="test/one", api=name))
        body = apply_plan(plan, _conversation(), StepInput()).request
        assert count_markers(body, name) == 1
        assert WIRE_BREAKPOINTS[name] == 1
        assert name not in EXPLICIT_BREAKPOINTS
    finally:
        unregister(name)
    assert name not in WIRE_BREAKPOINTS


def test_record_feeds_every_look_up(made_up: WireApiSpec) -> None:
    request = ModelRequest(model="m", messages=())
    assert endpoint(request, NAME) == "/v9/made-up"
    assert headers(request, NAME) == {"x-made-up": "m"}
    # The acceptance rules take the record's marker key and budget.
    assert RULES[NAME].marker_key == MARK
    assert RULES[NAME].marker_budget == 2
    assert "marker-budget" in rules_for(NAME)
    over = {
        "model": "m",
        "messages": [{"role": "user", "content": "x", MARK: {}} for _ in range(3)],
    }
    assert [v.rule for v in check_body(over, NAME)] == ["marker-budget"]


def test_server_edits_read_the_record(made_up: WireApiSpec) -> None:
    edits = ServerEdits([{"edit": "compaction", "trigger": 1}], NAME, len)
    assert edits.active
    body = {"messages": [{"role": "user", "content": "x" * 50} for _ in range(4)]}
    out, step = edits.apply(body)
    assert step.compacted
    assert out["messages"][0]["content"][0]["type"] == "text"
    # clear_thinking is not among the edits this provider runs.
    thinking = {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}
    played = ServerEdits([{"edit": "clear_thinking", "keep": 0}], NAME, len)
    assert played.apply({"messages": [thinking, thinking]})[1].cleared_thinking == 0


def test_a_name_is_taken_once(made_up: WireApiSpec) -> None:
    with pytest.raises(CatalogError, match="already registered"):
        register(_record(budget=3))
    register(made_up)  # the same record again is a no-op
    with pytest.raises(CatalogError, match="built in"):
        unregister("anthropic")
