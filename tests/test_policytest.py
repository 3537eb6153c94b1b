"""``kilo-rules test``: the repository's own policy tests pass and cover kilo-default, and
each expectation kind passes and fails where it is written."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kilo_rules.tools.checking.policytest import parse_request_path, run_test_file
from kilo_rules.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
KILO_DEFAULT = ROOT / "policies" / "kilo-default.yaml"


def _write(tmp_path: Path, text: str, name: str = "p.test.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _line_col(path: Path, needle: str) -> tuple[int, int]:
    """1-based line and column of the first ``needle`` in the file."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return n, line.index(needle) + 1
    raise AssertionError(needle)


@pytest.mark.slow
def test_repository_policy_tests_pass_and_cover_kilo_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    # One case replays a recorded session kept outside the test files' tree.
    allow = ["--allow-read", "examples/sessions"]
    code = main(["test", "policies/tests", "--format", "json", "--coverage", *allow])
    out = json.loads(capsys.readouterr().out)
    failures = [c for f in out["files"] for c in f["cases"] if c["status"] != "pass"]
    assert code == 0, failures
    assert out["summary"]["cases"] >= 60 and out["summary"]["failed"] == 0
    by_file = {Path(c["file"]).resolve(): c for c in out["coverage"]}
    kilo = by_file[KILO_DEFAULT]
    # Every rule and override of kilo-default is exercised by some case.
    assert kilo["rules"]["covered"] == kilo["rules"]["total"] > 100, kilo["uncovered"]
    assert kilo["overrides"] == {"covered": 1, "total": 1}
    assert kilo["expressions"]["covered"] == kilo["expressions"]["total"]
    assert kilo["uncovered"] == []


PASSING = """\
version: 1
policy: kilo-default
model: anthropic/claude-sonnet-4-5
cases:
  - name: every kind passes
    session:
      messages:
        - {id: m1, role: user, parts: [{type: text, id: p1, text: "Hello there"}]}
    expect:
      plan:
        budget.usable: 168000
        system.instructions.project_files: [AGENTS.md, CLAUDE.md, CONTEXT.md]
        cache.enabled: true
      decisions:
        - {rule: cap.fits, stage: output, result: 32000}
        - {rule: layers, result: {family_prompt: anthropic}}
      absent:
        - {rule: overflow}
      request:
        - {path: "messages[0].content[0].text", equals: "Hello there"}
        - {path: "messages[-1].content[0].text", contains: "Hello"}
        - {path: model, matches: "^claude-"}
        - {path: tools, exists: false}
        - {path: system, count: 1}
      compaction_needed: null
"""


def test_every_expectation_kind_passes(tmp_path: Path) -> None:
    report = run_test_file(_write(tmp_path, PASSING))
    assert report.exit_code == 0, report.diagnostics()
    assert [c.name for c in report.cases] == ["every kind passes"]


FAILING = """\
version: 1
policy: kilo-default
model: anthropic/claude-sonnet-4-5
cases:
  - name: every kind fails
    expect:
      plan:
        budget.usable: 1
        no.such.value: 3
      decisions:
        - {rule: cap.capped}
      absent:
        - {rule: cap.fits}
      request:
        - {path: "messages[0].role", equals: assistant}
        - {path: "messages[0].content[0].text", contains: Goodbye}
        - {path: model, matches: "^gpt-"}
        - {path: "messages[7]", exists: true}
        - {path: messages, count: 5}
      compaction_needed: overflow
"""


def test_every_expectation_kind_fails_where_it_is_written(tmp_path: Path) -> None:
    path = _write(tmp_path, FAILING)
    report = run_test_file(path)
    assert report.exit_code == 1
    (case,) = report.cases
    got = {(d.code, d.location.line, d.location.col) for d in case.failures}

    def at(code: str, needle: str, after: str = "") -> tuple[str, int, int]:
        line, col = _line_col(path, needle)
        if after:
            col += needle.index(after)
        return (code, line, col)

    assert got == {
        at("test.plan", "budget.usable: 1", "1"),
        at("test.plan", "no.such.value: 3", "3"),
        at("test.decision", "{rule: cap.capped}"),
        at("test.absent", "{rule: cap.fits}"),
        at("test.request", "equals: assistant}", "assistant"),
        at("test.request", "contains: Goodbye}", "Goodbye"),
        at("test.request", 'matches: "^gpt-"}', '"'),
        at("test.request", "exists: true}", "true"),
        at("test.request", "count: 5}", "5"),
        at("test.compaction", "compaction_needed: overflow", "overflow"),
    }
    usable = next(d for d in case.failures if "budget.usable" in d.message)
    assert usable.message == "budget.usable: expected 1, got 168000"
    assert usable.details["expected"] == 1 and usable.details["got"] == 168000


def test_replay_and_runtime_expectations(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        version: 1
        policy: kilo-default
        model: anthropic/claude-sonnet-4-5
        cases:
          - name: replay
            session: &s
              messages:
                - {id: m1, role: user, parts: [{type: text, id: p1, text: "one"}]}
                - {id: m2, role: assistant, finish: stop, tokens: {input: 2000},
                   parts: [{type: text, id: p2, text: "a"}]}
                - {id: m3, role: user, parts: [{type: text, id: p3, text: "two"}]}
                - {id: m4, role: assistant, finish: stop, tokens: {input: 4000},
                   parts: [{type: text, id: p4, text: "b"}]}
                - {id: m5, role: user, parts: [{type: text, id: p5, text: "three"}]}
                - {id: m6, role: assistant, finish: stop, tokens: {input: 170000},
                   parts: [{type: text, id: p6, text: "c"}]}
                - {id: m7, role: user, parts: [{type: text, id: p7, text: "four"}]}
            expect:
              replay: {compactions: 1, at_steps: [4], steps: 4}
          - name: replay counted wrong
            session: *s
            expect:
              replay: {compactions: 2}
          - name: runtime
            mode: runtime
            session: *s
            expect:
              decisions: [{stage: compaction, rule: select}]
          - name: an expected error
            config: {compaction.threshold_percent: 50}
            policy: broken.yaml
            expect:
              error: policy.missing-file
        """,
    )
    _write(
        tmp_path,
        "version: 1\nname: broken\nextends: kilo-default\nprompts:\n  default: nope.txt\n",
        "broken.yaml",
    )
    report = run_test_file(path)
    by_name = {c.name: c for c in report.cases}
    assert by_name["replay"].passed and by_name["runtime"].passed, report.diagnostics()
    assert by_name["an expected error"].passed, by_name["an expected error"].failures
    (wrong,) = by_name["replay counted wrong"].failures
    assert wrong.code == "test.replay" and "expected 2, got 1" in wrong.message
    assert (wrong.location.line, wrong.location.col) == _line_col(path, "2}")


@pytest.mark.parametrize(
    ("text", "code", "needle"),
    [
        (
            "version: 1\npolicy: kilo-default\ncases:\n  - name: x\n    expectt: {}\n",
            "schema",
            "expectt",
        ),
        ("version: 2\ncases: []\n", "schema.const", "2"),
        (
            "version: 1\npolicy: kilo-default\nmodel: m\ncases:\n  - name: x\n"
            "    expect: {plan: {a: 1}, decisions: [{stage: output}]}\n",
            "schema.required",
            "{stage: output}",
        ),
        ("version: 1\ncases:\n  - name: x\n    expect: {}\n", "test.missing", "name"),
        (
            "version: 1\npolicy: kilo-default\nmodel: m\ncases:\n  - name: x\n"
            "    expect: {request: [{path: 'a..b', equals: 1}]}\n",
            "test.path",
            "'a..b'",
        ),
        (
            "version: 1\npolicy: kilo-default\nmodel: m\ncases:\n  - name: x\n"
            "    expect: {request: [{path: a}]}\n",
            "test.check",
            "{path: a}",
        ),
        (
            "version: 1\npolicy: kilo-default\nmodel: m\ncases:\n  - {name: x, expect: {}}\n"
            "  - {expect: {}, name: x}\n",
            "test.duplicate-case",
            "{expect: {}, name: x}",
        ),
        (
            "version: 1\npolicy: kilo-default\nmodel: m\ncases:\n  - name: x\n    session:\n"
            "      messages:\n        - {id: m1, role: robot, parts: []}\n    expect: {}\n",
            "schema.enum",
            "robot",
        ),
        ("version: 1\ncases: [\n", "yaml", "["),
    ],
)
def test_invalid_test_files_are_located(tmp_path: Path, text: str, code: str, needle: str) -> None:
    path = _write(tmp_path, text)
    report = run_test_file(path)
    assert report.exit_code == 2
    (f,) = report.files
    assert f.errors, f
    line, _ = _line_col(path, needle) if needle != "[" else (3, 0)
    located = [(d.code, d.location.line) for d in f.errors]
    assert any(c.startswith(code) and n == line for c, n in located), located


def test_invalid_case_inputs_exit_2(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
        version: 1
        policy: kilo-default
        cases:
          - name: unknown model
            model: no/such-model
            expect: {}
          - name: session outside the allowed directories
            model: anthropic/claude-sonnet-4-5
            session: /etc/hostname
            expect: {}
          - name: bad config
            model: anthropic/claude-sonnet-4-5
            config: {output_token_max: -1}
            expect: {}
          - name: duplicate ids in an inline session
            model: anthropic/claude-sonnet-4-5
            session:
              messages:
                - {id: m1, role: user, parts: []}
                - {id: m1, role: user, parts: []}
            expect: {}
        """,
    )
    report = run_test_file(path)
    assert report.exit_code == 2
    codes = {c.name: [d.code for d in c.failures] for c in report.cases}
    assert codes["unknown model"] == ["model.unknown"]
    assert codes["session outside the allowed directories"] == ["test.path-outside-roots"]
    assert codes["bad config"] == ["config.value"]
    assert codes["duplicate ids in an inline session"] == ["session.duplicate-id"]
    unknown = report.cases[0].failures[0]
    assert unknown.location.line == _line_col(path, "no/such-model")[0]
    duplicate = report.cases[3].failures[0]
    assert duplicate.location.line == _line_col(path, "- {id: m1, role: user, parts: []}")[0] + 1


def test_junit_output_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, PASSING, "a.test.yaml")
    _write(tmp_path, FAILING, "b.test.yaml")
    monkeypatch.chdir(tmp_path)
    code = main(["test", ".", "--format", "junit"])
    assert code == 1
    root = ET.fromstring(capsys.readouterr().out)
    assert root.tag == "testsuites"
    assert root.attrib["tests"] == "2" and root.attrib["failures"] == "1"
    suites = {s.attrib["name"]: s for s in root.iter("testsuite")}
    assert set(suites) == {"a.test.yaml", "b.test.yaml"}
    (failed,) = suites["b.test.yaml"].iter("testcase")
    failure = failed.find("failure")
    assert failure is not None and failure.attrib["type"] == "test.plan"
    assert failed.attrib["line"] == "5"


def test_text_json_github_and_sarif(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, FAILING)
    monkeypatch.chdir(tmp_path)
    assert main(["test", "p.test.yaml"]) == 1
    text = capsys.readouterr().out
    assert "FAIL  every kind fails" in text and "p.test.yaml:8:24: error[test.plan]" in text
    assert "PASS: 0/1, FAIL: 1, ERROR: 0" in text
    assert main(["test", "p.test.yaml", "--format", "github"]) == 1
    assert "::error file=p.test.yaml,line=8,col=24,title=test.plan::" in capsys.readouterr().out
    assert main(["test", "p.test.yaml", "--format", "sarif"]) == 1
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["runs"][0]["results"]
    assert main(["test", "p.test.yaml", "--format", "json", "--coverage"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["failed"] == 1 and out["coverage"]
    assert main(["test", "no-such-dir"]) == 2


def test_coverage_text_lists_uncovered_locations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, PASSING)
    monkeypatch.chdir(ROOT)
    assert main(["test", str(tmp_path / "p.test.yaml"), "--coverage"]) == 0
    out = capsys.readouterr().out
    assert "policies/kilo-default.yaml:" in out
    assert "not covered: policies/kilo-default.yaml:15  rule tokens.counter" in out
    assert "override openai-explicit-breakpoints" in out


MINE = """\
version: 1
name: mine
extends: kilo-default
overrides:
  - name: small
    when: 'model.limits.context < 100000'
    set: {output: {max_tokens: 1000}}
"""

MINE_TEST = """\
version: 1
policy: mine.yaml
model: anthropic/claude-sonnet-4-5
cases:
  - name: large window
    expect:
      plan: {overrides: []}
"""


def test_coverage_lists_the_files_under_test_and_sums_up_a_bundled_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, MINE, "mine.yaml")
    _write(tmp_path, MINE_TEST)
    monkeypatch.chdir(tmp_path)
    assert main(["test", "p.test.yaml", "--coverage"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("coverage:")
    shown = lines[at + 1 :]
    assert shown[0].startswith("  mine.yaml: ")
    assert shown[1] == "    not covered: mine.yaml:5  override small"
    # kilo-default, reached only through extends: one line, none of its ~130 items.
    (base,) = [line for line in shown if "kilo-default.yaml" in line]
    assert base.endswith("; --coverage-all lists what is not covered")
    assert "(bundled base):" in base
    assert len(shown) == 3
    assert main(["test", "p.test.yaml", "--coverage-all"]) == 0
    every = capsys.readouterr().out
    assert "not covered: " + str(KILO_DEFAULT) + ":15  rule tokens.counter" in every
    assert main(["test", "p.test.yaml", "--coverage", "--format", "json"]) == 0
    files = json.loads(capsys.readouterr().out)["coverage"]
    assert [(Path(f["file"]).name, f["base"]) for f in files] == [
        ("mine.yaml", False),
        ("kilo-default.yaml", True),
    ]


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("messages[0].content[-1].text", ("messages", 0, "content", -1, "text")),
        ("[2].a", (2, "a")),
        ("max_tokens", ("max_tokens",)),
    ],
)
def test_request_paths(text: str, steps: tuple[str | int, ...]) -> None:
    assert parse_request_path(text) == steps


@pytest.mark.parametrize("text", ["", ".a", "a..b", "a[x]", "a]", "a[0]b"])
def test_bad_request_paths(text: str) -> None:
    with pytest.raises(ValueError):
        parse_request_path(text)
