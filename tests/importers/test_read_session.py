"""``read_session``, the one reader: every source (path, text, bytes, parsed data), Session
v1 or any log, typed located errors; the names it replaced still work and warn; a log of
several runs read without ``run=`` says which it took."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from importer_helpers import SWE_AGENT

import kilo_rules
from kilo_rules import MultipleRunsWarning, read_session
from kilo_rules.engine.base.errors import ImportFormatError, Location, SessionError
from kilo_rules.engine.formats.session import dump_session
from kilo_rules.tools.cli import main

V1 = json.dumps(
    {
        "version": 1,
        "id": "s",
        "messages": [
            {"id": "u1", "role": "user", "parts": [{"id": "p1", "type": "text", "text": "hi"}]}
        ],
    },
    indent=2,
)


def _run(i: int) -> str:
    event = {
        "id": 0,
        "source": "user",
        "action": "message",
        "args": {"content": f"fix bug {i}"},
        "timestamp": "2025-01-01T00:00:00",
    }
    return json.dumps({"instance_id": f"task-{i}", "history": [event]})


RUNS = "".join(_run(i) + "\n" for i in range(3))


def _text(session: kilo_rules.Session) -> str:
    return str(getattr(session.messages[0].parts[0], "text", ""))


def test_every_source_of_a_session_v1(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(V1, encoding="utf-8")
    from_path = read_session(path)
    assert from_path == read_session(str(path))
    assert read_session(text=V1) == from_path
    assert read_session(text=("\ufeff" + V1).encode()) == from_path
    assert read_session(data=json.loads(V1)) == from_path
    assert _text(from_path) == "hi"


def test_every_source_of_a_log() -> None:
    from_path = read_session(SWE_AGENT)
    raw, name = SWE_AGENT.read_bytes(), str(SWE_AGENT)  # the session id comes from the name
    assert read_session(text=raw, name=name) == from_path
    assert read_session(text=raw.decode(), name=name) == from_path
    assert read_session(data=json.loads(raw), name=name) == from_path
    assert read_session(SWE_AGENT, fmt="swe_agent") == from_path
    assert read_session(text=raw).id != from_path.id


def test_errors_are_typed_and_located(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(SessionError) as err:
        read_session(missing)
    assert err.value.diagnostic.code == "io.read"
    assert err.value.diagnostic.location == Location(str(missing), 1, 1)
    bad = V1.replace('"role": "user"', '"role": "robot"')
    with pytest.raises(SessionError) as err:
        read_session(text=bad, name="req.json")
    d = err.value.diagnostic
    assert (d.code, d.location.file, d.location.line) == ("session.invalid", "req.json", 7)
    with pytest.raises(ImportFormatError) as imp:
        read_session(text='{"what": 1}', name="x.json")
    assert imp.value.diagnostic.code == "import.format"
    with pytest.raises(ImportFormatError) as imp:
        read_session(text=V1, fmt="openhands")  # a named format is a log: v1 is refused
    assert imp.value.diagnostic.code == "import.session-v1"
    with pytest.raises(ImportFormatError) as imp:
        read_session(text=V1, run=1)
    assert imp.value.diagnostic.code == "import.run"


def test_exactly_one_source() -> None:
    with pytest.raises(TypeError, match="none was given"):
        read_session()
    with pytest.raises(TypeError, match="not path and text"):
        read_session("a.json", text=V1)


@pytest.mark.parametrize(
    ("name", "call", "use"),
    [
        ("import_file", lambda f, p: f(p), r"read_session\(path, fmt=\.\.\.\)"),
        ("load_session", lambda f, p: f(p), r"read_session\(path\)"),
        ("session_from_json", lambda f, p: f(p.read_text()), r"read_session\(text=\.\.\."),
        (
            "session_from_data",
            lambda f, p: f(json.loads(p.read_text())),
            r"read_session\(data=\.\.\.",
        ),
    ],
)
def test_the_replaced_loaders_warn_and_still_work(
    tmp_path: Path, name: str, call: Any, use: str
) -> None:
    source = tmp_path / "s.json"
    # import_file takes logs only; the others Session v1 only.
    source.write_text(SWE_AGENT.read_text() if name == "import_file" else V1, encoding="utf-8")
    assert name not in kilo_rules.__all__
    with pytest.warns(DeprecationWarning, match=f"kilo_rules.{name} is deprecated: use .*{use}"):
        loader = getattr(kilo_rules, name)
    assert call(loader, source) == read_session(source)


def test_one_run_of_many_read_without_run_is_a_warning_naming_the_choice() -> None:
    with pytest.warns(MultipleRunsWarning) as caught:
        session = read_session(text=RUNS, name="output.jsonl")
    w = caught[0].message
    assert isinstance(w, MultipleRunsWarning)
    assert (w.file, w.runs, w.run, w.instance) == ("output.jsonl", 3, 0, "task-0")
    assert "output.jsonl holds 3 runs; run 0 (task-0) was read: pass run=N (0–2)" in str(w)
    assert caught[0].filename == __file__  # pointed at the caller, not the importer
    assert _text(session) == "fix bug 0"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _text(read_session(text=RUNS, run=2)) == "fix bug 2"
        read_session(text=_run(5))  # a file of one run: nothing to choose
        # A Session v1 saved from run 0 remembers the runs of its log; no choice is made.
        read_session(text=dump_session(read_session(text=RUNS, run=0)))
    from kilo_rules.engine.importers import import_text

    with pytest.warns(MultipleRunsWarning):
        import_text(RUNS)


def test_the_cli_notes_which_run_it_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "output.jsonl"
    log.write_text(RUNS, encoding="utf-8")
    out = tmp_path / "s.json"
    assert main(["import", str(log), "-o", str(out)]) == 0
    assert capsys.readouterr().err == (
        f"kilo-rules import: note: {log} holds 3 runs (one per line); read run 0 (task-0); "
        "pick another with --run N (0–2)\n"
    )
    assert main(["import", str(log), "--run", "1", "-o", str(out)]) == 0
    assert capsys.readouterr().err == ""
    model = ["--model", "anthropic/claude-sonnet-4-5"]
    assert main(["build", *model, "--session", str(log)]) == 0
    assert "kilo-rules build: note:" in capsys.readouterr().err
