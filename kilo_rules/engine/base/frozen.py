"""Immutable containers for data many callers share (a compiled plan and its settings)."""

from __future__ import annotations

import copy
from typing import Any, NoReturn, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(dict[K, V]):
    """A mapping that refuses every change.

    A compiled plan is shared by every caller of ``compile_policy`` (it is cached) and by
    every thread that applies it, so none of them may change it under the others. It is a
    ``dict`` so that readers and ``json.dumps`` treat it as one; copies are plain dicts."""

    __slots__ = ()

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise TypeError("a compiled plan is immutable; compile another policy instead")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __copy__(self) -> dict[K, V]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[K, V]:
        return {k: copy.deepcopy(v, memo) for k, v in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


def freeze(value: Any) -> Any:
    """``value`` with every dict made a :class:`FrozenDict` and every list a tuple."""
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value
