"""A reference interpreter that walks lark's parse tree on every evaluation.

It shares the operator and function implementations with the compiler but none of its
machinery (no typed nodes, no closures, no folding), which makes it a useful second
opinion: the tests run both on generated expressions and require the same results, and
the benchmark measures what compiling buys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lark import Token, Tree
from lark.visitors import Interpreter

from kilo_rules.engine.base.errors import Diagnostic, EvalError, Location
from kilo_rules.engine.frontend.expr import ops
from kilo_rules.engine.frontend.expr.closures import OP_ERRORS, failure_message
from kilo_rules.engine.frontend.expr.functions import FUNCTIONS
from kilo_rules.engine.frontend.expr.nodes import Expr, Node
from kilo_rules.engine.frontend.expr.ops import kind_of
from kilo_rules.engine.frontend.expr.parser import (
    decode_duration,
    decode_float,
    decode_int,
    decode_size,
    decode_string,
    tree_parser,
)

_BINARY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "floordiv": "//",
    "mod": "%",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "in_": "in",
    "not_in": "not in",
    "contains": "contains",
    "startswith": "startswith",
    "endswith": "endswith",
    "matches": "matches",
}
_LITERALS: dict[str, Callable[[str], Any]] = {
    "int_": decode_int,
    "float_": decode_float,
    "size": decode_size,
    "duration": decode_duration,
    "string": decode_string,
    "true": lambda _: True,
    "false": lambda _: False,
    "null": lambda _: None,
}


class _Fail(Exception):  # noqa: N818 -- internal signal, never escapes
    def __init__(self, tree: Tree[Token], message: str) -> None:
        super().__init__(message)
        self.tree, self.message = tree, message


def _span(tree: Tree[Token]) -> Node:
    # failure_message only needs a span to quote the source.
    return Node(start=tree.meta.start_pos, end=tree.meta.end_pos)


def _operands(tree: Tree[Token]) -> list[Tree[Token]]:
    return [c for c in tree.children if isinstance(c, Tree)]


class _Walker(Interpreter[Token, Any]):
    """One method per grammar rule (lark's idiom); ``ctx`` is the context of this walk."""

    def __init__(self, expr: Expr, ctx: Mapping[str, Any]) -> None:
        self.expr, self.ctx = expr, ctx

    def apply(self, tree: Tree[Token], fn: Callable[..., Any], what: str) -> Any:
        operands = _operands(tree)
        values = tuple(self.visit(t) for t in operands)
        try:
            return fn(*values)
        except OP_ERRORS as exc:
            pairs = tuple((_span(t), v) for t, v in zip(operands, values, strict=True))
            raise _Fail(tree, failure_message(self.expr, _span(tree), pairs, exc, what)) from None

    def boolean(self, tree: Tree[Token], what: str) -> bool:
        value = self.visit(tree)
        if value is True or value is False:
            return value
        raise _Fail(tree, f"{what} needs a bool, got {kind_of(value)}")

    def __default__(self, tree: Tree[Token]) -> Any:
        if tree.data in _LITERALS:
            return _LITERALS[tree.data](str(tree.children[0]))
        op = _BINARY[tree.data]
        return self.apply(tree, ops.BINARY[op], f"'{op}'")

    def name(self, tree: Tree[Token]) -> Any:
        key = str(tree.children[0])
        if key not in self.ctx:
            raise _Fail(tree, f"no value for {key}")
        return self.ctx[key]

    def and_(self, tree: Tree[Token]) -> bool:
        left, right = _operands(tree)
        return self.boolean(left, "'and'") and self.boolean(right, "'and'")

    def or_(self, tree: Tree[Token]) -> bool:
        left, right = _operands(tree)
        return self.boolean(left, "'or'") or self.boolean(right, "'or'")

    def not_(self, tree: Tree[Token]) -> bool:
        return not self.boolean(_operands(tree)[0], "'not'")

    def neg(self, tree: Tree[Token]) -> Any:
        return self.apply(tree, ops.neg, "'-'")

    def paren(self, tree: Tree[Token]) -> Any:
        return self.visit(_operands(tree)[0])

    def coalesce(self, tree: Tree[Token]) -> Any:
        left, right = _operands(tree)
        value = self.visit(left)
        return self.visit(right) if value is None else value

    def conditional(self, tree: Tree[Token]) -> Any:
        then, cond, orelse = _operands(tree)
        return self.visit(then if self.boolean(cond, "the condition") else orelse)

    def list_(self, tree: Tree[Token]) -> list[Any]:
        return [self.visit(item) for item in _operands(tree)]

    def call(self, tree: Tree[Token]) -> Any:
        name = str(tree.children[0])
        func = FUNCTIONS.get(name)
        if func is None:
            raise _Fail(tree, f"unknown function {name}()")
        return self.apply(tree, func.impl, f"{name}()")


class TreeInterpreter:
    """Evaluates an expression by walking its lark tree (slow; for tests and benchmarks)."""

    def __init__(self, expr: Expr) -> None:
        self.expr = expr
        self.tree: Tree[Token] = tree_parser().parse(expr.text)

    def __call__(self, context: Mapping[str, Any]) -> Any:
        try:
            return _Walker(self.expr, context).visit(self.tree)
        except _Fail as fail:
            meta = fail.tree.meta
            start, end = self.expr.locate(meta.start_pos), self.expr.locate(meta.end_pos)
            raise EvalError(
                Diagnostic(
                    "expr.eval",
                    f"{fail.message} (in `{self.expr.text}`)",
                    Location(start.file, start.line, start.col, end.line, end.col),
                    details={"expression": self.expr.text},
                )
            ) from None


def interpret(expr: Expr, context: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` once by walking its parse tree (see :class:`TreeInterpreter`)."""
    return TreeInterpreter(expr)(context)
