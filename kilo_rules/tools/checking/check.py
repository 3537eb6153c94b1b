"""``kilo-rules check``: validate policy and catalog files the way CI needs.

Paths may be files, directories (searched for ``*.yaml``/``*.yml``) or globs. Each file is
classified by its content — a top-level ``models:`` list is a model catalog, a ``version``
with ``routes:`` or ``default:`` a routes file, anything else a policy — and checked
completely: YAML limits, JSON Schema, ``extends:`` chain, semantic checks and every
expression; a routes file's policy refs, the policy files it names, and its routes against
the bundled catalog. All diagnostics are collected, none stops the others.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, PathAliases
from kilo_rules.engine.formats.catalog import ModelInfo
from kilo_rules.engine.formats.load import Document, load_yaml_file


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
            walked = safefs.glob_spec(raw)
            matches = walked.matches
            if walked.cut is not None:
                problems.append(f"{raw}: the pattern's walk {walked.cut}; narrow it")
            elif not matches:
                problems.append(f"{raw}: no file matches this pattern")
            files.extend(Path(m) for m in matches if Path(m).is_file())
            continue
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                x
                for x in p.rglob("*")
                if x.suffix in (".yaml", ".yml")
                and x.is_file()
                and ".pre-commit" not in x.name
                # policy test files (kilo-rules test) live beside the policies they test
                and not x.name.endswith(".test.yaml")
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
    # A policy has neither key, so a routes file whose schema is wrong is still one.
    if isinstance(data, dict) and "version" in data and ("routes" in data or "default" in data):
        return "routes"
    return "policy"


def check_catalog_document(doc: Document) -> list[Diagnostic]:
    """Schema and consistency checks of a model catalog file."""
    from kilo_rules.engine.formats.validate import schema_diagnostics

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


def check_routes_file(
    path: Path, checked: set[Path] | None = None
) -> tuple[list[Diagnostic], dict[str, str]]:
    """Every diagnostic of a routes file: its schema and policy refs, every policy file it
    names (checked as a policy is, once: ``checked`` holds the real paths already done), and
    its routes against the bundled catalog."""
    from kilo_rules.engine.formats.catalog import bundled_catalog
    from kilo_rules.engine.frontend.routes import check_routes, read_routes

    done = set() if checked is None else checked
    routes, diags = read_routes(path)
    sources: dict[str, str] = {}
    if routes is None:
        return diags, sources
    for ref in routes.policies():
        # Refs that failed to resolve stay strings, so a refused file is never read here.
        if isinstance(ref, Path) and ref not in done:
            done.add(ref)
            more, src = check_policy_file(ref)
            diags.extend(more)
            sources.update(src)
    diags.extend(check_routes(routes, bundled_catalog()))
    return diags, sources


def check_policy_file(path: Path) -> tuple[list[Diagnostic], dict[str, str]]:
    """Every diagnostic of one policy file (and the files of its extends chain)."""
    from kilo_rules.engine.frontend.checks import semantic_diagnostics
    from kilo_rules.engine.frontend.resolve import resolve_policy

    try:
        policy = resolve_policy(path)
    except KiloRulesError as exc:
        from kilo_rules.tools.checking.check_partial import diagnostics_despite_errors

        # The later stages still run on what is valid, so one run shows every problem.
        more, sources = diagnostics_despite_errors(path, exc.diagnostics)
        return [*exc.diagnostics, *more], sources
    from kilo_rules.engine.frontend.policy_exprs import expression_diagnostics

    diags = semantic_diagnostics(policy)
    diags.extend(expression_diagnostics(policy))
    for hook in POLICY_HOOKS:
        diags.extend(hook(policy))
    return diags, policy.sources()


#: Further checks of a resolved policy (the expression checker registers itself here).
POLICY_HOOKS: list[Callable[..., list[Diagnostic]]] = []


def check_paths(
    paths: Iterable[str],
    *,
    models: Sequence[ModelInfo] = (),
    bundle_key: bytes | None = None,
) -> CheckReport:
    """Check every file named by ``paths``; a policy that checks clean is also compiled
    for each of ``models``, adding what compile finds doubtful for that model (a window
    with no room left, a tail larger than the usable window, ...). A bundle file is
    checked as :func:`check_bundle` does, its signature against ``bundle_key`` if given."""
    from kilo_rules.engine.frontend.checks import file_checks_once

    with file_checks_once():
        return _check_paths(paths, models, bundle_key)


def _check_paths(
    paths: Iterable[str], models: Sequence[ModelInfo], bundle_key: bytes | None = None
) -> CheckReport:
    report = CheckReport()
    files, problems = expand_paths(paths)
    report.usage_errors.extend(problems)
    policies_checked: set[Path] = set()
    for path in files:
        if is_bundle(path):
            inner = check_bundle(path, bundle_key, models=models)
            report.files.extend(inner.files)
            report.diagnostics.extend(inner.diagnostics)
            report.sources.update(inner.sources)
            report.usage_errors.extend(inner.usage_errors)
            continue
        report.files.append(str(path))
        try:
            doc = _load(path)
        except KiloRulesError as exc:
            if any(d.code == "io.read" for d in exc.diagnostics):
                report.usage_errors.append(str(exc.diagnostic))
            report.diagnostics.extend(exc.diagnostics)
            continue
        report.sources[doc.file] = doc.text
        kind = _kind(doc)
        if kind == "catalog":
            report.diagnostics.extend(check_catalog_document(doc))
            continue
        if kind == "routes":
            diags, sources = check_routes_file(path, policies_checked)
            report.sources.update(sources)
            report.diagnostics.extend(diags)
            continue
        policies_checked.add(path.resolve())
        diags, sources = check_policy_file(path)
        report.sources.update(sources)
        report.diagnostics.extend(diags)
        if models and not any(d.severity == "error" for d in diags):
            report.diagnostics.extend(_model_diagnostics(path, models))
    # The same base file reached through two policies reports its problems once.
    unique = {(d.code, d.message, str(d.location)): d for d in report.diagnostics}
    report.diagnostics = sorted(unique.values(), key=Diagnostic.sort_key)
    return report


def _load(path: Path) -> Document:
    """The document of ``path``. A policy is parsed as ``resolve_policy`` names it (from
    the working directory), so that resolving it next reuses the parse instead of reading
    the file twice; problems and other kinds of file are reported under the name given."""
    from kilo_rules.engine.frontend.resolve import load_policy_document

    try:
        doc = load_policy_document(path if path.is_absolute() else Path.cwd() / path)
    except KiloRulesError:
        return load_yaml_file(path)
    return doc if _kind(doc) == "policy" else load_yaml_file(path)


def _model_diagnostics(path: Path, models: Sequence[ModelInfo]) -> list[Diagnostic]:
    from kilo_rules.engine.compiler.compile import (
        compile_policy,  # only when models are given: it is heavy
    )

    out: list[Diagnostic] = []
    for model in models:
        try:
            out.extend(compile_policy(path, model).warnings)
        except KiloRulesError as exc:
            out.extend(exc.diagnostics)
    return out


# ---------------------------------------------------------------------------- bundles

#: The first bytes of a gzip stream: a bundle (no YAML file starts with a control byte).
_GZIP_MAGIC = b"\x1f\x8b"


def is_bundle(path: Path) -> bool:
    """Whether the file at ``path`` is a bundle (a gzip stream) rather than YAML."""
    try:
        return safefs.read_head(path, 2) == _GZIP_MAGIC
    except OSError:  # ReadRefused: a FIFO is not opened for reading, the load reports it
        return False


def check_bundle(
    bundle: Path, public_key_pem: bytes | None = None, *, models: Sequence[ModelInfo] = ()
) -> CheckReport:
    """Verify ``bundle`` as ``kilo-rules bundle verify`` does (its members against the
    manifest, its expiry, and with ``public_key_pem`` its signature), then check every
    file in it as :func:`check_paths` checks a directory, each located inside the bundle
    (``policies.tar.gz!/team.yaml:4:3``)."""
    from kilo_rules.engine.formats.bundle import BundleError, read_bundle

    try:
        _, files = read_bundle(bundle, public_key_pem)
    except BundleError as exc:
        report = CheckReport(files=[str(bundle)], diagnostics=list(exc.diagnostics))
        if all(d.code in _BUNDLE_USAGE_CODES for d in exc.diagnostics):
            report.usage_errors.extend(str(d) for d in exc.diagnostics)
        return report
    return check_files(files, f"{bundle}!/", models=models)


#: Bundle refusals about what was asked (a file that cannot be read, a key), not the bundle.
_BUNDLE_USAGE_CODES = frozenset({"bundle.io", "bundle.key", "bundle.cryptography-missing"})


def check_files(
    files: Mapping[str, bytes], shown_as: str, *, models: Sequence[ModelInfo] = ()
) -> CheckReport:
    """Check a policy tree given as its files (relative POSIX path → bytes), as
    :func:`check_paths` checks a directory holding them; each file is named ``shown_as``
    followed by its path (a bundle's ``b.tar.gz!/``, or the directory it was read from)."""
    with tempfile.TemporaryDirectory(prefix="kilo-rules-check-") as tmp:
        root = Path(tmp).resolve()
        for rel, data in files.items():
            # A name that climbs out (a caller's mapping, not a verified bundle) is refused.
            target = Path(safefs.resolve_beneath(root, rel))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        inner = check_paths([str(root)], models=models)
    names = PathAliases({str(root): shown_as.rstrip("/")})
    return CheckReport(
        files=[names.text(f) for f in inner.files],
        sources={names.text(f): t for f, t in inner.sources.items()},
        usage_errors=[names.text(u) for u in inner.usage_errors],
        diagnostics=[names.diagnostic(d) for d in inner.diagnostics],
    )
