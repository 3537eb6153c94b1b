"""The typed lists of wire API names that stay Literals (for mypy and the JSON Schemas)
agree with the registry's facts, and each built-in record is the registry's."""

from __future__ import annotations

from typing import get_args

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import EXPLICIT_BREAKPOINTS, WIRE_BREAKPOINTS, WireApi
from kilo_rules.engine.formats.policy import Cache
from kilo_rules.engine.providers import APIS, anthropic, registry
from kilo_rules.engine.providers.acceptance import RULES


def test_wire_api_literal_is_the_builtin_facts() -> None:
    assert get_args(WireApi) == tuple(f.name for f in wireapi.BUILTIN)
    assert tuple(sorted(get_args(WireApi))) == APIS


def test_policy_cache_shapes_are_the_facts_marker_shapes() -> None:
    keys, values = get_args(Cache.model_fields["shapes"].annotation)
    choices = {f.name: f.marker_shapes for f in wireapi.BUILTIN if f.marker_shapes}
    assert set(get_args(keys)) == set(choices)
    assert set(get_args(values)) == {s for shapes in choices.values() for s in shapes}


def test_breakpoint_tables_read_the_facts() -> None:
    assert dict(WIRE_BREAKPOINTS) == {f.name: f.marker_budget for f in wireapi.BUILTIN}
    assert dict(EXPLICIT_BREAKPOINTS) == {"openai": 4, "openai-responses": 4}


def test_acceptance_marker_budget_is_the_records() -> None:
    # The marker key and budget are written once, in the record, not in the rules.
    for name in APIS:
        spec = registry.spec(name)
        assert RULES[name].marker_key == spec.marker_key
        if spec.marker_key is None:
            assert RULES[name].marker_budget is None
        else:
            explicit = spec.facts.explicit_breakpoints
            assert RULES[name].marker_budget == (
                explicit if explicit is not None else spec.facts.marker_budget
            )
    assert registry.spec("anthropic") is anthropic.SPEC


def test_only_anthropic_places_a_breakpoint_of_its_own() -> None:
    # verify counts the automatic breakpoint against the budget of the APIs that have one.
    assert {f.name for f in wireapi.BUILTIN if f.automatic_marker} == {"anthropic"}
