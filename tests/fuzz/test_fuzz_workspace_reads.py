"""Instruction discovery over hostile workspaces: any glob pattern, any path a read tool
names. ``safefs.glob_beneath`` finds what ``glob.glob`` finds in a tree without symlinks,
and over a tree full of symlink loops and links out of it, discovery and on-demand reads
finish, raise nothing, and never return text from outside the workspace."""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base import safefs
from kilo_rules.engine.formats.policy import Instructions
from kilo_rules.engine.formats.request import ModelMessage, Text, ToolCall, ToolResult
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.ondemand import attach
from kilo_rules.engine.runtime.system import discover_instruction_files, instructions_text
from tests.fuzz.budget import FUZZ

SECRET = "SECRET-outside-7731"
FILES = (
    "AGENTS.md",
    "a.md",
    ".h.md",
    "docs/x.md",
    "docs/.y.md",
    "docs/sub/AGENTS.md",
    "deep/er/est/z.txt",
    "[x].md",
    "s p a c e.md",
)

_names = st.sampled_from(["*", "**", "?", "*.md", "docs", "sub", ".*", "[a-d]*", "[!a]*", "x.md"])
patterns = st.one_of(
    st.lists(_names, min_size=1, max_size=5).map("/".join),
    st.text(alphabet="*?[]!/.-ab\\x", min_size=1, max_size=12),
)


@pytest.fixture(scope="module")
def trees() -> Iterator[tuple[Path, Path]]:
    """(a plain tree, a hostile tree: the same files plus loops and links out)."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        out = base / "outside"
        out.mkdir()
        (out / "AGENTS.md").write_text(SECRET, encoding="utf-8")
        (out / "x.md").write_text(SECRET, encoding="utf-8")
        for name in ("plain", "hostile"):
            for rel in FILES:
                (base / name / rel).parent.mkdir(parents=True, exist_ok=True)
                (base / name / rel).write_text(f"inside {rel}", encoding="utf-8")
        h = base / "hostile"
        (h / "a").symlink_to(".", target_is_directory=True)
        (h / "docs" / "up").symlink_to("..", target_is_directory=True)
        (h / "docs" / "out").symlink_to(out, target_is_directory=True)
        (h / "deep" / "x.md").symlink_to(out / "x.md")
        (h / "docs" / "sub" / "cred.md").symlink_to(out / "AGENTS.md")
        os.mkfifo(h / "docs" / "pipe.md")
        yield base / "plain", h


@pytest.mark.slow
@FUZZ
@given(pattern=patterns)
def test_glob_beneath_agrees_with_glob_without_symlinks(
    trees: tuple[Path, Path], pattern: str
) -> None:
    plain, _ = trees
    if pattern.startswith("/") or "\\" in pattern:
        return  # absolute patterns are refused by check; backslashes mean nothing to either
    # glob lists "d/" for a trailing "**" (even "file/" for "file/**"); neither is a file
    # that discovery could read, so only names without the slash are compared.
    want = {m for m in glob.glob(str(plain / pattern), recursive=True) if not m.endswith("/")}  # noqa: PTH207
    got = set(safefs.glob_beneath(plain, pattern).matches)
    files = {m for m in want if os.path.isfile(m)}  # noqa: PTH113
    assert {m for m in got if os.path.isfile(m)} == files  # noqa: PTH113


@pytest.mark.slow
@FUZZ
@given(globs=st.lists(patterns, max_size=3), names=st.lists(_names, max_size=2))
def test_discovery_over_a_hostile_tree_stays_inside(
    trees: tuple[Path, Path], globs: list[str], names: list[str]
) -> None:
    _, hostile = trees
    settings = Instructions(project_files=tuple(names), globs=tuple(globs), glob_max_entries=2_000)
    ws = Workspace(cwd=str(hostile / "docs" / "sub"), root=str(hostile), home=str(hostile))
    found, _ = discover_instruction_files(settings, ws)
    assert all(f.path.is_relative_to(hostile) for f in found)
    text, _, _ = instructions_text(settings, StepInput(workspace=ws))
    assert SECRET not in text


@pytest.mark.slow
@FUZZ
@given(path=st.lists(_names | st.sampled_from(["..", "out", "up", "a", "/"]), max_size=6))
def test_on_demand_reads_over_a_hostile_tree_stay_inside(
    trees: tuple[Path, Path], path: list[str]
) -> None:
    _, hostile = trees
    call = ToolCall("c1", "read", {"filePath": "/".join(path) or "x"})
    messages = [
        ModelMessage("assistant", (call,), source_id="a1"),
        ModelMessage("tool", (ToolResult("c1", "read", (Text("ok"),)),)),
    ]
    ws = Workspace(cwd=str(hostile / "docs"), root=str(hostile))
    out, _ = attach(messages, ("AGENTS.md", "x.md", "cred.md", "pipe.md"), set(), ws)
    assert SECRET not in repr(out)
