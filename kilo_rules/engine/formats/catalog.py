"""Model descriptors and the bundled, versioned model catalog (``policies/models.yaml``).

A :class:`ModelInfo` says what the runtime must know about a model: where it is served
(provider and wire API), its limits, prices, prompt-cache facts, which family prompt it
prefers and which tokenizer approximates it. Policies read these values as ``model.*``.
A model that is not in the catalog can be described inline (a mapping in the same shape).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kilo_rules.engine.base.errors import CatalogError, Diagnostic, Location, did_you_mean
from kilo_rules.engine.formats import wireapi


def _registered_api(value: str) -> str:
    if not wireapi.known(value):
        expected = [repr(n) for n in wireapi.names()]
        raise PydanticCustomError(
            "literal_error",
            "Input should be {expected}",
            {"expected": f"{', '.join(expected[:-1])} or {expected[-1]}"},
        )
    return value


#: A registered wire API's name (a built-in one, :data:`kilo_rules.engine.formats.wireapi.BUILTIN`,
#: or one registered since with ``kilo_rules.engine.providers.register``): validated against
#: the registry when a model is read; its JSON Schema lists the built-in ones.
WireApiName = Annotated[
    str,
    AfterValidator(_registered_api),
    WithJsonSchema({"enum": [f.name for f in wireapi.BUILTIN], "type": "string"}),
]

#: Most explicit cache breakpoints one request may carry, per registered wire API (the
#: ``marker_budget`` of :mod:`kilo_rules.engine.formats.wireapi`'s facts, read at each look-up).
WIRE_BREAKPOINTS: Mapping[str, int] = wireapi.FactsView(lambda f: f.marker_budget)

#: The breakpoints of a wire API whose models take explicit ones on request (the policy's
#: ``cache.shapes``): OpenAI models from GPT-5.6 take up to 4 ``prompt_cache_breakpoint``,
#: on Chat Completions and on the Responses API alike.
EXPLICIT_BREAKPOINTS: Mapping[str, int] = wireapi.FactsView(lambda f: f.explicit_breakpoints)

#: The AI SDK package Kilo reaches each provider through (models.dev's ``npm``), for a
#: model entry that names none; Kilo's cache gate and marker namespaces key on it.
PROVIDER_SDKS: Mapping[str, str] = MappingProxyType(
    {
        "anthropic": "@ai-sdk/anthropic",
        "openai": "@ai-sdk/openai",
        "azure": "@ai-sdk/azure",
        "google": "@ai-sdk/google",
        "google-vertex": "@ai-sdk/google-vertex",
        "google-vertex-anthropic": "@ai-sdk/google-vertex/anthropic",
        "amazon-bedrock": "@ai-sdk/amazon-bedrock",
        "openrouter": "@openrouter/ai-sdk-provider",
        "deepseek": "@ai-sdk/deepseek",
        "alibaba": "@ai-sdk/alibaba",
        "qwen": "@ai-sdk/alibaba",  # Alibaba Cloud Model Studio
        "mistral": "@ai-sdk/mistral",
        "xai": "@ai-sdk/xai",
        "kilo": "@kilocode/kilo-gateway",
        "vercel": "@ai-sdk/gateway",
        "github-copilot": "@ai-sdk/github-copilot",
    }
)
#: The package of a provider the table does not know (an OpenAI-compatible server).
DEFAULT_SDK = "@ai-sdk/openai-compatible"

#: Provider ids known to the catalog and to cache/lowering tables in policies.
PROVIDERS = (
    "anthropic",
    "openai",
    "google",
    "google-vertex",
    "google-vertex-anthropic",
    "amazon-bedrock",
    "openrouter",
    "deepseek",
    "qwen",
    "mistral",
    "xai",
    "moonshotai",
    "moonshotai-cn",
    "kimi-for-coding",
    "kilo",
    "litellm",
    "ollama",
    "azure",
    "github-copilot",
)


# Model-id fragments that tell which vendor's models made a reasoning signature. Vendor,
# not provider: Claude signs the same way on Anthropic, Bedrock and Vertex, so a signature
# made on one is read on the others, while Gemini cannot read it at all.
_SIGNATURE_ISSUERS = (
    (re.compile(r"claude|anthropic", re.IGNORECASE), "anthropic"),
    (re.compile(r"gemini|gemma", re.IGNORECASE), "google"),
    (re.compile(r"(^|[/.:])(gpt-|o[1-9]\b|o[1-9]-|codex)", re.IGNORECASE), "openai"),
)


def signature_issuer(model_id: str | None) -> str | None:
    """The vendor whose models issue the reasoning signatures of ``model_id``.

    ``"anthropic"``, ``"google"`` or ``"openai"``; None when the id names none of them
    (or is None). A signature is only meaningful to the vendor that issued it, so a
    renderer sends it back only to that vendor's models.

    >>> signature_issuer("claude-opus-4-6"), signature_issuer("google/gemini-3-pro-preview")
    ('anthropic', 'google')
    """
    if not model_id:
        return None
    for pattern, issuer in _SIGNATURE_ISSUERS:
        if pattern.search(model_id):
            return issuer
    return None


Modality = Literal["text", "image", "pdf", "audio", "video"]
#: Context management a provider runs on its side when the request asks: Anthropic's
#: context editing (clearing old tool uses, clearing old thinking) and server-side
#: compaction, or the OpenAI Responses API's compaction.
ServerEdit = Literal["clear_tool_uses", "clear_thinking", "compaction"]


def _text_only() -> list[Modality]:
    return ["text"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Model):
    """Token limits. ``input`` is set only where the provider caps input separately."""

    context: int = Field(ge=0, description="Context window in tokens (input + output).")
    input: int | None = Field(None, ge=0, description="Separate input limit, if any.")
    output: int = Field(0, ge=0, description="Maximum output tokens (0 = unknown).")


class Prices(_Model):
    """USD per million tokens."""

    input: float = Field(ge=0, description="Uncached input.")
    output: float = Field(ge=0, description="Output (reasoning included).")
    cache_write: float = Field(0, ge=0, description="Cache write (5-minute TTL where it applies).")
    cache_write_1h: float | None = Field(None, ge=0, description="Cache write with 1-hour TTL.")
    cache_read: float = Field(0, ge=0, description="Cache read.")


class CacheFacts(_Model):
    """What the provider's prompt cache allows for this model."""

    kind: Literal["explicit", "automatic", "none"] = Field(
        description="explicit: the request must carry breakpoints; automatic: the provider "
        "caches prefixes by itself; none: no prompt caching."
    )
    max_breakpoints: int = Field(0, ge=0, description="Most explicit breakpoints per request.")
    min_cacheable_tokens: int = Field(0, ge=0, description="Shortest prefix that is cached.")


class ModelInfo(_Model):
    """Everything the runtime needs to know about one model."""

    id: str = Field(description="Catalog id, e.g. anthropic/claude-sonnet-4-5.")
    provider: str = Field(description="Provider id, e.g. anthropic, openrouter, amazon-bedrock.")
    sdk: str = Field(
        "",
        description="The AI SDK package the provider is reached through (models.dev npm, "
        "e.g. @ai-sdk/anthropic, @ai-sdk/gateway); left out, the provider's usual package "
        "(kilo_rules.engine.formats.catalog.PROVIDER_SDKS), else @ai-sdk/openai-compatible.",
    )
    family: str = Field(description="Model family, e.g. claude, gpt, gemini, deepseek.")
    api_id: str = Field(description="The id sent to the provider's API.")
    api: WireApiName = Field(description="Wire format of requests for this model.")
    name: str | None = Field(None, description="Display name.")
    limits: Limits = Field(description="Token limits.")
    prices: Prices | None = Field(None, description="USD per million tokens.")
    cache: CacheFacts = Field(
        default_factory=lambda: CacheFacts(kind="none"), description="Prompt-cache facts."
    )
    prompt: str | None = Field(
        None, description="Prompt variant metadata (anthropic, gemini, beast, codex, ...)."
    )
    tokenizer: str = Field(
        "estimate",
        description="Token counter that approximates this model: estimate, or "
        "tiktoken:<encoding> for an encoding shipped offline.",
    )
    reasoning: bool = Field(False, description="The model emits reasoning.")
    media_in_tool_results: bool = Field(
        False, description="Tool results may carry images (else media move to a user message)."
    )
    modalities: list[Modality] = Field(default_factory=_text_only, description="Input modalities.")
    server_edits: list[ServerEdit] = Field(
        default_factory=list,
        description="Context management the provider runs when asked (Anthropic context "
        "editing and compaction, OpenAI Responses compaction); a policy's server section is "
        "sent only for these.",
    )
    source: str | None = Field(None, description="Where the limits and prices were read.")
    as_of: str | None = Field(None, description="Date (YYYY-MM-DD) the facts were read.")

    @model_validator(mode="before")
    @classmethod
    def _default_sdk(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("sdk") and isinstance(data.get("provider"), str):
            return {**data, "sdk": PROVIDER_SDKS.get(data["provider"], DEFAULT_SDK)}
        return data


class Catalog(_Model):
    """The versioned model catalog."""

    version: Literal[1] = Field(1, description="Catalog format version.")
    as_of: str = Field(description="Date (YYYY-MM-DD) of the catalog revision.")
    models: list[ModelInfo] = Field(description="Known models.")

    def get(self, model_id: str) -> ModelInfo:
        """Look a model up by catalog id (or, failing that, by api id)."""
        for m in self.models:
            if m.id == model_id:
                return m
        for m in self.models:
            if m.api_id == model_id:
                return m
        suggestion = did_you_mean(model_id, [m.id for m in self.models])
        raise CatalogError(
            Diagnostic(
                "model.unknown",
                f"unknown model {model_id!r}",
                Location("<model>", 1, 1),
                hint=(f"did you mean {suggestion!r}?" if suggestion else None)
                or "describe it inline (a YAML/JSON file with id, provider, family, api_id, "
                "api and limits) or run `kilo-rules models` to list the catalog",
            )
        )


def model_from_data(data: Any, file: str = "<model>") -> ModelInfo:
    """Validate an inline model descriptor."""
    try:
        return ModelInfo.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(
            [
                Diagnostic(
                    "model.invalid",
                    f"{'.'.join(str(p) for p in e['loc']) or 'model'}: {e['msg']}",
                    Location(file, 1, 1),
                )
                for e in exc.errors()[:20]
            ]
        ) from None


@lru_cache(maxsize=1)
def bundled_catalog() -> Catalog:
    """The catalog shipped in ``policies/models.yaml`` (validated, loaded once)."""
    from kilo_rules.engine.formats.load import load_yaml_resource

    doc = load_yaml_resource("models.yaml")
    try:
        return Catalog.model_validate(doc.data)
    except ValidationError as exc:
        diags = []
        for e in exc.errors()[:20]:
            path = tuple(e["loc"])
            diags.append(
                Diagnostic(
                    "catalog.invalid",
                    f"{'.'.join(str(p) for p in path)}: {e['msg']}",
                    doc.locate(path),
                )
            )
        raise CatalogError(diags) from None


#: Names of the expression vocabulary whose values are enumerated, each with the field of
#: a catalog model it reads. A string compared with one of these that no value matches makes
#: a rule that silently never (or always) applies: ``kilo-rules check`` warns about it.
ENUMERATED_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "model.id": "id",
        "model.api_id": "api_id",
        "model.provider": "provider",
        "model.family": "family",
        "model.sdk": "sdk",
        "model.api": "api",
        "model.cache.kind": "cache.kind",
        "model.modalities": "modalities",
    }
)


def known_values(catalog: Catalog | None = None) -> Mapping[str, tuple[str, ...]]:
    """The values each name of :data:`ENUMERATED_FIELDS` can have, sorted: what
    ``catalog`` (default the bundled one) lists, plus what the descriptor's type allows
    (every wire API, cache kind and modality) and the provider and SDK tables know."""
    if catalog is None:
        cached = _bundled_known_values()
        apis = wireapi.names()
        if set(apis) <= set(cached["model.api"]):
            return cached
        # A wire API registered since the bundled values were read.
        merged = tuple(sorted({*cached["model.api"], *apis}))
        return MappingProxyType({**cached, "model.api": merged})
    found: dict[str, set[str]] = {name: set() for name in ENUMERATED_FIELDS}
    found["model.provider"].update(PROVIDERS, PROVIDER_SDKS)
    found["model.sdk"].update(PROVIDER_SDKS.values(), [DEFAULT_SDK])
    found["model.api"].update(wireapi.names())
    found["model.cache.kind"].update(get_args(CacheFacts.model_fields["kind"].annotation))
    found["model.modalities"].update(get_args(Modality))
    for model in catalog.models:
        for name, attr in ENUMERATED_FIELDS.items():
            value: Any = model
            for part in attr.split("."):
                value = getattr(value, part)
            found[name].update(value if isinstance(value, list) else [value])
    return MappingProxyType({k: tuple(sorted(v)) for k, v in found.items()})


@lru_cache(maxsize=1)
def _bundled_known_values() -> Mapping[str, tuple[str, ...]]:
    return known_values(bundled_catalog())
