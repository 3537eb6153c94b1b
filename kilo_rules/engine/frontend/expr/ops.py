"""Runtime semantics of the operators, shared by the compiler and the reference interpreter.

Each operation checks the kinds of its operands itself instead of trusting Python's
operators, which would happily repeat a string (``"a" * 10**9``), add booleans to numbers,
or overflow to ``inf``. Failures raise :class:`OpError` (a message for the policy author)
or ``TypeError``; the evaluators attach the location.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kilo_rules.engine.base.regex import Pattern, compile_regex
from kilo_rules.engine.base.regex import regex_problem as _regex_problem
from kilo_rules.engine.frontend.expr.nodes import LIMITS

_NUMERIC = frozenset({int, float})
_MAX = LIMITS.max_int


class OpError(Exception):
    """An operation failed on values of the right kinds (division by zero, overflow...)."""


def kind_of(value: Any) -> str:
    """The language's name for the kind of a runtime value."""
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", tuple: "list"}.get(
        type(value), type(value).__name__
    )


def number(value: Any) -> Any:
    """``value`` if it is within the numeric range (this also rejects ``inf`` and ``nan``)."""
    if -_MAX <= value <= _MAX:
        return value
    raise OpError(f"result {value} is out of range (at most {_MAX:_} in magnitude)")


def _numbers(a: Any, b: Any) -> None:
    if type(a) not in _NUMERIC or type(b) not in _NUMERIC:
        raise TypeError


def add(a: Any, b: Any) -> Any:
    if type(a) is str and type(b) is str:
        if len(a) + len(b) > LIMITS.max_string:
            raise OpError(f"string longer than {LIMITS.max_string} characters")
        return a + b
    _numbers(a, b)
    return number(a + b)


def sub(a: Any, b: Any) -> Any:
    _numbers(a, b)
    return number(a - b)


def mul(a: Any, b: Any) -> Any:
    _numbers(a, b)
    return number(a * b)


def _divisor(a: Any, b: Any) -> None:
    _numbers(a, b)
    if b == 0:
        raise OpError("division by zero")


def div(a: Any, b: Any) -> Any:
    _divisor(a, b)
    return number(a / b)


def floordiv(a: Any, b: Any) -> Any:
    _divisor(a, b)
    return number(a // b)


def mod(a: Any, b: Any) -> Any:
    _divisor(a, b)
    return number(a % b)


def neg(a: Any) -> Any:
    if type(a) not in _NUMERIC:
        raise TypeError
    return -a


def eq(a: Any, b: Any) -> bool:
    return bool(a == b)


def ne(a: Any, b: Any) -> bool:
    return bool(a != b)


def _ordered(a: Any, b: Any) -> None:
    if not ((type(a) in _NUMERIC and type(b) in _NUMERIC) or (type(a) is str and type(b) is str)):
        raise TypeError


def lt(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return bool(a < b)


def le(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return bool(a <= b)


def gt(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return bool(a > b)


def ge(a: Any, b: Any) -> bool:
    _ordered(a, b)
    return bool(a >= b)


def in_(a: Any, b: Any) -> bool:
    if type(b) is str:
        if type(a) is not str:
            raise TypeError
        return a in b
    if type(b) is list or type(b) is tuple:
        return a in b
    raise TypeError


def not_in(a: Any, b: Any) -> bool:
    return not in_(a, b)


def contains(a: Any, b: Any) -> bool:
    return in_(b, a)


def _strings(a: Any, b: Any) -> None:
    if type(a) is not str or type(b) is not str:
        raise TypeError


def startswith(a: Any, b: Any) -> bool:
    _strings(a, b)
    return bool(a.startswith(b))


def endswith(a: Any, b: Any) -> bool:
    _strings(a, b)
    return bool(a.endswith(b))


def matches(a: Any, b: Any) -> bool:
    _strings(a, b)
    return safe_regex(b).search(a) is not None


#: Binary operators that evaluate both operands (``and``, ``or``, ``??`` are lazy).
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": add,
    "-": sub,
    "*": mul,
    "/": div,
    "//": floordiv,
    "%": mod,
    "==": eq,
    "!=": ne,
    "<": lt,
    "<=": le,
    ">": gt,
    ">=": ge,
    "in": in_,
    "not in": not_in,
    "contains": contains,
    "startswith": startswith,
    "endswith": endswith,
    "matches": matches,
}


# --- regular expressions -----------------------------------------------------------------


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused, or None when it can run.

    Patterns are compiled by RE2 (:mod:`kilo_rules.engine.base.regex`), which matches in time linear
    in the text, so no pattern can make an evaluation hang; what RE2 cannot run that way
    (backreferences, lookaround) is refused here, and by ``check`` for a literal pattern.
    """
    if len(pattern) > LIMITS.max_regex_length:
        return (
            f"regular expression is {len(pattern)} characters long, more than the limit "
            f"of {LIMITS.max_regex_length}"
        )
    problem = _regex_problem(pattern)
    return f"invalid regular expression: {problem}" if problem else None


def safe_regex(pattern: str) -> Pattern:
    """``pattern`` compiled by RE2 if :func:`regex_problem` accepts it, else raise
    :class:`OpError` (an evaluation error at the operator)."""
    problem = regex_problem(pattern)
    if problem:
        raise OpError(problem)
    return compile_regex(pattern)
