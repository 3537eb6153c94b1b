"""Policy test files (``*.test.yaml``) generated and mutated, run through the test runner:
hostile paths in every path field (``/``, ``..``, ``~``, symlinks out of the tree, a FIFO,
``/proc``), numbers of thousands of digits, NULs and other control characters, broken YAML.

Every outcome is a report (cases that pass, fail or are invalid, files with located
errors) or one of the package's typed errors, and no output ever holds the text of the
sentinel files planted outside the test file's tree, nor does a case that asks for it
pass."""

from __future__ import annotations

import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.tools.checking.policytest import RunReport, run_paths, run_test_file
from tests.fuzz.budget import EXAMPLES, FUZZ, FUZZING

SECRET = "SENTINEL-policytest-4be1"
#: Matches the sentinel without spelling it, so that the test file (and its echo in a
#: failure) never holds the sentinel itself: only a read outside the tree can.
ORACLE = "SENTINEL-policytest-4be[1]"

# Compiling and running a case costs milliseconds: make test runs a few derandomised
# examples per test; make fuzz the full count.
FEW = settings(FUZZ, max_examples=EXAMPLES if FUZZING else 25)


@cache
def tree() -> Path:
    """``root/outside`` holds the sentinel (as an instruction file, a session and a test
    file of its own); ``root/tests`` is the test files' tree, with a symlink out, a loop,
    a FIFO, a workspace and a session of its own. Built once per process."""
    root = Path(tempfile.mkdtemp(prefix="kilo-fuzz-policytest-"))
    outside = root / "outside"
    outside.mkdir()
    for name in ("AGENTS.md", "CLAUDE.md", "secret.md"):
        (outside / name).write_text(SECRET, encoding="utf-8")
    (outside / ".claude").mkdir()
    (outside / ".claude" / "CLAUDE.md").write_text(SECRET, encoding="utf-8")
    (outside / "s.json").write_text(
        json.dumps(
            {
                "version": 1,
                "id": SECRET,
                "messages": [
                    {
                        "id": "m1",
                        "role": "user",
                        "parts": [{"type": "text", "id": "p", "text": SECRET}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    (outside / "p.yaml").write_text(_POLICY, encoding="utf-8")
    (outside / "x.test.yaml").write_text(
        yaml.safe_dump({**_base(), "policy": "./p.yaml"}), encoding="utf-8"
    )
    tests = root / "tests"
    (tests / "ws").mkdir(parents=True)
    (tests / "ws" / "AGENTS.md").write_text("Local instructions.", encoding="utf-8")
    (tests / "p.yaml").write_text(_POLICY, encoding="utf-8")
    (tests / "s.json").write_text(
        json.dumps(
            {
                "version": 1,
                "id": "s",
                "messages": [
                    {
                        "id": "m1",
                        "role": "user",
                        "parts": [{"type": "text", "id": "p", "text": "hi"}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    (tests / "link").symlink_to(outside, target_is_directory=True)
    (tests / "loop").symlink_to(tests, target_is_directory=True)
    (tests / "secret-link.md").symlink_to(outside / "secret.md")
    (tests / "out.test.yaml").symlink_to(outside / "x.test.yaml")
    os.mkfifo(tests / "fifo")
    os.mkfifo(tests / "fifo.test.yaml")
    return root


# A policy whose instruction globs would read the sentinel if a workspace reached it.
_POLICY = """\
version: 1
name: fuzz
extends: kilo-default
system:
  instructions:
    globs: ["*.md", "**/secret.md", "link/secret.md", "outside/*.md", "proc/*/environ"]
"""

PATHS = [
    ".",
    "..",
    "../..",
    "/",
    "/etc",
    "/proc",
    "/proc/self",
    "~",
    "~/.claude",
    "ws",
    "ws/..",
    "link",
    "link/..",
    "loop/link",
    "loop/ws",
    "../outside",
    "../tests/../outside",
    "fifo",
    "s.json",
    "p.yaml",
    "secret-link.md",
    "../outside/s.json",
    "link/s.json",
    "link/p.yaml",
    "../outside/p.yaml",
    "/dev/zero",
    "/dev/stdin",
    "nowhere",
    "",
    "a\tb",
    "9" * 5000,
]
HUGE = st.sampled_from(["9" * 5000, "-" + "1" * 4301, "1" * 1001, "1e999", "0x" + "f" * 400])


def _base() -> dict[str, Any]:
    return {
        "version": 1,
        "policy": "./p.yaml",
        "model": "anthropic/claude-sonnet-4-5",
        "cases": [
            {
                "name": "oracle",
                "step": {"workspace": {"cwd": ".", "root": ".", "home": "."}},
                "expect": {"request": [{"path": "system[0].text", "matches": ORACLE}]},
            }
        ],
    }


FIELDS = [
    ("cases", 0, "step", "workspace", "cwd"),
    ("cases", 0, "step", "workspace", "root"),
    ("cases", 0, "step", "workspace", "home"),
    ("cases", 0, "session"),
    ("cases", 0, "policy"),
    ("policy",),
]


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = doc
    for step in path[:-1]:
        node = node.setdefault(step, {}) if isinstance(node, dict) else node[step]
    node[path[-1]] = value


def _assert_safe(report: RunReport, extra: str = "") -> None:
    out = json.dumps(report.to_json(coverage=True), ensure_ascii=False, default=str)
    text = out + extra + "".join(str(d) for d in report.diagnostics())
    assert SECRET not in text
    for f in report.files:
        assert SECRET not in f.text
    # The oracle case asks for the sentinel: it may fail or be invalid, never pass.
    assert not any(c.passed and c.name == "oracle" for c in report.cases)


def _run(text: str, name: str = "fuzz.test.yaml") -> None:
    path = tree() / "tests" / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        _assert_safe(run_test_file(path))
    except KiloRulesError as exc:  # only the package's own errors, located
        for d in exc.diagnostics:
            assert d.location.line >= 1 and SECRET not in str(d)


@pytest.mark.slow
@FEW
@given(
    choices=st.lists(
        st.tuples(st.sampled_from(FIELDS), st.sampled_from(PATHS)), min_size=1, max_size=4
    )
)
def test_hostile_paths(choices: list[tuple[tuple[str | int, ...], str]]) -> None:
    doc = _base()
    for field, value in choices:
        _set(doc, field, value)
    _run(yaml.safe_dump(doc, allow_unicode=True))


@FEW
@given(
    field=st.sampled_from(
        [
            ("cases", 0, "step", "step"),
            ("cases", 0, "step", "max_steps"),
            ("cases", 0, "run"),
            ("cases", 0, "config", "output_token_max"),
            ("cases", 0, "expect", "request", 0, "count"),
            ("cases", 0, "expect", "plan", "budget.usable"),
            ("version",),
        ]
    ),
    number=HUGE,
)
def test_huge_numbers(field: tuple[str | int, ...], number: str) -> None:
    doc = _base()
    marker = "__NUMBER__"
    _set(doc, field, marker)
    _run(yaml.safe_dump(doc).replace(f"'{marker}'", number).replace(marker, number))


@FEW
@given(
    data=st.data(),
    insert=st.sampled_from(
        [
            "\x00",
            "\\0",
            "\\x00",
            "\x1b",
            "\ud800",
            "\ufeff",
            "{",
            "]",
            ": :",
            "&a *a",
            "!!python/object:os.system",
        ]
    ),
)
def test_mutated_text(data: st.DataObject, insert: str) -> None:
    text = yaml.safe_dump(_base())
    at = data.draw(st.integers(min_value=0, max_value=len(text)))
    cut = data.draw(st.integers(min_value=at, max_value=min(len(text), at + 8)))
    _run(text[:at] + insert + text[cut:])


@FEW
@given(
    session=st.sampled_from(PATHS[:27]),
    # Directories in the tree; one the operator names outside it (link) is theirs to run.
    sub=st.sampled_from([".", "ws", "loop", "loop/ws"]),
)
def test_directory_runs(session: str, sub: str) -> None:
    """``kilo-rules test DIR`` over the tree (its symlinks out, its loop, its FIFO named
    ``*.test.yaml``): what runs is in the tree, and no output holds the sentinel."""
    doc = _base()
    _set(doc, ("cases", 0, "session"), session)
    (tree() / "tests" / "dir.test.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    report, problems = run_paths([tree() / "tests" / sub])
    _assert_safe(report, "".join(problems))
    tests = os.path.realpath(tree() / "tests")
    for f in report.files:
        assert os.path.realpath(f.file).startswith(tests + os.sep)
