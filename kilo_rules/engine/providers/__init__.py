"""Provider wire formats: the exact JSON body a request is sent as, one module per API.

:func:`render` turns the provider-neutral :class:`~kilo_rules.engine.formats.request.ModelRequest`
into the body for one wire API, :func:`endpoint` gives the URL path it is posted to, and
:func:`count_markers` counts the cache breakpoints a rendered body carries. Each module's
docstring says what it does with system text, tools, media, reasoning and cache marks.

``options`` read by the renderers (all optional):

* ``output_limit`` (int): Anthropic's ``max_tokens`` when the request leaves it unset;
* ``automatic_cache`` (true or ``"1h"``): Anthropic's top-level automatic caching;
* ``prompt_cache_breakpoints`` (bool): OpenAI explicit breakpoints (GPT-5.6 and later), on
  Chat Completions and on the Responses API;
* ``reasoning_field`` (str): the assistant field an OpenAI-compatible server reads
  reasoning from (``reasoning_content`` for DeepSeek and Moonshot);
* ``system_as_instructions`` (bool, default true): the Responses API gets the system text
  as ``instructions``; false sends it as ``developer`` input messages instead;
* ``reasoning`` (bool): the model reasons (the catalog's ``reasoning``); the Responses API
  then asks for its encrypted reasoning back (``include``), since with ``store: false`` the
  next request can only hand the model its earlier reasoning that way.

Wire APIs: ``anthropic`` (Messages), ``bedrock`` (Converse), ``gemini``
(``generateContent``), ``openai`` (Chat Completions), ``openai-responses`` (the Responses
API), ``openai-compatible`` (Chat Completions servers such as OpenRouter and LiteLLM) and
``copilot`` (GitHub Copilot's Chat Completions, with ``copilot_cache_control`` marks).
Each module declares its API as one record (``SPEC``, a
:class:`~kilo_rules.engine.providers.registry.WireApiSpec`), and every function here reads the
registry those records are in; :func:`register` adds another wire API.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import WIRE_BREAKPOINTS, signature_issuer
from kilo_rules.engine.formats.request import Approval, ModelRequest
from kilo_rules.engine.providers._shared import FragmentStore, dumps, encode
from kilo_rules.engine.providers.registry import Renderer, WireApiSpec, register, spec, unregister

__all__ = [
    "APIS",
    "PROVIDER_BREAKPOINT_LIMITS",
    "Renderer",
    "WireApiSpec",
    "count_markers",
    "endpoint",
    "register",
    "render",
    "render_json",
    "signature_issuer",
    "unregister",
]

# A built-in wire API is its facts in wireapi.BUILTIN and the module of this package named
# after it (``openai-responses`` -> ``openai_responses``), whose SPEC is registered here:
# the facts list is the one list of built-in APIs. The modules are imported by name, from
# this package only, so no contract of the layers is passed by.
for _facts in wireapi.BUILTIN:
    _module = importlib.import_module(f"{__name__}.{_facts.name.replace('-', '_')}")
    register(_module.SPEC)

#: The built-in wire APIs, sorted (one registered later is rendered too).
APIS: tuple[str, ...] = tuple(sorted(f.name for f in wireapi.BUILTIN))

#: Most explicit cache breakpoints one request may carry, per wire API (catalog data).
PROVIDER_BREAKPOINT_LIMITS: Mapping[str, int] = WIRE_BREAKPOINTS


def _check(api: str) -> WireApiSpec:
    """The record of ``api``; the unknown-API error (with its did-you-mean) otherwise."""
    return spec(api)


def render(request: ModelRequest, api: str) -> dict[str, Any]:
    """The JSON body ``request`` is sent as on wire API ``api``.

    The same request always gives the same body, key order included, so
    ``json.dumps(render(r, api))`` is byte-identical across calls. Raises
    :class:`~kilo_rules.engine.base.errors.CatalogError` for an unknown ``api``.
    """
    return _check(api).render(_without_approvals(request))


def render_json(request: ModelRequest, api: str, fragments: FragmentStore | None = None) -> bytes:
    """The body of ``render(request, api)`` as the bytes it is sent as: the compact JSON
    (``json.dumps(body, ensure_ascii=False, separators=(",", ":"))``) in UTF-8, byte for
    byte (a lone surrogate kept as its three bytes, ``surrogatepass``).

    With ``fragments``, a wire API that renders message by message reuses the text of the
    messages it rendered before (the same objects), so a step renders only the messages
    that are new or changed since the last one."""
    record = _check(api)
    if record.render_json is not None:
        return record.render_json(request, fragments)
    return encode(dumps(record.render(_without_approvals(request))))


def _without_approvals(request: ModelRequest) -> ModelRequest:
    """``request`` without tool-approval parts, which no wire API takes (the AI SDK drops
    them too); a message left empty by that is dropped with them."""
    if not any(isinstance(p, Approval) for m in request.messages for p in m.parts):
        return request
    messages = []
    for m in request.messages:
        parts = tuple(p for p in m.parts if not isinstance(p, Approval))
        if parts:
            messages.append(m if len(parts) == len(m.parts) else replace(m, parts=parts))
    return replace(request, messages=tuple(messages))


def headers(request: ModelRequest, api: str) -> dict[str, str]:
    """HTTP headers the body needs besides the usual ones: Anthropic's ``anthropic-beta``
    for the context edits it asks for (the betas sorted, comma-separated)."""
    return _check(api).headers(request)


def endpoint(request: ModelRequest, api: str) -> str:
    """The URL path (relative to the provider's base URL) the body is posted to.

    Bedrock and Gemini carry the model id in the path rather than in the body.
    """
    return _check(api).path(request)


def count_markers(body: Mapping[str, Any], api: str) -> int:
    """How many cache breakpoints the rendered ``body`` carries for wire API ``api``."""
    key = _check(api).marker_key
    if key is None:
        return 0
    top = {k: v for k, v in body.items() if k != "cache_control"}
    return _count(top, key)


def _count(value: Any, key: str) -> int:
    if isinstance(value, Mapping):
        return sum((k == key) + _count(v, key) for k, v in value.items())
    if isinstance(value, list):
        return sum(_count(v, key) for v in value)
    return 0
