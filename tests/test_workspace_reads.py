"""Workspace and policy-tree reads under attack: symlinks out of the root, components
swapped for symlinks while a read is under way, and globs over symlink loops.

The race tests flip a name between a legitimate entry and a symlink out of the root in a
second thread, as fast as the machine allows, and read through the project's readers
thousands of times: a reader that checks a path and then opens it by name reads the
outside file in about 1 % of the rounds; these readers must never."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Location, PolicyError
from kilo_rules.engine.base.sandbox import FileRef, read_text
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.policy import Instructions
from kilo_rules.engine.formats.request import ModelMessage
from kilo_rules.engine.formats.session import Session, ToolPart
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.lower import lower, lower_settings
from kilo_rules.engine.runtime.ondemand import attach
from kilo_rules.engine.runtime.system import discover_instruction_files, instructions_text

from .runtime.helpers import assistant, model, session, user

SECRET = "SECRET-credentials-0451"
ROUNDS = 3_000  # a check-then-open reader leaks in about 0.5 % of rounds: ~15 here


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every workspace, holding credential-looking files under the
    names the readers look for."""
    out = tmp_path / "outside"
    out.mkdir()
    for name in ("AGENTS.md", "cred", "rules.md", "prompt.md"):
        (out / name).write_text(SECRET, encoding="utf-8")
    return out


def _read_call(path: str) -> ToolPart:
    return ToolPart(id="r", call_id="c1", tool="read", input={"filePath": path}, output="x = 1")


def _lowered(plan: Plan, s: Session) -> list[ModelMessage]:
    return lower(s.messages, lower_settings(plan))


#: Flips a name in a process of its own (threads of one interpreter take turns, and would
#: hide the window): ``file`` alternates a regular file and a symlink to TARGET, each put
#: in place by an atomic rename; ``dir`` alternates a directory and a symlink to TARGET.
FLIPPER = """
import os, sys, time
mode, path, target = sys.argv[1:4]
real, link, saved = path + ".real", path + ".link", path + ".saved"
i = 0
while True:
    i += 1
    try:
        if mode == "file":
            if i % 2:
                if os.path.lexists(link):
                    os.unlink(link)
                os.symlink(target, link)
                os.replace(link, path)
            else:
                with open(real, "w") as fh:
                    fh.write("inside")
                os.replace(real, path)
        elif i % 2:
            os.rename(path, saved)
            os.symlink(target, path)
        else:
            os.unlink(path)
            os.rename(saved, path)
    except OSError:
        pass
    if i == 2:
        print("flipping", flush=True)
    if i % 64 == 0:
        time.sleep(0.002)  # a still spell now and then, so that some reads complete
"""


@contextmanager
def flipping(mode: str, path: Path, target: Path) -> Iterator[None]:
    """Flip ``path`` (see FLIPPER) in another process until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FLIPPER, mode, str(path), str(target)], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"flipping\n"
        yield
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _rounds(read: Callable[[], str]) -> tuple[int, int, int]:
    """(rounds that read the inside text, rounds that read the secret, rounds that found
    neither) over ROUNDS: the first and the last both above 0 prove the race was live."""
    inside = leaked = other = 0
    for _ in range(ROUNDS):
        try:
            text = read()
        except (OSError, PolicyError, UnicodeDecodeError):
            other += 1
            continue
        if SECRET in text:
            leaked += 1
        elif "inside" in text:
            inside += 1
        else:
            other += 1
    return inside, leaked, other


# -- symlinks that stay put -------------------------------------------------------------


def test_an_on_demand_instruction_file_symlinked_out_is_not_sent(
    tmp_path: Path, outside: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "AGENTS.md").symlink_to(outside / "cred")
    s = session(user("u1", "look"), assistant("a1", _read_call("docs/a.py"), finish="tool-calls"))
    plan = compile_policy("kilo-default", model())
    names = plan.settings.system.instructions.project_files
    assert "AGENTS.md" in names
    lowered, decisions = attach(
        _lowered(plan, s), names, set(), Workspace(cwd=str(ws), root=str(ws))
    )
    assert SECRET not in repr(lowered)
    assert [d["rule"] for d in decisions] == ["on_demand.skipped"]
    assert "outside" in decisions[0]["warning"]


def test_on_demand_through_apply_plan_never_reads_through_a_symlinked_directory(
    tmp_path: Path, outside: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "vendor").symlink_to(outside, target_is_directory=True)  # vendor/AGENTS.md: secret
    s = session(
        user("u1", "look"), assistant("a1", _read_call("vendor/lib.py"), finish="tool-calls")
    )
    plan = _on_demand_plan(tmp_path)
    step = StepInput(workspace=Workspace(cwd=str(ws), root=str(ws), home=str(tmp_path / "h")))
    result = apply_plan(plan, s, step)
    assert SECRET not in json.dumps(result.request)
    skipped = [d for d in result.decisions if d.rule == "on_demand.skipped"]
    assert skipped and skipped[0].severity == "warning"


def _on_demand_plan(tmp_path: Path) -> Plan:
    policy = tmp_path / "on-demand.yaml"
    policy.write_text(
        "version: 1\nname: on-demand\nextends: kilo-default\n"
        "system:\n  instructions:\n    on_demand: true\n",
        encoding="utf-8",
    )
    return compile_policy(str(policy), model())


def test_project_files_under_a_symlinked_parent_are_refused(tmp_path: Path, outside: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sub").symlink_to(outside, target_is_directory=True)
    settings = Instructions(project_files=("AGENTS.md",))
    found, skipped = discover_instruction_files(
        settings, Workspace(cwd=str(ws / "sub"), root=str(ws), home=str(tmp_path / "h"))
    )
    assert found == [] and skipped == []  # the working directory resolves outside the root
    text, _, _ = instructions_text(
        settings, StepInput(workspace=Workspace(cwd=str(ws / "sub"), root=str(ws)))
    )
    assert SECRET not in text


# -- races --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_policy_file_flipped_to_a_symlink_is_never_read_outside(
    tmp_path: Path, outside: Path
) -> None:
    tree = tmp_path / "policies"
    tree.mkdir()
    prompt = tree / "prompt.md"
    prompt.write_text("inside", encoding="utf-8")
    ref = FileRef("prompt.md", Location(str(tree / "p.yaml"), 3, 5), tree)
    with flipping("file", prompt, outside / "prompt.md"):
        inside, leaked, other = _rounds(lambda: read_text(ref, [tree], max_bytes=4096)[1])
    assert inside > 0 and other > 0
    assert leaked == 0


@pytest.mark.slow
def test_a_policy_directory_swapped_for_a_symlink_is_never_read_outside(
    tmp_path: Path, outside: Path
) -> None:
    tree = tmp_path / "policies"
    (tree / "prompts").mkdir(parents=True)
    (tree / "prompts" / "prompt.md").write_text("inside", encoding="utf-8")
    ref = FileRef("prompts/prompt.md", Location(str(tree / "p.yaml"), 3, 5), tree)
    with flipping("dir", tree / "prompts", outside):
        inside, leaked, other = _rounds(lambda: read_text(ref, [tree], max_bytes=4096)[1])
    assert inside > 0 and other > 0
    assert leaked == 0


@pytest.mark.slow
def test_an_instruction_file_flipped_to_a_symlink_is_never_read_outside(
    tmp_path: Path, outside: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("inside", encoding="utf-8")
    settings = Instructions(project_files=("AGENTS.md",), globs=("*.md",))
    step = StepInput(workspace=Workspace(cwd=str(ws), root=str(ws), home=str(tmp_path / "h")))
    with flipping("file", ws / "AGENTS.md", outside / "AGENTS.md"):
        inside, leaked, other = _rounds(lambda: instructions_text(settings, step)[0])
    assert inside > 0 and other > 0
    assert leaked == 0


def test_an_instruction_directory_swapped_for_a_symlink_is_never_read_outside(
    tmp_path: Path, outside: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "rules.md").write_text("inside", encoding="utf-8")
    settings = Instructions(globs=("docs/*.md",))
    step = StepInput(workspace=Workspace(cwd=str(ws), root=str(ws), home=str(tmp_path / "h")))
    with flipping("dir", ws / "docs", outside):
        inside, leaked, other = _rounds(lambda: instructions_text(settings, step)[0])
    assert inside > 0 and other > 0
    assert leaked == 0


def test_an_on_demand_directory_swapped_for_a_symlink_is_never_read_outside(
    tmp_path: Path, outside: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "AGENTS.md").write_text("inside", encoding="utf-8")
    s = session(user("u1", "look"), assistant("a1", _read_call("pkg/a.py"), finish="tool-calls"))
    plan = compile_policy("kilo-default", model())
    messages = _lowered(plan, s)
    wsp = Workspace(cwd=str(ws), root=str(ws))

    def once() -> str:
        return repr(attach(messages, ("AGENTS.md",), set(), wsp)[0])

    with flipping("dir", ws / "pkg", outside):
        inside, leaked, other = _rounds(once)
    assert inside > 0 and other > 0
    assert leaked == 0


def test_safefs_reads_beneath_a_root_never_leave_it_under_a_file_flip(
    tmp_path: Path, outside: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("inside", encoding="utf-8")

    def once() -> str:
        return safefs.read_beneath(ws, "f", max_bytes=64)[1].decode()

    with flipping("file", ws / "f", outside / "cred"):
        inside, leaked, other = _rounds(once)
    assert inside > 0 and other > 0
    assert leaked == 0


# -- typed refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda ws, out: (ws / "x").symlink_to(out / "cred"), "outside"),
        (lambda ws, out: os.mkfifo(ws / "x"), "not-regular"),
        (lambda ws, out: (ws / "x").mkdir(), "not-regular"),
        (lambda ws, out: (ws / "x").write_bytes(b"y" * 100), "too-large"),
        (lambda ws, out: None, "missing"),
    ],
)
def test_safefs_refusals_are_typed(
    tmp_path: Path, outside: Path, make: Callable[[Path, Path], object], reason: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make(ws, outside)
    with pytest.raises(safefs.ReadRefused) as info:
        safefs.read_beneath(ws, "x", max_bytes=10)
    assert info.value.reason == reason
    assert isinstance(info.value, OSError)


@pytest.mark.parametrize("path", ["../outside/cred", "/etc/passwd", "a\x00b"])
def test_safefs_refuses_names_outside_or_malformed(tmp_path: Path, path: str) -> None:
    with pytest.raises(safefs.ReadRefused):
        safefs.read_beneath(tmp_path, path, max_bytes=10)


def test_the_head_of_a_file_is_read_without_opening_a_fifo_for_reading(tmp_path: Path) -> None:
    from kilo_rules.tools.checking.check import is_bundle

    (tmp_path / "b.tar.gz").write_bytes(b"\x1f\x8b rest")
    assert safefs.read_head(tmp_path / "b.tar.gz", 2) == b"\x1f\x8b"
    assert is_bundle(tmp_path / "b.tar.gz")
    os.mkfifo(tmp_path / "fifo")  # nobody writes to it: a blocking open would hang here
    with pytest.raises(safefs.ReadRefused) as info:
        safefs.read_head(tmp_path / "fifo", 2)
    assert info.value.reason == "not-regular"
    assert not is_bundle(tmp_path / "fifo")
    with pytest.raises(safefs.ReadRefused) as info:
        safefs.read_head(tmp_path / "gone", 2)
    assert info.value.reason == "missing"


def test_a_refusal_survives_pickling() -> None:
    import pickle

    exc = pickle.loads(pickle.dumps(safefs.ReadRefused("changed", "a/b", "a/b: changed")))
    assert (exc.reason, exc.path, str(exc)) == ("changed", "a/b", "a/b: changed")


# -- globs --------------------------------------------------------------------------------


def test_a_glob_over_symlink_loops_finishes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "rules.md").write_text("rules", encoding="utf-8")
    (ws / "a").symlink_to(".", target_is_directory=True)
    (ws / "b").symlink_to(".", target_is_directory=True)
    (ws / "docs" / "up").symlink_to("..", target_is_directory=True)
    settings = Instructions(globs=("**/*.md",))
    box: list[object] = []
    worker = threading.Thread(
        target=lambda: box.append(
            discover_instruction_files(settings, Workspace(cwd=str(ws), root=str(ws)))
        ),
        daemon=True,
    )
    worker.start()
    worker.join(20)
    assert box, "the glob did not finish"
    found, skipped = box[0]  # type: ignore[misc]
    assert [f.path for f in found] == [(ws / "docs" / "rules.md").resolve()]
    assert skipped == []


def test_a_glob_cut_short_by_its_entry_bound_says_so(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for i in range(30):
        d = ws / f"d{i:02}"
        d.mkdir(parents=True)
        (d / "notes.md").write_text(f"n{i}", encoding="utf-8")
    settings = Instructions(globs=("**/*.md",), glob_max_entries=100)
    found, skipped = discover_instruction_files(settings, Workspace(cwd=str(ws), root=str(ws)))
    assert 0 < len(found) < 30
    assert len(skipped) == 1 and "stopped after 100 entries" in skipped[0]


def test_a_glob_cut_short_by_its_time_bound_says_so(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    for i in range(600):
        (ws / "d" / f"f{i}.txt").write_text("x", encoding="utf-8")
    walked = safefs.glob_beneath(ws, "**/*.md", max_seconds=1e-9)
    assert walked.cut == "stopped at its time limit"


@pytest.mark.parametrize(
    "pattern",
    ["*.md", "**/*.md", "docs/*.md", "docs/**", "**/sub/*.md", "d?cs/[a-z]*.md", ".github/*.md"],
)
def test_glob_beneath_matches_what_glob_matches_without_symlinks(
    tmp_path: Path, pattern: str
) -> None:
    import glob

    ws = tmp_path / "ws"
    for rel in (
        "a.md",
        ".hidden.md",
        "docs/x.md",
        "docs/.y.md",
        "docs/sub/z.md",
        "deep/sub/w.md",
        ".github/ci.md",
        "docs/readme.txt",
    ):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(rel, encoding="utf-8")
    # Directories are never instruction files; glob also lists "docs/" for "docs/**".
    want = [m for m in sorted(glob.glob(str(ws / pattern), recursive=True)) if os.path.isfile(m)]  # noqa: PTH207, PTH113
    got = safefs.glob_beneath(str(ws), pattern).matches
    assert [m for m in got if os.path.isfile(m)] == want  # noqa: PTH113
    assert want


@pytest.mark.slow
def test_the_race_tests_catch_a_reader_that_checks_then_opens(
    tmp_path: Path, outside: Path
) -> None:
    """The race harness itself: a naive check-then-open reader leaks within ROUNDS."""
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "cred").write_text("inside", encoding="utf-8")

    def naive() -> str:
        real = os.path.realpath(ws / "docs" / "cred")
        if not real.startswith(str(ws.resolve())):
            raise OSError("outside")
        with open(ws / "docs" / "cred", encoding="utf-8") as fh:  # noqa: PTH123
            return fh.read()

    with flipping("dir", ws / "docs", outside):
        leaked = sum(_rounds(naive)[1] for _ in range(5))
    assert leaked > 0


def _loop_tree(tmp_path: Path) -> Path:
    top = tmp_path / "tree"
    (top / "sub").mkdir(parents=True)
    (top / "a").symlink_to(".", target_is_directory=True)
    (top / "b").symlink_to(".", target_is_directory=True)
    (top / "sub" / "up").symlink_to("..", target_is_directory=True)
    return top


def _promptly(fn: Callable[[], object], seconds: float = 30.0) -> object:
    box: list[object] = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, "did not finish"
    return box[0]


def test_check_globs_over_symlink_loops_finish(tmp_path: Path) -> None:
    from kilo_rules.tools.checking.check import expand_paths

    top = _loop_tree(tmp_path)
    (top / "sub" / "team.yaml").write_text("version: 1\nname: team\n", encoding="utf-8")
    files, problems = _promptly(lambda: expand_paths([f"{top}/**/*.yaml"]))  # type: ignore[misc]
    assert files == [top / "sub" / "team.yaml"] and problems == []


def test_session_globs_over_symlink_loops_finish(tmp_path: Path) -> None:
    from kilo_rules.tools.simulation.fleet import expand_sessions

    top = _loop_tree(tmp_path)
    (top / "sub" / "s.jsonl").write_text("{}\n", encoding="utf-8")
    found = _promptly(lambda: expand_sessions([f"{top}/**/*.jsonl"]))
    assert found == [top / "sub" / "s.jsonl"]


def test_glob_spec_names_matches_as_glob_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import glob

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.yaml").write_text("x", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for spec in ("d/*.yaml", "**/*.yaml", f"{tmp_path}/d/*.yaml", "*/x.yaml"):
        assert safefs.glob_spec(spec).matches == sorted(glob.glob(spec, recursive=True))  # noqa: PTH207


@pytest.mark.parametrize(
    "ws",
    [
        Workspace(cwd="/tmp/a\x00b"),
        Workspace(cwd="/tmp", home="/h\x00"),
        Workspace(cwd="/tmp/" + "a" * 5000),
        Workspace(cwd="/tmp", root="/tmp/" + "r" * 300),
    ],
)
def test_workspace_paths_no_file_can_have_are_warnings_not_errors(ws: Workspace) -> None:
    settings = Instructions(
        global_files=("~/" + "g" * 300,), project_files=("AGENTS.md",), globs=("*.md",)
    )
    found, _ = discover_instruction_files(settings, ws)
    assert found == []
    s = session(user("u1", "hi"), assistant("a1", _read_call("x\x00y.py"), finish="tool-calls"))
    plan = compile_policy("kilo-default", model())
    result = apply_plan(plan, s, StepInput(workspace=ws))
    assert result.request
