"""The JSON Schemas in ``schemas/``, generated from the typed models.

The models are the single source of truth; ``kilo-rules schema --write`` regenerates the
files and a test fails when a committed schema drifts from its model.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

BASE_ID = "https://kilo-rules.dev/schemas/"


class _Generator(GenerateJsonSchema):
    """Draft 2020-12 output with a ``description`` on every property."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _strip_titles(v) for k, v in node.items() if k != "title" or not isinstance(v, str)
        }
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def _plain_types(branch: Any) -> list[str] | None:
    """The types of a branch made only of ``{"type": ...}`` alternatives, else None."""
    if not isinstance(branch, dict):
        return None
    if set(branch) <= {"type", "x-expression"}:
        t = branch.get("type")
        if isinstance(t, str):
            return [t]
        if isinstance(t, list):
            return [str(x) for x in t]
    if set(branch) <= {"anyOf", "x-expression"} and "anyOf" in branch:
        out: list[str] = []
        for b in branch["anyOf"]:
            t = _plain_types(b)
            if t is None:
                return None
            out.extend(t)
        return out
    return None


def _flatten(node: Any) -> Any:
    """Turn ``anyOf`` of plain types into one ``type`` list: shorter schemas, and
    validation messages that name every accepted type at once."""
    if isinstance(node, list):
        return [_flatten(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _flatten(v) for k, v in node.items()}
    if "anyOf" in node:
        types: list[str] = []
        expr = None
        for b in node["anyOf"]:
            t = _plain_types(b)
            if t is None:
                return node
            types.extend(t)
            expr = expr or (b.get("x-expression") if isinstance(b, dict) else None)
        del node["anyOf"]
        uniq = list(dict.fromkeys(types))
        node["type"] = uniq[0] if len(uniq) == 1 else uniq
        if expr:
            node["x-expression"] = expr
    return node


def _generate(model: type[BaseModel], name: str, title: str) -> dict[str, Any]:
    body: JsonSchemaValue = model.model_json_schema(
        mode="validation", schema_generator=_Generator, ref_template="#/$defs/{model}"
    )
    body = _flatten(_strip_titles(body))
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": BASE_ID + name,
        "title": title,
    }
    out.update(body)
    return out


def _models() -> dict[str, tuple[type[BaseModel], str]]:
    from kilo_rules.engine.formats.catalog import Catalog
    from kilo_rules.engine.formats.policy import Policy
    from kilo_rules.engine.formats.policytest_format import PolicyTestFile
    from kilo_rules.engine.formats.session import Session
    from kilo_rules.engine.formats.tune_format import TuneFile
    from kilo_rules.engine.frontend.routes import RoutesFile
    from kilo_rules.tools.simulation.documents import CorpusDocument, SessionDocument, TuneReport

    return {
        "policy.v1.json": (Policy, "kilo-rules policy v1"),
        "session.v1.json": (Session, "kilo-rules session v1"),
        "catalog.v1.json": (Catalog, "kilo-rules model catalog v1"),
        "routes.v1.json": (RoutesFile, "kilo-rules routes v1"),
        "policytest.v1.json": (PolicyTestFile, "kilo-rules policy tests v1"),
        "tune.v1.json": (TuneFile, "kilo-rules tune v1"),
        "simulate.v1.json": (SessionDocument, "kilo-rules simulate document v1"),
        "corpus.v1.json": (CorpusDocument, "kilo-rules simulate corpus document v1"),
        "tune-report.v1.json": (TuneReport, "kilo-rules tune report v1"),
    }


def generated_schemas() -> dict[str, dict[str, Any]]:
    """File name → schema document, as the models define them."""
    return {name: _generate(m, name, t) for name, (m, t) in _models().items()}


def render(schema: dict[str, Any]) -> str:
    """Serialise a schema the way it is committed (stable, diff-friendly)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
