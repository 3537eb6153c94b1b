"""Validators for rendered bodies: the official SDK request types and the documented shapes.

The SDK request types are TypedDicts. Pydantic ignores unknown keys in them and reads
``Iterable`` fields lazily, so :func:`strict_validator` rewrites the core schema to forbid
extra keys and to read iterables as lists. That makes a misspelled key a failure, which
is the point of the check. Bedrock and Gemini have no SDK type here; their bodies are
checked against the JSON Schemas in ``schemas/``, written from the API references.

Extensions of a Chat Completions server (OpenAI-compatible ``cache_control``, Copilot's
``copilot_cache_control``, a reasoning field) are checked on their own and taken out
before the body meets the OpenAI type. Responses API bodies meet the SDK's
``ResponseCreateParamsNonStreaming``; their ``reasoning`` items carry no ``id`` (see
``kilo_rules.engine.providers.openai_responses``), so the check gives each a stand-in id, the one
field the SDK type requires that an input item sent back with ``store: false`` leaves out.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pydantic_core
from anthropic.types.beta.message_create_params import (
    MessageCreateParamsNonStreaming as BetaMessageCreateParamsNonStreaming,
)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

SCHEMAS = Path(__file__).parent / "schemas"
CACHE_CONTROL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {"type": {"const": "ephemeral"}, "ttl": {"enum": ["5m", "1h"]}},
}
COPILOT_CACHE_CONTROL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {"type": {"const": "ephemeral"}},
}


def _tighten(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "generator":
            node["type"] = "list"
        # A node that types its extra keys (a JSON Schema object in the beta types) says
        # extras are part of the shape: it is left open.
        open_extras = "extras_schema" in node
        if node.get("type") in ("typed-dict", "model-fields") and not open_extras:
            node["extra_behavior"] = "forbid"
        if node.get("type") == "model" and isinstance(node.get("config"), dict):
            fields = node.get("schema")
            if not (isinstance(fields, dict) and "extras_schema" in fields):
                node["config"]["extra_fields_behavior"] = "forbid"
        for value in node.values():
            _tighten(value)
    elif isinstance(node, list):
        for value in node:
            _tighten(value)


@cache
def strict_validator(name: str) -> pydantic_core.SchemaValidator:
    """A validator for the SDK request type that rejects unknown keys."""
    kind = {
        "anthropic": MessageCreateParamsNonStreaming,
        # Context editing and server-side compaction are beta: their type is the beta one.
        "anthropic-beta": BetaMessageCreateParamsNonStreaming,
        "openai": CompletionCreateParamsNonStreaming,
        "openai-responses": ResponseCreateParamsNonStreaming,
    }
    schema = copy.deepcopy(TypeAdapter(kind[name]).core_schema)
    _tighten(schema)
    return pydantic_core.SchemaValidator(schema)


@cache
def schema_validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@cache
def _mark_validator(schema_json: str) -> jsonschema.protocols.Validator:
    # jsonschema.validate checks the schema against its metaschema on every call, which
    # cost more than the rest of a replay's wire checks; the schema is checked once here.
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def strip_extension(
    body: Any,
    reasoning_field: str | None = None,
    mark_key: str = "cache_control",
    mark_schema: dict[str, Any] = CACHE_CONTROL,
) -> Any:
    """The OpenAI-compatible body minus its extensions, each checked on the way out."""
    if isinstance(body, list):
        return [strip_extension(v, reasoning_field, mark_key, mark_schema) for v in body]
    if not isinstance(body, dict):
        return body
    out = {}
    for key, value in body.items():
        if key == mark_key:
            _mark_validator(json.dumps(mark_schema, sort_keys=True)).validate(value)
        elif key == reasoning_field:
            assert isinstance(value, str)
        else:
            out[key] = strip_extension(value, reasoning_field, mark_key, mark_schema)
    return out


def with_reasoning_ids(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses body with a stand-in id on each reasoning item (none may have one)."""
    items = []
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("type") == "reasoning":
            assert "id" not in item, "reasoning items are sent without an id"
            item = {**item, "id": "rs_stand_in"}
        items.append(item)
    return {**body, "input": items}


def check(body: dict[str, Any], api: str) -> None:
    """Raise if ``body`` is not a valid request for ``api``."""
    if api == "anthropic":
        beta = "context_management" in body
        strict_validator("anthropic-beta" if beta else "anthropic").validate_python(body)
    elif api == "openai":
        strict_validator("openai").validate_python(body)
    elif api == "openai-compatible":
        strict_validator("openai").validate_python(strip_extension(body, "reasoning_content"))
    elif api == "copilot":
        bare = strip_extension(body, None, "copilot_cache_control", COPILOT_CACHE_CONTROL)
        strict_validator("openai").validate_python(bare)
    elif api == "openai-responses":
        strict_validator("openai-responses").validate_python(with_reasoning_ids(body))
    elif api == "bedrock":
        schema_validator("bedrock-converse.request.json").validate(body)
    elif api == "gemini":
        schema_validator("gemini-generate-content.request.json").validate(body)
    else:
        raise AssertionError(f"no validator for wire API {api!r}")
