"""Static checking: names against the vocabulary, operand and argument types, regexes.

The checker infers a type for every node and collects located diagnostics instead of
stopping at the first one; a node with an error gets the type ``any`` so that one mistake
is reported once. Null safety is flow-sensitive for names: after ``x != null`` (in the
``then`` branch of a conditional, or on the right of ``and``) ``x`` counts as non-null.
"""

from __future__ import annotations

from collections.abc import Callable

from kilo_rules.engine.base.errors import Diagnostic, ExprError, did_you_mean
from kilo_rules.engine.frontend.expr.functions import FUNCTIONS, ArgTypeError
from kilo_rules.engine.frontend.expr.nodes import (
    LIMITS,
    Binary,
    Call,
    Conditional,
    Expr,
    ListExpr,
    Literal,
    Name,
    Node,
    Unary,
)
from kilo_rules.engine.frontend.expr.ops import regex_problem
from kilo_rules.engine.frontend.expr.types import (
    ANY,
    BOOL,
    FLOAT,
    INT,
    NEVER,
    NULL,
    NUMBER,
    STR,
    Type,
    assignable,
    comparable,
    join,
    list_of,
    type_of_value,
)
from kilo_rules.engine.frontend.expr.vocabulary import Vocabulary

_ARITHMETIC = frozenset({"+", "-", "*", "/", "//", "%"})
_ORDERING = frozenset({"<", "<=", ">", ">="})
_STRING_OPS = frozenset({"startswith", "endswith", "matches"})

_Facts = frozenset[str]


def _names_known_non_null(node: Node, truth: bool) -> _Facts:
    """Names that cannot be null when ``node`` evaluates to ``truth``."""
    if isinstance(node, Unary) and node.op == "not":
        return _names_known_non_null(node.operand, not truth)
    if not isinstance(node, Binary):
        return frozenset()
    if node.op in ("==", "!="):
        if (node.op == "!=") != truth:
            return frozenset()
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if isinstance(a, Name) and isinstance(b, Literal) and b.value is None:
                return frozenset({a.name})
        return frozenset()
    if (node.op == "and" and truth) or (node.op == "or" and not truth):
        return _names_known_non_null(node.left, truth) | _names_known_non_null(node.right, truth)
    return frozenset()


class _Checker:
    def __init__(self, expr: Expr, vocab: Vocabulary) -> None:
        self.expr, self.vocab = expr, vocab
        self.diagnostics: list[Diagnostic] = []

    def error(self, code: str, node: Node, message: str, hint: str | None = None) -> Type:
        if len(self.diagnostics) < LIMITS.max_diagnostics:
            self.diagnostics.append(
                Diagnostic(
                    code,
                    message,
                    self.expr.location(node),
                    hint=hint,
                    details={"expression": self.expr.text},
                )
            )
        return ANY

    def src(self, node: Node) -> str:
        text = self.expr.source(node)
        return text if len(text) <= 40 else text[:37] + "..."

    def visit(self, node: Node, facts: _Facts) -> Type:
        method: Callable[[_Checker, Node, _Facts], Type] = _VISIT[type(node)]
        return method(self, node, facts)

    # A value used where null is not allowed: the most common mistake, so a precise hint.
    def need(
        self, node: Node, t: Type, ok: Callable[[Type], bool], wanted: str, context: str
    ) -> bool:
        if t.is_any:
            return True
        if t.nullable and t.non_null().kinds and ok(t.non_null()):
            shown = self.src(node)
            self.error(
                "expr.type",
                node,
                f"{shown} may be null; {context} needs {wanted}",
                hint=f"give a default with `{shown} ?? ...`, or test `{shown} != null` first",
            )
            return False
        if not ok(t):
            self.error("expr.type", node, f"{context} needs {wanted}, but {self.src(node)} is {t}")
            return False
        return True

    def need_both(
        self,
        node: Binary,
        left: Type,
        right: Type,
        ok: Callable[[Type], bool],
        wanted: str,
        context: str,
    ) -> bool:
        """:meth:`need` for both operands, reporting each one that fails."""
        left_ok = self.need(node.left, left, ok, wanted, context)
        right_ok = self.need(node.right, right, ok, wanted, context)
        return left_ok and right_ok

    def literal(self, node: Literal, facts: _Facts) -> Type:
        return type_of_value(node.value)

    def name(self, node: Name, facts: _Facts) -> Type:
        t = self.vocab.get(node.name)
        if t is not None:
            return t.non_null() if node.name in facts else t
        if self.vocab.is_group(node.name):
            members = self.vocab.members(node.name)
            shown = ", ".join(members[:6]) + (", ..." if len(members) > 6 else "")
            return self.error(
                "expr.unknown-name",
                node,
                f"{node.name} is a group of names, not a value",
                hint=f"use one of {shown}",
            )
        suggestion = self.vocab.suggest(node.name)
        return self.error(
            "expr.unknown-name",
            node,
            f"unknown name {node.name}",
            hint=f"did you mean {suggestion}?" if suggestion else None,
        )

    def list_(self, node: ListExpr, facts: _Facts) -> Type:
        elem: Type = NEVER
        for item in node.items:
            t = self.visit(item, facts)
            joined = join(elem, t)
            if joined is None:
                self.error(
                    "expr.type",
                    item,
                    f"list items must all have one type, but "
                    f"{self.src(item)} is {t} and earlier items "
                    f"are {elem}",
                )
                joined = ANY
            elem = joined
        return list_of(elem)

    def unary(self, node: Unary, facts: _Facts) -> Type:
        t = self.visit(node.operand, facts)
        if node.op == "not":
            self.need(node.operand, t, lambda t: t == BOOL, "a bool", "'not'")
            return BOOL
        if not self.need(node.operand, t, Type.is_numeric, "a number", "'-'"):
            return ANY
        return t

    def binary(self, node: Binary, facts: _Facts) -> Type:
        op = node.op
        left = self.visit(node.left, facts)
        if op in ("and", "or"):
            more = _names_known_non_null(node.left, op == "and")
            right = self.visit(node.right, facts | more)
            for side, t in ((node.left, left), (node.right, right)):
                self.need(side, t, lambda t: t == BOOL, "a bool", f"'{op}'")
            return BOOL
        right = self.visit(node.right, facts)
        if op == "??":
            result = join(left.non_null(), right)
            if result is None:
                return self.error(
                    "expr.type",
                    node,
                    f"both sides of '??' must have one type, but they are {left} and {right}",
                )
            return right if left == NULL else result
        if op in ("==", "!="):
            if not comparable(left, right):
                return self.error(
                    "expr.type",
                    node,
                    f"{self.src(node.left)} ({left}) and "
                    f"{self.src(node.right)} ({right}) can "
                    f"never be equal",
                )
            return BOOL
        if op in _ARITHMETIC:
            return self.arithmetic(node, left, right)
        if op in _ORDERING:
            return self.ordering(node, left, right)
        if op in _STRING_OPS:
            ok = self.need_both(node, left, right, lambda t: t == STR, "a string", f"'{op}'")
            if ok and op == "matches":
                self.regex(node.right)
            return BOOL
        return self.membership(node, left, right)

    def arithmetic(self, node: Binary, left: Type, right: Type) -> Type:
        op = node.op
        if op == "+" and STR in (left.non_null(), right.non_null()):
            ok = self.need_both(node, left, right, lambda t: t == STR, "a string", "'+' on strings")
            return STR if ok else ANY
        ok = self.need_both(node, left, right, Type.is_numeric, "a number", f"'{op}'")
        if not ok or left.is_any or right.is_any:
            return ANY
        # Python's arithmetic: int op int is an int (except /), a float operand makes a float.
        if op == "/" or FLOAT in (left, right):
            return FLOAT
        return INT if left == INT and right == INT else NUMBER

    def ordering(self, node: Binary, left: Type, right: Type) -> Type:
        ok = self.need_both(
            node,
            left,
            right,
            lambda t: t.is_numeric() or t == STR,
            "a number or a string",
            f"'{node.op}'",
        )
        if ok and not (left.is_any or right.is_any) and (left == STR) != (right == STR):
            self.error("expr.type", node, f"cannot compare {left} with {right} using '{node.op}'")
        return BOOL

    def membership(self, node: Binary, left: Type, right: Type) -> Type:
        # `a contains b` is `b in a`: normalise to (item, container).
        item, container = (
            (node.right, node.left) if node.op == "contains" else (node.left, node.right)
        )
        item_t, container_t = (right, left) if node.op == "contains" else (left, right)
        ok = self.need(
            container,
            container_t,
            lambda t: t == STR or t.is_kind("list"),
            "a string or a list",
            f"'{node.op}'",
        )
        if not ok or container_t.is_any:
            return BOOL
        if container_t == STR:
            self.need(item, item_t, lambda t: t == STR, "a string", f"'{node.op}' on a string")
        elif not comparable(item_t, container_t.elem or NEVER):
            self.error(
                "expr.type", node, f"{self.src(item)} ({item_t}) can never be in a {container_t}"
            )
        return BOOL

    def regex(self, node: Node) -> None:
        if isinstance(node, Literal) and isinstance(node.value, str):
            problem = regex_problem(node.value)
            if problem:
                self.error("expr.regex", node, problem)

    def conditional(self, node: Conditional, facts: _Facts) -> Type:
        cond = self.visit(node.cond, facts)
        self.need(node.cond, cond, lambda t: t == BOOL, "a bool", "the condition")
        then = self.visit(node.then, facts | _names_known_non_null(node.cond, True))
        orelse = self.visit(node.orelse, facts | _names_known_non_null(node.cond, False))
        result = join(then, orelse)
        if result is None:
            return self.error(
                "expr.type",
                node,
                f"both branches must have one type, but they are {then} and {orelse}",
            )
        return result

    def call(self, node: Call, facts: _Facts) -> Type:
        args = [self.visit(arg, facts) for arg in node.args]
        func = FUNCTIONS.get(node.func)
        if func is None:
            suggestion = did_you_mean(node.func, FUNCTIONS)
            return self.error(
                "expr.unknown-function",
                node,
                f"unknown function {node.func}()",
                hint=f"did you mean {suggestion}()?"
                if suggestion
                else "functions: " + ", ".join(sorted(FUNCTIONS)),
            )
        count = len(args)
        if count < func.min_args or (func.max_args is not None and count > func.max_args):
            return self.error(
                "expr.arity",
                node,
                f"{func.name}() takes {func.arity_text()}, got {count}",
                hint=func.signature,
            )
        if node.func == "regex_match" and count == 2:
            self.regex(node.args[1])
        try:
            return func.result(args)
        except ArgTypeError as exc:
            target = node.args[exc.index] if exc.index is not None else node
            return self.error(
                "expr.type", target, f"{func.name}(): {exc.message}", hint=func.signature
            )


_VISIT: dict[type, Callable[[_Checker, Node, _Facts], Type]] = {
    Literal: _Checker.literal,  # type: ignore[dict-item]
    Name: _Checker.name,  # type: ignore[dict-item]
    ListExpr: _Checker.list_,  # type: ignore[dict-item]
    Unary: _Checker.unary,  # type: ignore[dict-item]
    Binary: _Checker.binary,  # type: ignore[dict-item]
    Conditional: _Checker.conditional,  # type: ignore[dict-item]
    Call: _Checker.call,  # type: ignore[dict-item]
}


def infer(
    expr: Expr, vocab: Vocabulary, expected: Type | None = None
) -> tuple[Type, list[Diagnostic]]:
    """The type of ``expr`` and every problem found, best first."""
    checker = _Checker(expr, vocab)
    result = checker.visit(expr.root, frozenset())
    if expected is not None and not assignable(result, expected):
        root = expr.root
        if result.nullable and assignable(result.non_null(), expected):
            shown = checker.src(root)
            checker.error(
                "expr.type",
                root,
                f"this expression may be null, but {expected} is required here",
                hint=f"give a default with `{shown} ?? ...`",
            )
        else:
            hint = None
            if expected == INT and result.is_numeric():
                hint = "use floor(), ceil(), round() or int() to get a whole number"
            checker.error(
                "expr.type",
                root,
                f"expected {expected}, but this expression is {result}",
                hint=hint,
            )
    return result, sorted(checker.diagnostics, key=Diagnostic.sort_key)


def check(expr: Expr, vocab: Vocabulary, *, expected: Type | None = None) -> list[Diagnostic]:
    """Every problem in ``expr`` against ``vocab`` (and the ``expected`` result type)."""
    return infer(expr, vocab, expected)[1]


def check_or_raise(expr: Expr, vocab: Vocabulary, *, expected: Type | None = None) -> Type:
    """The type of ``expr``; raises :class:`ExprError` with all diagnostics if any."""
    result, diagnostics = infer(expr, vocab, expected)
    if diagnostics:
        raise ExprError(diagnostics)
    return result
