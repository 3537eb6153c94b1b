"""The policy expression language: parse → check → compile → evaluate.

>>> from kilo_rules.engine.frontend.expr import INT, compile_source, default_vocabulary
>>> usable = compile_source(
...     "model.limits.input ?? model.limits.context - 20_000",
...     expected=INT, vocab=default_vocabulary())
>>> usable({"model.limits.input": None, "model.limits.context": 200_000})
180000

See ``docs/expressions.md`` for the language itself.
"""

from __future__ import annotations

from typing import Any

from kilo_rules.engine.base.errors import Diagnostic, EvalError, ExprError
from kilo_rules.engine.frontend.expr.check import check, infer
from kilo_rules.engine.frontend.expr.compile import NO_FALLBACK, CompiledExpr, compile_expr
from kilo_rules.engine.frontend.expr.functions import FUNCTIONS, Function
from kilo_rules.engine.frontend.expr.interpret import TreeInterpreter, interpret
from kilo_rules.engine.frontend.expr.nodes import LIMITS, Expr, Limits, Locate, text_locate
from kilo_rules.engine.frontend.expr.parser import GRAMMAR_ERRORS, parse
from kilo_rules.engine.frontend.expr.types import (
    BOOL,
    FLOAT,
    INT,
    NULL,
    NUMBER,
    STR,
    Type,
    assignable,
    list_of,
    nullable,
    type_of_value,
)
from kilo_rules.engine.frontend.expr.vocabulary import (
    Vocabulary,
    default_vocabulary,
    free_names,
    model_values,
    order_definitions,
)


def compile_source(
    text: str,
    *,
    expected: Type,
    vocab: Vocabulary,
    locate: Locate | None = None,
    fallback: Any = NO_FALLBACK,
) -> CompiledExpr:
    """Parse, check and compile ``text`` in one go.

    Raises :class:`ExprError` carrying every diagnostic found (syntax, names, types,
    regexes, limits, constant sub-expressions that always fail). ``fallback``, when given,
    must itself be a value of the ``expected`` type.
    """
    expr = parse(text, locate=locate)
    result, diagnostics = infer(expr, vocab, expected)
    if fallback is not NO_FALLBACK and not assignable(type_of_value(fallback), expected):
        diagnostics.append(
            Diagnostic(
                "expr.type", f"the fallback {fallback!r} is not a {expected}", expr.location()
            )
        )
    if diagnostics:
        raise ExprError(diagnostics)
    return compile_expr(expr, fallback=fallback, result_type=result)


__all__ = [
    "BOOL",
    "FLOAT",
    "FUNCTIONS",
    "GRAMMAR_ERRORS",
    "INT",
    "LIMITS",
    "NO_FALLBACK",
    "NULL",
    "NUMBER",
    "STR",
    "CompiledExpr",
    "EvalError",
    "Expr",
    "ExprError",
    "Function",
    "Limits",
    "Locate",
    "TreeInterpreter",
    "Type",
    "Vocabulary",
    "check",
    "compile_expr",
    "compile_source",
    "default_vocabulary",
    "free_names",
    "infer",
    "interpret",
    "list_of",
    "model_values",
    "nullable",
    "order_definitions",
    "parse",
    "text_locate",
]
