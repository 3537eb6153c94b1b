"""Every expression of a policy: found, parsed, type-checked and compiled, with locations.

Besides the built-in vocabulary (``model.*``, ``session.*``, ...), an expression may read
the values the policy itself defines, by their dotted path: ``budget.usable``,
``output.configured``, ``overflow.threshold_percent``. Definitions are ordered by what they
read; a cycle is an error located at the reference that closes it. Override conditions are
decided once per model, so they may read only ``model.*`` and ``config.*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import Diagnostic, ExprError, KiloRulesError, Location, did_you_mean
from .expr import (
    BOOL,
    INT,
    NUMBER,
    STR,
    CompiledExpr,
    Expr,
    Type,
    Vocabulary,
    default_vocabulary,
    infer,
    nullable,
    order_definitions,
    parse,
)
from .expr.compile import compile_expr
from .expr.types import type_of_value
from .load import JsonPath, lookup
from .policy import expression_fields, expression_kind
from .resolve import ResolvedPolicy, policy_bodies

KIND_TYPES: dict[str, Type] = {
    "int": INT,
    "number": NUMBER,
    "number?": nullable(NUMBER),
    "bool": BOOL,
    "str": STR,
}

#: Sections whose scalar fields become readable names (``budget.usable``).
VALUE_SECTIONS = (
    "tokens",
    "output",
    "budget",
    "overflow",
    "payload",
    "prune",
    "compaction",
    "tool_output",
    "cache",
    "system",
    "environment",
    "reminders",
    "lowering",
)
#: Names that are only decided per model (override conditions).
MODEL_ONLY_PREFIXES = ("model.", "config.")


def value_leaves(body: dict[str, Any]) -> Iterator[tuple[str, JsonPath, Any]]:
    """(dotted name, path, value) of every scalar a policy defines in a value section."""
    stack: list[tuple[JsonPath, Any]] = [((k,), body[k]) for k in VALUE_SECTIONS if k in body]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in value.items() if str(k).isidentifier())
        elif not isinstance(value, list):
            yield ".".join(str(p) for p in path), path, value


@dataclass
class PolicyExpressions:
    """The compiled expressions of one policy, keyed by path in the merged document."""

    vocabulary: Vocabulary
    compiled: dict[JsonPath, CompiledExpr]
    kinds: dict[JsonPath, str]
    order: list[str]  # value names in evaluation order
    warnings: list[Diagnostic]


def policy_vocabulary(policy: ResolvedPolicy, kinds: dict[JsonPath, str]) -> Vocabulary:
    """The built-in vocabulary plus the names this policy defines, with their types."""
    types: dict[str, Type] = {}
    for prefix, body in policy_bodies(policy.data):
        for name, path, value in value_leaves(body):
            kind = kinds.get((*prefix, *path))
            t = KIND_TYPES[kind] if kind else type_of_value(value)
            if value is None:
                field_kind = expression_kind(path)
                t = nullable(KIND_TYPES[field_kind]) if field_kind else t
            prev = types.get(name)
            if prev is None:
                types[name] = t
            elif prev != t:
                merged = prev.kinds | t.kinds
                types[name] = Type(frozenset(merged), prev.elem or t.elem)
    base = default_vocabulary()
    return base.extended({k: v for k, v in types.items() if k not in base})


def compile_policy_expressions(policy: ResolvedPolicy) -> PolicyExpressions:
    """Parse, check and compile every expression of ``policy`` (base and overrides).

    Raises :class:`ExprError` with every diagnostic found."""
    fields = expression_fields(policy.data)
    kinds = dict(fields)
    vocab = policy_vocabulary(policy, kinds)
    diags: list[Diagnostic] = []
    parsed: dict[JsonPath, Expr] = {}
    compiled: dict[JsonPath, CompiledExpr] = {}
    for path, kind in fields:
        text = lookup(policy.data, path)
        try:
            expr = parse(text, locate=_scalar_locator(policy, path))
        except ExprError as exc:
            diags.extend(exc.diagnostics)
            continue
        result, problems = infer(expr, vocab, KIND_TYPES[kind])
        if problems:
            diags.extend(problems)
            continue
        parsed[path] = expr
        compiled[path] = compile_expr(expr, result_type=result)
        if path[0] == "overrides" and path[-1] == "when" and len(path) == 3:
            for name, loc in _names(expr):
                if not name.startswith(MODEL_ONLY_PREFIXES):
                    diags.append(
                        Diagnostic(
                            "expr.override-scope",
                            f"an override condition may only read model.* and config.*, not {name}",
                            loc,
                            hint="overrides are chosen once per model, before any session",
                        )
                    )
    warnings = [w for expr in parsed.values() for w in literal_diagnostics(expr)]
    order: list[str] = []
    for prefix, defs in _definitions(parsed).items():
        try:
            ordered = order_definitions(defs)
        except ExprError as exc:
            diags.extend(exc.diagnostics)
            continue
        if prefix == ():
            order = ordered
    if diags:
        raise ExprError([*diags, *warnings])
    return PolicyExpressions(vocab, compiled, kinds, order, warnings)


def literal_diagnostics(expr: Expr) -> list[Diagnostic]:
    """Warnings for string literals compared with ``model.provider`` or ``model.api`` that
    no known provider or wire format has (a typo makes a rule silently never match)."""
    from typing import get_args

    from .catalog import PROVIDERS, WireApi
    from .expr.nodes import Binary, ListExpr, Literal, Name, walk

    known = {"model.provider": tuple(PROVIDERS), "model.api": tuple(get_args(WireApi))}
    out: list[Diagnostic] = []
    for node in walk(expr.root):
        if not isinstance(node, Binary) or node.op not in ("==", "!=", "in", "not in"):
            continue
        sides = [(node.left, node.right), (node.right, node.left)]
        for name_side, value_side in sides:
            if not (isinstance(name_side, Name) and name_side.name in known):
                continue
            values = value_side.items if isinstance(value_side, ListExpr) else (value_side,)
            for v in values:
                if isinstance(v, Literal) and isinstance(v.value, str):
                    options = known[name_side.name]
                    if v.value not in options:
                        guess = did_you_mean(v.value, options)
                        out.append(
                            Diagnostic(
                                "expr.unknown-provider",
                                f"{v.value!r} is not a known value of {name_side.name}",
                                expr.location(v),
                                hint=f"did you mean {guess!r}?"
                                if guess
                                else f"known: {', '.join(options)}",
                                severity="warning",
                            )
                        )
    return out


def _scalar_locator(policy: ResolvedPolicy, path: JsonPath) -> Callable[[int], Location]:
    def locate(offset: int) -> Location:
        return policy.locate_in_scalar(path, offset)

    return locate


def _names(expr: Expr) -> list[tuple[str, Any]]:
    from .expr import free_names

    return free_names(expr)


def _definitions(parsed: dict[JsonPath, Expr]) -> dict[JsonPath, dict[str, Expr]]:
    """Per body (base, each override), value name → expression, for cycle detection."""
    out: dict[JsonPath, dict[str, Expr]] = {}
    for path, expr in parsed.items():
        prefix: JsonPath = path[:3] if path[0] == "overrides" else ()
        rest = path[len(prefix) :]
        if rest and rest[0] in VALUE_SECTIONS and all(isinstance(p, str) for p in rest):
            out.setdefault(prefix, {})[".".join(str(p) for p in rest)] = expr
    base = out.get((), {})
    # An override's definitions are checked together with the base ones they replace.
    for prefix, defs in list(out.items()):
        if prefix:
            out[prefix] = {**base, **defs}
    return out


def expression_diagnostics(policy: ResolvedPolicy) -> list[Diagnostic]:
    """Hook for ``kilo-rules check``: every expression problem of a policy."""
    try:
        return compile_policy_expressions(policy).warnings
    except KiloRulesError as exc:
        return exc.diagnostics
