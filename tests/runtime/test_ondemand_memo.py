"""On-demand instructions carried from one step to the next (``OnDemandMemo``): a step walks
only the messages it has not seen, and gives what a walk from scratch gives, whatever
happened on disk in between."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Message, Session, ToolPart, session_from_json
from kilo_rules.engine.runtime import ondemand
from kilo_rules.engine.runtime.apply import apply_plan, run
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.ondemand import OnDemandMemo, attach

from .helpers import assistant, model, session
from .test_ondemand_steps import _attached, _read, _reads, _repo

NAMES = ("AGENTS.md", "CLAUDE.md")


def _lowered(messages: list[Message], ws: Workspace) -> list[Any]:
    """The lowered messages of a step, before any instruction file is attached."""
    nowhere = StepInput(workspace=Workspace(cwd="/nonexistent/k", root="/nonexistent/k"))
    plan = compile_policy("kilo-default", model())
    return run(plan, session(*messages), nowhere, until="lower").lowered


def _both(memo: OnDemandMemo, lowered: list[Any], ws: Workspace) -> tuple[Any, Any]:
    return attach(lowered, NAMES, (), ws, memo, "k"), attach(lowered, NAMES, (), ws)


def test_a_step_walks_only_the_reads_it_has_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path)
    walked: list[str] = []
    real = ondemand._read_path

    def counting(call: Any, ws: Workspace) -> str | None:
        walked.append(call.call_id)
        return real(call, ws)

    monkeypatch.setattr(ondemand, "_read_path", counting)
    plan = compile_policy("kilo-default", model())
    ws = StepInput(workspace=Workspace(cwd=str(repo), root=str(repo)))
    history = _reads(30)
    apply_plan(plan, session(*history), ws)
    assert len(walked) == 60
    walked.clear()
    history.append(assistant("later", _read("z", "pkg/a.py"), finish="tool-calls"))
    result = apply_plan(plan, session(*history), ws)
    assert walked == ["cz"]  # the 60 reads before it are not looked at again
    assert _attached(result, repo) == 31


def test_a_session_read_back_from_json_is_carried_on_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path)
    walked: list[str] = []
    real = ondemand._read_path

    def counting(call: Any, ws: Workspace) -> str | None:
        walked.append(call.call_id)
        return real(call, ws)

    monkeypatch.setattr(ondemand, "_read_path", counting)
    plan = compile_policy("kilo-default", model())
    ws = StepInput(workspace=Workspace(cwd=str(repo), root=str(repo)))
    history = _reads(5)
    apply_plan(plan, session_from_json(session(*history).model_dump_json()), ws)
    walked.clear()
    history.append(assistant("later", _read("z", "pkg/a.py"), finish="tool-calls"))
    result = apply_plan(plan, session_from_json(session(*history).model_dump_json()), ws)
    assert walked == ["cz"]
    assert _attached(result, repo) == 6


@pytest.mark.parametrize("change", ["appear", "change-same-size", "delete", "symlink-out"])
def test_a_change_on_disk_gives_what_a_walk_from_scratch_gives(tmp_path: Path, change: str) -> None:
    repo = _repo(tmp_path)
    agents = repo / "pkg" / "AGENTS.md"
    deep = repo / "pkg" / "deep" / "CLAUDE.md"
    secret = tmp_path / "secret.md"
    secret.write_text("not for the model")
    old = 1_000_000_000 * 1_000_000_000  # long before the read: its status is trusted
    os.utime(agents, ns=(old, old))
    ws = Workspace(cwd=str(repo), root=str(repo))
    memo = OnDemandMemo()
    history = _reads(4)
    lowered = _lowered(history, ws)
    carried, scratch = _both(memo, lowered, ws)
    assert carried == scratch
    if change == "appear":
        deep.write_text("deep rules")
    elif change == "change-same-size":
        agents.write_text("PKG RULES")  # same size; its time says it changed
    elif change == "delete":
        agents.unlink()
    else:
        agents.unlink()
        agents.symlink_to(secret)
    history.append(assistant("later", _read("z", "pkg/a.py"), finish="tool-calls"))
    lowered = _lowered(history, ws)
    carried, scratch = _both(memo, lowered, ws)
    assert carried == scratch
    text = json.dumps([repr(m) for m in carried[0]])
    expected = {
        "appear": ("deep rules", 4),  # the reads of pkg/deep
        "change-same-size": ("PKG RULES", 5),
        "delete": ("pkg rules", 0),
        "symlink-out": ("not for the model", 0),
    }[change]
    assert text.count(expected[0]) == expected[1]


def test_a_file_changed_just_before_it_was_read_is_read_again(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    agents = repo / "pkg" / "AGENTS.md"
    ws = Workspace(cwd=str(repo), root=str(repo))
    memo = OnDemandMemo()
    lowered = _lowered(_reads(2), ws)
    attach(lowered, NAMES, (), ws, memo, "k")
    # Rewritten with the same size and then given back its old status: only the time of
    # the read being close to the file's tells that its text may be stale.
    st = agents.stat()
    agents.write_text("PKG RULES")
    os.utime(agents, ns=(st.st_atime_ns, st.st_mtime_ns))
    carried, _ = attach(lowered, NAMES, (), ws, memo, "k")
    assert "PKG RULES" in repr(carried)


def test_a_list_that_drops_its_last_messages_is_carried_back(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    ws = Workspace(cwd=str(repo), root=str(repo))
    memo = OnDemandMemo()
    full = _lowered(_reads(6), ws)
    attach(full, NAMES, (), ws, memo, "k")
    for end in (len(full) - 1, 3, len(full)):  # a tool message, then more, then back
        carried, scratch = _both(memo, full[:end], ws)
        assert carried == scratch


def _recorded() -> list[Path]:
    shared = Path(__file__).resolve().parents[3] / "shared" / "data" / "trajectories"
    return sorted(p for p in shared.glob("*") if p.name != "SOURCES.md")


@pytest.mark.slow
@pytest.mark.parametrize("path", _recorded(), ids=lambda p: p.name[:30])
def test_every_step_of_every_recorded_session_matches_a_walk_from_scratch(
    path: Path, tmp_path: Path
) -> None:
    from kilo_rules import read_session

    recorded: Session = read_session(path, run=0)  # run 0 of the OpenHands output
    # Every directory the session reads in is made under a workspace of our own, with an
    # instruction file in every other one, so the reads attach files step by step.
    paths = {
        str(p.input[k])
        for m in recorded.messages
        for p in m.parts
        if isinstance(p, ToolPart) and p.tool in ondemand.READ_TOOLS
        for k in ondemand.PATH_KEYS
        if isinstance(p.input.get(k), str)
    }
    abs_paths = sorted(p for p in paths if p.startswith("/"))
    base = os.path.commonpath(abs_paths) if abs_paths else "/none"
    repo = tmp_path / "ws"
    text = recorded.model_dump_json()
    if abs_paths:
        text = text.replace(base, str(repo))
    ses = session_from_json(text)
    dirs = sorted({str(Path(p.replace(base, str(repo), 1)).parent) for p in abs_paths})
    for i, d in enumerate(dirs):
        Path(d).mkdir(parents=True, exist_ok=True)
        if i % 2 == 0:
            (Path(d) / NAMES[i % 4 // 2]).write_text(f"rules of {d}")
    repo.mkdir(exist_ok=True)
    (repo / "AGENTS.md").write_text("root rules")
    ws = Workspace(cwd=str(repo), root=str(repo))
    nowhere = StepInput(workspace=Workspace(cwd="/nonexistent/k", root="/nonexistent/k"))
    plan = compile_policy("kilo-default", model(limits={"context": 2_000_000, "output": 64_000}))
    memo = OnDemandMemo()
    ends = [i for i, m in enumerate(ses.messages) if m.role == "assistant" and i > 0]
    attached = 0
    for k, end in enumerate([*ends, len(ses.messages)]):
        cut = ses.model_copy(update={"messages": ses.messages[:end]})
        lowered = run(plan, cut, nowhere, until="lower").lowered
        if k == len(ends) // 2 and dirs:  # the workspace changes mid-session
            (Path(dirs[0]) / NAMES[0]).unlink()
            (Path(dirs[-1]) / NAMES[1]).write_text("late rules")
        carried, scratch = _both(memo, lowered, ws)
        assert carried == scratch, f"step {k}"
        attached = len(scratch[1])
    assert attached > 0 or not abs_paths
