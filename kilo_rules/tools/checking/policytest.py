"""Policy unit tests: ``*.test.yaml`` files of cases checked against what a policy decides.

A test file names a policy and lists cases. Each case compiles the policy for one model,
runs it on one session (one step, one agent-loop step with compaction, or a replay of the
whole session) and checks what came out: plan values, decisions present or absent, values
in the request body, whether compaction is needed, how often a replay compacted. A failed
expectation is a :class:`~kilo_rules.engine.base.errors.Diagnostic` located at the line and column
of the test file that states it, with what was expected and what was found.

Test files are untrusted input, like policies: they are loaded within the YAML limits of
:mod:`kilo_rules.engine.formats.load`, validated against ``schemas/policytest.v1.json`` (generated
from the models below) with located errors, and every path they name (the workspace's cwd, root and
home, a policy path, a session) must lie in the test file's directory tree, the bundled
policies or a directory the operator allowed (:func:`kilo_rules.engine.base.sandbox.allow_read`), as
written and once symlinks are resolved (``test.path-outside-roots``); a file named is a
regular file of bounded size, a session read through the sandbox. A case's home defaults to
:data:`DEFAULT_HOME` in the test file's tree, never the real user's home.

Coverage (:class:`Coverage`) says which rules, overrides and expressions of each policy file
the cases exercised, as ``opa test --coverage`` does; docs/testing-policies.md defines it.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import ValidationError

from kilo_rules.engine.base import safefs, sandbox
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location, PolicyError
from kilo_rules.engine.base.regex import compile_regex
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog
from kilo_rules.engine.formats.load import DEFAULT_LIMITS, Document, JsonPath, load_yaml_file
from kilo_rules.engine.formats.policy import expression_fields
from kilo_rules.engine.formats.policytest_format import (
    CaseSpec,
    DecisionMatch,
    Mode,
    PolicyTestFile,
    RequestCheck,
)
from kilo_rules.engine.formats.session import MAX_BYTES as SESSION_MAX_BYTES
from kilo_rules.engine.formats.session import Session, session_from_data
from kilo_rules.engine.formats.validate import diagnose_all, dotted, load_schema, schema_diagnostics
from kilo_rules.engine.frontend.policy_exprs import VALUE_SECTIONS
from kilo_rules.engine.frontend.resolve import ResolvedPolicy, bundled_root, resolve_policy
from kilo_rules.engine.importers import read_session_bytes
from kilo_rules.engine.runtime.apply import Decision, apply_plan
from kilo_rules.engine.runtime.apply import run as run_stages
from kilo_rules.engine.runtime.context import Agent, Skill, StepInput, Workspace
from kilo_rules.engine.runtime.facade import Runtime

__all__ = [
    "DEFAULT_HOME",
    "SCHEMA",
    "TEST_SUFFIX",
    "CaseOutcome",
    "Coverage",
    "CoverageItem",
    "FileCoverage",
    "FileOutcome",
    "PolicyTestFile",
    "RunReport",
    "find_test_files",
    "parse_request_path",
    "run_paths",
    "run_test_file",
]

#: Test files are found by this suffix when a directory is given.
TEST_SUFFIX = ".test.yaml"
#: The JSON Schema test files are validated against.
SCHEMA = "policytest.v1.json"
#: Most test files one run reads from directories.
MAX_FILES = 10_000

Kind = Literal["rule", "override", "expression"]


# -- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseOutcome:
    """One case: passed when it has no failures and is not ``invalid``."""

    name: str
    file: str
    location: Location  # where the case is written
    seconds: float = 0.0
    failures: tuple[Diagnostic, ...] = ()
    #: The case could not run: its inputs are wrong (model, session, config, policy file).
    invalid: bool = False
    policy: str | None = None  # the policy file the case compiled

    @property
    def passed(self) -> bool:
        """No failure and nothing invalid."""
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the case."""
        status = "pass" if self.passed else ("error" if self.invalid else "fail")
        return {
            "name": self.name,
            "status": status,
            "location": self.location.to_json(),
            "seconds": round(self.seconds, 6),
            "policy": self.policy,
            "failures": [d.to_json() for d in self.failures],
        }


@dataclass(frozen=True)
class FileOutcome:
    """One test file: its cases, or the errors that kept it from running."""

    file: str
    text: str = ""
    cases: tuple[CaseOutcome, ...] = ()
    errors: tuple[Diagnostic, ...] = ()

    @property
    def invalid(self) -> bool:
        """The file or one of its cases could not run."""
        return bool(self.errors) or any(c.invalid for c in self.cases)

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the file."""
        return {
            "file": self.file,
            "errors": [d.to_json() for d in self.errors],
            "cases": [c.to_json() for c in self.cases],
        }


@dataclass(frozen=True, order=True)
class CoverageItem:
    """One thing of a policy file that a test can exercise."""

    location: Location
    kind: Kind
    name: str

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the item."""
        return {"kind": self.kind, "name": self.name, "at": str(self.location)}


@dataclass(frozen=True)
class FileCoverage:
    """Coverage of one policy file: every item and those exercised."""

    file: str
    items: tuple[CoverageItem, ...]
    covered: frozenset[CoverageItem]
    #: A bundled policy that no case tests, compiled only as the base of one that is: not
    #: the user's own file, so coverage summarises it in one line by default.
    base: bool = False

    def counts(self, kind: Kind) -> tuple[int, int]:
        """(covered, total) items of ``kind``."""
        items = [i for i in self.items if i.kind == kind]
        return sum(1 for i in items if i in self.covered), len(items)

    @property
    def uncovered(self) -> list[CoverageItem]:
        """The items no case exercised, in file order."""
        return sorted(i for i in self.items if i not in self.covered)

    def percent(self, kinds: Iterable[Kind] = ("rule", "override", "expression")) -> float:
        """Covered share of the items of ``kinds``, 0-100 (100 when there are none)."""
        got = [self.counts(k) for k in kinds]
        total = sum(t for _, t in got)
        return 100.0 if total == 0 else 100.0 * sum(c for c, _ in got) / total

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape: counts per kind and the uncovered items."""
        kinds: tuple[Kind, ...] = ("rule", "override", "expression")
        return {
            "file": self.file,
            "base": self.base,
            "percent": round(self.percent(), 2),
            **{f"{k}s": _counts(self.counts(k)) for k in kinds},
            "uncovered": [i.to_json() for i in self.uncovered],
        }


def _counts(pair: tuple[int, int]) -> dict[str, int]:
    return {"covered": pair[0], "total": pair[1]}


@dataclass(frozen=True)
class Coverage:
    """Coverage of every policy file the cases compiled (the files of their chains)."""

    files: tuple[FileCoverage, ...] = ()

    def for_file(self, path: str | Path) -> FileCoverage | None:
        """The coverage of the policy file at ``path``, if a case compiled it."""
        key = _abs(str(path))
        return next((f for f in self.files if _abs(f.file) == key), None)

    def to_json(self) -> list[dict[str, Any]]:
        """One entry per policy file."""
        return [f.to_json() for f in self.files]


@dataclass(frozen=True)
class RunReport:
    """Every test file run, and the coverage of the policies they tested."""

    files: tuple[FileOutcome, ...]
    coverage: Coverage = field(default_factory=Coverage)

    @property
    def cases(self) -> list[CaseOutcome]:
        """Every case of every file, in order."""
        return [c for f in self.files for c in f.cases]

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 some failed, 2 a test file or a case's inputs are invalid."""
        if any(f.invalid for f in self.files):
            return 2
        return 1 if any(not c.passed for c in self.cases) else 0

    def diagnostics(self) -> list[Diagnostic]:
        """Every failure and every error, in file order."""
        out: list[Diagnostic] = []
        for f in self.files:
            out.extend(f.errors)
            for c in f.cases:
                out.extend(c.failures)
        return out

    def to_json(self, *, coverage: bool = False) -> dict[str, Any]:
        """Stable JSON shape of the run (with the coverage when asked)."""
        cases = self.cases
        passed = sum(1 for c in cases if c.passed)
        out: dict[str, Any] = {
            "version": 1,
            "summary": {
                "files": len(self.files),
                "cases": len(cases),
                "passed": passed,
                "failed": sum(1 for c in cases if not c.passed and not c.invalid),
                "errors": sum(1 for c in cases if c.invalid)
                + sum(len(f.errors) for f in self.files),
            },
            "files": [f.to_json() for f in self.files],
        }
        if coverage:
            out["coverage"] = self.coverage.to_json()
        return out


# -- request paths --------------------------------------------------------------------------

_SEGMENT = re.compile(r"\[(-?\d+)\]|\.?([^.\[\]]+)")
_MAX_PATH = 64


def parse_request_path(text: str) -> tuple[str | int, ...]:
    """``messages[0].content[-1].text`` → ``("messages", 0, "content", -1, "text")``;
    raises ValueError saying what is wrong with a malformed path."""
    steps: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _SEGMENT.match(text, pos)
        if m is None or (m.group(2) is not None and m.group(0).startswith(".") and pos == 0):
            raise ValueError(f"unexpected {text[pos]!r} at character {pos + 1}")
        if m.group(1) is not None:
            steps.append(int(m.group(1)))
        else:
            if pos > 0 and not m.group(0).startswith("."):
                raise ValueError(f"expected '.' or '[' at character {pos + 1}")
            steps.append(m.group(2))
        pos = m.end()
    if not steps:
        raise ValueError("the path is empty")
    if len(steps) > _MAX_PATH:
        raise ValueError(f"more than {_MAX_PATH} steps")
    return tuple(steps)


_MISSING = object()


def _at_path(data: Any, steps: Sequence[str | int]) -> Any:
    for s in steps:
        by_index = isinstance(s, int) and isinstance(data, list) and -len(data) <= s < len(data)
        if not (by_index or (isinstance(s, str) and isinstance(data, Mapping) and s in data)):
            return _MISSING
        data = data[s]
    return data


# -- running --------------------------------------------------------------------------------


class _InvalidCaseError(Exception):
    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        super().__init__(str(diagnostics[0]) if diagnostics else "invalid")
        self.diagnostics = list(diagnostics)


Key = tuple[str, int, int]


def _abs(file: str) -> str:
    if file.startswith("<"):
        return file
    try:
        return str(Path(file).resolve())
    except OSError:
        return file


def _key(loc: Location | None) -> Key | None:
    if loc is None or loc.file.startswith("<"):
        return None
    return (_abs(loc.file), loc.line, loc.col)


@dataclass
class _Hits:
    """Policy locations one run exercised, per kind, and the chains it compiled."""

    rule: set[Key] = field(default_factory=set)
    override: set[Key] = field(default_factory=set)
    expression: set[Key] = field(default_factory=set)
    documents: dict[str, Document] = field(default_factory=dict)
    tested: set[str] = field(default_factory=set)  # the policy files cases name

    def add(self, kind: Kind, loc: Location | None) -> None:
        k = _key(loc)
        if k is not None:
            getattr(self, kind).add(k)


@dataclass
class _Outcome:
    """What running a case produced, for the expectations to check."""

    plan: Plan
    decisions: list[Decision] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    compaction_needed: str | None = None
    stepped: bool = False
    compactions: int = 0
    at_steps: list[int] = field(default_factory=list)
    steps: int = 0
    session: Session | None = None  # what the last replayed step left


@dataclass
class _Context:
    """One test file being run."""

    doc: Document
    spec: PolicyTestFile
    base: Path  # the test file's directory
    hits: _Hits
    resolved: dict[str, ResolvedPolicy]

    def at(self, *path: str | int) -> Location:
        return self.doc.locate(tuple(path))

    def at_key(self, *path: str | int) -> Location:
        return self.doc.locate_key(tuple(path))

    def roots(self) -> tuple[Path, ...]:
        """Where the test file may name files and workspaces: its own directory tree, the
        bundled policies and the operator's roots (never the working directory: a test
        file arriving by pull request must not reach what the machine running it holds)."""
        return (self.base, bundled_root(), *sandbox.operator_roots())


def find_test_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """(test files, problems): each path given is a file (taken whatever its name) or a
    directory searched for ``*.test.yaml``; a path that does not exist is a problem. A
    directory's symlinks to directories are not followed, and a test file that is a
    symlink leading out of the directory is a problem, not a test file."""
    found, problems = _find(paths)
    return [p for p, _ in found], problems


def _find(paths: Iterable[str | Path]) -> tuple[list[tuple[Path, Path | None]], list[str]]:
    """(test file, the directory it was found under or None when it was named), problems."""
    files: list[tuple[Path, Path | None]] = []
    problems: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = _walk(p, problems)
            if not found:
                problems.append(f"{raw}: no *{TEST_SUFFIX} files")
            files.extend((f, p) for f in found)
        elif p.is_file():
            files.append((p, None))
        else:
            problems.append(f"{raw}: no such file or directory")
        if len(files) > MAX_FILES:
            problems.append(f"more than {MAX_FILES:,} test files")
            return files[:MAX_FILES], problems
    return list(dict.fromkeys(files)), problems


def _walk(top: Path, problems: list[str]) -> list[Path]:
    """The ``*.test.yaml`` regular files under ``top`` that stay under it once their
    symlinks are resolved; directory symlinks are not followed (``os.walk``'s default),
    so a link to ``/`` or to ``.`` neither leaves the tree nor loops."""
    found: list[Path] = []
    for here, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(n for n in names if n.endswith(TEST_SUFFIX)):
            full = os.path.join(here, name)  # noqa: PTH118
            try:
                safefs.resolve_beneath(top, full)
            except safefs.ReadRefused as exc:
                problems.append(f"{exc} (a symlink out of {top})")
                continue
            if os.path.isfile(full):  # noqa: PTH113 - a FIFO named *.test.yaml is skipped
                found.append(Path(full))
        if len(found) > MAX_FILES:
            break
    return sorted(found)


def run_paths(
    paths: Iterable[str | Path], *, select: str | None = None
) -> tuple[RunReport, list[str]]:
    """Run every test file under ``paths`` (see :func:`find_test_files`); ``select`` keeps
    the cases whose name contains it. Returns the report and the paths that gave nothing.
    A test file found under a directory is read beneath it without following a symlink."""
    files, problems = _find(paths)
    hits = _Hits()
    resolved: dict[str, ResolvedPolicy] = {}
    outcomes = tuple(_run_file(f, hits, resolved, select, root) for f, root in files)
    return RunReport(outcomes, _coverage(hits)), problems


def run_test_file(path: str | Path, *, select: str | None = None) -> RunReport:
    """Run one test file (whatever its name)."""
    hits = _Hits()
    outcome = _run_file(Path(path), hits, {}, select)
    return RunReport((outcome,), _coverage(hits))


def _run_file(
    path: Path,
    hits: _Hits,
    resolved: dict[str, ResolvedPolicy],
    select: str | None,
    root: Path | None = None,
) -> FileOutcome:
    file = str(path)
    try:
        doc = load_yaml_file(path, DEFAULT_LIMITS, root=root)
    except KiloRulesError as exc:
        return FileOutcome(file, errors=tuple(exc.diagnostics))
    errors = _refined(doc, schema_diagnostics(doc, SCHEMA))
    if errors:
        return FileOutcome(file, doc.text, errors=tuple(errors))
    try:
        spec = PolicyTestFile.model_validate(doc.data)
    except ValidationError as exc:  # the schema should have said it; kept located anyway
        diags = [
            Diagnostic("schema.invalid", f"{dotted(e['loc'])}: {e['msg']}", doc.locate(e["loc"]))
            for e in exc.errors()[:20]
        ]
        return FileOutcome(file, doc.text, errors=tuple(diags))
    ctx = _Context(doc, spec, path.resolve().parent, hits, resolved)
    errors = _static_problems(ctx)
    if errors:
        return FileOutcome(file, doc.text, errors=tuple(errors))
    cases = tuple(
        _run_case(ctx, i, case)
        for i, case in enumerate(spec.cases)
        if select is None or select in case.name
    )
    return FileOutcome(file, doc.text, cases=cases)


#: Fields that take a string or a mapping: a mapping written there is checked against the
#: mapping's schema alone, so that its errors point inside it instead of saying "expected a
#: string" at the whole value.
_EITHER = {"session": "InlineSession", "model": "ModelInfo"}


def _refined(doc: Document, errors: list[Diagnostic]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for d in errors:
        path = tuple(d.details.get("path") or ())
        name = _EITHER.get(str(path[-1])) if path else None
        value = _at_path(doc.data, path) if name else None
        if d.code != "schema.type" or not isinstance(value, dict) or name is None:
            out.append(d)
            continue
        defs = load_schema(SCHEMA)["$defs"]
        sub = Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": defs})
        found = [x for e in sub.iter_errors(value) for x in diagnose_all(e, doc, path)]
        out.extend(found or [d])
    return sorted(out, key=Diagnostic.sort_key)


def _static_problems(ctx: _Context) -> list[Diagnostic]:
    """What the schema cannot say: unique names, a policy and a model for every case,
    request paths and patterns that parse, ``error`` not mixed with result checks."""
    out: list[Diagnostic] = []
    seen: dict[str, int] = {}
    for i, case in enumerate(ctx.spec.cases):
        where = ("cases", i)
        if case.name in seen:
            out.append(
                Diagnostic(
                    "test.duplicate-case",
                    f"case name {case.name!r} is already used by cases[{seen[case.name]}]",
                    ctx.at(*where, "name"),
                )
            )
        seen.setdefault(case.name, i)
        if case.policy is None and ctx.spec.policy is None:
            out.append(_missing(ctx, where, "policy"))
        if case.model is None and ctx.spec.model is None:
            out.append(_missing(ctx, where, "model"))
        e = case.expect
        for j, check in enumerate(e.request):
            at = (*where, "expect", "request", j)
            try:
                parse_request_path(check.path)
            except ValueError as exc:
                out.append(
                    Diagnostic(
                        "test.path",
                        f"request path {check.path!r}: {exc}",
                        ctx.at(*at, "path"),
                        hint="keys by dots, list items by [n] or [-1]: messages[0].content[0].text",
                    )
                )
            given = check.model_fields_set - {"path"}
            if not given:
                out.append(
                    Diagnostic(
                        "test.check",
                        "a request check needs equals, contains, matches, exists or count",
                        ctx.at(*at),
                    )
                )
            if check.matches is not None:
                try:
                    compile_regex(check.matches, ctx.at(*at, "matches"), code="test.regex")
                except KiloRulesError as exc:
                    out.extend(exc.diagnostics)
        if e.error is not None:
            mixed = [
                k
                for k in ("decisions", "absent", "request", "compaction_needed", "replay")
                if k in e.model_fields_set
            ]
            if mixed:
                out.append(
                    Diagnostic(
                        "test.error-mixed",
                        f"expect.error cannot be combined with {', '.join(mixed)}: a run "
                        "that fails has no decisions or request to check",
                        ctx.at_key(*where, "expect", mixed[0]),
                    )
                )
        mode = _mode(case)
        if e.replay is not None and mode != "replay":
            out.append(
                Diagnostic(
                    "test.mode",
                    f"expect.replay needs mode: replay, not {mode}",
                    ctx.at(*where, "mode"),
                )
            )
    return out


def _missing(ctx: _Context, where: JsonPath, what: str) -> Diagnostic:
    return Diagnostic(
        "test.missing",
        f"case has no {what}, and the file gives no default {what}",
        ctx.at_key(*where, "name"),
        hint=f"add {what}: to the case or at the top of the file",
    )


def _mode(case: CaseSpec) -> Mode:
    if case.mode is not None:
        return case.mode
    return "replay" if case.expect.replay is not None else "apply"


def _run_case(ctx: _Context, i: int, case: CaseSpec) -> CaseOutcome:
    start = time.perf_counter()
    loc = ctx.at("cases", i, "name")
    policy_file: str | None = None
    invalid = False
    try:
        policy = _policy(ctx, i, case)
        policy_file = policy.file
        failures = _case_failures(ctx, i, case, policy)
    except _InvalidCaseError as exc:
        failures, invalid = exc.diagnostics, True
    except KiloRulesError as exc:  # the policy under test does not load
        failures = _expected_error(ctx, i, case, exc, "policy load")
    seconds = time.perf_counter() - start
    return CaseOutcome(case.name, ctx.doc.file, loc, seconds, tuple(failures), invalid, policy_file)


def _case_failures(
    ctx: _Context, i: int, case: CaseSpec, policy: ResolvedPolicy
) -> list[Diagnostic]:
    """Compile, run and check one case; raises :class:`_InvalidCaseError` for inputs the test file
    got wrong (model, session, config)."""
    model = _model(ctx, i, case)
    session = _session(ctx, i, case)
    step = _step(ctx, i, case)
    try:
        plan = compile_policy(policy, model, config=case.config)
    except KiloRulesError as exc:
        if all(d.code.startswith("config.") for d in exc.diagnostics):
            at = ctx.at("cases", i, "config")
            raise _InvalidCaseError([_relocated(d, at) for d in exc.diagnostics]) from None
        return _expected_error(ctx, i, case, exc, "compile")
    _record_compile(ctx.hits, policy, plan)
    out = _Outcome(plan)
    try:
        _execute(case, plan, session, step, out)
    except KiloRulesError as exc:
        _record_run(ctx.hits, plan, out)
        return [
            *_expected_error(ctx, i, case, exc, "run"),
            *_check_plan(ctx, i, case, plan, session, step),
        ]
    _record_run(ctx.hits, plan, out)
    failures: list[Diagnostic] = []
    if case.expect.error is not None:
        failures.append(
            Diagnostic(
                "test.error",
                f"expected the run to fail with {case.expect.error}, but it succeeded",
                ctx.at("cases", i, "expect", "error"),
                details={"case": case.name, "expected": case.expect.error, "got": None},
            )
        )
    failures.extend(_check_plan(ctx, i, case, plan, session, step))
    failures.extend(_check_outcome(ctx, i, case, out))
    return failures


def _relocated(d: Diagnostic, at: Location) -> Diagnostic:
    """A diagnostic about a value the test file gave, placed where the file gives it."""
    if d.location.file.startswith("<"):
        return Diagnostic(d.code, d.message, at, d.details, d.hint, d.severity)
    return d


def _expected_error(
    ctx: _Context, i: int, case: CaseSpec, exc: KiloRulesError, what: str
) -> list[Diagnostic]:
    codes = [d.code for d in exc.diagnostics]
    expected = case.expect.error
    if expected is not None and expected in codes:
        return []
    first = exc.diagnostics[0]
    at = (
        ctx.at("cases", i, "expect", "error")
        if expected is not None
        else ctx.at("cases", i, "name")
    )
    lead = f"expected {expected}, got " if expected is not None else f"the {what} failed: "
    return [
        Diagnostic(
            "test.error",
            f"{lead}{first.code}: {first.message} ({first.location.relative()})",
            at,
            details={
                "case": case.name,
                "expected": expected,
                "got": codes,
                "diagnostics": [d.to_json() for d in exc.diagnostics],
            },
            hint=first.hint,
        )
    ]


# -- inputs ---------------------------------------------------------------------------------


#: What a refused path's hint says.
_ROOTS_HINT = (
    "a test file names files and workspaces only under its own directory (and the bundled "
    "policies); allow another directory with --allow-read DIR (or KILO_RULES_READ_ROOTS)"
)


#: The longest path and file name the file system takes (Linux PATH_MAX and NAME_MAX, in
#: bytes): a longer one names no file, and every system call on it fails.
_MAX_PATH_BYTES = 4096
_MAX_NAME_BYTES = 255


def _path_problem(value: str) -> str | None:
    """Why ``value`` can name no file (a NUL, a path or a name too long), or None."""
    if "\x00" in value:
        return "holds a NUL byte"
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > _MAX_PATH_BYTES:
        return f"is {len(raw):,} bytes long; a path is at most {_MAX_PATH_BYTES:,}"
    if any(len(part) > _MAX_NAME_BYTES for part in raw.split(b"/")):
        return f"has a name longer than {_MAX_NAME_BYTES} bytes"
    return None


def _ref(ctx: _Context, value: str, at: Location, what: str) -> sandbox.FileRef:
    """``value`` as a path the test file names, refused with a located diagnostic when it
    can name no file (a NUL, too long: ``test.path-invalid``) or lies outside the test file's
    roots, as written or once its symlinks are resolved (``test.path-outside-roots``)."""
    why = _path_problem(value)
    if why is not None:
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise _InvalidCaseError([Diagnostic("test.path-invalid", f"{what} {shown!r} {why}", at)])
    ref = sandbox.FileRef(value, at, ctx.base)
    real, problem = sandbox.confine(ref, ctx.roots())
    if problem is not None:
        written = safefs.lexical(ref.path)
        escape = "" if written == str(real) else f" (a symlink to {real})"
        raise _InvalidCaseError(
            [
                Diagnostic(
                    "test.path-outside-roots",
                    f"{what} {value!r} is outside the directories a test file may name{escape}",
                    at,
                    problem.details,
                    _ROOTS_HINT,
                )
            ]
        )
    return ref


def _named_file(ctx: _Context, value: str, at: Location, what: str, max_bytes: int) -> Path:
    ref = _ref(ctx, value, at, what)
    try:
        return sandbox.check_file(ref, ctx.roots(), max_bytes=max_bytes, what=what)
    except KiloRulesError as exc:
        raise _InvalidCaseError(exc.diagnostics) from None


def _policy(ctx: _Context, i: int, case: CaseSpec) -> ResolvedPolicy:
    ref = case.policy or ctx.spec.policy or ""
    at = ctx.at("cases", i, "policy") if case.policy else ctx.at("policy")
    is_path = "/" in ref or "\\" in ref or ref.endswith((".yaml", ".yml"))
    target = str(_named_file(ctx, ref, at, "policy", DEFAULT_LIMITS.max_bytes)) if is_path else ref
    key = f"{target}\0{sandbox.operator_roots()}"
    hit = ctx.resolved.get(key)
    if hit is None:
        try:
            hit = resolve_policy(target)
        except PolicyError as exc:
            # An unknown bundled name or an unreadable file is the test file's mistake; a
            # policy that does not validate is what is under test (the caller fails the case).
            if not is_path or all(d.code.startswith("io.") for d in exc.diagnostics):
                raise _InvalidCaseError([_relocated(d, at) for d in exc.diagnostics]) from None
            raise
        ctx.resolved[key] = hit
    for d in hit.chain:
        ctx.hits.documents.setdefault(_abs(d.file), d)
    ctx.hits.tested.add(_abs(hit.file))
    return hit


def _model(ctx: _Context, i: int, case: CaseSpec) -> ModelInfo:
    given = case.model if case.model is not None else ctx.spec.model
    at = ctx.at("cases", i, "model") if case.model is not None else ctx.at("model")
    if isinstance(given, ModelInfo):
        return given
    assert given is not None  # _static_problems refused a case without one
    try:
        return bundled_catalog().get(given)
    except KiloRulesError as exc:
        raise _InvalidCaseError([_relocated(d, at) for d in exc.diagnostics]) from None


_DEFAULT_SESSION: dict[str, Any] = {
    "id": "policytest",
    "messages": [
        {
            "id": "msg_user_1",
            "role": "user",
            "created": 1_700_000_000_000,
            "parts": [{"type": "text", "id": "prt_user_1", "text": "Hello"}],
        }
    ],
}


def _session(ctx: _Context, i: int, case: CaseSpec) -> Session:
    where: JsonPath = ("cases", i, "session")
    given = case.session
    if given is None:
        return session_from_data(_DEFAULT_SESSION)
    if isinstance(given, str):
        at = ctx.at(*where)
        ref = _ref(ctx, given, at, "session")
        try:
            # Read through the sandbox, not by name: a directory or the file swapped for a
            # symlink after the check is refused instead of followed out of the roots.
            path, content = sandbox.read_bytes(
                ref, ctx.roots(), max_bytes=SESSION_MAX_BYTES, what="session"
            )
            return read_session_bytes(content, run=case.run, name=str(path))
        except KiloRulesError as exc:
            raise _InvalidCaseError(exc.diagnostics) from None
    raw = ctx.doc.data["cases"][i]["session"]
    data = {"version": 1, "id": given.id, **raw}
    try:
        return session_from_data(data, file=ctx.doc.file)
    except KiloRulesError as exc:
        diags = []
        for d in exc.diagnostics:
            inner: JsonPath = tuple(d.details.get("path") or ())
            diags.append(Diagnostic(d.code, d.message, ctx.at(*where, *inner), d.details, d.hint))
        raise _InvalidCaseError(diags) from None


#: The home directory of a case that gives none, relative to the test file: a directory
#: that normally does not exist, so that global instruction files (``~/.claude/CLAUDE.md``)
#: are never read from the machine running the tests, and are read from the test file's
#: tree only when a case names its ``home``.
DEFAULT_HOME = ".kilo-rules-test-home"


def _step(ctx: _Context, i: int, case: CaseSpec) -> StepInput:
    s = case.step
    w = s.workspace
    where: JsonPath = ("cases", i, "step", "workspace")

    def place(key: str, value: str) -> str:
        at = ctx.at(*where, key) if key in w.model_fields_set else ctx.at("cases", i, "name")
        return str(sandbox.confine(_ref(ctx, value, at, f"workspace {key}"), ctx.roots())[0])

    cwd = place("cwd", w.cwd)
    agent = Agent(
        name=s.agent.name,
        prompt=s.agent.prompt,
        skills_enabled=s.agent.skills_enabled,
        task_enabled=s.agent.task_enabled,
        skills=tuple(Skill(k.name, k.description) for k in s.agent.skills),
    )
    # Every directory the runtime reads instruction files under is confined to the test
    # file's roots; root defaults to the working directory and home to DEFAULT_HOME, so no
    # case reads instruction files from the machine it happens to run on.
    workspace = Workspace(
        cwd=cwd,
        root=cwd if w.root is None else place("root", w.root),
        platform=w.platform,
        is_git_repo=w.is_git_repo,
        open_files=tuple(w.open_files),
        visible_files=tuple(w.visible_files),
        home=place("home", w.home if w.home is not None else DEFAULT_HOME),
    )
    return StepInput(
        agent=agent,
        workspace=workspace,
        step=s.step,
        max_steps=s.max_steps,
        previous_agent=s.previous_agent,
        automatic_caching=s.automatic_caching,
        provider=s.provider,
        options=dict(s.options),
        fetch=_no_fetch,
    )


def _no_fetch(url: str, timeout: float, max_bytes: int) -> str:
    """Policy tests never reach the network: an instruction URL is a warning decision."""
    raise OSError(f"policy tests do not fetch {url}")


# -- executing ------------------------------------------------------------------------------


def _execute(case: CaseSpec, plan: Plan, session: Session, step: StepInput, out: _Outcome) -> None:
    mode = _mode(case)
    if mode == "apply":
        result = apply_plan(plan, session, step)
        out.decisions, out.request = list(result.decisions), result.request
        out.compaction_needed, out.stepped, out.steps = result.compaction_needed, True, 1
        return
    runtime = Runtime(plan)
    if mode == "runtime":
        sr = runtime.step(session, step)
        out.decisions, out.request = list(sr.decisions), sr.request
        out.compaction_needed, out.stepped, out.steps = sr.compaction_needed, True, 1
        out.compactions = sr.compactions
        out.at_steps = [1] if sr.compactions else []
        return
    live = session.model_copy(update={"messages": []})
    messages = list(session.messages)
    for n, msg in enumerate(messages):
        if msg.role == "assistant":
            _replay_step(runtime, live, step, out)
            live = out.session or live
        live = live.model_copy(update={"messages": [*live.messages, msg]})
        if n == len(messages) - 1 and msg.role == "user":
            _replay_step(runtime, live, step, out)


def _replay_step(runtime: Runtime, live: Session, step: StepInput, out: _Outcome) -> None:
    out.steps += 1
    out.stepped = True
    sr = runtime.step(live, step)
    out.decisions.extend(sr.decisions)
    out.request = sr.request
    out.compaction_needed = sr.compaction_needed
    out.compactions += sr.compactions
    out.at_steps.extend([out.steps] * sr.compactions)
    out.session = sr.session


# -- checking -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Plan values are frozen (tuples, read-only mappings): compare them as YAML reads."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _same(expected: Any, got: Any) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, int | float) and isinstance(got, int | float):
        return math.isclose(expected, got, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(_same(v, got[k]) for k, v in expected.items())
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(
            _same(a, b) for a, b in zip(expected, got, strict=True)
        )
    return bool(expected == got)


def _subset(expected: Any, got: Any) -> bool:
    """``expected`` matches ``got``: mappings by the keys ``expected`` gives, else equal."""
    if isinstance(expected, dict) and isinstance(got, dict):
        return all(k in got and _subset(v, got[k]) for k, v in expected.items())
    return _same(expected, got)


def _show(value: Any, limit: int = 120) -> str:
    import json

    if value is _MISSING:
        return "nothing (the path is not there)"
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fail(
    ctx: _Context,
    case: CaseSpec,
    code: str,
    message: str,
    at: Location,
    expected: Any,
    got: Any,
    hint: str | None = None,
) -> Diagnostic:
    details = {"case": case.name, "expected": _plain(expected), "got": _plain(got)}
    if got is _MISSING:
        details["got"] = None
    return Diagnostic(code, message, at, details, hint)


def _plan_value(plan: Plan, name: str, step_values: Any) -> tuple[Any, Location | None]:
    """(value, where the policy sets it) of a plan name; see docs/testing-policies.md for
    the order names are looked up in."""
    v = plan.values.get(name)
    if v is not None:
        if not v.dynamic:
            return _plain(v.value), v.location
        return _plain(step_values().get(name, _MISSING)), v.location
    steps = tuple(name.split("."))
    data = _at_path(plan.data, steps)
    if data is not _MISSING:
        return _plain(data), plan.where(name)
    return _plain(_at_path(plan.to_json(), steps)), None


def _check_plan(
    ctx: _Context, i: int, case: CaseSpec, plan: Plan, session: Session, step: StepInput
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    cached: dict[str, Any] = {}

    def step_values() -> dict[str, Any]:
        if "ctx" not in cached:
            cached["ctx"] = run_stages(plan, session, step, until="guards").context
        ctx_values: dict[str, Any] = cached["ctx"]
        return ctx_values

    for name, expected in case.expect.plan.items():
        at = ctx.at("cases", i, "expect", "plan", name)
        try:
            got, where = _plan_value(plan, name, step_values)
        except KiloRulesError as exc:
            out.extend(_expected_error(ctx, i, case, exc, "step"))
            continue
        if where is not None:
            ctx.hits.add("rule", where)
            ctx.hits.add("expression", where)
        if got is _MISSING:
            out.append(
                _fail(
                    ctx,
                    case,
                    "test.plan",
                    f"the plan has no value {name!r}",
                    at,
                    expected,
                    got,
                    hint="a value name (budget.usable), a setting of the policy "
                    "(system.instructions.project_files) or a field of `kilo-rules plan "
                    "--format json` (overrides, prompt.rule, cache.enabled)",
                )
            )
        elif not _same(_plain(expected), got):
            out.append(
                _fail(
                    ctx,
                    case,
                    "test.plan",
                    f"{name}: expected {_show(expected)}, got {_show(got)}",
                    at,
                    expected,
                    got,
                )
            )
    return out


def _matches(m: DecisionMatch, d: Decision) -> bool:
    if d.rule != m.rule:
        return False
    if m.stage is not None and d.stage != m.stage:
        return False
    if m.severity is not None and d.severity != m.severity:
        return False
    return "result" not in m.model_fields_set or _subset(_plain(m.result), _plain(d.result))


def _describe(m: DecisionMatch) -> str:
    out = f"rule {m.rule!r}"
    if m.stage is not None:
        out += f" in stage {m.stage!r}"
    if "result" in m.model_fields_set:
        out += f" with result {_show(m.result)}"
    if m.severity is not None:
        out += f" ({m.severity})"
    return out


def _check_outcome(ctx: _Context, i: int, case: CaseSpec, out: _Outcome) -> list[Diagnostic]:
    e = case.expect
    base: JsonPath = ("cases", i, "expect")
    fails: list[Diagnostic] = []
    for j, m in enumerate(e.decisions):
        if not any(_matches(m, d) for d in out.decisions):
            same_rule = [d.to_json() for d in out.decisions if d.rule == m.rule]
            rules = sorted({d.rule for d in out.decisions})
            got: Any = same_rule or rules
            seen = (
                f"decisions of that rule: {_show([g['result'] for g in same_rule])}"
                if same_rule
                else f"rules decided: {', '.join(rules) or 'none'}"
            )
            fails.append(
                _fail(
                    ctx,
                    case,
                    "test.decision",
                    f"expected a decision {_describe(m)}; {seen}",
                    ctx.at(*base, "decisions", j),
                    m.model_dump(exclude_unset=True),
                    got,
                )
            )
    for j, m in enumerate(e.absent):
        found = [d for d in out.decisions if _matches(m, d)]
        if found:
            fails.append(
                _fail(
                    ctx,
                    case,
                    "test.absent",
                    f"expected no decision {_describe(m)}, got {_show(found[0].to_json())}",
                    ctx.at(*base, "absent", j),
                    None,
                    found[0].to_json(),
                )
            )
    for j, check in enumerate(e.request):
        fails.extend(_check_request(ctx, case, (*base, "request", j), check, out.request))
    if "compaction_needed" in e.model_fields_set and e.compaction_needed != out.compaction_needed:
        fails.append(
            _fail(
                ctx,
                case,
                "test.compaction",
                f"compaction_needed: expected {_show(e.compaction_needed)}, "
                f"got {_show(out.compaction_needed)}",
                ctx.at(*base, "compaction_needed"),
                e.compaction_needed,
                out.compaction_needed,
            )
        )
    if e.replay is not None:
        r = e.replay
        got_values = {"compactions": out.compactions, "at_steps": out.at_steps, "steps": out.steps}
        for key in ("compactions", "at_steps", "steps"):
            want = getattr(r, key)
            if want is not None and not _same(want, got_values[key]):
                fails.append(
                    _fail(
                        ctx,
                        case,
                        "test.replay",
                        f"replay {key}: expected {_show(want)}, got {_show(got_values[key])}",
                        ctx.at(*base, "replay", key),
                        want,
                        got_values[key],
                    )
                )
    return fails


def _check_request(
    ctx: _Context, case: CaseSpec, where: JsonPath, check: RequestCheck, body: dict[str, Any]
) -> list[Diagnostic]:
    steps = parse_request_path(check.path)
    got = _at_path(body, steps)
    given = check.model_fields_set
    fails: list[Diagnostic] = []

    def fail(key: str, what: str, expected: Any) -> None:
        fails.append(
            _fail(
                ctx,
                case,
                "test.request",
                f"{check.path}: expected {what}, got {_show(got)}",
                ctx.at(*where, key),
                expected,
                got,
            )
        )

    if "exists" in given and check.exists is not None and check.exists != (got is not _MISSING):
        fail("exists", "the path to be there" if check.exists else "nothing there", check.exists)
    if "equals" in given and (got is _MISSING or not _same(_plain(check.equals), got)):
        fail("equals", _show(check.equals), check.equals)
    if "contains" in given and not _contains(got, _plain(check.contains)):
        fail("contains", f"a value containing {_show(check.contains)}", check.contains)
    if check.matches is not None:
        pattern = compile_regex(check.matches, ctx.at(*where, "matches"), code="test.regex")
        if not (isinstance(got, str) and pattern.search(got) is not None):
            fail("matches", f"a string matching {check.matches!r}", check.matches)
    if check.count is not None:
        size = len(got) if isinstance(got, list | dict | str) else None
        if size != check.count:
            fails.append(
                _fail(
                    ctx,
                    case,
                    "test.request",
                    f"{check.path}: expected {check.count} item(s), got "
                    + (f"{size}" if size is not None else _show(got)),
                    ctx.at(*where, "count"),
                    check.count,
                    size,
                )
            )
    return fails


def _contains(got: Any, expected: Any) -> bool:
    if isinstance(got, str):
        return isinstance(expected, str) and expected in got
    if isinstance(got, list):
        return any(_subset(expected, item) for item in got)
    if isinstance(got, dict):
        return _subset(expected, got) if isinstance(expected, dict) else expected in got
    return False


# -- coverage -------------------------------------------------------------------------------


def _record_compile(hits: _Hits, policy: ResolvedPolicy, plan: Plan) -> None:
    """What compiling exercised: override conditions, the overrides applied, every
    expression decided for the model, the prompt rules tried, layer conditions."""
    applied = list(plan.overrides)
    for i, ov in enumerate(policy.data.get("overrides") or []):
        hits.add("expression", policy.locate(("overrides", i, "when")))
        name = ov.get("name") or f"overrides[{i}]"
        if name in applied:
            applied.remove(name)
            hits.add("override", policy.locate(("overrides", i)))
    for v in plan.values.values():
        if v.expression is not None and not v.dynamic:
            hits.add("expression", v.location)
    rules = _at_path(plan.data, ("prompts", "rules"))
    if isinstance(rules, list | tuple) and plan.prompt is not None:
        for i, rule in enumerate(rules):
            when = _locate(plan, ("prompts", "rules", i, "when"))
            hits.add("expression", when)
            if when == plan.prompt.location:
                for key in (rule.get("replace") or {}) if isinstance(rule, Mapping) else {}:
                    hits.add("expression", _locate(plan, ("prompts", "rules", i, "replace", key)))
                break
    conditional = {layer.location for layer in plan.layers if layer.condition is not None}
    layers = _at_path(plan.data, ("system", "layers"))
    for i, layer in enumerate(layers if isinstance(layers, list | tuple) else ()):
        if (
            isinstance(layer, Mapping)
            and isinstance(layer.get("when"), str)
            and _locate(plan, ("system", "layers", i)) not in conditional
        ):
            hits.add("expression", _locate(plan, ("system", "layers", i, "when")))


def _locate(plan: Plan, path: JsonPath) -> Location:
    return plan._locate(path)


def _record_run(hits: _Hits, plan: Plan, out: _Outcome) -> None:
    """What the steps exercised: every decision's rule, the per-step expressions, the
    layers that gave text, the family prompt sent."""
    for d in out.decisions:
        hits.add("rule", d.at)
        hits.add("expression", d.at)
    if not out.stepped:
        return
    for v in plan.values.values():
        if v.dynamic:
            hits.add("expression", v.location)
    by_id = {layer.id: layer for layer in plan.layers}
    layers = _at_path(plan.data, ("system", "layers"))
    for i in range(len(layers) if isinstance(layers, list | tuple) else 0):
        loc = _locate(plan, ("system", "layers", i))
        if any(lp.location == loc and lp.condition is not None for lp in plan.layers):
            hits.add("expression", _locate(plan, ("system", "layers", i, "when")))
    for d in out.decisions:
        if d.stage == "system" and d.rule == "layers":
            for layer_id in d.inputs.get("layers") or []:
                lp = by_id.get(str(layer_id))
                if lp is not None:
                    hits.add("rule", lp.location)
            if plan.prompt is not None and d.result.get("family_prompt") == plan.prompt.rule:
                hits.add("rule", plan.prompt.location)


#: Lists whose items are rules of their own; any other list is one setting.
_RULE_LISTS = {("system", "layers"): "id", ("prompts", "rules"): "name"}


def _items(doc: Document) -> list[CoverageItem]:
    """Every rule, override and expression written in one policy file."""
    data = doc.data if isinstance(doc.data, dict) else {}
    out: list[CoverageItem] = []
    stack: list[tuple[JsonPath, Any]] = [
        ((k,), data[k]) for k in (*VALUE_SECTIONS, "prompts") if k in data
    ]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in value.items())
        elif path in _RULE_LISTS and isinstance(value, list):
            label = _RULE_LISTS[path]
            for i, item in enumerate(value):
                name = item.get(label) if isinstance(item, dict) else None
                at = (*path, i, "when") if path == ("prompts", "rules") else (*path, i)
                out.append(CoverageItem(doc.locate(at), "rule", f"{dotted(path)}[{name or i}]"))
        else:
            out.append(CoverageItem(doc.locate(path), "rule", dotted(path)))
    for i, ov in enumerate(data.get("overrides") or []):
        name = ov.get("name") if isinstance(ov, dict) else None
        where = doc.locate(("overrides", i))
        out.append(CoverageItem(where, "override", name or f"overrides[{i}]"))
    for path, _ in expression_fields(data):
        out.append(CoverageItem(doc.locate(path), "expression", dotted(path)))
    return sorted(out)


def _coverage(hits: _Hits) -> Coverage:
    files = []
    bundled = Path(_abs(str(bundled_root())))
    for file, doc in sorted(hits.documents.items()):
        if file == _abs(str(bundled_root() / "models.yaml")):
            continue
        items = tuple(_items(doc))
        covered = frozenset(i for i in items if _key(i.location) in getattr(hits, i.kind))
        base = file not in hits.tested and Path(file).is_relative_to(bundled)
        files.append(FileCoverage(doc.file, items, covered, base))
    # The user's own files first, then the bundled bases they reach, whatever the paths
    # sort as (a checkout under /a sorts before the site-packages of the bundled policies).
    return Coverage(tuple(sorted(files, key=lambda f: f.base)))
