"""A corpus run where one log is bad: it fails alone, located; files that are not logs are
skipped with a note; every good session is reported and the HTML is written. simulate and
tune take the same path."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base.errors import Location
from kilo_rules.engine.importers import read_session
from kilo_rules.tools.cli import main
from kilo_rules.tools.simulation import fleet

from .conftest import ROOT, SHARED

TRAJECTORIES = SHARED / "data" / "trajectories"
SONNET = "anthropic/claude-sonnet-4-5"
SMALL = (
    ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl",
    ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj",
)
#: The bytes kept of a log to truncate it: mid-record, so that its last line breaks.
CUT = 60_000


def _truncate(source: Path, target: Path, size: int = CUT) -> Path:
    target.write_bytes(source.read_bytes()[:size])
    return target


def _small_corpus(tmp_path: Path) -> Path:
    """The two example logs, a truncated copy of the first, and files that are not logs."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for log in SMALL:
        shutil.copy(log, folder / log.name)
    _truncate(SMALL[0], folder / "truncated.jsonl")
    (folder / "SOURCES.md").write_text("# Where these logs come from\n\n- ...\n", "utf-8")
    (folder / "README").write_text("Recorded sessions, one per file.\n", "utf-8")
    (folder / "package.json").write_text('{"name": "logs", "version": "1.0.0"}\n', "utf-8")
    return folder


def _simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", "--model", SONNET, "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- the whole shared folder --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not TRAJECTORIES.is_dir(), reason="the shared trajectories are absent")
def test_the_shared_folder_with_its_sources_and_a_truncated_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "trajectories"
    shutil.copytree(TRAJECTORIES, folder)
    folder.chmod(0o755)  # the shared copy is read-only, and so is copytree's
    logs = sorted(p for p in folder.iterdir() if p.name != "SOURCES.md")
    assert (folder / "SOURCES.md").is_file() and len(logs) >= 6
    opus = folder / "claude-code-opus46-spotter-8463c716.jsonl"
    truncated = _truncate(opus, folder / "truncated.jsonl", 200_000)
    page = tmp_path / "report.html"

    code, out, err = _simulate(
        capsys,
        "--session",
        f"{folder}/*",
        "--executor",
        "process",
        "--jobs",
        "2",
        "--format",
        "json",
        "--html",
        str(page),
    )

    assert code == 1, err  # a session failed: reported, and the run says so
    corpus = json.loads(out)
    assert sorted(d["session"] for d in corpus["sessions"]) == [str(p) for p in logs]
    assert all(r["error"] is None for d in corpus["sessions"] for r in d["reports"])
    (failed,) = corpus["failed"]
    assert failed["session"] == str(truncated)
    assert [(d["code"], d["location"]) for d in failed["diagnostics"]] == [
        ("import.json", {"file": str(truncated), "line": 74, "col": 414})
    ]
    assert corpus["skipped"] == [
        {
            "session": str(folder / "SOURCES.md"),
            "code": "import.json",
            "reason": "not valid JSON: Expecting value",
        }
    ]
    assert (corpus["aggregate"]["sessions"], corpus["aggregate"]["failed"]) == (len(logs) + 1, 1)
    assert [p["sessions"] for p in corpus["aggregate"]["policies"]] == [len(logs)]
    assert "BrokenProcessPool" not in err
    assert f"skipped {folder / 'SOURCES.md'}: not a recorded log" in err
    assert "truncated.jsonl:74:414: error[import.json]: not valid JSON" in err

    html = page.read_text(encoding="utf-8")
    assert html.count('data-chart="context"') == len(logs)
    assert '<section class="failed"' in html and "truncated.jsonl" in html


# --- a small corpus, every executor ---------------------------------------------------------


@pytest.mark.parametrize("spec", ["folder", "glob"])
def test_text_mode_notes_the_skipped_and_locates_the_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    folder = _small_corpus(tmp_path)
    page = tmp_path / "report.html"
    session = str(folder) if spec == "folder" else f"{folder}/*"
    code, out, err = _simulate(
        capsys, "--session", session, "--executor", "serial", "--html", str(page)
    )

    assert code == 1
    # A folder walk takes only the names logs have: README and SOURCES.md are not matched.
    skipped = ["package.json"] if spec == "folder" else ["README", "SOURCES.md", "package.json"]
    what = "a log" if len(skipped) == 1 else "logs"
    assert out.splitlines()[0] == (
        f"2 sessions on {SONNET} (1 failed, {len(skipped)} skipped as not {what})"
    )
    notes = [line for line in err.splitlines() if " skipped " in line]
    assert notes == [
        f"kilo-rules simulate: skipped {folder / name}: not a recorded log ({reason})"
        for name, reason in sorted(_REASONS.items())
        if name in skipped
    ]
    assert "truncated.jsonl:" in err and "error[import.json]" in err
    assert "1 of 3 sessions could not be replayed" in err
    assert page.read_text(encoding="utf-8").count('data-chart="context"') == 2


_REASONS = {
    "README": "not valid JSON: Expecting value",
    "SOURCES.md": "not valid JSON: Expecting value",
    "package.json": "cannot tell the format of this JSON (tried mini_swe_agent, swe_agent, "
    "openhands, claude_code, openai_responses, anthropic_messages, openai_chat)",
}


def test_a_file_named_that_is_not_a_log_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _small_corpus(tmp_path)
    notes = folder / "SOURCES.md"
    code, out, err = _simulate(
        capsys,
        "--session",
        str(notes),
        "--session",
        str(SMALL[1]),
        "--format",
        "json",
        "--executor",
        "serial",
    )
    assert code == 1
    corpus = json.loads(out)
    assert [f["session"] for f in corpus["failed"]] == [str(notes)]
    assert corpus["skipped"] == []
    assert "SOURCES.md:1:1: error[import.json]" in err

    code, _, err = _simulate(capsys, "--session", str(notes))  # one file: no corpus at all
    assert code == 1 and "SOURCES.md:1:1: error[import.json]" in err


@pytest.mark.slow
def test_a_glob_of_nothing_but_notes_is_no_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _small_corpus(tmp_path)
    code, _, err = _simulate(
        capsys, "--session", f"{folder}/*.md", "--session", f"{folder}/READ*", "--jobs", "1"
    )
    assert code == 2
    assert "error[simulate.no-sessions]: none of the 2 files matched is a recorded log" in err


@pytest.mark.slow
def test_when_every_session_fails_the_run_reports_them_and_writes_no_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    for n, log in enumerate(SMALL):
        _truncate(log, folder / f"cut-{n}{log.suffix}")
    page = tmp_path / "report.html"
    code, out, err = _simulate(capsys, "--session", str(folder), "--html", str(page), "--jobs", "2")
    assert code == 1
    assert out.startswith(f"0 sessions on {SONNET} (2 failed)")
    assert err.count("error[import.json]") == 2
    assert f"{page} not written: no session could be replayed" in err
    assert not page.exists()


# --- which files are not logs ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "skipped"),
    [
        ("notes.md", b"# notes\n", True),
        ("table.csv", b"a,b\n1,2\n", True),
        ("numbers.txt", b"123\nhello\n", True),
        ("script.py", b'"""doc"""\n', True),
        ("empty.jsonl", b"", True),
        ("blank.json", b"  \n\n", True),
        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00", True),
        ("package.json", b'{"name": "x"}', True),
        ("lines.jsonl", b'{"a": 1}\n{"b": 2}\n', True),
        ("bom.md", b"\xef\xbb\xbf# notes\n", True),
        ("cut.json", b'{"messages": [{"role": "user", "content": "hi', False),
        ("cut.jsonl", b'  \n{"type": "user"}\n{"type": "assistant", "mess', False),
        ("array.json", b'[{"role": "user", "content": "hi"}, ', False),
    ],
)
def test_what_counts_as_not_a_log(tmp_path: Path, name: str, content: bytes, skipped: bool) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    (outcome,) = fleet.run_corpus([path], read_session, executor="serial")
    assert not outcome.ok
    reason = fleet.not_a_log(outcome)
    assert (reason is not None) is skipped, outcome.diagnostics
    if skipped:
        assert reason == outcome.diagnostics[0].message
    # Named on its own, a file is meant to be a session: never skipped.
    assert fleet.not_a_log(outcome, fleet.named_files([str(path)])) is None


def test_a_good_outcome_and_a_failure_elsewhere_are_not_skipped(tmp_path: Path) -> None:
    good = fleet.run_corpus([SMALL[1]], read_session, executor="serial")[0]
    assert good.ok and fleet.not_a_log(good) is None
    # A diagnostic located in another file (a policy every session compiles) is no verdict
    # on the session file.
    path = tmp_path / "x.md"
    path.write_text("# x\n", "utf-8")
    (outcome,) = fleet.run_corpus([path], read_session, executor="serial")
    elsewhere = Location("policy.yaml", 3, 5)
    moved = replace(
        outcome, diagnostics=tuple(replace(d, location=elsewhere) for d in outcome.diagnostics)
    )
    assert fleet.not_a_log(moved) is None


# --- tune ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tune_over_a_corpus_skips_notes_and_fails_the_bad_log_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _small_corpus(tmp_path)
    tune = tmp_path / "tune.yaml"
    tune.write_text(
        "version: 1\n"
        "base: kilo-default\n"
        f"model: {SONNET}\n"
        f"sessions: ['{folder}/*']\n"
        "knobs:\n"
        "  cache.breakpoints.non_system_last: [1]\n",
        encoding="utf-8",
    )
    out_dir = tmp_path / "out"
    code = main(["tune", str(tune), "--out", str(out_dir), "--jobs", "2", "--no-progress"])
    out, err = capsys.readouterr()

    assert code == 1  # a session failed: the report is written all the same
    assert "on 2 sessions" in out and "; 1 failed, 3 skipped as not logs" in out
    report: dict[str, Any] = json.loads((out_dir / "report.json").read_text("utf-8"))
    assert sorted(report["sessions"]) == sorted(str(folder / p.name) for p in SMALL)
    (failed,) = report["failed"]
    assert failed["session"] == str(folder / "truncated.jsonl")
    assert [d["code"] for d in failed["diagnostics"]] == ["import.json"]
    assert [s["session"] for s in report["skipped"]] == [
        str(folder / n) for n in ("README", "SOURCES.md", "package.json")
    ]
    assert report["winner"] is not None
    assert f"kilo-rules tune: skipped {folder / 'SOURCES.md'}: not a recorded log" in err
    assert "truncated.jsonl:" in err and "error[import.json]" in err
    assert "BrokenProcessPool" not in err


def test_a_multi_run_log_in_a_corpus_says_which_run_was_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Read in a worker, the multi-run warning would be lost (or, serially under an "error"
    # warning filter, fail the session): it travels back as the session's note instead.
    folder = tmp_path / "corpus"
    folder.mkdir()
    shutil.copy(SMALL[1], folder / SMALL[1].name)
    events = [
        {"id": 0, "source": "user", "action": "message", "args": {"content": f"fix bug {i}"}}
        for i in range(3)
    ]
    runs = "".join(
        json.dumps({"instance_id": f"task-{i}", "history": [e]}) + "\n"
        for i, e in enumerate(events)
    )
    log = folder / "output.jsonl"
    log.write_text(runs, encoding="utf-8")
    code, out, err = _simulate(
        capsys, "--session", str(folder), "--executor", "serial", "--format", "json"
    )
    assert code == 0, err
    docs = {d["session"]: d for d in json.loads(out)["sessions"]}
    assert docs[str(log)]["notes"] == [
        f"{log} holds 3 runs (one per line); run 0 (task-0) was replayed; replay another "
        f"alone with --session {log} --run N (0–2)"
    ]
    assert docs[str(folder / SMALL[1].name)]["notes"] == []
    assert f"kilo-rules simulate: note: {log}: {log} holds 3 runs" in err
