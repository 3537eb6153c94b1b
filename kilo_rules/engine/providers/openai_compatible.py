"""OpenAI-compatible Chat Completions (OpenRouter, LiteLLM, gateways): the request body.

The body is OpenAI's Chat Completions shape (see :mod:`.openai`) with the extensions these
servers accept:

* cache marks → ``cache_control: {"type": "ephemeral"}`` (``"ttl": "1h"`` for the hour
  bucket) on the marked content part, which OpenRouter forwards to Anthropic and Gemini
  models. A message-level mark goes on the message's last content part; string content
  becomes a one-part array when it is marked. A turn of only tool calls has no content
  part, so its mark goes on the message object, as Kilo's AI-SDK path does with
  message-level provider options;
* the output limit is sent as ``max_tokens``, the key these servers document;
* reasoning is sent back only when ``options["reasoning_field"]`` names the assistant
  field for it (``reasoning_content`` for DeepSeek and Moonshot, which need it on
  tool-call turns); otherwise it is dropped, as for OpenAI.

Tool-call ids are passed through unchanged: these servers forward them as they are, and a
server in front of Anthropic cleans them itself.
"""

from __future__ import annotations

from typing import Any

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.request import CacheMark, ModelRequest
from kilo_rules.engine.providers._api_rules import TOOL_NAME, ApiRules
from kilo_rules.engine.providers._shared import FragmentStore
from kilo_rules.engine.providers.openai import Dialect, render_chat, render_chat_json
from kilo_rules.engine.providers.registry import WireApiSpec

ENDPOINT = "/chat/completions"  # relative to the server's base URL (often ending in /v1)


def cache_control(mark: CacheMark) -> dict[str, Any]:
    """The wire form of a mark, as OpenRouter documents it for content parts."""
    out: dict[str, Any] = {"type": "ephemeral"}
    if mark.ttl == "1h":
        out["ttl"] = "1h"
    return out


def dialect(request: ModelRequest) -> Dialect:
    """The OpenAI-compatible dialect for ``request`` (its options pick the reasoning field)."""
    field = request.options.get("reasoning_field")
    return Dialect(
        part_mark=cache_control,
        mark_key="cache_control",
        message_mark=True,
        max_tokens_key="max_tokens",
        reasoning_field=field if isinstance(field, str) and field else None,
    )


def render(request: ModelRequest) -> dict[str, Any]:
    """The OpenAI-compatible request body for ``request`` (JSON-serialisable, deterministic)."""
    return render_chat(request, dialect(request))


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, from per-message fragments (kept per
    reasoning field, the one option the dialect reads)."""
    chosen = dialect(request)
    return render_chat_json(
        request, chosen, fragments, f"openai-compatible+{chosen.reasoning_field or ''}"
    )


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("openai-compatible"),
    render=render,
    render_json=render_json,
    endpoint=ENDPOINT,
    marker_key="cache_control",
    rules=ApiRules(
        shape="chat",
        pairing="tool-messages",
        unique_call_ids=True,
        marked_text_not_blank=True,
        assistant_needs_content=True,
        tool_name_pattern=TOOL_NAME,
        output_cap=("max_tokens",),
    ),
)
