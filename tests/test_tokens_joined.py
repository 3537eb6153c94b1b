"""Counting a concatenation from its parts (``count_joined``): exact for the estimate and
for cached cl100k tiktoken, each long part tokenized once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kilo_rules.engine.text.tokens import (
    CountCache,
    EstimateCounter,
    TiktokenCounter,
    count_joined,
    word_edges,
)

# Characters around which BPE pre-tokens form and merge: letters next to quotes and
# contractions, digit runs (split in threes), spaces before punctuation, whitespace runs
# before a newline or the end, non-ASCII letters and digits, astral and lone surrogates.
TRICKY = [
    *"aZs t'dl09 .,;:{}[]\"\\/_-\n\r\t",
    *["'re", "'ll", "  ", "\n\n", " \n", "é", "ß", "中", "٣", "😀", "\u00a0", "\u2028"],
    *["\ud83d", "\ude00", "<|endoftext|>", '{"role":"', '"}]}', "123456"],
]
texts = st.lists(st.sampled_from(TRICKY), max_size=40).map("".join)


class CountingTiktoken(TiktokenCounter):
    """cl100k that records the length of every text it tokenizes."""

    def __init__(self) -> None:
        super().__init__("cl100k_base")
        self.lengths: list[int] = []

    def count(self, text: str) -> int:
        self.lengths.append(len(text))
        return super().count(text)


@pytest.fixture(scope="module")
def tiktoken_counter() -> TiktokenCounter:
    return TiktokenCounter("cl100k_base")


def test_cl100k_is_joinable_and_a_factor_is_not(tiktoken_counter: TiktokenCounter) -> None:
    assert tiktoken_counter.joinable
    assert not TiktokenCounter("cl100k_base", factor=1.2).joinable


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(texts, min_size=1, max_size=6))
def test_joined_count_equals_the_count_of_the_joined_text(parts: list[str]) -> None:
    counter = TiktokenCounter("cl100k_base")
    cache = CountCache(counter)
    joined = "".join(parts)
    assert cache.count_joined(parts) == counter.count(joined)
    assert cache.count_joined(parts) == counter.count(joined)  # from cached edges
    assert count_joined(cache.count, parts) == counter.count(joined)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(texts, min_size=1, max_size=6))
def test_joined_estimate_equals_the_estimate_of_the_joined_text(parts: list[str]) -> None:
    for counter in (EstimateCounter(), EstimateCounter(3.5, factor=1.3)):
        assert count_joined(counter.count, parts) == counter.count("".join(parts))
        assert CountCache(counter).count_joined(parts) == counter.count("".join(parts))


def test_joined_json_messages_are_exact(tiktoken_counter: TiktokenCounter) -> None:
    # The shape compaction counts: message JSON joined by commas inside brackets, where
    # the closing and opening punctuation of two messages merge into one pre-token.
    a = '{"role":"assistant","content":[{"type":"text","text":"Done: it\'s fixed!!"}]}'
    b = '{"role":"tool","content":[{"type":"tool-result","output":{"value":"1234567 ok\\n"}}]}'
    parts = ["[", a, ",", b, ",", a, "]"]
    cache = CountCache(tiktoken_counter)
    assert cache.count_joined(parts) == tiktoken_counter.count("".join(parts))
    assert cache.count_joined(parts) != sum(tiktoken_counter.count(p) for p in parts)


def test_each_long_part_is_tokenized_once() -> None:
    counter = CountingTiktoken()
    cache = CountCache(counter)
    long_part = '{"role":"user","content":"' + "the quick brown fox " * 500 + '"}'
    cache.count_joined(["[", long_part, "]"])
    counter.lengths.clear()
    total = cache.count_joined(["[", long_part, ",", long_part, "]"])
    assert total == TiktokenCounter().count(f"[{long_part},{long_part}]")
    assert counter.lengths  # the joins were counted
    assert max(counter.lengths) < 40  # ...and nothing but the joins


def test_a_counter_that_cannot_join_counts_the_joined_text() -> None:
    scaled = TiktokenCounter("cl100k_base", factor=1.3)
    parts = ["word " * 20, "}]},{", "more " * 20]
    assert CountCache(scaled).count_joined(parts) == scaled.count("".join(parts))
    seen: list[str] = []

    def plain(text: str) -> int:
        seen.append(text)
        return len(text)

    assert count_joined(plain, parts) == len("".join(parts))
    assert seen == ["".join(parts)]


@pytest.mark.parametrize(
    ("text", "edges"),
    [
        ('{"role":"user"}', (6, 13)),  # after "role", after "user"
        ("abc", None),  # a run that ends with the text is no boundary
        ("a1", (1, 1)),  # a letter before a digit
        ("12a!", (2, 3)),
        ("中文。", None),  # non-ASCII letters never make a boundary
        ("x中", None),
        ("!!!", None),
    ],
)
def test_word_edges(text: str, edges: tuple[int, int] | None) -> None:
    assert word_edges(text) == edges
