"""AST → Python closures, with constant folding.

Each node becomes a closure ``fn(context) -> value`` that calls its children's closures;
nothing is ``eval``-ed. Sub-expressions whose operands are all constants are computed once
here, so ``20_000 * 2`` costs nothing per call and a fully constant expression compiles to
a closure returning its value (:attr:`CompiledExpr.constant`).

Runtime failures travel as :class:`~.closures.Fail` (node + message) up to
:attr:`CompiledExpr.evaluate`, which turns them into an :class:`EvalError` located at the
failing sub-expression, or returns the fallback given at compile time.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Mapping
from typing import Any, Final

from kilo_rules.engine.base.errors import Diagnostic, EvalError, ExprError, did_you_mean
from kilo_rules.engine.frontend.expr import ops
from kilo_rules.engine.frontend.expr.closures import (
    OP_ERRORS,
    Fail,
    Fn,
    call_closure,
    failure_message,
    fast_binary,
)
from kilo_rules.engine.frontend.expr.functions import FUNCTIONS
from kilo_rules.engine.frontend.expr.nodes import (
    Binary,
    Call,
    Conditional,
    Expr,
    ListExpr,
    Literal,
    Name,
    Node,
    Unary,
    walk,
)
from kilo_rules.engine.frontend.expr.ops import kind_of
from kilo_rules.engine.frontend.expr.types import Type


class _NoFallback(enum.Enum):
    NO_FALLBACK = enum.auto()

    def __repr__(self) -> str:
        return "NO_FALLBACK"


#: The default of ``fallback=``: runtime failures raise :class:`EvalError`.
NO_FALLBACK: Final = _NoFallback.NO_FALLBACK


class CompiledExpr:
    """An expression ready to evaluate against a context of full dotted names.

    Call it (or :meth:`evaluate`) with a mapping such as
    ``{"model.limits.context": 200000, ...}``.
    """

    __slots__ = ("_value", "evaluate", "expr", "fallback", "is_constant", "names", "type")

    def __init__(
        self,
        expr: Expr,
        fn: Fn,
        *,
        constant: bool,
        value: Any,
        fallback: Any = NO_FALLBACK,
        result_type: Type | None = None,
    ) -> None:
        from kilo_rules.engine.frontend.expr.vocabulary import name_nodes

        self.expr = expr
        self._value = value
        #: Whether the value does not depend on the context.
        self.is_constant: bool = constant
        #: Returned instead of raising when evaluation fails (``NO_FALLBACK``: raise).
        self.fallback = fallback
        #: The checked result type, when compiled through :func:`compile_source`.
        self.type = result_type
        #: The names the expression reads, in source order.
        self.names: tuple[str, ...] = tuple(n.name for n in name_nodes(expr))

        first_use: dict[str, Node] = {}  # where to point when the context lacks a name
        for node in walk(expr.root):
            if isinstance(node, Name) and node.name not in first_use:
                first_use[node.name] = node

        def evaluate(context: Mapping[str, Any]) -> Any:
            try:
                return fn(context)
            except Fail as fail:
                if fallback is not NO_FALLBACK and not fail.missing:
                    return fallback
                raise _eval_error(expr, fail) from None
            except KeyError as exc:
                key = exc.args[0] if exc.args else None
                if key not in first_use:
                    raise
                missing = Fail(first_use[key], f"no value for {key}", missing=True)
                raise _eval_error(expr, missing) from None

        #: The value for ``context``; a plain closure, so hot loops pay one call.
        self.evaluate: Callable[[Mapping[str, Any]], Any] = evaluate

    @property
    def constant(self) -> Any:
        """The value of a constant expression; ``ValueError`` if it reads any name."""
        if not self.is_constant:
            raise ValueError(f"`{self.expr.text}` is not constant")
        return self._value

    @property
    def text(self) -> str:
        """The source text."""
        return self.expr.text

    def __call__(self, context: Mapping[str, Any]) -> Any:
        """Same as :attr:`evaluate`."""
        return self.evaluate(context)

    def __repr__(self) -> str:
        return f"CompiledExpr({self.expr.text!r})"


def _eval_error(expr: Expr, fail: Fail) -> EvalError:
    return EvalError(
        Diagnostic(
            "expr.eval",
            f"{fail.message} (in `{expr.text}`)",
            expr.location(fail.node),
            details={
                "expression": expr.text,
                "subexpression": expr.source(fail.node),
                "kind": "missing-name" if fail.missing else "runtime",
            },
            hint="the evaluation context must provide every name the expression reads"
            if fail.missing
            else None,
        )
    )


_Compiled = tuple[Fn, bool, Any]  # (closure, is constant, constant value)
_EMPTY: Mapping[str, Any] = {}


class _Compiler:
    def __init__(self, expr: Expr) -> None:
        self.expr = expr

    def compile(self, node: Node) -> _Compiled:
        if isinstance(node, Literal):
            return self.constant(node.value)
        if isinstance(node, Name):
            return self.name(node), False, None
        method: Callable[[Any], _Compiled] = getattr(self, type(node).__name__.lower())
        return method(node)

    def constant(self, value: Any) -> _Compiled:
        if type(value) is list:
            # Lists are mutable: hand every caller its own copy.
            return (lambda ctx: list(value)), True, value
        return (lambda ctx: value), True, value

    def fold(self, fn: Fn, node: Node) -> _Compiled:
        """Evaluate a node whose operands are all constants, once, now."""
        try:
            return self.constant(fn(_EMPTY))
        except Fail as fail:
            where = self.expr.location(fail.node)
            raise ExprError(
                Diagnostic(
                    "expr.eval",
                    f"this always fails: {fail.message}",
                    where,
                    details={
                        "expression": self.expr.text,
                        "subexpression": self.expr.source(fail.node),
                    },
                )
            ) from None

    def name(self, node: Name) -> Fn:
        # A C-level getter: no Python frame per name. A missing key raises KeyError, which
        # CompiledExpr.evaluate turns into a located EvalError.
        return operator.itemgetter(node.name)

    def listexpr(self, node: ListExpr) -> _Compiled:
        items = [self.compile(item) for item in node.items]
        fns = [fn for fn, _, _ in items]

        def build(ctx: Mapping[str, Any]) -> list[Any]:
            return [f(ctx) for f in fns]

        if all(const for _, const, _ in items):
            return self.constant([value for _, _, value in items])
        return build, False, None

    def unary(self, node: Unary) -> _Compiled:
        f, const, _ = self.compile(node.operand)
        operand = node.operand
        expr = self.expr

        if node.op == "not":

            def run(ctx: Mapping[str, Any]) -> Any:
                v = f(ctx)
                if v is True:
                    return False
                if v is False:
                    return True
                raise Fail(operand, f"'not' needs a bool, got {kind_of(v)}")
        else:

            def run(ctx: Mapping[str, Any]) -> Any:
                v = f(ctx)
                try:
                    return ops.neg(v)
                except OP_ERRORS as exc:
                    raise Fail(
                        node, failure_message(expr, node, ((operand, v),), exc, "'-'")
                    ) from None

        return self.fold(run, node) if const else (run, False, None)

    def binary(self, node: Binary) -> _Compiled:
        if node.op in ("and", "or"):
            return self.logical(node)
        lf, lconst, lvalue = self.compile(node.left)
        rf, rconst, rvalue = self.compile(node.right)
        if node.op == "??":
            if lconst:
                return (rf, rconst, rvalue) if lvalue is None else self.constant(lvalue)

            def coalesce(ctx: Mapping[str, Any]) -> Any:
                v = lf(ctx)
                return rf(ctx) if v is None else v

            return coalesce, False, None
        if (
            rconst
            and not lconst
            and node.op in ("/", "//", "%")
            and type(rvalue) in (int, float)
            and rvalue == 0
        ):
            raise ExprError(
                Diagnostic(
                    "expr.eval",
                    "division by zero: the divisor is always 0",
                    self.expr.location(node.right),
                    details={"expression": self.expr.text},
                )
            )
        op = ops.BINARY[node.op]
        expr, left, right, what = self.expr, node.left, node.right, f"'{node.op}'"

        def checked(a: Any, b: Any) -> Any:
            try:
                return op(a, b)
            except OP_ERRORS as exc:
                raise Fail(
                    node, failure_message(expr, node, ((left, a), (right, b)), exc, what)
                ) from None

        if lconst and rconst:
            return self.fold(lambda ctx: checked(lvalue, rvalue), node)
        run = fast_binary(node.op, lf, rf, rconst, rvalue, checked)
        return run, False, None

    def logical(self, node: Binary) -> _Compiled:
        lf, lconst, lvalue = self.compile(node.left)
        rf, rconst, _ = self.compile(node.right)
        # `and` stops at False, `or` at True; the other operand must then be a bool too.
        stop = node.op == "or"
        left, right = node.left, node.right

        def run(ctx: Mapping[str, Any]) -> Any:
            a = lf(ctx)
            if a is stop:
                return stop
            if a is not (not stop):
                raise Fail(left, f"'{node.op}' needs a bool, got {kind_of(a)}")
            b = rf(ctx)
            if b is True or b is False:
                return b
            raise Fail(right, f"'{node.op}' needs a bool, got {kind_of(b)}")

        if lconst and (lvalue is stop or rconst):
            return self.fold(run, node)
        return run, False, None

    def conditional(self, node: Conditional) -> _Compiled:
        cf, cconst, cvalue = self.compile(node.cond)
        then = self.compile(node.then)
        orelse = self.compile(node.orelse)
        if cconst and (cvalue is True or cvalue is False):
            return then if cvalue else orelse
        tf, ef, cond = then[0], orelse[0], node.cond

        def run(ctx: Mapping[str, Any]) -> Any:
            c = cf(ctx)
            if c is True:
                return tf(ctx)
            if c is False:
                return ef(ctx)
            raise Fail(cond, f"the condition must be a bool, got {kind_of(c)}")

        return self.fold(run, node) if cconst else (run, False, None)

    def call(self, node: Call) -> _Compiled:
        func = FUNCTIONS.get(node.func)
        if func is None:
            suggestion = did_you_mean(node.func, FUNCTIONS)
            raise ExprError(
                Diagnostic(
                    "expr.unknown-function",
                    f"unknown function {node.func}()",
                    self.expr.location(node),
                    hint=f"did you mean {suggestion}()?" if suggestion else None,
                )
            )
        args = [self.compile(arg) for arg in node.args]
        impl, expr, what = func.impl, self.expr, f"{func.name}()"

        def fail(values: tuple[Any, ...], exc: Exception) -> Fail:
            operands = tuple(zip(node.args, values, strict=True))
            return Fail(node, failure_message(expr, node, operands, exc, what))

        if all(const for _, const, _ in args):
            values = tuple(value for _, _, value in args)

            def once(ctx: Mapping[str, Any]) -> Any:
                try:
                    return impl(*values)
                except OP_ERRORS as exc:
                    raise fail(values, exc) from None

            return self.fold(once, node)
        return call_closure(impl, fail, args), False, None


def compile_expr(
    expr: Expr, *, fallback: Any = NO_FALLBACK, result_type: Type | None = None
) -> CompiledExpr:
    """Compile a parsed (and normally checked) expression into a :class:`CompiledExpr`.

    ``fallback``: the value to return when evaluation fails at run time (division by
    zero, a null operand, overflow...) instead of raising :class:`EvalError`. A name
    missing from the context always raises: that is a bug in the caller, not in the data.
    A constant sub-expression that always fails raises :class:`ExprError` here.
    """
    fn, const, value = _Compiler(expr).compile(expr.root)
    return CompiledExpr(
        expr, fn, constant=const, value=value, fallback=fallback, result_type=result_type
    )
