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

from ..errors import Diagnostic, EvalError, Location
from . import ops
from .compile import failure_message
from .functions import FUNCTIONS
from .nodes import Expr, Node
from .ops import OpError, kind_of
from .parser import (
    decode_duration,
    decode_float,
    decode_int,
    decode_size,
    decode_string,
    tree_parser,
)

_OP_ERRORS = (TypeError, ValueError, OpError, OverflowError, ZeroDivisionError)

_BINARY = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "in_": "in", "not_in": "not in", "contains": "contains", "startswith": "startswith",
    "endswith": "endswith", "matches": "matches",
}
_LITERALS: dict[str, Callable[[str], Any]] = {
    "int_": decode_int, "float_": decode_float, "size": decode_size,
    "duration": decode_duration, "string": decode_string,
    "true": lambda _: True, "false": lambda _: False, "null": lambda _: None,
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


class TreeInterpreter:
    """Evaluates an expression by walking its lark tree (slow; for tests and benchmarks)."""

    def __init__(self, expr: Expr) -> None:
        self.expr = expr
        self.tree: Tree[Token] = tree_parser().parse(expr.text)

    def __call__(self, context: Mapping[str, Any]) -> Any:
        try:
            return self.eval(self.tree, context)
        except _Fail as fail:
            meta = fail.tree.meta
            start, end = self.expr.locate(meta.start_pos), self.expr.locate(meta.end_pos)
            raise EvalError(Diagnostic(
                "expr.eval", f"{fail.message} (in `{self.expr.text}`)",
                Location(start.file, start.line, start.col, end.line, end.col),
                details={"expression": self.expr.text},
            )) from None

    def bool_of(self, tree: Tree[Token], ctx: Mapping[str, Any], what: str) -> bool:
        value = self.eval(tree, ctx)
        if value is True or value is False:
            return value
        raise _Fail(tree, f"{what} needs a bool, got {kind_of(value)}")

    def eval(self, tree: Tree[Token], ctx: Mapping[str, Any]) -> Any:
        rule = tree.data
        if rule in _LITERALS:
            return _LITERALS[rule](str(tree.children[0]))
        if rule == "name":
            key = str(tree.children[0])
            if key not in ctx:
                raise _Fail(tree, f"no value for {key}")
            return ctx[key]
        operands = _operands(tree)
        if rule in _BINARY:
            a, b = self.eval(operands[0], ctx), self.eval(operands[1], ctx)
            return self.apply(tree, ops.BINARY[_BINARY[rule]], (a, b), operands,
                              f"'{_BINARY[rule]}'")
        if rule == "and_":
            if not self.bool_of(operands[0], ctx, "'and'"):
                return False
            return self.bool_of(operands[1], ctx, "'and'")
        if rule == "or_":
            if self.bool_of(operands[0], ctx, "'or'"):
                return True
            return self.bool_of(operands[1], ctx, "'or'")
        if rule == "not_":
            return not self.bool_of(operands[0], ctx, "'not'")
        if rule == "neg":
            return self.apply(tree, ops.neg, (self.eval(operands[0], ctx),), operands, "'-'")
        if rule == "paren":
            return self.eval(operands[0], ctx)
        if rule == "coalesce":
            value = self.eval(operands[0], ctx)
            return self.eval(operands[1], ctx) if value is None else value
        if rule == "conditional":
            then, cond, orelse = operands
            return self.eval(then if self.bool_of(cond, ctx, "the condition") else orelse, ctx)
        if rule == "list_":
            return [self.eval(item, ctx) for item in operands]
        if rule == "call":
            name = str(tree.children[0])
            func = FUNCTIONS.get(name)
            if func is None:
                raise _Fail(tree, f"unknown function {name}()")
            values = tuple(self.eval(arg, ctx) for arg in operands)
            return self.apply(tree, func.impl, values, operands, f"{name}()")
        raise AssertionError(f"no rule {rule!r}")

    def apply(self, tree: Tree[Token], fn: Callable[..., Any], values: tuple[Any, ...],
              operands: list[Tree[Token]], what: str) -> Any:
        try:
            return fn(*values)
        except _OP_ERRORS as exc:
            node = _span(tree)
            pairs = tuple((_span(t), v) for t, v in zip(operands, values, strict=True))
            raise _Fail(tree, failure_message(self.expr, node, pairs, exc, what)) from None


def interpret(expr: Expr, context: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` once by walking its parse tree (see :class:`TreeInterpreter`)."""
    return TreeInterpreter(expr)(context)
