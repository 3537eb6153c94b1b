"""Token counters: Kilo's estimate (spec §1), offline tiktoken, fallbacks, the count cache."""

from __future__ import annotations

import socket
import threading
import urllib.request
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.text.tokens import (
    CountCache,
    EstimateCounter,
    TiktokenCounter,
    TokenCounter,
    TokenizerUnavailableError,
    counter_for,
    estimate,
    utf16_len,
)

# --- estimate (spec §1) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [(4000, 1000), (20000, 5000), (0, 0), (1, 0), (2, 1), (3, 1), (5, 1), (6, 2), (7, 2)],
)
def test_spec_1_estimate_pinned_values(chars: int, tokens: int) -> None:
    # 4000 → 1000, 20000 → 5000 and "" → 0 are Kilo's test values; the rest pin half-up
    # rounding (2/4 = 0.5 → 1, 6/4 = 1.5 → 2), where Python's round() would give 0 and 2.
    assert estimate("x" * chars) == tokens


def test_spec_1_estimate_counts_utf16_units() -> None:
    emoji = "\U0001f600"  # astral: 2 UTF-16 units, 1 Python code point
    assert utf16_len(emoji) == 2
    assert estimate(emoji * 2) == 1  # 4 units → 1 token
    assert estimate(emoji * 4000) == 2000
    cjk = "漢字"  # BMP: 1 unit each
    assert utf16_len(cjk * 2000) == 4000
    assert estimate(cjk * 2000) == 1000
    assert utf16_len("\ud800") == 1  # a lone surrogate counts 1, as in JavaScript


@given(st.text())
def test_estimate_matches_the_formula(text: str) -> None:
    units = sum(2 if ord(c) > 0xFFFF else 1 for c in text)
    assert utf16_len(text) == units
    assert estimate(text) == int(units / 4 + 0.5)


def test_estimate_counter_default_is_kilo_estimate() -> None:
    counter = EstimateCounter()
    assert counter.name == "estimate"
    assert counter.count("x" * 4000) == 1000
    assert isinstance(counter, TokenCounter)


def test_estimate_counter_factor_is_ceiled() -> None:
    counter = EstimateCounter(factor=1.3)
    assert counter.name == "estimate*1.3"
    assert counter.count("x" * 4000) == 1300
    assert counter.count("x" * 4) == 2  # ceil(1 * 1.3)
    assert counter.count("") == 0


def test_estimate_counter_chars_per_token() -> None:
    counter = EstimateCounter(chars_per_token=3)
    assert counter.name == "estimate/3"
    assert counter.count("x" * 9) == 3
    assert counter.count("x" * 4) == 1  # 1.33 → 1
    assert counter.count("x" * 5) == 2  # 1.67 → 2
    with pytest.raises(ValueError, match="chars_per_token"):
        EstimateCounter(chars_per_token=0)
    with pytest.raises(ValueError, match="factor"):
        EstimateCounter(factor=0)


# --- tiktoken, offline only --------------------------------------------------------------


def test_tiktoken_counts_deterministically() -> None:
    counter = TiktokenCounter()
    assert counter.name == "tiktoken:cl100k_base"
    assert counter.count("hello world") == 2
    assert counter.count("") == 0
    assert counter.count("hello world") == 2
    assert isinstance(counter, TokenCounter)


def test_tiktoken_counts_special_token_text_as_ordinary() -> None:
    # A tool output may contain the literal text of a special token; it must not raise.
    assert TiktokenCounter().count("<|endoftext|>") > 1


def test_tiktoken_factor() -> None:
    plain = TiktokenCounter().count("hello world " * 100)
    assert TiktokenCounter(factor=1.5).count("hello world " * 100) == -(-plain * 3 // 2)
    assert TiktokenCounter(factor=1.5).name == "tiktoken:cl100k_base*1.5"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every network path raise, and record what tried to use one."""
    attempts: list[str] = []
    real_read_file = tiktoken.load.read_file

    def read_file(blobpath: str) -> bytes:
        if "://" in blobpath:
            attempts.append(blobpath)
            raise OSError(f"network access attempted: {blobpath}")
        return real_read_file(blobpath)  # local files (the offline rank file) are fine

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args[:2]))
        raise OSError("network access attempted")

    monkeypatch.setattr(tiktoken.load, "read_file", read_file)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    try:
        import requests

        monkeypatch.setattr(requests, "get", refuse)
    except ImportError:  # pragma: no cover - requests comes with tiktoken
        pass
    # Start from an empty encoding cache and no on-disk copy, so the rank file is really
    # loaded again under these conditions.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    return attempts


def test_tiktoken_loads_offline_with_the_network_refused(no_network: list[str]) -> None:
    counter = TiktokenCounter("cl100k_base")
    assert counter.count("hello world") == 2
    assert no_network == []


def test_tiktoken_refuses_encodings_that_would_download(no_network: list[str]) -> None:
    # o200k_base is registered by tiktoken's own plugin, whose constructor downloads.
    assert "o200k_base" in tiktoken.registry.list_encoding_names()
    with pytest.raises(TokenizerUnavailableError) as info:
        TiktokenCounter("o200k_base")
    assert info.value.diagnostic.code == "tokenizer.unavailable"
    assert "o200k_base" in info.value.diagnostic.message
    assert no_network == []


def test_tiktoken_unknown_encoding_is_a_typed_error() -> None:
    with pytest.raises(TokenizerUnavailableError, match="no offline registration"):
        TiktokenCounter("nonexistent_base")


# --- counter_for --------------------------------------------------------------------------


def test_counter_for_estimate() -> None:
    counter, warning = counter_for("estimate")
    assert warning is None
    assert isinstance(counter, EstimateCounter)
    assert counter.count("x" * 4000) == 1000


def test_counter_for_tiktoken() -> None:
    counter, warning = counter_for("tiktoken:cl100k_base", factor=1.2)
    assert warning is None
    assert isinstance(counter, TiktokenCounter)
    assert counter.name == "tiktoken:cl100k_base*1.2"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("tiktoken:o200k_base", "not available offline"),
        ("tiktoken:nope", "not available offline"),
        ("sentencepiece:llama", "unknown tokenizer spec"),
        ("tiktoken:", "unknown tokenizer spec"),
        ("", "unknown tokenizer spec"),
    ],
)
def test_counter_for_falls_back_with_a_warning(
    spec: str, fragment: str, no_network: list[str]
) -> None:
    counter, warning = counter_for(spec, factor=1.3)
    assert isinstance(counter, EstimateCounter)
    assert counter.factor == 1.3  # the policy's safety factor survives the fallback
    assert warning is not None
    assert fragment in warning
    assert "estimate" in warning
    assert no_network == []


# --- CountCache ---------------------------------------------------------------------------


class _Counting:
    """A counter that records how often it was asked."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return len(text)


def test_cache_hits_on_repeat() -> None:
    inner = _Counting()
    cache = CountCache(inner, maxsize=10)
    assert cache.count("abc") == 3
    assert cache.count("abc") == 3
    assert cache.count("abcd") == 4
    assert inner.calls == 2
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size) == (1, 2, 2)
    assert stats.hit_rate == pytest.approx(1 / 3)
    assert isinstance(cache, TokenCounter)
    assert cache.name == "fake"


def test_cache_is_bounded_lru() -> None:
    inner = _Counting()
    cache = CountCache(inner, maxsize=2)
    cache.count("a")
    cache.count("bb")
    cache.count("a")  # refresh "a": "bb" is now the least recently used
    cache.count("ccc")  # evicts "bb"
    assert len(cache) == 2
    calls = inner.calls
    cache.count("a")
    assert inner.calls == calls  # still cached
    cache.count("bb")
    assert inner.calls == calls + 1  # was evicted


def test_cache_keys_include_the_counter_name() -> None:
    shared_texts = "x" * 40
    plain = CountCache(EstimateCounter())
    padded = CountCache(EstimateCounter(factor=2.0))
    assert plain.count(shared_texts) == 10
    assert padded.count(shared_texts) == 20


def test_cache_clear_and_bad_size() -> None:
    cache = CountCache(_Counting())
    cache.count("a")
    cache.clear()
    assert len(cache) == 0
    assert cache.stats().misses == 0
    with pytest.raises(ValueError, match="maxsize"):
        CountCache(_Counting(), maxsize=0)


def test_cache_handles_lone_surrogates() -> None:
    assert CountCache(EstimateCounter()).count("\ud800abc") == 1


def test_cache_concurrent_counts() -> None:
    cache = CountCache(EstimateCounter(), maxsize=64)
    texts = [f"part {i} " * (i + 1) for i in range(200)]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for t in texts:
                assert cache.count(t) == estimate(t)
        except BaseException as exc:  # pragma: no cover - only on failure
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache) <= 64
