"""The fixed registry of functions an expression may call.

Each :class:`Function` carries its arity, a typing rule used by the checker and the Python
implementation used at run time. There is no way to add functions from a policy: the
language stays closed, and every function is total over its checked argument types except
for the documented runtime failures (empty list, bad number text, ``clamp`` bounds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kilo_rules.engine.frontend.expr.ops import OpError, number, safe_regex
from kilo_rules.engine.frontend.expr.types import (
    ANY,
    BOOL,
    FLOAT,
    INT,
    NEVER,
    NUMBER,
    STR,
    Type,
    join,
    nullable,
)


class ArgTypeError(Exception):
    """A typing rule rejected argument ``index`` (``None``: the call as a whole)."""

    def __init__(self, index: int | None, message: str) -> None:
        super().__init__(message)
        self.index, self.message = index, message


@dataclass(frozen=True, slots=True)
class Function:
    """A callable of the language."""

    name: str
    signature: str
    doc: str
    min_args: int
    max_args: int | None
    result: Callable[[Sequence[Type]], Type]
    impl: Callable[..., Any]

    def arity_text(self) -> str:
        """``"3 arguments"``, ``"1 or more arguments"``..."""
        if self.max_args is None:
            return f"{self.min_args} or more arguments"
        if self.min_args == self.max_args:
            return f"{self.min_args} argument" + ("" if self.min_args == 1 else "s")
        return f"{self.min_args} to {self.max_args} arguments"


# --- typing rules ------------------------------------------------------------------------


def _need(index: int, t: Type, ok: bool, wanted: str) -> None:
    if t.is_any or ok:
        return
    if t.nullable and t.non_null().kinds:
        raise ArgTypeError(index, f"argument {index + 1} may be null, expected {wanted}")
    raise ArgTypeError(index, f"argument {index + 1} is {t}, expected {wanted}")


def _numbers(args: Sequence[Type]) -> Type:
    result: Type | None = NEVER
    for i, t in enumerate(args):
        _need(i, t, t.is_numeric(), "a number")
        result = join(result, t) if result is not None else None
    return result or NUMBER


def _to_int(args: Sequence[Type]) -> Type:
    _need(0, args[0], args[0].is_numeric(), "a number")
    return INT


def _same_number(args: Sequence[Type]) -> Type:
    _need(0, args[0], args[0].is_numeric(), "a number")
    return args[0]


def _min_max(args: Sequence[Type]) -> Type:
    if len(args) == 1:
        t = args[0]
        elem = t.elem or NEVER
        ok = t.is_kind("list") and (elem.is_numeric() or elem == NEVER or elem.is_any)
        _need(0, t, ok, "a list of numbers (or call it with two or more numbers)")
        return elem if elem.is_numeric() else NUMBER if elem == NEVER else ANY
    return _numbers(args)


def _sum(args: Sequence[Type]) -> Type:
    t = args[0]
    elem = t.elem or NEVER
    _need(
        0,
        t,
        t.is_kind("list") and (elem.is_numeric() or elem == NEVER or elem.is_any),
        "a list of numbers",
    )
    return elem if elem.is_numeric() else INT if elem == NEVER else ANY


def _len(args: Sequence[Type]) -> Type:
    t = args[0]
    _need(0, t, t.is_kind("str") or t.is_kind("list"), "a string or a list")
    return INT


def _strings(result: Type) -> Callable[[Sequence[Type]], Type]:
    def rule(args: Sequence[Type]) -> Type:
        for i, t in enumerate(args):
            _need(i, t, t.is_kind("str"), "a string")
        return result

    return rule


def _parse_number(result: Type) -> Callable[[Sequence[Type]], Type]:
    def rule(args: Sequence[Type]) -> Type:
        t = args[0]
        _need(0, t, t.is_numeric() or t.is_kind("str"), "a number or a string")
        return result

    return rule


def _bools(args: Sequence[Type]) -> Type:
    t = args[0]
    elem = t.elem or NEVER
    _need(0, t, t.is_kind("list") and (elem in (BOOL, NEVER) or elem.is_any), "a list of booleans")
    return BOOL


def _coalesce(args: Sequence[Type]) -> Type:
    result: Type | None = NEVER
    for i, t in enumerate(args):
        result = join(result, t.non_null()) if result is not None else None
        if result is None:
            raise ArgTypeError(i, f"argument {i + 1} is {t}, which does not mix with the others")
    assert result is not None
    return nullable(result) if all(t.nullable for t in args) else result


def _text(args: Sequence[Type]) -> Type:
    return STR


# --- implementations ---------------------------------------------------------------------


def _js_round(x: Any) -> int:
    """JavaScript ``Math.round``: halves go up (``-2.5`` → ``-2``), unlike Python's round."""
    if type(x) is int:
        return x
    if type(x) is not float:
        raise TypeError
    low = math.floor(x)
    return int(number(low + 1 if x - low >= 0.5 else low))


def _floor(x: Any) -> int:
    if type(x) is int:
        return x
    if type(x) is not float:
        raise TypeError
    return math.floor(x)  # finite and in range: every float value is bounded


def _ceil(x: Any) -> int:
    if type(x) is int:
        return x
    if type(x) is not float:
        raise TypeError
    return math.ceil(x)


def _abs(x: Any) -> Any:
    if type(x) not in (int, float):
        raise TypeError
    return number(abs(x))


_NUM = frozenset({int, float})


def _pick(name: str, choose: Callable[..., Any]) -> Callable[..., Any]:
    def impl(*args: Any) -> Any:
        if len(args) == 2 and type(args[0]) in _NUM and type(args[1]) in _NUM:
            return choose(args)  # the common min(a, b): skip the general checks
        values = args[0] if len(args) == 1 else args
        if type(values) not in (list, tuple):
            raise TypeError
        if not values:
            raise OpError(f"{name}() of an empty list")
        for v in values:
            if type(v) not in _NUM:
                raise TypeError
        return choose(values)

    return impl


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    if type(x) not in _NUM or type(lo) not in _NUM or type(hi) not in _NUM:
        raise TypeError
    if lo > hi:
        raise OpError(f"clamp() lower bound {lo} is above upper bound {hi}")
    return lo if x < lo else hi if x > hi else x


def _sum_impl(values: Any) -> Any:
    if type(values) not in (list, tuple) or any(type(v) not in (int, float) for v in values):
        raise TypeError
    return number(sum(values))


def _len_impl(x: Any) -> int:
    if type(x) not in (str, list, tuple):
        raise TypeError
    return len(x)


def _str_method(method: Callable[[str], str]) -> Callable[[Any], str]:
    def impl(x: Any) -> str:
        if type(x) is not str:
            raise TypeError
        return method(x)

    return impl


def _int(x: Any) -> int:
    if type(x) is str:
        try:
            return int(number(int(x.strip())))
        except ValueError:
            raise OpError(f"int() cannot read {x!r} as a whole number") from None
    if type(x) not in (int, float):
        raise TypeError
    return int(x)


def _float(x: Any) -> float:
    if type(x) is str:
        try:
            value = float(x)
        except ValueError:
            raise OpError(f"float() cannot read {x!r} as a number") from None
        return float(number(value))
    if type(x) not in (int, float):
        raise TypeError
    return float(x)


def to_text(value: Any) -> str:
    """How ``str()`` shows a value: ``true``/``false``/``null``, lists as JSON."""
    if type(value) is str:
        return value
    return json.dumps(value, ensure_ascii=False)


def _booleans(values: Any) -> Any:
    if type(values) not in (list, tuple) or any(v is not True and v is not False for v in values):
        raise TypeError
    return values


def _any(values: Any) -> bool:
    return True in _booleans(values)


def _all(values: Any) -> bool:
    return False not in _booleans(values)


def _coalesce_impl(*args: Any) -> Any:
    for value in args:
        if value is not None:
            return value
    return None


def _regex_match(s: Any, pattern: Any) -> bool:
    if type(s) is not str or type(pattern) is not str:
        raise TypeError
    return safe_regex(pattern).search(s) is not None


def _f(
    name: str,
    signature: str,
    doc: str,
    arity: tuple[int, int | None],
    result: Callable[[Sequence[Type]], Type],
    impl: Callable[..., Any],
) -> Function:
    return Function(name, signature, doc, arity[0], arity[1], result, impl)


#: Every function of the language, by name.
FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        _f("abs", "abs(x: number) -> number", "Absolute value.", (1, 1), _same_number, _abs),
        _f(
            "all",
            "all(xs: list[bool]) -> bool",
            "Every item is true (true for []).",
            (1, 1),
            _bools,
            _all,
        ),
        _f(
            "any",
            "any(xs: list[bool]) -> bool",
            "Some item is true (false for []).",
            (1, 1),
            _bools,
            _any,
        ),
        _f("ceil", "ceil(x: number) -> int", "Smallest whole number >= x.", (1, 1), _to_int, _ceil),
        _f(
            "clamp",
            "clamp(x, lo, hi: number) -> number",
            "x limited to [lo, hi]; lo > hi fails.",
            (3, 3),
            _numbers,
            _clamp,
        ),
        _f(
            "coalesce",
            "coalesce(a, b, ...) -> T",
            "The first argument that is not null "
            "(all arguments are evaluated; use ?? to skip the rest).",
            (1, None),
            _coalesce,
            _coalesce_impl,
        ),
        _f(
            "float",
            "float(x: number | str) -> float",
            "x as a float; bad text fails.",
            (1, 1),
            _parse_number(FLOAT),
            _float,
        ),
        _f(
            "floor",
            "floor(x: number) -> int",
            "Largest whole number <= x.",
            (1, 1),
            _to_int,
            _floor,
        ),
        _f(
            "int",
            "int(x: number | str) -> int",
            "x truncated toward zero; bad text fails.",
            (1, 1),
            _parse_number(INT),
            _int,
        ),
        _f(
            "len",
            "len(x: str | list) -> int",
            "Characters in a string, items in a list.",
            (1, 1),
            _len,
            _len_impl,
        ),
        _f(
            "lower",
            "lower(s: str) -> str",
            "Lower-case.",
            (1, 1),
            _strings(STR),
            _str_method(str.lower),
        ),
        _f(
            "max",
            "max(a, b, ...: number) or max(xs: list[number]) -> number",
            "Largest value; an empty list fails.",
            (1, None),
            _min_max,
            _pick("max", max),
        ),
        _f(
            "min",
            "min(a, b, ...: number) or min(xs: list[number]) -> number",
            "Smallest value; an empty list fails.",
            (1, None),
            _min_max,
            _pick("min", min),
        ),
        _f(
            "regex_match",
            "regex_match(s: str, pattern: str) -> bool",
            "Same as `s matches pattern` (an RE2 search).",
            (2, 2),
            _strings(BOOL),
            _regex_match,
        ),
        _f(
            "round",
            "round(x: number) -> int",
            "Nearest whole number, halves up (JavaScript "
            "Math.round: round(2.5) = 3, round(-2.5) = -2).",
            (1, 1),
            _to_int,
            _js_round,
        ),
        _f(
            "str",
            "str(x) -> str",
            "Text of any value: true/false/null, numbers, lists as JSON.",
            (1, 1),
            _text,
            to_text,
        ),
        _f(
            "sum",
            "sum(xs: list[number]) -> number",
            "Sum of the items (0 for []).",
            (1, 1),
            _sum,
            _sum_impl,
        ),
        _f(
            "upper",
            "upper(s: str) -> str",
            "Upper-case.",
            (1, 1),
            _strings(STR),
            _str_method(str.upper),
        ),
    )
}
