"""kilo-rules simulate over many sessions, calibration options and the HTML report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kilo_rules.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
SONNET = "anthropic/claude-sonnet-4-5"


def _corpus(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "corpus"
    (folder / "nested").mkdir(parents=True)
    for i in range(n):
        where = folder / "nested" if i % 2 else folder
        shutil.copy(EXAMPLE, where / f"s{i}.jsonl")
    return folder


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", "--model", SONNET, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_a_folder_runs_in_parallel_and_aggregates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _corpus(tmp_path, 4)
    code, out, _ = _run(capsys, "--session", str(EXAMPLE), "--format", "json")
    assert code == 0
    single = json.loads(out)
    cost = {r["policy"]: r["cost_usd"] for r in single["reports"]}

    args = ["--session", str(folder), "--policy", "kilo-default", "--policy", "cache-max"]
    code, out, err = _run(capsys, *args, "--format", "json", "--jobs", "2")
    assert code == 0, err
    corpus = json.loads(out)
    assert len(corpus["sessions"]) == 4 and corpus["failed"] == []
    rows = {p["policy"]: p for p in corpus["aggregate"]["policies"]}
    assert rows["kilo-default"]["cost_usd"] == pytest.approx(4 * cost["kilo-default"])
    assert rows["kilo-default"]["cost_p90"] == pytest.approx(cost["kilo-default"])
    assert rows["cache-max"]["sessions"] == 4
    assert "4/4 sessions" in err  # progress on stderr (plain lines: not a terminal)


def test_globs_and_files_mix_and_a_broken_session_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _corpus(tmp_path, 2)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n", encoding="utf-8")
    code, out, err = _run(
        capsys,
        "--session",
        str(folder / "*.jsonl"),
        "--session",
        str(broken),
        "--executor",
        "serial",
        "--no-progress",
    )
    assert code == 1
    assert "1 sessions on" in out or "1 session" in out
    assert "broken.jsonl" in err
    assert "policy" in out and "kilo-default" in out


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _corpus(tmp_path, 2)
    assert _run(capsys, "--session", str(folder), "--run", "0")[0] == 2
    assert _run(capsys, "--session", str(tmp_path / "nothing-*.jsonl"))[0] == 2
    code, _, err = _run(capsys, "--session", str(EXAMPLE), "--token-factor", "abc")
    assert code == 2 and "--token-factor" in err
    code, _, err = _run(capsys, "--session", str(EXAMPLE), "--jobs", "0", "--session", str(folder))
    assert code == 2 and "--jobs" in err


def test_declared_calibration_by_provider(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--session", str(EXAMPLE), "--format", "json"]
    code, out, _ = _run(capsys, *base)
    plain = json.loads(out)
    code, out, _ = _run(
        capsys, *base, "--hidden-prefix", "20000", "--token-factor", "openai=3",
        "--token-factor", "anthropic=1.1",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["calibration"]["declared"] and doc["calibration"]["applied"]
    assert doc["calibration"]["factor"] == 1.1 and doc["calibration"]["offset"] == 20000
    first, scaled = plain["reports"][0]["steps"][0], doc["reports"][0]["steps"][0]
    assert abs(scaled["input"] - (1.1 * first["input"] + 20000)) <= 8


def test_calibrate_reports_the_fit_and_applies_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--session", str(EXAMPLE), "--format", "json", "--calibrate")
    assert code == 0
    doc = json.loads(out)
    cal = doc["calibration"]
    assert cal["applied"] and not cal["declared"] and cal["steps"] == 12
    steps = doc["reports"][0]["steps"]
    errors = sorted(abs(s["input"] - s["recorded_input"]) / s["recorded_input"] for s in steps)
    assert errors[len(errors) // 2] < 0.03


@pytest.mark.slow
def test_html_report_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "report.html"
    code, _, _ = _run(capsys, "--session", str(EXAMPLE), "--html", str(page))
    assert code == 0
    html = page.read_text(encoding="utf-8")
    assert html.count('data-chart="context"') == 1 and "kilo-default" in html
    folder = _corpus(tmp_path, 2)
    code, _, _ = _run(capsys, "--session", str(folder), "--html", str(page), "--no-progress")
    assert code == 0
    assert page.read_text(encoding="utf-8").count('data-chart="context"') == 2
    code, _, err = _run(capsys, "--session", str(EXAMPLE), "--html", str(tmp_path / "no/x.html"))
    assert code != 0 and "x.html" in err
