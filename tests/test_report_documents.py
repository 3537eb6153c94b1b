"""The JSON documents of simulate and tune hold to their committed schemas.

Real runs (the command line and the Python API) on recorded sessions are validated with
``jsonschema`` against ``schemas/simulate.v1.json``, ``corpus.v1.json`` and
``tune-report.v1.json``; the models read back what they wrote, unchanged; and a document
with a wrong value deep inside is refused by the HTML renderer at that value's path.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.importers import read_session
from kilo_rules.tools.cli import main
from kilo_rules.tools.simulation.documents import (
    CorpusDocument,
    SessionDocument,
    TuneReport,
    read_document,
)
from kilo_rules.tools.simulation.htmlreport import DocumentError, render_html, render_tune_html
from kilo_rules.tools.simulation.simulate import Calibration, build_session_document

from .conftest import ROOT, SHARED

SCHEMAS = ROOT / "schemas"
TRAJECTORIES = SHARED / "data/trajectories"
# A 12-request Claude Code subagent, with the usage its provider reported: calibrates.
SUBAGENT = TRAJECTORIES / "claude-code-sonnet45-subagent-a2898e3.jsonl"
# A SWE-agent log without usage.
SWE_AGENT = TRAJECTORIES / "swe-agent-gpt4-pydicom-1458.traj"
OLD_DOCUMENT = ROOT / "tests/fixtures/simulate/sonnet45-subagent.json"
TUNE_FIXTURE = ROOT / "tests/fixtures/tune/report.json"
SONNET = "anthropic/claude-sonnet-4-5"

pytestmark = pytest.mark.skipif(not SUBAGENT.is_file(), reason="shared trajectories absent")


@cache
def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return Draft202012Validator(schema)


def _problems(name: str, doc: Any) -> list[str]:
    return [
        f"{e.json_path}: {e.message}"
        for e in sorted(_validator(name).iter_errors(doc), key=lambda e: e.json_path)
    ]


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, json.loads(out), err


# --- one session -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="plain"),
        pytest.param(["--calibrate"], id="calibrated"),
        pytest.param(["--hidden-prefix", "900", "--token-factor", "1.05"], id="declared"),
    ],
)
def test_the_simulate_document_of_the_command_line_holds_to_its_schema(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    code, doc, err = _cli(
        capsys,
        *("simulate", "--model", SONNET, "--session", str(SUBAGENT)),
        *("--policy", "kilo-default", "--policy", "cache-max", "--format", "json", *extra),
    )
    assert code == 0, err
    assert _problems("simulate.v1.json", doc) == []
    # Every key the model knows is written, the per-step detail included.
    assert list(doc) == list(SessionDocument.model_fields)
    assert doc["recorded"]["with_usage"] > 0 and doc["reports"][0]["steps"]
    # The log records usage: the calibration is always fitted, applied only when asked.
    assert doc["calibration"]["applied"] is (extra != [])
    # The model reads back what it wrote, unchanged.
    assert read_document(SessionDocument, doc).to_json() == doc


def test_the_simulate_document_of_the_python_api_holds_to_its_schema() -> None:
    plans = [compile_policy(p, SONNET) for p in ("kilo-default", "long-run")]
    for path, steps in ((SUBAGENT, True), (SWE_AGENT, False)):
        doc = build_session_document(
            read_session(path), plans, name=str(path), calibrate=True, steps=steps
        )
        data = json.loads(json.dumps(doc.to_json()))
        assert _problems("simulate.v1.json", data) == [], path
        assert all(("steps" in r) == steps for r in data["reports"])
        assert SessionDocument.model_validate(data) == doc
    declared = build_session_document(
        read_session(SUBAGENT), plans[:1], name="s", declared=Calibration(1.1, 100)
    )
    assert declared.calibration is not None and declared.calibration.declared
    assert _problems("simulate.v1.json", declared.to_json()) == []


def test_a_document_an_older_simulator_wrote_still_holds_to_the_schema() -> None:
    old = json.loads(OLD_DOCUMENT.read_text(encoding="utf-8"))
    assert "floor" not in old and "prunes" not in old["reports"][0]["steps"][0]
    assert _problems("simulate.v1.json", old) == []
    assert read_document(SessionDocument, old).floor is None


def test_schema_and_model_refuse_the_same_wrong_values() -> None:
    plans = [compile_policy("kilo-default", SONNET)]
    good = build_session_document(read_session(SUBAGENT), plans, name="s").to_json()
    changes: list[tuple[tuple[str | int, ...], str, Any]] = [
        (("reports", 0, "steps", 3), "input", "12"),
        (("reports", 0), "stopped", 0),
        (("cache",), "kind", "sometimes"),
        (("reports", 0), "surprise", 1),
        ((), "version", 2),
        (("recorded",), "with_usage", None),  # None: the key removed
    ]
    for where, key, value in changes:
        bad = json.loads(json.dumps(good))
        node = bad
        for part in where:
            node = node[part]
        if value is None:
            del node[key]
        else:
            node[key] = value
        assert _problems("simulate.v1.json", bad), bad
        with pytest.raises(ValueError):
            read_document(SessionDocument, bad)


# --- many sessions -----------------------------------------------------------------------------


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    shutil.copy(SUBAGENT, folder / "a.jsonl")
    shutil.copy(SWE_AGENT, folder / "b.traj")
    (folder / "notes.json").write_text("not a log\n", encoding="utf-8")  # skipped
    (folder / "broken.jsonl").write_text('{"type": "user", "mess\n', encoding="utf-8")  # failed
    return folder


def test_the_corpus_document_holds_to_its_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, err = _cli(
        capsys,
        *("simulate", "--model", SONNET, "--session", str(_folder(tmp_path))),
        *("--policy", "kilo-default", "--policy", "cache-max", "--calibrate"),
        *("--format", "json", "--executor", "serial", "--no-progress"),
    )
    assert code == 1, err  # the broken log
    assert _problems("corpus.v1.json", doc) == []
    assert [len(doc[k]) for k in ("sessions", "failed", "skipped")] == [2, 1, 1]
    assert doc["failed"][0]["diagnostics"][0]["location"]["file"].endswith("broken.jsonl")
    assert [p["policy"] for p in doc["aggregate"]["policies"]] == ["kilo-default", "cache-max"]
    assert read_document(CorpusDocument, doc).to_json() == doc


def test_a_corpus_with_a_wrong_type_deep_inside_is_refused_where_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, _ = _cli(
        capsys,
        *("simulate", "--model", SONNET, "--session", str(_folder(tmp_path))),
        *("--policy", "kilo-default", "--policy", "cache-max"),
        *("--format", "json", "--executor", "serial", "--no-progress"),
    )
    assert code == 1
    assert render_html(doc).startswith("<!DOCTYPE html>")
    doc["sessions"][0]["reports"][1]["steps"][3]["input"] = "51838"
    worst = best_match(_validator("corpus.v1.json").iter_errors(doc))
    assert worst is not None
    assert (worst.json_path, worst.message) == (
        "$.sessions[0].reports[1].steps[3].input",
        "'51838' is not of type 'integer'",
    )
    with pytest.raises(DocumentError) as info:
        render_html(doc)
    assert info.value.path == "sessions[0].reports[1].steps[3].input"
    assert str(info.value) == (
        "sessions[0].reports[1].steps[3].input: expected an integer, got a string"
    )


# --- tune --------------------------------------------------------------------------------------


def test_the_tune_report_holds_to_its_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tune = tmp_path / "tune.yaml"
    tune.write_text(
        "version: 1\n"
        "base: kilo-default\n"
        f"model: {SONNET}\n"
        f"sessions: [{SUBAGENT}]\n"
        "knobs:\n"
        '  compaction.preserve_recent_tokens: ["floor(budget.nope * 2)", 4000]\n',
        encoding="utf-8",
    )
    out = tmp_path / "tuned"
    code, printed, err = _cli(
        capsys, "tune", str(tune), "--out", str(out), "--executor", "serial", "--format", "json"
    )
    assert code == 0, err
    written = json.loads((out / "report.json").read_text(encoding="utf-8"))
    for doc in (printed, written):
        assert _problems("tune-report.v1.json", doc) == []
        assert read_document(TuneReport, doc).to_json() == doc
    assert [c["status"] for c in written["candidates"]] == ["measured", "skipped", "measured"]
    assert written["candidates"][1]["diagnostics"][0]["code"] == "expr.unknown-name"
    assert written["winner"]["file"] == str(out / "kilo-default-tuned.yaml")
    assert "outputs" not in written and set(printed["outputs"]) == {"policy", "json", "html"}
    assert _problems("tune-report.v1.json", json.loads(TUNE_FIXTURE.read_text("utf-8"))) == []


def test_a_tune_report_with_a_wrong_type_deep_inside_is_refused_where_it_is() -> None:
    doc = json.loads(TUNE_FIXTURE.read_text(encoding="utf-8"))
    doc["candidates"][2]["diagnostics"] = [{"code": "x", "severity": "fatal"}]
    assert _problems("tune-report.v1.json", doc)
    with pytest.raises(DocumentError) as info:
        render_tune_html(doc)
    assert str(info.value) == (
        "candidates[2].diagnostics[0].severity: expected 'error' or 'warning', got 'fatal'"
    )
