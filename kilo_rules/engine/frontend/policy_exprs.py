"""Every expression of a policy: found, parsed, type-checked and compiled, with locations.

Besides the built-in vocabulary (``model.*``, ``session.*``, ...), an expression may read
the values the policy itself defines, by their dotted path: ``budget.usable``,
``output.configured``, ``overflow.threshold_percent``. Definitions are ordered by what they
read; a cycle is an error located at the reference that closes it. Override conditions are
decided once per model, so they may read only ``model.*`` and ``config.*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeGuard

from kilo_rules.engine.base.errors import (
    Diagnostic,
    ExprError,
    KiloRulesError,
    Location,
    did_you_mean,
)
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.formats.load import JsonPath, lookup
from kilo_rules.engine.formats.policy import expression_fields, expression_kind
from kilo_rules.engine.frontend.expr import (
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
from kilo_rules.engine.frontend.expr.compile import compile_expr
from kilo_rules.engine.frontend.expr.nodes import Binary, ListExpr, Literal, Name, Node, walk
from kilo_rules.engine.frontend.expr.parser import DEFAULT_TREES, tree_cache
from kilo_rules.engine.frontend.expr.types import type_of_value
from kilo_rules.engine.frontend.expr.vocabulary import name_nodes
from kilo_rules.engine.frontend.resolve import ResolvedPolicy, locate_in_document, policy_bodies

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


def policy_vocabulary(
    policy: ResolvedPolicy, kinds: dict[JsonPath, str], caches: ExpressionCaches | None = None
) -> Vocabulary:
    """The built-in vocabulary plus the names this policy defines, with their types
    (``caches``: whose vocabularies to share, default :data:`DEFAULT_EXPRESSION_CACHES`)."""
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
    extra = tuple(sorted((k, v) for k, v in types.items() if k not in base))
    cache = (DEFAULT_EXPRESSION_CACHES if caches is None else caches).vocabularies
    return cache.get_or(extra, lambda: base.extended(dict(extra)))


@dataclass(frozen=True, slots=True)
class _Parsed:
    """One expression as written in one document: its tree, the names it reads and its
    literal warnings, none of which depends on the policy that inherits it."""

    expr: Expr
    names: tuple[str, ...]
    warnings: tuple[Diagnostic, ...]


#: (file, file text, path in the file, expression text): what a parse depends on.
_SourceKey = tuple[str, str, JsonPath, str]
_CompiledKey = tuple[_SourceKey, str, tuple[tuple[str, Type | None], ...]]


class ExpressionCaches:
    """The bounded caches of policy expressions, all keyed by content: syntax trees by
    text, parses by source (file, its text, path, expression), compilations by source,
    field kind and the types of the names read, and vocabularies by the names a policy
    adds. A hundred policies extending one base parse and compile its expressions once.

    A :class:`kilo_rules.engine.compiler.compile.Compiler` owns one; thread-safe (each cache holds a
    lock).
    """

    def __init__(self, *, trees: LRUCache[str, Node] | None = None) -> None:
        self.trees: LRUCache[str, Node] = tree_cache() if trees is None else trees
        self.parsed: LRUCache[_SourceKey, _Parsed | ExprError] = LRUCache(4096)
        self.compiled: LRUCache[_CompiledKey, CompiledExpr] = LRUCache(4096)
        # Policies extending one base mostly define the same names with the same types.
        self.vocabularies: LRUCache[tuple[tuple[str, Type], ...], Vocabulary] = LRUCache(256)

    def caches(self) -> dict[str, LRUCache[Any, Any]]:
        """Each cache by name (for statistics and :meth:`clear`)."""
        return {
            "trees": self.trees,
            "parsed": self.parsed,
            "compiled": self.compiled,
            "vocabularies": self.vocabularies,
        }

    def clear(self) -> None:
        """Forget every entry."""
        for c in self.caches().values():
            c.clear()


#: What calls that name no caches share (the default compiler's, and :func:`parse`'s).
DEFAULT_EXPRESSION_CACHES = ExpressionCaches(trees=DEFAULT_TREES)


def _parse_once(
    key: _SourceKey | None,
    text: str,
    locate: Callable[[int], Location],
    caches: ExpressionCaches,
) -> _Parsed:
    """The parse of ``text`` (raises :class:`ExprError`), shared by source when ``key``."""

    def make() -> _Parsed | ExprError:
        try:
            expr = parse(text, locate=locate, trees=caches.trees)
        except ExprError as exc:
            return exc
        names = tuple(n.name for n in name_nodes(expr))
        return _Parsed(expr, names, tuple(literal_diagnostics(expr)))

    got = make() if key is None else caches.parsed.get_or(key, make)
    if isinstance(got, ExprError):
        raise ExprError(got.diagnostics)
    return got


def compile_policy_expressions(
    policy: ResolvedPolicy, caches: ExpressionCaches | None = None
) -> PolicyExpressions:
    """Parse, check and compile every expression of ``policy`` (base and overrides).

    ``caches`` holds the parses and compilations to share (default
    :data:`DEFAULT_EXPRESSION_CACHES`). Raises :class:`ExprError` with every diagnostic
    found."""
    exprs = DEFAULT_EXPRESSION_CACHES if caches is None else caches
    fields = expression_fields(policy.data)
    kinds = dict(fields)
    vocab = policy_vocabulary(policy, kinds, exprs)
    diags: list[Diagnostic] = []
    parsed: dict[JsonPath, Expr] = {}
    compiled: dict[JsonPath, CompiledExpr] = {}
    warnings: list[Diagnostic] = []
    for path, kind in fields:
        text = lookup(policy.data, path)
        origin = policy.origin.get(path)
        key: _SourceKey | None = None
        if origin is None:
            locate = _scalar_locator(policy, path)
        else:
            doc, dpath = origin
            key = (doc.file, doc.text, dpath, text)
            locate = partial(locate_in_document, doc, dpath, caches=policy.caches)
        try:
            got = _parse_once(key, text, locate, exprs)
        except ExprError as exc:
            diags.extend(exc.diagnostics)
            continue
        expr = got.expr
        types = tuple((name, vocab.get(name)) for name in got.names)
        ckey = None if key is None else (key, kind, types)
        hit = None if ckey is None else exprs.compiled.get(ckey)
        if hit is None:
            result, problems = infer(expr, vocab, KIND_TYPES[kind])
            if problems:
                # Not cached: a problem's hint may name any word of the vocabulary.
                diags.extend(problems)
                continue
            hit = compile_expr(expr, result_type=result)
            if ckey is not None:
                exprs.compiled.put(ckey, hit)
        parsed[path] = expr
        compiled[path] = hit
        warnings.extend(got.warnings)
        if path[0] == "overrides" and path[-1] == "when" and len(path) == 3:
            for node in name_nodes(expr):
                if not node.name.startswith(MODEL_ONLY_PREFIXES):
                    diags.append(
                        Diagnostic(
                            "expr.override-scope",
                            "an override condition may only read model.* and config.*, "
                            f"not {node.name}",
                            expr.location(node),
                            hint="overrides are chosen once per model, before any session",
                        )
                    )
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


#: Names whose values are open-ended (a model described inline brings its own id): a string
#: compared with one is reported only when it is a near miss of a catalog value.
_OPEN_NAMES = frozenset({"model.id", "model.api_id"})


def literal_diagnostics(expr: Expr) -> list[Diagnostic]:
    """Warnings (``expr.unknown-value``) for string literals compared with a name whose
    values the catalog enumerates (``model.family``, ``model.provider``, ``model.api``,
    ``model.sdk``, ...; :func:`kilo_rules.engine.formats.catalog.known_values`) that no value
    matches: a typo makes a rule silently never match. Each is located at the literal; ``==``,
    ``!=``, ``in``, ``not in`` and ``contains`` are looked at, either way round."""
    from kilo_rules.engine.formats.catalog import known_values

    known = known_values()
    out: list[Diagnostic] = []
    for node in walk(expr.root):
        if not isinstance(node, Binary):
            continue
        for name, literal in _compared_literals(node, known):
            options = known[name]
            if literal.value in options:
                continue
            guess = did_you_mean(str(literal.value), options)
            if guess is None and name in _OPEN_NAMES:
                continue
            shown = ", ".join(options[:12]) + (", ..." if len(options) > 12 else "")
            out.append(
                Diagnostic(
                    "expr.unknown-value",
                    f"{literal.value!r} is not a known value of {name}",
                    expr.location(literal),
                    hint=f"did you mean {guess!r}?" if guess else f"known: {shown}",
                    details={"name": name, "value": literal.value},
                    severity="warning",
                )
            )
    return out


def _compared_literals(node: Binary, known: Mapping[str, object]) -> Iterator[tuple[str, Literal]]:
    """(name, string literal) pairs that ``node`` compares: ``name == "x"`` and
    ``"x" == name``; ``name in ["x", ...]`` (and ``[...] contains name``); for a list
    name, ``"x" in name`` (and ``name contains "x"``). ``"x" in name`` on a string name is
    a substring test, not a comparison with a value, and is left alone."""

    def strings(side: Node) -> list[Literal]:
        items = side.items if isinstance(side, ListExpr) else ()
        return [v for v in items if _is_string(v)]

    op = node.op
    if op in ("==", "!="):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if _is_string(b) and isinstance(a, Name) and a.name in known:
                yield a.name, b
        return
    if op not in ("in", "not in", "contains"):
        return
    item, container = (node.right, node.left) if op == "contains" else (node.left, node.right)
    if isinstance(item, Name) and item.name in known:
        for v in strings(container):
            yield item.name, v
    elif isinstance(container, Name) and container.name in known:
        listed = default_vocabulary().get(container.name)
        if _is_string(item) and listed is not None and listed.is_kind("list"):
            yield container.name, item


def _is_string(node: Node) -> TypeGuard[Literal]:
    return isinstance(node, Literal) and isinstance(node.value, str)


def _scalar_locator(policy: ResolvedPolicy, path: JsonPath) -> Callable[[int], Location]:
    def locate(offset: int) -> Location:
        return policy.locate_in_scalar(path, offset)

    return locate


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
