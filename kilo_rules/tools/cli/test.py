"""``kilo-rules test PATH...``: run policy unit tests (``*.test.yaml``), like ``opa test``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kilo_rules.engine.base.errors import Location
from kilo_rules.tools.checking.policytest import (
    CaseOutcome,
    Coverage,
    FileOutcome,
    RunReport,
    run_paths,
)
from kilo_rules.tools.checking.report import FORMATS, CaseResult, SuiteResult, render, to_junit
from kilo_rules.tools.cli._options import Subcommands, add_allow_read, add_command
from kilo_rules.tools.cli._runner import EXIT_USAGE, relative


def register(sub: Subcommands) -> None:
    """Add ``test`` to the subcommands."""
    p = add_command(
        sub,
        "test",
        summary="run policy unit tests (*.test.yaml)",
        description="Run the cases of policy test files: compile a policy for a model, "
        "run it on a session, check plan values, decisions, the request and compaction. "
        "Directories are searched for *.test.yaml. Exit 0 when every case passes, 1 when "
        "one fails, 2 when a test file (or a case's model, session or config) is invalid.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="test files or directories")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="output format (default: text); junit: JUnit XML for CI, github: workflow "
        "annotations, sarif: SARIF 2.1.0 (the last two list failures only)",
    )
    p.add_argument(
        "--coverage",
        action="store_true",
        help="report which rules, overrides and expressions of each policy file the cases "
        "exercised (in the text and json output; on stderr for the other formats); a "
        "bundled policy the cases reach only through extends is summarised in one line",
    )
    p.add_argument(
        "--coverage-all",
        action="store_true",
        help="--coverage, listing what is not covered in the bundled bases too",
    )
    p.add_argument(
        "--case",
        default=None,
        metavar="TEXT",
        help="run only the cases whose name contains TEXT",
    )
    p.add_argument(
        "--verbose", action="store_true", help="text: list passing cases too (default: failures)"
    )
    add_allow_read(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the tests and print the report; the exit code says how they went."""
    report, problems = run_paths(args.paths, select=args.case)
    args.coverage = args.coverage or args.coverage_all
    for problem in problems:
        print(f"kilo-rules test: {problem}", file=sys.stderr)
    fmt = args.format
    if fmt == "text":
        print(
            text_report(
                report,
                verbose=args.verbose,
                coverage=args.coverage,
                coverage_all=args.coverage_all,
            )
        )
    elif fmt == "json":
        print(json.dumps(report.to_json(coverage=args.coverage), indent=2, ensure_ascii=False))
    elif fmt == "junit":
        print(junit_report(report))
    else:
        out = render(
            relative(report.diagnostics()), fmt, tool="kilo-rules", suite="kilo-rules test"
        )
        if out:
            print(out)
    if args.coverage and fmt not in ("text", "json"):
        print(coverage_text(report.coverage, every_file=args.coverage_all), file=sys.stderr)
    if fmt != "text":
        print(summary_line(report), file=sys.stderr)
    if problems and not report.files:
        return EXIT_USAGE
    return max(report.exit_code, EXIT_USAGE if problems else 0)


def _rel(file: str) -> str:
    return Location(file, 1, 1).relative().file


def summary_line(report: RunReport) -> str:
    """``PASS: 12/13, FAIL: 1, ERROR: 0`` (errors: invalid files and cases)."""
    cases = report.cases
    passed = sum(1 for c in cases if c.passed)
    failed = sum(1 for c in cases if not c.passed and not c.invalid)
    errors = sum(1 for c in cases if c.invalid) + sum(1 for f in report.files if f.errors)
    return f"PASS: {passed}/{len(cases)}, FAIL: {failed}, ERROR: {errors}"


def text_report(
    report: RunReport,
    *,
    verbose: bool = False,
    coverage: bool = False,
    coverage_all: bool = False,
) -> str:
    """The run for people: each file, its failing cases with located failures (source
    lines and carets), then the summary and, when asked, the coverage (``coverage_all``:
    the bundled bases' uncovered items too)."""
    lines: list[str] = []
    for f in report.files:
        sources = {_rel(f.file): f.text} if f.text else {}
        if f.errors:
            lines.append(f"{_rel(f.file)}: invalid test file")
            lines.append(_indent(render(relative(f.errors), "text", sources=sources)))
            continue
        shown = [c for c in f.cases if verbose or not c.passed]
        if shown:
            lines.append(f"{_rel(f.file)}:")
        for c in shown:
            status = "PASS" if c.passed else ("ERROR" if c.invalid else "FAIL")
            lines.append(f"  {status}  {c.name} ({c.seconds:.3f}s)")
            if c.failures:
                text = render(relative(c.failures), "text", sources=sources)
                lines.append(_indent(text, "      "))
    if lines:
        lines.append("-" * 60)
    lines.append(summary_line(report))
    if coverage or coverage_all:
        lines.append(coverage_text(report.coverage, every_file=coverage_all))
    return "\n".join(lines)


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line if line else line for line in text.splitlines())


def coverage_text(coverage: Coverage, *, every_file: bool = False) -> str:
    """Per policy file: covered/total rules, overrides and expressions, then every
    uncovered item as ``file:line kind name``. A bundled base no case tests itself is one
    line, as coverage.py leaves installed packages out, unless ``every_file``."""
    lines = ["coverage:"]
    if not coverage.files:
        lines.append("  (no policy was compiled)")
    for f in coverage.files:
        counts = ", ".join(
            f"{kind}s {c}/{t}"
            for kind in ("rule", "override", "expression")
            for c, t in [f.counts(kind)]
        )
        if f.base and not every_file:
            lines.append(
                f"  {_rel(f.file)} (bundled base): {f.percent():.1f}% ({counts}); "
                "--coverage-all lists what is not covered"
            )
            continue
        lines.append(f"  {_rel(f.file)}: {f.percent():.1f}% ({counts})")
        for item in f.uncovered:
            where = f"{_rel(item.location.file)}:{item.location.line}"
            lines.append(f"    not covered: {where}  {item.kind} {item.name}")
    return "\n".join(lines)


def _case_result(f: FileOutcome, c: CaseOutcome) -> CaseResult:
    return CaseResult(
        name=c.name,
        classname=_rel(f.file),
        seconds=c.seconds,
        failures=tuple(relative(c.failures)),
        file=_rel(f.file),
        line=c.location.line,
    )


def junit_suites(report: RunReport) -> list[SuiteResult]:
    """One JUnit suite per test file, one case per test case; an invalid file is one
    failing case holding its errors."""
    suites = []
    for f in report.files:
        cases: Sequence[CaseResult]
        if f.errors:
            errors = tuple(relative(f.errors))
            first = errors[0].location.line
            cases = [
                CaseResult("(test file)", _rel(f.file), 0.0, errors, None, _rel(f.file), first)
            ]
        else:
            cases = [_case_result(f, c) for c in f.cases]
        suites.append(SuiteResult(_rel(f.file), tuple(cases)))
    return suites


def junit_report(report: RunReport) -> str:
    """The run as JUnit XML."""
    return to_junit(junit_suites(report))
