"""The static types of the expression language.

A type is a set of kinds (``int``, ``float``, ``str``, ``bool``, ``null``, ``list``) plus an
element type for lists. Sets make the two unions the language needs cheap to express:
``number`` is ``{int, float}`` and a nullable ``T`` is ``T`` plus ``null`` (written ``T?``).
"""

from __future__ import annotations

from dataclasses import dataclass

_NUMERIC = frozenset({"int", "float"})


@dataclass(frozen=True, slots=True)
class Type:
    """A static type: a set of kinds, and for lists the element type."""

    kinds: frozenset[str]
    elem: Type | None = None

    @property
    def nullable(self) -> bool:
        """Whether null is among the values of this type."""
        return "null" in self.kinds

    @property
    def is_any(self) -> bool:
        """The type of an expression that already has an error: it fits everywhere."""
        return "any" in self.kinds

    def non_null(self) -> Type:
        """This type without null."""
        return Type(self.kinds - {"null"}, self.elem) if self.nullable else self

    def is_numeric(self) -> bool:
        """Whether every value is an int or a float (null excluded)."""
        return bool(self.kinds) and self.kinds <= _NUMERIC

    def is_kind(self, kind: str) -> bool:
        """Whether every value has exactly this kind (``str``, ``bool``, ``list``...)."""
        return self.kinds == frozenset({kind})

    def __str__(self) -> str:
        if self.is_any:
            return "any"
        base = self.kinds - {"null"}
        if not base:
            return "null" if self.nullable else "never"
        if base == _NUMERIC:
            text = "number"
        else:
            parts = [f"list[{self.elem or NEVER}]" if k == "list" else k for k in sorted(base)]
            text = " | ".join(parts)
        return text + "?" if self.nullable else text


INT = Type(frozenset({"int"}))
FLOAT = Type(frozenset({"float"}))
NUMBER = Type(_NUMERIC)
STR = Type(frozenset({"str"}))
BOOL = Type(frozenset({"bool"}))
NULL = Type(frozenset({"null"}))
#: The type of an erroneous sub-expression; it suppresses follow-up errors.
ANY = Type(frozenset({"any"}))
#: The element type of an empty list literal: it joins with every type.
NEVER = Type(frozenset())


def list_of(elem: Type) -> Type:
    """``list[elem]``."""
    return Type(frozenset({"list"}), elem)


def nullable(t: Type) -> Type:
    """``t?``: ``t`` or null."""
    return Type(t.kinds | {"null"}, t.elem)


def type_of_value(value: object) -> Type:
    """The type of a runtime value (lists take the join of their items)."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, str):
        return STR
    if isinstance(value, (list, tuple)):
        elem: Type | None = NEVER
        for item in value:
            elem = join(elem, type_of_value(item)) if elem is not None else None
        return list_of(elem if elem is not None else ANY)
    return ANY


def join(a: Type, b: Type) -> Type | None:
    """The smallest type holding both, or None when they do not mix (e.g. int and str).

    Numbers mix (int and float give number) and null mixes with anything (giving ``T?``).
    """
    if a.is_any or b.is_any:
        return ANY
    base_a, base_b = a.kinds - {"null"}, b.kinds - {"null"}
    if base_a and base_b and base_a != base_b and not (base_a | base_b) <= _NUMERIC:
        return None
    elem = None
    if "list" in base_a and "list" in base_b:
        elem = join(a.elem or NEVER, b.elem or NEVER)
        if elem is None:
            return None
    else:
        elem = a.elem or b.elem
    return Type(a.kinds | b.kinds, elem)


def assignable(src: Type, dst: Type) -> bool:
    """Whether every value of ``src`` is acceptable where ``dst`` is expected.

    An int is acceptable where a float is expected (it widens), not the reverse.
    """
    if src.is_any or dst.is_any:
        return True
    for kind in src.kinds:
        if kind in dst.kinds:
            continue
        if kind == "int" and "float" in dst.kinds:
            continue
        return False
    if "list" in src.kinds:
        return assignable(src.elem or NEVER, dst.elem or NEVER)
    return True


def comparable(a: Type, b: Type) -> bool:
    """Whether ``a == b`` can ever be true (null compares with everything)."""
    if a.is_any or b.is_any:
        return True
    base_a, base_b = a.kinds - {"null"}, b.kinds - {"null"}
    if not base_a or not base_b:
        return True
    if base_a <= _NUMERIC and base_b <= _NUMERIC:
        return True
    if base_a & base_b == {"list"}:
        return comparable(a.elem or NEVER, b.elem or NEVER)
    return bool(base_a & base_b)
