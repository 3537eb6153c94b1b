"""The committed JSON Schemas: in step with the models, documented, and satisfied by the
bundled files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kilo_rules.engine.formats.load import load_yaml_resource
from kilo_rules.engine.formats.policy import expression_fields
from kilo_rules.tools.checking.jsonschemas import generated_schemas, render

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


@pytest.mark.parametrize("name", sorted(generated_schemas()))
def test_committed_schema_matches_model(name: str) -> None:
    committed = (SCHEMAS / name).read_text(encoding="utf-8")
    assert committed == render(generated_schemas()[name]), (
        f"schemas/{name} is stale: run `kilo-rules schema --write`"
    )


def _properties(node: Any, path: str = "") -> list[tuple[str, Any]]:
    out = []
    if isinstance(node, dict):
        for k, v in (node.get("properties") or {}).items():
            out.append((f"{path}.{k}", v))
        for k, v in node.items():
            if k != "properties":
                out.extend(_properties(v, f"{path}/{k}"))
        for k, v in (node.get("properties") or {}).items():
            out.extend(_properties(v, f"{path}.{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_properties(v, f"{path}[{i}]"))
    return out


@pytest.mark.parametrize("name", sorted(generated_schemas()))
def test_schema_is_valid_versioned_and_documented(name: str) -> None:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(f"/{name}") and ".v1." in schema["$id"]
    undocumented = [p for p, v in _properties(schema) if "description" not in v and "$ref" not in v]
    assert not undocumented, undocumented


def test_policy_schema_closes_every_object() -> None:
    schema = json.loads((SCHEMAS / "policy.v1.json").read_text(encoding="utf-8"))
    for name, d in schema["$defs"].items():
        if d.get("type") == "object" and "properties" in d:
            assert d.get("additionalProperties") is False, name


def test_expression_fields_are_found_in_kilo_default() -> None:
    doc = load_yaml_resource("kilo-default.yaml")
    fields = dict(expression_fields(doc.data))
    assert fields[("budget", "usable")] == "int"
    assert fields[("output", "send")] == "bool"
    assert fields[("prompts", "rules", 0, "when")] == "bool"
    assert fields[("cache", "placement")] == "str"
    assert ("prune", "protect_tokens") not in fields  # a plain integer there


def test_expression_types_come_from_the_model_through_lists_and_overrides() -> None:
    from kilo_rules.engine.formats.policy import expression_kind

    assert expression_kind(("budget", "usable")) == "int"
    assert expression_kind(("overflow", "threshold_percent")) == "number?"
    assert expression_kind(("prompts", "rules", 3, "replace", "name")) == "str"
    assert expression_kind(("overrides", 0, "set", "output", "send")) == "bool"
    assert expression_kind(("overrides", 0, "when")) == "bool"
    assert expression_kind(("prune", "protect_turns")) is None  # a plain setting
    assert expression_kind(("budget", "nope")) is None
    fields = dict(
        expression_fields(
            {"overrides": [{"when": "model.id == 'x'", "set": {"budget": {"usable": "1 + 1"}}}]}
        )
    )
    assert fields == {
        ("overrides", 0, "when"): "bool",
        ("overrides", 0, "set", "budget", "usable"): "int",
    }


def test_the_schema_command_offers_every_generated_schema() -> None:
    from kilo_rules.tools.cli.schema import NAMES

    assert sorted(f"{n}.v1.json" for n in NAMES) == sorted(generated_schemas())
