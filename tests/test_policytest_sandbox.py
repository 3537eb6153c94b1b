"""A policy test file is untrusted input: every path it names (workspace cwd, root, home,
policy, session) stays in the test file's directory tree unless the operator allows more,
as written and once symlinks are resolved; a home it does not give is never the real one;
a directory of test files is walked without following a symlink out of it.

Each test plants a sentinel file outside the tree and attacks it the way a hostile pull
request would; the sentinel's text must never appear in any output."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kilo_rules.engine.base.sandbox import allow_read
from kilo_rules.tools.checking.policytest import DEFAULT_HOME, run_paths, run_test_file
from kilo_rules.tools.cli import main

SECRET = "SENTINEL-6f1c0e-never-printed"


def _tree(tmp_path: Path, globs: str = '["out/secret.md"]') -> tuple[Path, Path]:
    """(the test files' directory, a directory outside it holding the sentinel)."""
    outside = tmp_path / "out"
    outside.mkdir()
    (outside / "secret.md").write_text(SECRET, encoding="utf-8")
    (outside / "AGENTS.md").write_text(SECRET, encoding="utf-8")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "p.yaml").write_text(
        f"version: 1\nname: leak\nextends: kilo-default\nsystem:\n  instructions:\n"
        f"    globs: {globs}\n",
        encoding="utf-8",
    )
    return tests, outside


def _case(tests: Path, body: str, name: str = "a.test.yaml") -> Path:
    head = "version: 1\npolicy: ./p.yaml\nmodel: anthropic/claude-sonnet-4-5\ncases:\n"
    path = tests / name
    path.write_text(head + textwrap.indent(textwrap.dedent(body), "  "), encoding="utf-8")
    return path


def _line_col(path: Path, needle: str) -> tuple[int, int]:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return n, line.index(needle) + 1
    raise AssertionError(needle)


ORACLE = f"""\
expect:
  request:
    - {{path: "system[0].text", contains: "{SECRET}"}}
"""


@pytest.mark.parametrize(
    ("workspace", "needle"),
    [
        ("{cwd: .., root: ..}", ".."),
        ("{cwd: ., root: ..}", ".."),
        ("{cwd: /, root: /}", "/"),
        ("{home: ..}", ".."),
        ("{home: '~'}", "'~'"),
        ("{cwd: ../tests/../out}", "../tests/../out"),
    ],
)
def test_a_workspace_outside_the_tree_is_refused_where_it_is_written(
    tmp_path: Path, workspace: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tests, _ = _tree(tmp_path, '["out/secret.md", "proc/*/environ", "secret.md"]')
    path = _case(
        tests, f"- name: leak\n  step: {{workspace: {workspace}}}\n" + textwrap.indent(ORACLE, "  ")
    )
    assert main(["test", str(path), "--format", "json"]) == 2
    out = capsys.readouterr().out
    assert SECRET not in out
    (case,) = json.loads(out)["files"][0]["cases"]
    (failure,) = case["failures"]
    assert failure["code"] == "test.path-outside-roots"
    line, col = _line_col(path, "workspace:")
    at = failure["location"]
    assert (
        at["line"] == line
        and at["col"] == path.read_text().splitlines()[line - 1].index(needle, col) + 1
    )


def test_a_workspace_symlink_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    tests, outside = _tree(tmp_path, '["secret.md"]')
    (tests / "ws").symlink_to(outside, target_is_directory=True)
    path = _case(
        tests, "- name: leak\n  step: {workspace: {cwd: ws}}\n" + textwrap.indent(ORACLE, "  ")
    )
    report = run_test_file(path)
    assert report.exit_code == 2
    (d,) = report.diagnostics()
    assert d.code == "test.path-outside-roots" and "a symlink to" in d.message
    assert SECRET not in json.dumps(report.to_json())


def test_the_operator_may_allow_a_workspace_outside_the_tree(tmp_path: Path) -> None:
    tests, _ = _tree(tmp_path)
    path = _case(
        tests,
        "- name: allowed\n  step: {workspace: {cwd: .., root: ..}}\n"
        + textwrap.indent(ORACLE, "  "),
    )
    with allow_read([tmp_path]):
        report = run_test_file(path)
    assert report.exit_code == 0, report.diagnostics()


def test_a_home_not_given_is_never_the_real_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tests, _ = _tree(tmp_path, "[]")
    real_home = tmp_path / "home"
    (real_home / ".claude").mkdir(parents=True)
    (real_home / ".claude" / "CLAUDE.md").write_text(SECRET, encoding="utf-8")
    monkeypatch.setenv("HOME", str(real_home))
    # Neither the real home nor the test file's own directory is the default home.
    (tests / ".claude").mkdir()
    (tests / ".claude" / "CLAUDE.md").write_text(SECRET, encoding="utf-8")
    body = "- name: no home given\n" + textwrap.indent(
        "expect:\n  absent:\n    - {rule: instructions}\n", "  "
    )
    path = _case(tests, body)
    report = run_test_file(path)
    assert report.exit_code == 0, report.diagnostics()
    # A home inside the tree, named by the case, is read: the check above can fail.
    fake = tests / "fakehome" / ".claude"
    fake.mkdir(parents=True)
    (fake / "CLAUDE.md").write_text("from the fake home", encoding="utf-8")
    given = _case(
        tests,
        "- name: home given\n  step: {workspace: {home: fakehome}}\n"
        "  expect:\n    request:\n"
        '      - {path: "system[0].text", contains: "from the fake home"}\n',
        "b.test.yaml",
    )
    assert run_test_file(given).exit_code == 0
    assert not (tests / DEFAULT_HOME).exists()


@pytest.mark.parametrize("field", ["session", "policy"])
def test_a_file_named_outside_the_tree_is_refused(tmp_path: Path, field: str) -> None:
    tests, outside = _tree(tmp_path)
    (outside / "s.json").write_text(
        json.dumps({"version": 1, "id": SECRET, "messages": []}), encoding="utf-8"
    )
    target = "../out/s.json" if field == "session" else "../out/secret.md"
    path = _case(tests, f"- name: leak\n  {field}: {target}\n  expect: {{}}\n")
    report = run_test_file(path)
    assert report.exit_code == 2
    (d,) = report.diagnostics()
    assert d.code == "test.path-outside-roots"
    assert (d.location.line, d.location.col) == _line_col(path, target)
    assert SECRET not in json.dumps(report.to_json())


def test_a_session_symlink_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    tests, outside = _tree(tmp_path)
    (outside / "s.json").write_text(
        json.dumps({"version": 1, "id": SECRET, "messages": []}), encoding="utf-8"
    )
    (tests / "s.json").symlink_to(outside / "s.json")
    path = _case(tests, "- name: leak\n  session: s.json\n  expect: {}\n")
    report = run_test_file(path)
    (d,) = report.diagnostics()
    assert d.code == "test.path-outside-roots" and "a symlink to" in d.message


def test_a_session_fifo_in_the_tree_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    tests, _ = _tree(tmp_path)
    os.mkfifo(tests / "s.json")
    path = _case(tests, "- name: fifo\n  session: s.json\n  expect: {}\n")
    (d,) = run_test_file(path).diagnostics()
    assert d.code == "policy.not-a-regular-file"
    assert (d.location.line, d.location.col) == _line_col(path, "s.json")


def test_a_directory_walk_follows_no_symlink_out_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tests, outside = _tree(tmp_path)
    # A test file outside the tree that would read the sentinel if it ran from there.
    (outside / "p.yaml").write_text((tests / "p.yaml").read_text(), encoding="utf-8")
    (outside / "evil.test.yaml").write_text(
        "version: 1\npolicy: ./p.yaml\nmodel: anthropic/claude-sonnet-4-5\ncases:\n"
        f"  - name: evil\n    session: secret.md\n    expect: {{error: {SECRET}}}\n",
        encoding="utf-8",
    )
    (tests / "link.test.yaml").symlink_to(outside / "evil.test.yaml")
    (tests / "linked-dir").symlink_to(outside, target_is_directory=True)
    (tests / "loop").symlink_to(tests, target_is_directory=True)
    _case(tests, "- name: fine\n  expect: {}\n")
    report, problems = run_paths([tests])
    assert [c.name for c in report.cases] == ["fine"]
    assert len(problems) == 1 and "link.test.yaml" in problems[0]
    assert main(["test", str(tests), "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err


def test_a_test_file_or_policy_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    tests, _ = _tree(tmp_path)
    os.mkfifo(tests / "fifo.test.yaml")
    # No writer ever opens the FIFOs: a blocking open would hang this test for good.
    (f,) = run_test_file(tests / "fifo.test.yaml").files
    assert [d.code for d in f.errors] == ["io.not-regular-file"]
    os.mkfifo(tests / "fifo.yaml")
    path = _case(tests, "- name: fifo policy\n  policy: ./fifo.yaml\n  expect: {}\n")
    (d,) = run_test_file(path).diagnostics()
    assert d.code == "policy.not-a-regular-file"


def test_a_path_too_long_to_name_a_file_is_located(tmp_path: Path) -> None:
    tests, _ = _tree(tmp_path)
    long = "9" * 5000
    path = _case(tests, f"- name: long\n  step: {{workspace: {{cwd: '{long}'}}}}\n  expect: {{}}\n")
    (d,) = run_test_file(path).diagnostics()
    assert d.code == "test.path-invalid"
    assert d.location.line == _line_col(path, long)[0]
