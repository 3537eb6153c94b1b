"""Machine-readable outputs of diagnostics: one place for every ``--format``.

``text``, ``json`` and ``github`` are the renderings of :mod:`kilo_rules.engine.base.errors`; this
module adds SARIF 2.1.0 (GitHub code scanning and other static-analysis dashboards) and
JUnit XML (the test report most CI systems show), and :func:`render` picks one by name.
Commands that report diagnostics (``check``, ``verify``, ``test``, ``diff``) all go through
here, so a format means the same thing everywhere.

Nothing here reads files or the environment except the working directory, which is the
default base that SARIF paths are made relative to.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kilo_rules.engine.base.errors import Diagnostic, render_github, render_json, render_text
from kilo_rules.engine.base.version import __version__

__all__ = [
    "FORMATS",
    "SARIF_SCHEMA",
    "SARIF_VERSION",
    "CaseResult",
    "SuiteResult",
    "diagnostics_suite",
    "render",
    "to_junit",
    "to_sarif",
]

#: Every output format, in the order ``--help`` lists them.
FORMATS = ("text", "json", "github", "sarif", "junit")

SARIF_VERSION = "2.1.0"
#: The ``$schema`` written into every SARIF log (the schema's published address).
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

#: The uriBaseId that relative artifact URIs are resolved against.
SRCROOT = "%SRCROOT%"

#: Short descriptions of diagnostic code families, used for SARIF rules when the caller
#: gives none: a dashboard needs a readable name for every rule.
_FAMILIES = {
    "bundle": "policy bundle check",
    "catalog": "model catalog problem",
    "check": "policy check",
    "compile": "policy does not compile for the model",
    "config": "invalid config value",
    "eval": "expression failed while evaluated",
    "expr": "expression does not parse or type-check",
    "import": "agent log could not be imported",
    "io": "file could not be read or written",
    "policy": "policy problem",
    "routes": "routes file problem",
    "schema": "value does not follow the JSON Schema",
    "session": "session does not follow Session v1",
    "test": "policy test",
    "verify": "policy verification",
    "yaml": "YAML syntax or limits",
}


@dataclass(frozen=True)
class CaseResult:
    """One JUnit test case: passed, failed with ``failures``, or ``skipped`` (the reason).

    ``file`` and ``line`` say where the case is defined (shown by CI systems that link to
    source); ``output`` becomes the case's ``system-out``."""

    name: str
    classname: str
    seconds: float = 0.0
    failures: tuple[Diagnostic, ...] = ()
    skipped: str | None = None
    file: str | None = None
    line: int | None = None
    output: str = ""


@dataclass(frozen=True)
class SuiteResult:
    """One JUnit test suite: a name and its cases."""

    name: str
    cases: tuple[CaseResult, ...]


# --- SARIF -----------------------------------------------------------------------------


def _level(diag: Diagnostic) -> str:
    return {"error": "error", "warning": "warning"}.get(diag.severity, "note")


def _rule_text(code: str, rules: Mapping[str, str]) -> str:
    if code in rules:
        return rules[code]
    family = code.split(".", 1)[0]
    return _FAMILIES.get(family, f"kilo-rules diagnostic {code}")


def _artifact(file: str, base: Path) -> dict[str, Any] | None:
    """The artifactLocation of ``file``: relative to ``base`` under %SRCROOT% when it is
    inside it, else an absolute ``file:`` URI; None for pseudo-files such as ``<stdin>``."""
    if not file or file.startswith("<"):
        return None
    if "!/" in file:
        # A bundle member has no file of its own on disk; point at the bundle.
        file = file.split("!/", 1)[0]
    path = Path(file)
    try:
        absolute = (path if path.is_absolute() else base / path).resolve()
    except (OSError, RuntimeError):
        return {"uri": quote(path.as_posix())}
    try:
        rel = absolute.relative_to(base)
    except ValueError:
        return {"uri": absolute.as_uri()}
    return {"uri": quote(rel.as_posix()), "uriBaseId": SRCROOT}


def _region(diag: Diagnostic) -> dict[str, int] | None:
    loc = diag.location
    if loc.line < 1:
        return None
    region = {"startLine": loc.line}
    if loc.col >= 1:
        region["startColumn"] = loc.col
    if loc.end_line is not None and loc.end_line >= loc.line:
        region["endLine"] = loc.end_line
        # Location.end_col is exclusive, as SARIF's endColumn is.
        end_col = loc.end_col
        if end_col is not None and end_col >= 1 and (loc.end_line > loc.line or end_col > loc.col):
            region["endColumn"] = end_col
    return region


def _result(diag: Diagnostic, index: int, base: Path) -> dict[str, Any]:
    # GitHub shows only the message text, so the hint goes there as well as in properties.
    text = diag.message if not diag.hint else f"{diag.message}\nhint: {diag.hint}"
    result: dict[str, Any] = {
        "ruleId": diag.code,
        "ruleIndex": index,
        "level": _level(diag),
        "message": {"text": text},
    }
    artifact = _artifact(diag.location.file, base)
    if artifact is not None:
        physical: dict[str, Any] = {"artifactLocation": artifact}
        region = _region(diag)
        if region is not None:
            physical["region"] = region
        result["locations"] = [{"physicalLocation": physical}]
    props: dict[str, Any] = {}
    if diag.hint:
        props["hint"] = diag.hint
    if diag.details:
        props["details"] = json.loads(json.dumps(dict(diag.details), default=str))
    if artifact is None or "!/" in diag.location.file:
        props["location"] = str(diag.location)
    if props:
        result["properties"] = props
    return result


def to_sarif(
    diagnostics: Sequence[Diagnostic],
    *,
    tool: str = "kilo-rules",
    rules: Mapping[str, str] | None = None,
    base: Path | None = None,
) -> dict[str, Any]:
    """A SARIF 2.1.0 log of ``diagnostics``: one run by ``tool``, one rule per diagnostic
    code (``rules`` maps codes to short descriptions; families of codes have defaults),
    one result per diagnostic.

    Files under ``base`` (default: the working directory) are given relative to it, with
    ``uriBaseId`` ``%SRCROOT%``, as code scanning expects paths relative to the repository;
    others get absolute ``file:`` URIs. A hint is appended to the message text and kept in
    the result's ``properties``."""
    version = __version__

    root = (base or Path.cwd()).resolve()
    given = dict(rules or {})
    codes = sorted({d.code for d in diagnostics} | set(given))
    index = {code: i for i, code in enumerate(codes)}
    driver: dict[str, Any] = {
        "name": tool,
        "version": version,
        "rules": [
            {"id": code, "shortDescription": {"text": _rule_text(code, given)}} for code in codes
        ],
    }
    ordered = sorted(diagnostics, key=Diagnostic.sort_key)
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {"driver": driver},
                "originalUriBaseIds": {SRCROOT: {"uri": root.as_uri().rstrip("/") + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": [_result(d, index[d.code], root) for d in ordered],
            }
        ],
    }


# --- JUnit -----------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _failure_text(diags: Sequence[Diagnostic]) -> str:
    lines = []
    for d in diags:
        lines.append(str(d))
        if d.hint:
            lines.append(f"  hint: {d.hint}")
    return "\n".join(lines)


def _case_element(case: CaseResult) -> ET.Element:
    attrs = {"name": case.name, "classname": case.classname, "time": _seconds(case.seconds)}
    if case.file is not None:
        attrs["file"] = case.file
    if case.line is not None:
        attrs["line"] = str(case.line)
    element = ET.Element("testcase", attrs)
    if case.failures:
        first = case.failures[0]
        message = str(first)
        if len(case.failures) > 1:
            message += f" (and {len(case.failures) - 1} more)"
        failure = ET.SubElement(element, "failure", {"message": message, "type": first.code})
        failure.text = _failure_text(case.failures)
    elif case.skipped is not None:
        ET.SubElement(element, "skipped", {"message": case.skipped})
    if case.output:
        ET.SubElement(element, "system-out").text = case.output
    return element


def _counts(cases: Sequence[CaseResult]) -> dict[str, str]:
    failed = sum(1 for c in cases if c.failures)
    skipped = sum(1 for c in cases if not c.failures and c.skipped is not None)
    return {
        "tests": str(len(cases)),
        "failures": str(failed),
        "errors": "0",
        "skipped": str(skipped),
        "time": _seconds(sum(c.seconds for c in cases)),
    }


def to_junit(suites: Sequence[SuiteResult]) -> str:
    """JUnit XML of ``suites``: ``testsuites`` > ``testsuite`` > ``testcase``, each with the
    counts (tests, failures, errors, skipped) and times CI systems read.

    A failing case has one ``failure`` element: its message is the first diagnostic
    (``file:line:col: error[code]: message``), its text every diagnostic with its hint."""
    root = ET.Element("testsuites", {"name": "kilo-rules"})
    every: list[CaseResult] = []
    for suite in suites:
        element = ET.SubElement(root, "testsuite", {"name": suite.name, **_counts(suite.cases)})
        element.extend(_case_element(case) for case in suite.cases)
        every.extend(suite.cases)
    root.attrib.update(_counts(every))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")


def _file_key(file: str) -> str:
    if not file or file.startswith("<"):
        return file
    try:
        return str(Path(file).resolve())
    except (OSError, RuntimeError):
        return file


def diagnostics_suite(
    name: str, files: Sequence[str], diagnostics: Sequence[Diagnostic]
) -> SuiteResult:
    """The diagnostics of a run over ``files`` as a JUnit suite: one case per file, failing
    with the errors located in it, its warnings as ``system-out``. Diagnostics located in
    a file not listed (a base reached through ``extends:``, or no file at all) get a case
    of their own per file, so none is lost."""
    by_key: dict[str, list[Diagnostic]] = {}
    shown: dict[str, str] = {}
    for f in files:
        key = _file_key(f)
        if key not in by_key:
            by_key[key] = []
            shown[key] = f
    for d in sorted(diagnostics, key=Diagnostic.sort_key):
        key = _file_key(d.location.file)
        if key not in by_key:
            by_key[key] = []
            shown[key] = d.location.file
        by_key[key].append(d)
    cases = []
    for key, diags in by_key.items():
        errors = tuple(d for d in diags if d.severity == "error")
        others = [d for d in diags if d.severity != "error"]
        cases.append(
            CaseResult(
                name=shown[key],
                classname=name,
                failures=errors,
                file=shown[key] if not shown[key].startswith("<") else None,
                line=errors[0].location.line if errors else None,
                output=_failure_text(others),
            )
        )
    return SuiteResult(name, tuple(cases))


# --- any format ------------------------------------------------------------------------


def render(
    diagnostics: Sequence[Diagnostic],
    fmt: str,
    *,
    sources: Mapping[str, str] | None = None,
    files: Sequence[str] = (),
    tool: str = "kilo-rules",
    suite: str = "kilo-rules",
) -> str:
    """``diagnostics`` in ``fmt``, one of :data:`FORMATS`.

    ``sources`` (file -> text) gives ``text`` its source lines and carets; ``files`` are
    the files looked at, each a JUnit case (passing when nothing is located in it);
    ``tool`` names the SARIF driver and ``suite`` the JUnit suite. ``text`` and ``github``
    of no diagnostics are empty strings; the other formats always produce a document."""
    if fmt == "text":
        return render_text(diagnostics, sources)
    if fmt == "json":
        return render_json(diagnostics)
    if fmt == "github":
        return render_github(diagnostics)
    if fmt == "sarif":
        return json.dumps(to_sarif(diagnostics, tool=tool), indent=2, ensure_ascii=False)
    if fmt == "junit":
        return to_junit([diagnostics_suite(suite, files, diagnostics)])
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
