"""Identity caches that let step k+1 reuse the work of step k.

Session messages and the messages lowered from them are immutable, so their lowering and
their JSON depend only on the object (and the settings used). Hashing a message by content
would cost as much as the work it saves (it holds every byte of its tool output), so these
caches are keyed by object identity; the entry holds the key, so an id is never reused while
it is cached, and the cache is bounded, so a long-lived plan cannot grow without end.
"""

from __future__ import annotations

from typing import TypeVar

from ..lru import LRUCache

K = TypeVar("K")
V = TypeVar("V")


class IdentityLRU(LRUCache[K, V]):
    """A bounded map from objects (by identity) to values; thread-safe."""

    def __init__(self, maxsize: int = 8192) -> None:
        super().__init__(maxsize, by_identity=True)
