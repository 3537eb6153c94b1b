"""What ``kilo-rules check`` can still say about a policy file that does not resolve.

A file with schema errors, or whose base is missing, is not merged by ``resolve_policy``;
yet its author wants every problem in one run, as OPA's compiler collects errors across
its stages. So the file is read again without the values the schema refused, merged onto
its base when the base resolves on its own, and the later stages run on what is left: its
expressions (syntax, names, types, values no model has) and the semantic checks
(tokenizers, layers and what they replace, the files it names, ...).

Nothing a refused value would have caused is reported: the names it defines are of
unknown type, so no expression is blamed for reading one, and a semantic finding located
at a refused value or at one of its parents (a layer whose ``path`` was refused has, to a
check, no path) is left out. Findings that depend on what a base defines are left out
when the base cannot be read. Cycles and override scopes are checked once the file
resolves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location
from kilo_rules.engine.formats.load import Document, JsonPath, iter_paths, lookup
from kilo_rules.engine.frontend.resolve import (
    ResolvedPolicy,
    load_policy_document,
    merged_onto,
    resolve_policy,
)

__all__ = ["diagnostics_despite_errors", "expressions_despite_errors"]

#: Failures of resolving after which the file's own content can still be checked.
RESOLVE_CODES = ("schema.", "policy.extends-")

#: Semantic findings that depend on the layers a base defines: without the base, a layer
#: that only changes an inherited one would look sourceless, pathless or unknown, and two
#: entries with one id (which merge onto an inherited list as one) would look like two.
_INHERITED = frozenset(
    {
        "policy.unknown-layer",
        "policy.layer-needs-path",
        "policy.layer-needs-text",
        "policy.duplicate-layer",
    }
)


@dataclass(frozen=True)
class _Partial:
    """The checkable part of a policy file that failed to resolve."""

    doc: Document
    data: dict[str, Any]  # the file's content less the values the schema refused
    refused: frozenset[JsonPath]
    blocked: frozenset[tuple[str, int, int]]  # where a refused value or a parent of one is
    alone: ResolvedPolicy  # the file on its own
    base: ResolvedPolicy | None  # its base, when that resolves on its own
    extends: bool  # the file names a base


def diagnostics_despite_errors(
    path: Path, failed: list[Diagnostic]
) -> tuple[list[Diagnostic], dict[str, str]]:
    """The expression and semantic diagnostics of the policy file ``path``, whose resolving
    failed with ``failed``, and the sources they are located in (for carets)."""
    partial = _prepare(path, failed)
    if partial is None:
        return [], {}
    policy = partial.alone
    if partial.base is not None:
        policy = merged_onto(partial.base, partial.doc, partial.data)
    out = [*_expressions(partial), *_semantics(partial, policy)]
    return out, policy.sources()


def expressions_despite_errors(path: Path, failed: list[Diagnostic]) -> list[Diagnostic]:
    """The expression diagnostics of a policy file that failed to resolve (schema errors,
    a missing base): only the file's own expressions, against the names it and its base
    (when that resolves on its own) define."""
    partial = _prepare(path, failed)
    return [] if partial is None else _expressions(partial)


def _prepare(path: Path, failed: list[Diagnostic]) -> _Partial | None:
    path = Path.cwd() / path  # as resolve_policy names it, so locations agree
    try:
        doc = load_policy_document(path)
    except KiloRulesError:
        return None
    if not isinstance(doc.data, dict) or any(not d.code.startswith(RESOLVE_CODES) for d in failed):
        return None
    here = path.resolve()
    mine = [d for d in failed if Path(d.location.file).resolve() == here]
    data, refused, required = _without_refused_values(doc.data, mine)
    blocked = {
        _where(doc.locate(p[:k])) for p in (*refused, *required) for k in range(1, len(p) + 1)
    }
    origin = {p: (doc, p) for p, _ in iter_paths(doc.data)}
    alone = ResolvedPolicy(name=str(data.get("name", "?")), data=data, chain=[doc], origin=origin)
    base = None
    ref = data.get("extends")
    # Only a base with no error of its own: one that has errors is reported on its own.
    if isinstance(ref, str) and len(mine) == len(failed):
        is_path = "/" in ref or "\\" in ref or ref.endswith((".yaml", ".yml"))
        try:
            base = resolve_policy(path.parent / ref if is_path else ref)
        except KiloRulesError:
            base = None
    return _Partial(
        doc=doc,
        data=data,
        refused=frozenset(refused),
        blocked=frozenset(blocked),
        alone=alone,
        base=base,
        extends="extends" in doc.data,
    )


def _where(loc: Location) -> tuple[str, int, int]:
    return (str(Path(loc.file).resolve()), loc.line, loc.col)


def _semantics(partial: _Partial, policy: ResolvedPolicy) -> list[Diagnostic]:
    from kilo_rules.engine.frontend.checks import CHECKS

    out: list[Diagnostic] = []
    for check in CHECKS.values():
        try:
            out.extend(check(policy))
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            # A check may assume the schema holds; where a refused value breaks that, it
            # has nothing to say this run (what it found before stopping is kept).
            continue
    inherited_unknown = partial.extends and partial.base is None
    return [
        d
        for d in out
        if _where(d.location) not in partial.blocked
        and not (inherited_unknown and d.code in _INHERITED)
    ]


def _expressions(partial: _Partial) -> list[Diagnostic]:
    from kilo_rules.engine.formats.policy import expression_fields
    from kilo_rules.engine.frontend.expr import Expr, Vocabulary, infer, parse
    from kilo_rules.engine.frontend.expr.types import ANY
    from kilo_rules.engine.frontend.expr.vocabulary import name_nodes
    from kilo_rules.engine.frontend.policy_exprs import (
        KIND_TYPES,
        VALUE_SECTIONS,
        literal_diagnostics,
        policy_vocabulary,
    )

    data, refused, policy = partial.data, partial.refused, partial.alone
    fields = [(p, k) for p, k in expression_fields(data) if p not in refused]
    try:
        vocab = policy_vocabulary(policy, dict(fields))
        vocab = vocab.extended({n: ANY for n in _names(refused) if n not in vocab})
    except ValueError:  # a key no schema-valid policy has; the schema errors say which
        return []
    base_names_unknown = isinstance(data.get("extends"), str)
    if partial.base is not None:
        try:
            base_vocab = policy_vocabulary(partial.base, dict(expression_fields(partial.base.data)))
        except ValueError:
            pass
        else:
            extra = {n: base_vocab[n] for n in base_vocab if n not in vocab}
            vocab = Vocabulary({**{n: vocab[n] for n in vocab}, **extra})
            base_names_unknown = False
    section_names = tuple(f"unknown name {s}." for s in VALUE_SECTIONS)
    out: list[Diagnostic] = []
    parsed: list[tuple[Expr, str]] = []
    for field_path, kind in fields:
        try:
            expr = parse(lookup(data, field_path), locate=_scalar_locator(policy, field_path))
        except KiloRulesError as exc:
            out.extend(exc.diagnostics)
            continue
        parsed.append((expr, kind))
    # A section the schema refused whole (`budget: x`) defines no name: whatever is read
    # under it is of unknown type too, not unknown.
    prefixes = tuple(f"{n}." for n in _names(refused))
    under = {
        node.name
        for expr, _ in parsed
        for node in name_nodes(expr)
        if node.name.startswith(prefixes) and node.name not in vocab
    }
    if under:
        vocab = vocab.extended(dict.fromkeys(under, ANY))
    for expr, kind in parsed:
        _, problems = infer(expr, vocab, KIND_TYPES[kind])
        out.extend(
            d
            for d in problems
            if not (
                base_names_unknown
                and d.code == "expr.unknown-name"
                and d.message.startswith(section_names)
            )
        )
        out.extend(literal_diagnostics(expr))
    return out


def _scalar_locator(policy: ResolvedPolicy, path: JsonPath) -> Callable[[int], Location]:
    def locate(offset: int) -> Location:
        return policy.locate_in_scalar(path, offset)

    return locate


def _without_refused_values(
    data: dict[str, Any], failed: list[Diagnostic]
) -> tuple[dict[str, Any], set[JsonPath], set[JsonPath]]:
    """A copy of ``data`` without the keys and values the schema refused, the paths of
    those, and the paths of the mappings that miss a required key (kept, but a check of
    them would only repeat that the key is missing)."""
    out = copy.deepcopy(data)
    refused: set[JsonPath] = set()
    required: set[JsonPath] = set()
    for d in failed:
        where = d.details.get("path")
        if not isinstance(where, list):
            continue
        target: JsonPath = tuple(where)
        if d.code == "schema.unknown-key":
            target = (*target, d.details.get("key", ""))
        elif d.code == "schema.required":
            required.add(target)
            continue
        if not target:
            continue
        parent = lookup(out, target[:-1])
        if isinstance(parent, dict) and target[-1] in parent:
            del parent[target[-1]]
        elif isinstance(parent, list) and isinstance(target[-1], int) and target[-1] < len(parent):
            parent[target[-1]] = None
        refused.add(target)
    return out, refused, required


def _names(paths: Iterable[JsonPath]) -> list[str]:
    """The dotted names of value paths (``budget.usable``), where they are plain names."""
    from kilo_rules.engine.frontend.policy_exprs import VALUE_SECTIONS

    return [
        ".".join(str(k) for k in p)
        for p in paths
        if p and p[0] in VALUE_SECTIONS and all(isinstance(k, str) and k.isidentifier() for k in p)
    ]
