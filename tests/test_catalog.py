"""The bundled model catalog (``policies/models.yaml``) and catalog look-ups."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from kilo_rules.engine.base.errors import CatalogError
from kilo_rules.engine.formats.catalog import (
    PROVIDERS,
    Catalog,
    ModelInfo,
    bundled_catalog,
    model_from_data,
)
from kilo_rules.engine.text.tokens import counter_for

REQUIRED_PROVIDERS = {
    "anthropic",
    "openai",
    "google",
    "amazon-bedrock",
    "openrouter",
    "deepseek",
    "qwen",
    "mistral",
}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return bundled_catalog()


def _iso(date: str | None) -> dt.date:
    assert date is not None
    return dt.date.fromisoformat(date)


def test_catalog_validates_and_is_large_enough(catalog: Catalog) -> None:
    assert catalog.version == 1
    _iso(catalog.as_of)
    assert len(catalog.models) >= 25


def test_every_required_provider_is_present(catalog: Catalog) -> None:
    providers = Counter(m.provider for m in catalog.models)
    assert set(providers) >= REQUIRED_PROVIDERS
    assert set(providers) <= set(PROVIDERS)


def test_ids_are_unique_and_prefixed_by_provider(catalog: Catalog) -> None:
    ids = [m.id for m in catalog.models]
    assert len(ids) == len(set(ids))
    for m in catalog.models:
        assert m.id.startswith(m.provider + "/"), m.id


def test_api_ids_do_not_shadow_other_catalog_ids(catalog: Catalog) -> None:
    # get() tries catalog ids first; an api id equal to another model's id would be
    # unreachable by api id, and two equal api ids on one provider would be ambiguous.
    ids = {m.id for m in catalog.models}
    pairs = Counter((m.provider, m.api_id) for m in catalog.models)
    for m in catalog.models:
        assert m.api_id == m.id or m.api_id not in ids, m.id
        assert pairs[(m.provider, m.api_id)] == 1, m.id


def test_every_entry_has_source_and_date(catalog: Catalog) -> None:
    for m in catalog.models:
        assert m.source and m.source.startswith("https://"), m.id
        assert _iso(m.as_of) <= _iso(catalog.as_of), m.id


def test_cache_facts_are_consistent(catalog: Catalog) -> None:
    for m in catalog.models:
        if m.cache.kind == "explicit":
            assert m.cache.max_breakpoints >= 1, m.id
        else:
            assert m.cache.max_breakpoints == 0, m.id
        if m.cache.kind == "none" and m.prices is not None:
            assert m.prices.cache_read == 0 and m.prices.cache_write == 0, m.id
        if m.family == "claude" and m.provider in ("anthropic", "amazon-bedrock"):
            assert m.cache.kind == "explicit", m.id
            assert m.cache.max_breakpoints == 4, m.id
            assert m.cache.min_cacheable_tokens in (512, 1024, 2048, 4096), m.id
            assert m.media_in_tool_results, m.id
        if m.provider == "openai":
            assert m.cache.kind == "automatic", m.id
            assert m.cache.min_cacheable_tokens == 1024, m.id
            assert not m.media_in_tool_results, m.id
        if m.provider == "google":
            assert m.cache.kind == "automatic", m.id
            assert m.media_in_tool_results, m.id


def test_anthropic_prices_follow_the_cache_multipliers(catalog: Catalog) -> None:
    # 5-minute write 1.25x, 1-hour write 2x, read 0.1x of the base input price.
    for m in catalog.models:
        if m.provider != "anthropic":
            continue
        assert m.prices is not None
        assert m.prices.cache_write == pytest.approx(1.25 * m.prices.input), m.id
        assert m.prices.cache_write_1h == pytest.approx(2 * m.prices.input), m.id
        assert m.prices.cache_read == pytest.approx(0.1 * m.prices.input), m.id


def test_limits_are_consistent(catalog: Catalog) -> None:
    for m in catalog.models:
        assert m.limits.context > 0, m.id
        assert m.limits.output <= m.limits.context, m.id
        if m.limits.input is not None:
            assert m.limits.input <= m.limits.context, m.id
    # At least one model caps input separately (the usable-context math differs with it).
    gpt5 = catalog.get("openai/gpt-5")
    assert (gpt5.limits.context, gpt5.limits.input, gpt5.limits.output) == (
        400_000,
        272_000,
        128_000,
    )


def test_tokenizers_resolve_offline(catalog: Catalog) -> None:
    for m in catalog.models:
        counter, warning = counter_for(m.tokenizer)
        assert warning is None, (m.id, warning)
        assert counter.count("hello world") > 0


def test_prompt_ladder_models_are_present(catalog: Catalog) -> None:
    api_ids = [m.api_id.lower() for m in catalog.models]
    assert any("kimi" in a for a in api_ids)
    assert any("ling" in a and "kling" not in a for a in api_ids)
    assert any("trinity" in a for a in api_ids)


@pytest.mark.parametrize(
    "name",
    ["anthropic/claude-sonnet-4-5", "anthropic/claude-opus-4-6", "anthropic/claude-haiku-4-5"],
)
def test_get_by_catalog_id(catalog: Catalog, name: str) -> None:
    assert catalog.get(name).id == name


def test_get_by_api_id(catalog: Catalog) -> None:
    assert catalog.get("claude-sonnet-4-5-20250929").id == "anthropic/claude-sonnet-4-5"
    assert catalog.get("gpt-5-mini").id == "openai/gpt-5-mini"
    assert catalog.get("anthropic.claude-sonnet-4-5-20250929-v1:0").provider == "amazon-bedrock"


def test_get_unknown_id_suggests_a_close_match(catalog: Catalog) -> None:
    with pytest.raises(CatalogError) as info:
        catalog.get("anthropic/claude-sonet-4-5")
    diag = info.value.diagnostic
    assert diag.code == "model.unknown"
    assert diag.hint == "did you mean 'anthropic/claude-sonnet-4-5'?"


def test_get_unknown_id_without_a_close_match(catalog: Catalog) -> None:
    with pytest.raises(CatalogError) as info:
        catalog.get("zzz")
    assert "describe it inline" in (info.value.diagnostic.hint or "")


def test_model_from_data_accepts_a_valid_descriptor() -> None:
    model = model_from_data(
        {
            "id": "local/my-model",
            "provider": "ollama",
            "family": "llama",
            "api_id": "my-model",
            "api": "openai-compatible",
            "limits": {"context": 32768, "output": 4096},
        }
    )
    assert isinstance(model, ModelInfo)
    assert model.tokenizer == "estimate"
    assert model.cache.kind == "none"


def test_model_from_data_rejects_a_bad_descriptor() -> None:
    with pytest.raises(CatalogError) as info:
        model_from_data(
            {
                "id": "x/y",
                "provider": "x",
                "family": "y",
                "api_id": "y",
                "api": "carrier-pigeon",
                "limits": {"context": -1},
                "surprise": True,
            },
            file="model.yaml",
        )
    messages = [d.message for d in info.value.diagnostics]
    assert all(d.code == "model.invalid" for d in info.value.diagnostics)
    assert all(d.location.file == "model.yaml" for d in info.value.diagnostics)
    assert any(m.startswith("api:") for m in messages)
    assert any(m.startswith("limits.context:") for m in messages)
    assert any(m.startswith("surprise:") for m in messages)
