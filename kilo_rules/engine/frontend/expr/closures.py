"""The runtime pieces of compiled expressions: the failure signal and closure factories.

Kept apart from :mod:`.compile` (which walks the tree and folds constants) because these
are the hot paths: each factory returns the closure that runs on every evaluation, shaped
so that the common case costs as few Python frames as possible.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from kilo_rules.engine.frontend.expr.nodes import LIMITS, Expr, Node
from kilo_rules.engine.frontend.expr.ops import OpError, kind_of

Fn = Callable[[Mapping[str, Any]], Any]

#: Errors an operation may raise on bad operands; everything else is a bug and propagates.
OP_ERRORS = (TypeError, ValueError, OpError, OverflowError, ZeroDivisionError)
_NUM = frozenset({int, float})
_MAX = LIMITS.max_int
_FAST: dict[str, tuple[Callable[[Any, Any], Any], str]] = {
    "+": (operator.add, "arith"),
    "-": (operator.sub, "arith"),
    "*": (operator.mul, "arith"),
    "/": (operator.truediv, "divide"),
    "//": (operator.floordiv, "divide"),
    "%": (operator.mod, "divide"),
    "<": (operator.lt, "order"),
    "<=": (operator.le, "order"),
    ">": (operator.gt, "order"),
    ">=": (operator.ge, "order"),
}


class Fail(Exception):  # noqa: N818 -- a signal between closures, never escapes
    """A runtime failure at ``node`` (``missing``: the context lacks a name)."""

    def __init__(self, node: Node, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.node, self.message, self.missing = node, message, missing


def failure_message(
    expr: Expr, node: Node, operands: tuple[tuple[Node, Any], ...], exc: Exception, what: str
) -> str:
    """A message for a failed operation, naming the operand that was null if one was."""
    if isinstance(exc, OpError):
        return str(exc)
    for operand, value in operands:
        if value is None:
            return f"{expr.source(operand)} is null, so {what} cannot be computed"
    kinds = " and ".join(kind_of(v) for _, v in operands)
    return f"{what} cannot be applied to {kinds}"


def fast_binary(
    op: str, lf: Fn, rf: Fn, rconst: bool, rvalue: Any, checked: Callable[[Any, Any], Any]
) -> Fn:
    """The closure for a binary operator, with an inline path for the common case.

    Numbers go through a C-level operator and a range check without any extra Python
    call; anything else (strings, nulls, errors) takes ``checked``, the full-rules path.
    """
    fast = _FAST.get(op)
    if op in ("==", "!="):
        equal = op == "=="
        if rconst:
            return (lambda ctx: lf(ctx) == rvalue) if equal else (lambda ctx: lf(ctx) != rvalue)
        return (lambda ctx: lf(ctx) == rf(ctx)) if equal else (lambda ctx: lf(ctx) != rf(ctx))
    if fast is None:
        if rconst:
            return lambda ctx: checked(lf(ctx), rvalue)
        return lambda ctx: checked(lf(ctx), rf(ctx))
    f, kind = fast
    if kind == "order":

        def order(ctx: Mapping[str, Any]) -> Any:
            a = lf(ctx)
            b = rvalue if rconst else rf(ctx)
            if type(a) in _NUM and type(b) in _NUM:
                return f(a, b)
            return checked(a, b)

        return order

    def arithmetic(ctx: Mapping[str, Any]) -> Any:
        a = lf(ctx)
        b = rvalue if rconst else rf(ctx)
        # A zero divisor falls through to `checked`, which reports it.
        if type(a) in _NUM and type(b) in _NUM and (b or kind == "arith"):
            v = f(a, b)
            if -_MAX <= v <= _MAX:
                return v
        return checked(a, b)

    return arithmetic


def call_closure(
    impl: Callable[..., Any],
    fail: Callable[[tuple[Any, ...], Exception], Fail],
    args: list[tuple[Fn, bool, Any]],
) -> Fn:
    """The closure for a call, specialised for the common shapes so that constant arguments
    are passed as values and no helper frame sits between the closure and the function."""
    fns = [fn for fn, _, _ in args]
    shape = tuple(const for _, const, _ in args)
    values = [value for _, _, value in args]
    if shape == (False,):
        (f0,) = fns

        def call1(ctx: Mapping[str, Any]) -> Any:
            a = f0(ctx)
            try:
                return impl(a)
            except OP_ERRORS as exc:
                raise fail((a,), exc) from None

        return call1
    if len(shape) == 2 and not all(shape):
        # Two arguments, at most one of them constant (min(20000, x), max(x, 0)...).
        f0, f1 = fns
        c0, c1 = values
        k0, k1 = shape

        def call2(ctx: Mapping[str, Any]) -> Any:
            a = c0 if k0 else f0(ctx)
            b = c1 if k1 else f1(ctx)
            try:
                return impl(a, b)
            except OP_ERRORS as exc:
                raise fail((a, b), exc) from None

        return call2
    if shape == (False, True, True):
        # clamp(x, lo, hi) with constant bounds.
        f0, c1, c2 = fns[0], values[1], values[2]

        def call3(ctx: Mapping[str, Any]) -> Any:
            a = f0(ctx)
            try:
                return impl(a, c1, c2)
            except OP_ERRORS as exc:
                raise fail((a, c1, c2), exc) from None

        return call3

    def call(ctx: Mapping[str, Any]) -> Any:
        got = tuple([f(ctx) for f in fns])
        try:
            return impl(*got)
        except OP_ERRORS as exc:
            raise fail(got, exc) from None

    return call
