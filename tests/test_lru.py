"""The bounded LRU cache behind every long-lived cache."""

from __future__ import annotations

import gc
import operator
import threading
import weakref
from functools import partial

import pytest

from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.runtime.memo import IdentityLRU


def test_the_least_recently_used_entry_goes_first() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_items_lists_least_recent_first_without_touching_the_order() -> None:
    cache: LRUCache[str, int] = LRUCache(3)
    for i, k in enumerate("abc"):
        cache.put(k, i)
    cache.get("a")
    assert cache.items() == [("b", 1), ("c", 2), ("a", 0)]
    assert cache.items() == [("b", 1), ("c", 2), ("a", 0)]  # reading moved nothing
    cache.put("d", 3)
    assert [k for k, _ in cache.items()] == ["c", "a", "d"]


def test_content_keys_hit_for_equal_keys() -> None:
    cache: LRUCache[tuple[str, int], str] = LRUCache()
    cache.put(("x" * 3, 1), "v")
    assert cache.get(("xxx", 1)) == "v"


def test_get_or_makes_each_value_once_and_counts() -> None:
    cache: LRUCache[str, list[int]] = LRUCache()
    made: list[str] = []

    def make() -> list[int]:
        made.append("k")
        return [1]

    first = cache.get_or("k", make)
    assert cache.get_or("k", make) is first
    assert made == ["k"]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size, stats.maxsize) == (1, 1, 1, 8192)
    assert stats.hit_rate == 0.5
    cache.clear()
    assert len(cache) == 0 and cache.stats().hits == 0


def test_identity_keys_hit_only_the_same_object_and_keep_it_alive() -> None:
    cache: IdentityLRU[object, str] = IdentityLRU(4)
    key = [1, 2]
    cache.put(key, "v")
    assert cache.get([1, 2]) is None  # equal, not the same object
    assert cache.get(key) == "v"

    class Key:
        pass

    other = Key()
    alive = weakref.ref(other)
    cache.put(other, "w")
    del other
    gc.collect()
    # The entry holds its key, so no new object can take that id and hit the entry.
    assert alive() is not None


def test_maxsize_must_be_positive() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        LRUCache(0)


def test_concurrent_use_stays_bounded_and_consistent() -> None:
    cache: LRUCache[int, int] = LRUCache(16)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(2000):
                k = (i * seed) % 40
                assert cache.get_or(k, partial(operator.mul, k, k)) == k * k
        except BaseException as exc:  # pragma: no cover - only on failure
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 3, 7, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache) <= 16


def test_a_weighed_cache_bounds_the_sum_of_weights_not_the_count() -> None:
    cache: LRUCache[str, str] = LRUCache(10, weigh=len)
    cache.put("a", "xxxx")
    cache.put("b", "yyyy")
    assert cache.weight() == 8
    cache.put("a", "xx")  # replacing an entry gives its old weight back
    assert cache.weight() == 6
    cache.put("c", "zzzzzz")  # 12 > 10: the least recently used ("b") goes
    assert cache.get("b") is None
    assert cache.get("a") == "xx"
    assert cache.weight() == 8
    cache.put("d", "w" * 11)  # heavier than the whole bound: not kept, nothing dropped
    assert cache.get("d") is None
    assert len(cache) == 2
    cache.clear()
    assert cache.weight() == 0
