"""Machine-readable outputs (``kilo_rules.tools.checking.report``): SARIF checked against the
official SARIF 2.1.0 schema, JUnit XML read back, and ``kilo-rules check`` in every format.

The schema fixture is the SARIF 2.1.0 JSON Schema as published (schemastore's
``sarif-2.1.0-rtm.5``, the final 2.1.0 text); it is committed so the tests need no network.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kilo_rules import __version__
from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.tools.checking.check import check_paths
from kilo_rules.tools.checking.report import (
    FORMATS,
    CaseResult,
    SuiteResult,
    diagnostics_suite,
    render,
    to_junit,
    to_sarif,
)
from kilo_rules.tools.cli import main

HERE = Path(__file__).parent
SCHEMA: dict[str, Any] = json.loads(
    (HERE / "fixtures" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8")
)
CORPUS = HERE / "corpus" / "broken_policies.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))["cases"]

BAD = "version: 1\nname: p\ncompaction:\n  tail_turn: 3\n"
GOOD = "version: 1\nname: good\nextends: kilo-default\n"


def _validate_sarif(log: dict[str, Any]) -> None:
    # The validator class follows the schema's own $schema draft, so a fixture of another
    # draft is checked by its own rules; no $ref leaves the document, so nothing is fetched.
    validator_class = jsonschema.validators.validator_for(SCHEMA)
    assert SCHEMA["$schema"].startswith("http://json-schema.org/draft-04/")
    assert validator_class is jsonschema.Draft4Validator
    validator_class.check_schema(SCHEMA)
    errors = sorted(validator_class(SCHEMA).iter_errors(log), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def _lay_out_corpus(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every corpus case that is plain text (the generated giants are left to the corpus
    test), each in a directory of its own under ``root``."""
    laid = []
    for i, case in enumerate(CASES):
        if case.get("generate") or case.get("check"):
            continue
        case_dir = root / f"case{i:03d}"
        for name, content in case["files"].items():
            target = case_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        laid.append((case_dir, case))
    return laid


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Diagnostic], Any]:
    """One ``check`` over the whole broken-policy corpus, and its SARIF log."""
    root = tmp_path_factory.mktemp("corpus").resolve()
    laid = _lay_out_corpus(root)
    report = check_paths([str(root)])
    assert report.diagnostics and not report.usage_errors
    log = to_sarif(report.diagnostics, base=root)
    return root, report.diagnostics, (log, laid)


def test_sarif_of_the_corpus_follows_the_official_schema(corpus_run: Any) -> None:
    _, _, (log, _) = corpus_run
    _validate_sarif(log)
    # And after a round trip through the text the CLI prints.
    _validate_sarif(json.loads(json.dumps(log, indent=2)))


def test_sarif_has_every_diagnostic_with_its_location(corpus_run: Any) -> None:
    root, diags, (log, _) = corpus_run
    (run,) = log["runs"]
    results = run["results"]
    assert len(results) == len(diags)
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rules == sorted({d.code for d in diags})
    assert run["tool"]["driver"]["version"] == __version__
    by_key = {
        (
            r["ruleId"],
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            r["locations"][0]["physicalLocation"]["region"]["startLine"],
            r["locations"][0]["physicalLocation"]["region"]["startColumn"],
        ): r
        for r in results
    }
    for d in diags:
        uri = Path(d.location.file).resolve().relative_to(root).as_posix()
        result = by_key[(d.code, uri, d.location.line, d.location.col)]
        assert result["message"]["text"].startswith(d.message)
        assert result["level"] == d.severity
        assert rules[result["ruleIndex"]] == d.code
        art = result["locations"][0]["physicalLocation"]["artifactLocation"]
        assert art["uriBaseId"] == "%SRCROOT%"
        if d.hint:
            assert result["properties"]["hint"] == d.hint
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root.as_uri() + "/"


def test_sarif_holds_every_error_the_corpus_expects(corpus_run: Any) -> None:
    root, _, (log, laid) = corpus_run
    results = log["runs"][0]["results"]
    for case_dir, case in laid:
        prefix = case_dir.relative_to(root).as_posix() + "/"
        mine = [
            r
            for r in results
            if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith(prefix)
        ]
        for want in case["want_errors"]:
            found = [
                r
                for r in mine
                if r["ruleId"] == want["code"]
                and want["message"] in r["message"]["text"]
                and r["level"] == "error"
                and (
                    "line" not in want
                    or r["locations"][0]["physicalLocation"]["region"]["startLine"] == want["line"]
                )
            ]
            assert found, f"{case['note']}: no SARIF result for {want}"


def test_sarif_regions_files_outside_the_base_and_pseudo_files(tmp_path: Path) -> None:
    inside = tmp_path / "a" / "p q.yaml"
    diags = [
        Diagnostic("expr.type", "bad", Location(str(inside), 3, 5, 3, 9), hint="use an int"),
        Diagnostic(
            "x.other", "elsewhere", Location("/nowhere/else.yaml", 2, 1), severity="warning"
        ),
        Diagnostic("io.read", "no file", Location("<stdin>", 1, 1)),
        Diagnostic(
            "bundle.digest", "bad member", Location(str(tmp_path / "b.tar.gz!/p.yaml"), 1, 1)
        ),
    ]
    log = to_sarif(diags, base=tmp_path, rules={"expr.type": "wrong type"})
    _validate_sarif(log)
    results = {r["ruleId"]: r for r in log["runs"][0]["results"]}
    phys = results["expr.type"]["locations"][0]["physicalLocation"]
    assert phys["artifactLocation"] == {"uri": "a/p%20q.yaml", "uriBaseId": "%SRCROOT%"}
    assert phys["region"] == {"startLine": 3, "startColumn": 5, "endLine": 3, "endColumn": 9}
    assert results["expr.type"]["message"]["text"] == "bad\nhint: use an int"
    other = results["x.other"]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert other == {"uri": "file:///nowhere/else.yaml"}
    assert results["x.other"]["level"] == "warning"
    assert "locations" not in results["io.read"]
    assert results["io.read"]["properties"]["location"] == "<stdin>:1:1"
    member = results["bundle.digest"]
    assert member["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "b.tar.gz"
    assert member["properties"]["location"].endswith("b.tar.gz!/p.yaml:1:1")
    rules = {
        r["id"]: r["shortDescription"]["text"] for r in log["runs"][0]["tool"]["driver"]["rules"]
    }
    assert rules["expr.type"] == "wrong type"
    assert rules["io.read"]
    assert rules["x.other"]


def test_sarif_of_nothing_is_a_valid_empty_run() -> None:
    log = to_sarif([])
    _validate_sarif(log)
    assert log["runs"][0]["results"] == []


def _parse(xml_text: str) -> ET.Element:
    assert xml_text.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    return ET.fromstring(xml_text.encode("utf-8"))


def test_junit_counts_times_and_escaping() -> None:
    fail = Diagnostic("t.fail", 'expected <a> & "b"', Location("p.yaml", 7, 3))
    suites = [
        SuiteResult(
            "unit",
            (
                CaseResult("passes", "p.yaml", seconds=0.25, output="ok\n"),
                CaseResult(
                    "fails", "p.yaml", seconds=0.5, failures=(fail, fail), file="p.yaml", line=7
                ),
                CaseResult("skips", "p.yaml", skipped="needs a model"),
            ),
        ),
        SuiteResult("other", (CaseResult("x", "q.yaml"),)),
    ]
    root = _parse(to_junit(suites))
    assert root.tag == "testsuites"
    assert root.attrib | {} == {
        "name": "kilo-rules",
        "tests": "4",
        "failures": "1",
        "errors": "0",
        "skipped": "1",
        "time": "0.750",
    }
    unit, other = root.findall("testsuite")
    assert (unit.get("name"), unit.get("tests"), unit.get("failures")) == ("unit", "3", "1")
    assert unit.get("skipped") == "1" and unit.get("time") == "0.750"
    assert other.get("tests") == "1" and other.get("failures") == "0"
    passes, fails, skips = unit.findall("testcase")
    assert passes.find("failure") is None
    assert passes.findtext("system-out") == "ok\n"
    failure = fails.find("failure")
    assert failure is not None
    assert failure.get("message") == 'p.yaml:7:3: error[t.fail]: expected <a> & "b" (and 1 more)'
    assert failure.get("type") == "t.fail"
    assert (failure.text or "").count("p.yaml:7:3") == 2
    assert (fails.get("file"), fails.get("line"), fails.get("time")) == ("p.yaml", "7", "0.500")
    skipped = skips.find("skipped")
    assert skipped is not None and skipped.get("message") == "needs a model"


def test_diagnostics_suite_one_case_per_file(tmp_path: Path) -> None:
    files = [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    diags = [
        Diagnostic("schema.type", "wrong", Location(files[0], 4, 2), hint="a number"),
        Diagnostic("policy.note", "doubtful", Location(files[1], 1, 1), severity="warning"),
        Diagnostic("schema.type", "in the base", Location(str(tmp_path / "base.yaml"), 9, 1)),
    ]
    suite = diagnostics_suite("check", files, diags)
    assert [c.name for c in suite.cases] == [*files, str(tmp_path / "base.yaml")]
    a, b, base = suite.cases
    assert a.failures == (diags[0],) and a.line == 4 and a.classname == "check"
    assert not b.failures and "doubtful" in b.output
    assert base.failures == (diags[2],)
    root = _parse(to_junit([suite]))
    assert root.get("tests") == "3" and root.get("failures") == "2"
    messages = [f.get("message") for f in root.iter("failure")]
    assert messages == [str(diags[0]), str(diags[2])]
    assert f"{files[0]}:4:2" in (messages[0] or "")


def test_render_each_format() -> None:
    diags = [Diagnostic("schema.type", "wrong", Location("p.yaml", 2, 1), hint="a number")]
    sources = {"p.yaml": "version: 1\nname: 3\n"}
    assert render(diags, "text", sources=sources).splitlines()[1].endswith("| name: 3")
    assert json.loads(render(diags, "json"))[0]["code"] == "schema.type"
    assert render(diags, "github").startswith("::error file=p.yaml,line=2,col=1")
    assert (
        json.loads(render(diags, "sarif", tool="kilo-rules verify"))["runs"][0]["tool"]["driver"][
            "name"
        ]
        == "kilo-rules verify"
    )
    junit = _parse(render(diags, "junit", files=["p.yaml", "q.yaml"], suite="s"))
    assert junit.find("testsuite").get("name") == "s"  # type: ignore[union-attr]
    assert junit.get("tests") == "2" and junit.get("failures") == "1"
    assert render([], "text") == "" and render([], "github") == ""
    with pytest.raises(ValueError, match="unknown format"):
        render(diags, "xml")
    assert FORMATS == ("text", "json", "github", "sarif", "junit")


# --- kilo-rules check in each format -----------------------------------------------------


def _write(root: Path, name: str, text: str) -> None:
    (root / name).write_text(text, encoding="utf-8")


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_cli_each_format(fmt: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(in_tmp, "bad.yaml", BAD)
    _write(in_tmp, "good.yaml", GOOD)
    assert main(["check", "--format", fmt, "bad.yaml", "good.yaml"]) == 1
    out = capsys.readouterr().out
    where = "bad.yaml:4:3"
    if fmt == "text":
        assert out.startswith(f"{where}: error[schema.unknown-key]")
    elif fmt == "json":
        assert json.loads(out)[0]["location"] == {"file": "bad.yaml", "line": 4, "col": 3}
    elif fmt == "github":
        assert out.startswith("::error file=bad.yaml,line=4,col=3")
    elif fmt == "sarif":
        log = json.loads(out)
        _validate_sarif(log)
        (result,) = log["runs"][0]["results"]
        phys = result["locations"][0]["physicalLocation"]
        assert phys["artifactLocation"] == {"uri": "bad.yaml", "uriBaseId": "%SRCROOT%"}
        assert phys["region"]["startLine"] == 4 and phys["region"]["startColumn"] == 3
        assert result["ruleId"] == "schema.unknown-key"
    else:
        root = _parse(out.rstrip("\n"))
        assert root.get("tests") == "2" and root.get("failures") == "1"
        cases = {c.get("name"): c for c in root.iter("testcase")}
        assert set(cases) == {"bad.yaml", "good.yaml"}
        assert cases["good.yaml"].find("failure") is None
        failure = cases["bad.yaml"].find("failure")
        assert failure is not None and (failure.get("message") or "").startswith(where)


@pytest.mark.parametrize("fmt", ["sarif", "junit", "json"])
def test_check_cli_clean_run_still_prints_a_document(
    fmt: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "good.yaml", GOOD)
    assert main(["check", "--format", fmt, "good.yaml"]) == 0
    out = capsys.readouterr().out
    if fmt == "sarif":
        log = json.loads(out)
        _validate_sarif(log)
        assert log["runs"][0]["results"] == []
    elif fmt == "junit":
        root = _parse(out.rstrip("\n"))
        assert (root.get("tests"), root.get("failures")) == ("1", "0")
    else:
        assert json.loads(out) == []


def test_check_cli_refuses_an_unknown_format(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(in_tmp, "good.yaml", GOOD)
    assert main(["check", "--format", "xml", "good.yaml"]) == 2
    assert "sarif" in capsys.readouterr().err
