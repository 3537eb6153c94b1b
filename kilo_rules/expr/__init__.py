"""The policy expression language: parse → check → compile → evaluate.

>>> from kilo_rules.expr import INT, compile_source, default_vocabulary
>>> usable = compile_source(
...     "model.limits.input ?? model.limits.context - 20_000",
...     expected=INT, vocab=default_vocabulary())
>>> usable({"model.limits.input": None, "model.limits.context": 200_000})
180000

See ``docs/expressions.md`` for the language itself.
"""

from __future__ import annotations

from typing import Any

from ..errors import Diagnostic, EvalError, ExprError
from .check import check, infer
from .compile import NO_FALLBACK, CompiledExpr, compile_expr
from .functions import FUNCTIONS, Function
from .interpret import TreeInterpreter, interpret
from .nodes import LIMITS, Expr, Limits, Locate, text_locate
from .parser import GRAMMAR_ERRORS, parse
from .types import (
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
from .vocabulary import (
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
