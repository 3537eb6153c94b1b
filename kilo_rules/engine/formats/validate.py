"""JSON Schema validation of loaded documents, mapped to ``file:line:col`` diagnostics.

jsonschema errors are translated here, once: each error is narrowed with ``best_match`` (so
an ``anyOf`` failure shows the branch that came closest), located through the document's
source map (unknown keys at the key, wrong values at the value), worded for a policy author,
and sorted by position so the output does not depend on the order keys were written in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from kilo_rules.engine.base.errors import Diagnostic, did_you_mean
from kilo_rules.engine.formats.load import Document, JsonPath, schema_root

_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
    "object": "a mapping",
    "array": "a list",
}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        short = value if len(value) <= 40 else value[:37] + "..."
        return f"string {short!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def dotted(path: Iterable[str | int]) -> str:
    """``compaction.summary.template`` / ``system.layers[2].id``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A bundled schema by file name (e.g. ``policy.v1.json``)."""
    data: dict[str, Any] = json.loads((schema_root() / name).read_text(encoding="utf-8"))
    return data


@cache
def validator(schema_name: str) -> Draft202012Validator:
    """A compiled validator for a bundled schema.

    The bundled schemas are checked against the metaschema by the test suite
    (``tests/test_schemas.py``), not again in every process: that took longer than
    checking a hundred policies."""
    schema = load_schema(schema_name)
    return Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _expected(schema: Any) -> str:
    t = schema.get("type") if isinstance(schema, dict) else None
    types = [t] if isinstance(t, str) else list(t or [])
    names = [_TYPE_NAMES.get(x, x) for x in types if x != "null"]
    if isinstance(schema, dict) and schema.get("x-expression") and "string" in types:
        names = [n for n in names if n != "a string"] + ["an expression"]
    if not names:
        return "a valid value"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _leaf(error: ValidationError) -> ValidationError:
    """Descend anyOf/oneOf to the most relevant sub-error (jsonschema's own ranking)."""
    while error.context:
        # A null branch is only there to allow "not set"; it never explains a mistake.
        useful = [e for e in error.context if e.validator_value != "null"]
        best = best_match(useful or error.context)
        if best is None or best is error:
            break
        error = best
    return error


def diagnose(error: ValidationError, doc: Document, prefix: JsonPath = ()) -> Diagnostic:
    """Translate one jsonschema error into a located, readable diagnostic."""
    top = error
    error = _leaf(error)
    path: JsonPath = (*prefix, *error.absolute_path)
    where = dotted(path)
    kind = error.validator
    details: dict[str, Any] = {"path": list(path), "schema_rule": kind}
    if kind == "additionalProperties":
        allowed = (
            list((error.schema.get("properties") or {}).keys())
            if isinstance(error.schema, dict)
            else []
        )
        extra = (
            [k for k in error.instance if k not in allowed]
            if isinstance(error.instance, dict)
            else []
        )
        return _unknown_keys(doc, path, extra, allowed, details)[0]
    if kind == "required":
        instance = error.instance if isinstance(error.instance, dict) else {}
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [k for k in required if k not in instance]
        key = missing[0] if missing else "?"
        return Diagnostic(
            "schema.required",
            f"missing required key {key!r}" + (f" in {where}" if path else ""),
            doc.locate_key(path) if path else doc.locate(path),
            details={**details, "key": key},
        )
    if kind == "type":
        return Diagnostic(
            "schema.type",
            f"{where}: expected {_expected(error.schema)}, got {_describe(error.instance)}",
            doc.locate(path),
            details=details,
        )
    if kind == "enum":
        options = [
            str(o)
            for o in (error.validator_value if isinstance(error.validator_value, list) else [])
        ]
        suggestion = did_you_mean(str(error.instance), options)
        return Diagnostic(
            "schema.enum",
            f"{where}: {_describe(error.instance)} is not one of "
            + ", ".join(repr(o) for o in options),
            doc.locate(path),
            details={**details, "allowed": options},
            hint=f"did you mean {suggestion!r}?" if suggestion else None,
        )
    if kind == "const":
        return Diagnostic(
            "schema.const",
            f"{where}: must be {error.validator_value!r}, got {_describe(error.instance)}",
            doc.locate(path),
            details=details,
        )
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[
            kind
        ]
        return Diagnostic(
            "schema.range",
            f"{where}: must be {op} {error.validator_value}, got {error.instance}",
            doc.locate(path),
            details=details,
        )
    if kind == "pattern":
        return Diagnostic(
            "schema.pattern",
            f"{where}: {_describe(error.instance)} does not match {error.validator_value}",
            doc.locate(path),
            details=details,
        )
    message = error.message if error is top else f"{error.message}"
    return Diagnostic("schema.invalid", f"{where}: {message}", doc.locate(path), details=details)


def _unknown_keys(
    doc: Document, path: JsonPath, extra: list[Any], allowed: list[str], details: dict[str, Any]
) -> list[Diagnostic]:
    """One diagnostic per unknown key of the mapping at ``path``, in the order written."""
    owner = f" in {dotted(path)}" if path else ""
    out = []
    for key in sorted(extra, key=lambda k: doc.locate_key((*path, k))) or ["?"]:
        suggestion = did_you_mean(str(key), allowed)
        out.append(
            Diagnostic(
                "schema.unknown-key",
                f"unknown key {key!r}{owner}",
                doc.locate_key((*path, key)),
                details={**details, "key": key, "allowed": allowed},
                hint=f"did you mean {suggestion!r}?"
                if suggestion
                else f"allowed keys: {', '.join(allowed)}",
            )
        )
    return out


def diagnose_all(error: ValidationError, doc: Document, prefix: JsonPath = ()) -> list[Diagnostic]:
    """Like :func:`diagnose`, but every unknown key of a mapping gets its own diagnostic
    (jsonschema reports them all in one ``additionalProperties`` error)."""
    leaf = _leaf(error)
    if leaf.validator == "additionalProperties" and isinstance(leaf.instance, dict):
        path: JsonPath = (*prefix, *leaf.absolute_path)
        schema = leaf.schema if isinstance(leaf.schema, dict) else {}
        allowed = list((schema.get("properties") or {}).keys())
        extra = [k for k in leaf.instance if k not in allowed]
        if extra:
            details = {"path": list(path), "schema_rule": "additionalProperties"}
            return _unknown_keys(doc, path, extra, allowed, details)
    return [diagnose(error, doc, prefix)]


def iter_schema_diagnostics(
    doc: Document, schema_name: str, data: Any = None, prefix: JsonPath = ()
) -> Iterator[Diagnostic]:
    """Yield a diagnostic per schema violation of ``data`` (default: the whole document)."""
    instance = doc.data if data is None else data
    for error in validator(schema_name).iter_errors(instance):
        for leaf in _expand(error):
            yield from diagnose_all(leaf, doc, prefix)


def _expand(error: ValidationError) -> Iterator[ValidationError]:
    """Every error inside an optional section, not just the best one: ``X | null`` is an
    ``anyOf`` whose null branch never explains a mistake, so when the value is not null
    all the errors of the other branch are real, and all are reported."""
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        real = [
            errs
            for errs in branches.values()
            if not (
                len(errs) == 1 and errs[0].validator == "type" and errs[0].validator_value == "null"
            )
        ]
        if len(real) == 1 and error.instance is not None:
            for sub in real[0]:
                yield from _expand(sub)
            return
    yield error


def schema_diagnostics(doc: Document, schema_name: str) -> list[Diagnostic]:
    """All schema violations, de-duplicated and sorted by position."""
    seen: set[tuple[str, str, int, int]] = set()
    out = []
    for d in iter_schema_diagnostics(doc, schema_name):
        key = (d.code, d.message, d.location.line, d.location.col)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return sorted(out, key=Diagnostic.sort_key)
