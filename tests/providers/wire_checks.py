"""Validators for rendered bodies: the official SDK request types and the documented shapes.

The SDK request types are TypedDicts. Pydantic ignores unknown keys in them and reads
``Iterable`` fields lazily, so :func:`strict_validator` rewrites the core schema to forbid
extra keys and to read iterables as lists. That makes a misspelled key a failure, which
is the point of the check. Bedrock and Gemini have no SDK type here; their bodies are
checked against the JSON Schemas in ``schemas/``, written from the API references.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pydantic_core
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from pydantic import TypeAdapter

SCHEMAS = Path(__file__).parent / "schemas"
CACHE_CONTROL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {"type": {"const": "ephemeral"}, "ttl": {"enum": ["5m", "1h"]}},
}


def _tighten(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "generator":
            node["type"] = "list"
        if node.get("type") in ("typed-dict", "model-fields"):
            node["extra_behavior"] = "forbid"
        if node.get("type") == "model" and isinstance(node.get("config"), dict):
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
        "openai": CompletionCreateParamsNonStreaming,
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


def strip_extension(body: Any, reasoning_field: str | None = None) -> Any:
    """The OpenAI-compatible body minus its extensions, each checked on the way out."""
    if isinstance(body, list):
        return [strip_extension(v, reasoning_field) for v in body]
    if not isinstance(body, dict):
        return body
    out = {}
    for key, value in body.items():
        if key == "cache_control":
            jsonschema.validate(value, CACHE_CONTROL)
        elif key == reasoning_field:
            assert isinstance(value, str)
        else:
            out[key] = strip_extension(value, reasoning_field)
    return out


def check(body: dict[str, Any], api: str) -> None:
    """Raise if ``body`` is not a valid request for ``api``."""
    if api == "anthropic":
        strict_validator("anthropic").validate_python(body)
    elif api == "openai":
        strict_validator("openai").validate_python(body)
    elif api == "openai-compatible":
        strict_validator("openai").validate_python(strip_extension(body, "reasoning_content"))
    elif api == "bedrock":
        schema_validator("bedrock-converse.request.json").validate(body)
    else:
        schema_validator("gemini-generate-content.request.json").validate(body)
