"""Golden bodies: the sample request, marked as Kilo marks it, rendered for each wire API.

The expected bodies live in ``golden/<api>.json``. After a deliberate change to a renderer,
rewrite them with ``KILO_RULES_UPDATE_GOLDEN=1 pytest tests/providers`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from provider_samples import sample_request

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.request import ModelRequest
from kilo_rules.engine.providers import APIS, endpoint, render
from kilo_rules.engine.runtime.cache import place_markers

GOLDEN = Path(__file__).parent / "golden"

# Kilo marks whole messages for Anthropic and Bedrock and the last stable part elsewhere
# (Copilot's renderer then moves each mark to its message); it places none for OpenAI
# models before GPT-5.6 or for Gemini.
SETTINGS = {
    "anthropic": CacheSettings(placement="message"),
    "bedrock": CacheSettings(placement="message"),
    "openai-compatible": CacheSettings(placement="last-part", skip_trailing_environment=True),
    "copilot": CacheSettings(placement="last-part", skip_trailing_environment=True),
    "openai": CacheSettings(enabled=False),
    "openai-responses": CacheSettings(enabled=False),
    "gemini": CacheSettings(enabled=False),
}


def marked(api: str) -> ModelRequest:
    request, _ = place_markers(sample_request(), SETTINGS[api])
    return request


def dump(body: object) -> str:
    return json.dumps(body, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("api", APIS)
def test_golden_body(api: str) -> None:
    text = dump(render(marked(api), api))
    path = GOLDEN / f"{api}.json"
    if os.environ.get("KILO_RULES_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("api", APIS)
def test_same_request_same_bytes(api: str) -> None:
    first = json.dumps(render(marked(api), api))
    second = json.dumps(render(marked(api), api))
    assert first == second


def test_endpoints() -> None:
    request = sample_request("anthropic.claude-sonnet-4-5-v1:0")
    assert endpoint(request, "anthropic") == "/v1/messages"
    assert endpoint(request, "openai") == "/v1/chat/completions"
    assert endpoint(request, "openai-compatible") == "/chat/completions"
    assert endpoint(request, "openai-responses") == "/v1/responses"
    assert endpoint(request, "copilot") == "/chat/completions"
    assert endpoint(request, "bedrock") == "/model/anthropic.claude-sonnet-4-5-v1%3A0/converse"
    gemini = sample_request("gemini-2.5-pro")
    assert endpoint(gemini, "gemini") == "/v1beta/models/gemini-2.5-pro:generateContent"
