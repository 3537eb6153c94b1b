"""On-demand instruction files across steps: each file is read once per step however many
reads lead to it, and every step sees the workspace as it is then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base import safefs
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Message, ToolPart
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace

from .helpers import assistant, model, session, user


def _read(pid: str, path: str) -> ToolPart:
    return ToolPart(id=pid, call_id=f"c{pid}", tool="read", input={"filePath": path}, output="x")


def _reads(n: int) -> list[Message]:
    """``n`` assistant messages, each reading two files of ``pkg``."""
    out: list[Message] = [user("u1", "look")]
    for k in range(n):
        reads = (_read(f"{k}a", "pkg/a.py"), _read(f"{k}b", "pkg/deep/b.py"))
        out.append(assistant(f"a{k:03}", *reads, finish="tool-calls"))
    return out


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "pkg" / "deep").mkdir(parents=True)
    (repo / "pkg" / "AGENTS.md").write_text("pkg rules")
    return repo


def _attached(result: Any, repo: Path) -> int:
    note = "Instructions from: " + str((repo / "pkg" / "AGENTS.md").resolve())
    return json.dumps(result.request).count(note)


def test_each_instruction_file_is_read_once_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path)
    opened: list[str] = []
    real_read = safefs.read_beneath

    def counting(root: Any, path: Any, *, max_bytes: int) -> tuple[str, bytes]:
        opened.append(str(path))
        return real_read(root, path, max_bytes=max_bytes)

    monkeypatch.setattr(safefs, "read_beneath", counting)
    plan = compile_policy("kilo-default", model())
    ws = Workspace(cwd=str(repo), root=str(repo))
    result = apply_plan(plan, session(*_reads(30)), StepInput(workspace=ws))
    assert _attached(result, repo) == 30  # once per assistant message, as before
    assert len([d for d in result.decisions if d.rule == "on_demand"]) == 30
    assert opened.count(str(repo / "pkg" / "AGENTS.md")) == 1


def test_a_file_that_appears_or_goes_between_steps_is_seen_by_the_next_step(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    agents = repo / "pkg" / "AGENTS.md"
    agents.unlink()
    plan = compile_policy("kilo-default", model())
    ws = StepInput(workspace=Workspace(cwd=str(repo), root=str(repo)))
    history = _reads(3)
    assert _attached(apply_plan(plan, session(*history), ws), repo) == 0
    agents.write_text("pkg rules")
    history.append(assistant("later", _read("z", "pkg/a.py"), finish="tool-calls"))
    assert _attached(apply_plan(plan, session(*history), ws), repo) == 4  # earlier reads too
    agents.write_text("new pkg rules")
    result = apply_plan(plan, session(*history), ws)
    assert json.dumps(result.request).count("new pkg rules") == 4
    agents.unlink()
    assert _attached(apply_plan(plan, session(*history), ws), repo) == 0
