"""A bounded least-recently-used map: the one cache mechanism of kilo-rules.

Every cache that lives as long as a process (token counts per part, lowered and serialised
messages per plan, compiled plans) is bounded, so that a long-running agent or server does
not grow without end, and drops the entry used least recently first. The caches of the
compiler (plans, resolved policies, parsed documents and expressions) belong to a
:class:`kilo_rules.engine.compiler.compile.Compiler`, not to the modules: a store or a test that
wants caches of its own makes its own compiler.

Keys are compared by content (hash and equality), which is what a shared cache should do:
equal inputs give equal results, however the caller built them. A few caches key immutable
objects that are expensive to hash (a session message holds every byte of its tool
output); those use ``by_identity=True``: the key's ``id()`` is looked up, and the entry
holds the key itself, so the id cannot be reused by another object while it is cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["CacheStats", "LRUCache"]

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of a cache: lookups answered, lookups missed, current and maximum size."""

    hits: int
    misses: int
    size: int
    maxsize: int

    @property
    def hit_rate(self) -> float:
        """Fraction of lookups answered from the cache (0 when nothing was looked up)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class LRUCache(Generic[K, V]):
    """A map of at most ``maxsize`` entries that forgets the least recently used first.

    With ``weigh``, ``maxsize`` bounds the sum of ``weigh(value)`` instead of the count
    (a cache of texts bounded by characters: one large value weighs as much as many small
    ones); a value heavier than the whole bound is not kept.

    Thread-safe: every read and write of the map holds a lock. :meth:`get_or` makes a
    missing value outside the lock (making it may be slow), so two threads missing the same
    key may both make it; the later one is kept, which is harmless for the pure
    computations cached here.
    """

    def __init__(
        self,
        maxsize: int = 8192,
        *,
        by_identity: bool = False,
        weigh: Callable[[V], int] | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.by_identity = by_identity
        self._weigh = weigh
        # The entry keeps the key beside the value: an identity key must stay alive.
        self._data: OrderedDict[object, tuple[K, V]] = OrderedDict()
        self._weight = 0  # the sum of weigh(value) over the entries (with weigh only)
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def _find(self, key: K) -> tuple[bool, V | None]:
        """(found, value) for ``key``; a hit becomes the most recently used."""
        by_identity = self.by_identity
        slot: object = id(key) if by_identity else key
        with self._lock:
            entry = self._data.get(slot)
            if entry is not None and (not by_identity or entry[0] is key):
                self._data.move_to_end(slot)
                self._hits += 1
                return True, entry[1]
            self._misses += 1
            return False, None

    def get(self, key: K) -> V | None:
        """The value cached for ``key`` (now the most recently used), or None."""
        return self._find(key)[1]

    def put(self, key: K, value: V) -> None:
        """Cache ``value`` for ``key``, dropping the least recently used beyond the bound."""
        slot: object = id(key) if self.by_identity else key
        weigh = self._weigh
        with self._lock:
            if weigh is None:
                self._data[slot] = (key, value)
                self._data.move_to_end(slot)
                if len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
                return
            old = self._data.pop(slot, None)
            if old is not None:
                self._weight -= weigh(old[1])
            weight = weigh(value)
            if weight > self.maxsize:
                return
            self._data[slot] = (key, value)
            self._weight += weight
            while self._weight > self.maxsize:
                _, (_, dropped) = self._data.popitem(last=False)
                self._weight -= weigh(dropped)

    def get_or(self, key: K, make: Callable[[], V]) -> V:
        """The value cached for ``key``, or ``make()`` cached and returned when absent."""
        found, cached = self._find(key)
        if found:
            return cached  # type: ignore[return-value]  # a cached value is a V
        value = make()
        self.put(key, value)
        return value

    def items(self) -> list[tuple[K, V]]:
        """Every entry, least recently used first (a copy: the cache may change meanwhile).
        Reading them makes none of them more recent."""
        with self._lock:
            return list(self._data.values())

    def weight(self) -> int:
        """The sum of ``weigh(value)`` over the entries (0 without ``weigh``)."""
        with self._lock:
            return self._weight

    def stats(self) -> CacheStats:
        """Hits, misses and current size."""
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._data), self.maxsize)

    def clear(self) -> None:
        """Forget every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self._weight = 0
            self._hits = 0
            self._misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
