"""``kilo-rules check``: validate policy and catalog files the way CI needs.

Paths may be files, directories (searched for ``*.yaml``/``*.yml``) or globs. Each file is
classified by its content — a top-level ``models:`` list is a model catalog, anything else a
policy — and checked completely: YAML limits, JSON Schema, ``extends:`` chain, semantic
checks and every expression. All diagnostics are collected, none stops the others.
"""

from __future__ import annotations

import glob as globlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Diagnostic, KiloRulesError
from .load import Document, load_yaml_file


@dataclass
class CheckReport:
    """What ``check`` found: files looked at, diagnostics, and the sources for carets."""

    files: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    usage_errors: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        """Diagnostics of severity error."""
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def exit_code(self) -> int:
        """0 clean, 1 diagnostics, 2 usage or I/O problems."""
        if self.usage_errors:
            return 2
        return 1 if self.errors else 0


def expand_paths(paths: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files named by ``paths`` (files, directories, globs) and the problems found."""
    files: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        if any(ch in raw for ch in "*?["):
            matches = sorted(globlib.glob(raw, recursive=True))  # noqa: PTH207 - user globs may be absolute
            if not matches:
                problems.append(f"{raw}: no file matches this pattern")
            files.extend(Path(m) for m in matches if Path(m).is_file())
            continue
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                x
                for x in p.rglob("*")
                if x.suffix in (".yaml", ".yml") and x.is_file() and ".pre-commit" not in x.name
            )
            if not found:
                problems.append(f"{raw}: directory holds no .yaml or .yml file")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            problems.append(f"{raw}: no such file or directory")
    unique = list(dict.fromkeys(files))
    return unique, problems


def _kind(doc: Document) -> str:
    data = doc.data
    if isinstance(data, dict) and isinstance(data.get("models"), list):
        return "catalog"
    return "policy"


def check_catalog_document(doc: Document) -> list[Diagnostic]:
    """Schema and consistency checks of a model catalog file."""
    from .validate import schema_diagnostics

    diags = schema_diagnostics(doc, "catalog.v1.json")
    if diags:
        return diags
    seen: dict[str, int] = {}
    for i, m in enumerate(doc.data.get("models", [])):
        mid = m.get("id")
        if mid in seen:
            diags.append(
                Diagnostic(
                    "catalog.duplicate-id",
                    f"model id {mid!r} is listed twice",
                    doc.locate(("models", i, "id")),
                    hint=f"first listed as models[{seen[mid]}]",
                )
            )
        seen.setdefault(mid, i)
        limits = m.get("limits", {})
        ctx, inp, out = limits.get("context", 0), limits.get("input"), limits.get("output", 0)
        if inp is not None and ctx and inp > ctx:
            diags.append(
                Diagnostic(
                    "catalog.limits",
                    f"{mid}: input limit {inp:,} exceeds the context window {ctx:,}",
                    doc.locate(("models", i, "limits", "input")),
                )
            )
        if ctx and out > ctx:
            diags.append(
                Diagnostic(
                    "catalog.limits",
                    f"{mid}: output limit {out:,} exceeds the context window {ctx:,}",
                    doc.locate(("models", i, "limits", "output")),
                )
            )
    return diags


def check_policy_file(path: Path) -> tuple[list[Diagnostic], dict[str, str]]:
    """Every diagnostic of one policy file (and the files of its extends chain)."""
    from .checks import semantic_diagnostics
    from .resolve import resolve_policy

    try:
        policy = resolve_policy(path)
    except KiloRulesError as exc:
        return exc.diagnostics, {}
    from .policy_exprs import expression_diagnostics

    diags = semantic_diagnostics(policy)
    diags.extend(expression_diagnostics(policy))
    for hook in POLICY_HOOKS:
        diags.extend(hook(policy))
    return diags, policy.sources()


#: Further checks of a resolved policy (the expression checker registers itself here).
POLICY_HOOKS: list[Callable[..., list[Diagnostic]]] = []


def check_paths(paths: Iterable[str]) -> CheckReport:
    """Check every file named by ``paths``."""
    report = CheckReport()
    files, problems = expand_paths(paths)
    report.usage_errors.extend(problems)
    for path in files:
        report.files.append(str(path))
        try:
            doc = load_yaml_file(path)
        except KiloRulesError as exc:
            if any(d.code == "io.read" for d in exc.diagnostics):
                report.usage_errors.append(str(exc.diagnostic))
            report.diagnostics.extend(exc.diagnostics)
            continue
        report.sources[doc.file] = doc.text
        if _kind(doc) == "catalog":
            report.diagnostics.extend(check_catalog_document(doc))
            continue
        diags, sources = check_policy_file(path)
        report.sources.update(sources)
        report.diagnostics.extend(diags)
    # The same base file reached through two policies reports its problems once.
    unique = {(d.code, d.message, str(d.location)): d for d in report.diagnostics}
    report.diagnostics = sorted(unique.values(), key=Diagnostic.sort_key)
    return report
