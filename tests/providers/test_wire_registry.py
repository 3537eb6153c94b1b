"""The built-in wire APIs are one list, their facts (``wireapi.BUILTIN``): the renderers
registered, the catalog's and the policy's JSON Schemas and the CLI's choices are read from
it, and each built-in record is the registry's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import (
    EXPLICIT_BREAKPOINTS,
    WIRE_BREAKPOINTS,
    ModelInfo,
)
from kilo_rules.engine.formats.policy import Cache
from kilo_rules.engine.providers import APIS, anthropic, registry
from kilo_rules.engine.providers.acceptance import RULES


def test_every_builtin_facts_has_its_module_registered() -> None:
    assert tuple(sorted(f.name for f in wireapi.BUILTIN)) == APIS
    for f in wireapi.BUILTIN:
        assert registry.spec(f.name).facts is f
    schema = ModelInfo.model_json_schema()["properties"]["api"]
    assert schema["enum"] == [f.name for f in wireapi.BUILTIN]


def test_policy_cache_shapes_schema_is_the_facts_marker_shapes() -> None:
    schema = Cache.model_json_schema()["properties"]["shapes"]
    choices = {f.name: list(f.marker_shapes) for f in wireapi.BUILTIN if f.marker_shapes}
    assert {k: v["enum"] for k, v in schema["properties"].items()} == choices
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("shapes", "ok"),
    [
        ({"openai": "explicit", "openai-compatible": "cache_control"}, True),
        ({"openai-responses": "none"}, True),
        ({"openai": "cache_control"}, False),  # a shape of another API
        ({"anthropic": "none"}, False),  # no choice there: marks are how it caches
        ({"opnai": "none"}, False),
    ],
)
def test_policy_cache_shapes_are_checked_per_api(shapes: dict[str, Any], ok: bool) -> None:
    if ok:
        assert dict(Cache.model_validate({"shapes": shapes}).shapes) == shapes
    else:
        with pytest.raises(ValidationError) as err:
            Cache.model_validate({"shapes": shapes})
        assert next(iter(shapes)) in str(err.value)


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
