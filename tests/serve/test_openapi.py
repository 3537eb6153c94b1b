"""The generated OpenAPI document is the sidecar's contract: committed, current, documented."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.tools.checking.jsonschemas import render
from kilo_rules.tools.serving.sidecar import openapi_document

from .conftest import Live

COMMITTED = Path(__file__).resolve().parents[2] / "schemas/openapi.json"


def test_the_committed_document_is_up_to_date() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == render(openapi_document()), (
        "schemas/openapi.json is stale: run `kilo-rules serve --openapi > schemas/openapi.json`"
    )


def test_the_server_serves_the_same_document(live: Live) -> None:
    with live.client() as http:
        served = http.get("/openapi.json").json()
    assert served == json.loads(COMMITTED.read_text(encoding="utf-8"))


def _undocumented(node: Any, path: str = "") -> list[str]:
    out = []
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            if "description" not in prop:
                out.append(f"{path}.{name}")
        for key, value in node.items():
            out.extend(_undocumented(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_undocumented(value, f"{path}[{i}]"))
    return out


def test_every_operation_and_property_is_typed_and_described() -> None:
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert not _undocumented(doc["components"]["schemas"])
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op.get("summary") and op.get("operationId"), (method, path)
            ok = op["responses"]["200"]
            assert ok["description"] and ok["content"], (method, path)
            for status, answer in op["responses"].items():
                if status != "200":
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
    build = doc["paths"]["/v1/build"]["post"]
    assert build["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BuildRequest"
    }
    request = doc["components"]["schemas"]["BuildRequest"]
    assert request["properties"]["session"]["$ref"] == "#/components/schemas/Session"
    assert set(request["required"]) == {"session", "model"}
    assert {"413", "422", "404", "503", "504"} <= set(build["responses"])
