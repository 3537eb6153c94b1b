"""Identity caches that let step k+1 reuse the work of step k.

Session messages and the messages lowered from them are immutable, so their lowering and
their JSON depend only on the object (and the settings used). The caches are keyed by
object identity, hold a reference to the key (so an id is never reused while cached), and
are bounded (least recently used first out), so a long-lived plan cannot grow without end.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityLRU(Generic[K, V]):
    """A bounded map from objects (by identity) to values; thread-safe."""

    def __init__(self, maxsize: int = 8192) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[int, tuple[K, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get_or(self, key: K, make: Callable[[], V]) -> V:
        """The cached value for ``key``, made (once) with ``make`` when absent."""
        ident = id(key)
        with self._lock:
            hit = self._data.get(ident)
            if hit is not None and hit[0] is key:
                self._data.move_to_end(ident)
                return hit[1]
        value = make()
        with self._lock:
            self._data[ident] = (key, value)
            self._data.move_to_end(ident)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._data)
