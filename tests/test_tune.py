"""kilo-rules tune: the tune file and its located errors, the candidates, a real tune on the
Claude Code sessions checked against simulate, constraints nothing meets, and the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.importers import read_session
from kilo_rules.tools.cli import main
from kilo_rules.tools.simulation.simulate import simulate
from kilo_rules.tools.simulation.tune import candidate_policy, candidates, load_tune_file

from .conftest import ROOT, SHARED, shared_by_workers

EXAMPLE = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
OPUS = SHARED / "data/trajectories/claude-code-opus46-spotter-8463c716.jsonl"
SONNET = "anthropic/claude-sonnet-4-5"

# A model whose window the example session (57k tokens at most) outgrows: it must compact.
TINY_MODEL = """\
id: test/tiny-claude
provider: anthropic
family: claude
api_id: claude-sonnet-4-5-20250929
api: anthropic
limits: {context: 30000, output: 4000}
prices: {input: 3.0, output: 15.0, cache_write: 3.75, cache_read: 0.3}
cache: {kind: explicit, max_breakpoints: 4, min_cacheable_tokens: 1024}
"""


def _tune_file(
    tmp_path: Path,
    knobs: str,
    *,
    extra: str = "",
    sessions: str | None = None,
    model: str = SONNET,
    name: str = "tune.yaml",
) -> Path:
    path = tmp_path / name
    path.write_text(
        "version: 1\n"
        "base: kilo-default\n"
        f"model: {model}\n"
        f"sessions: [{sessions or EXAMPLE}]\n"
        f"{extra}"
        "knobs:\n"
        f"{knobs}",
        encoding="utf-8",
    )
    return path


def _refused(path: Path) -> list[tuple[str, int, int]]:
    with pytest.raises(PolicyError) as info:
        load_tune_file(path)
    return [(d.code, d.location.line, d.location.col) for d in info.value.diagnostics]


# --- the tune file -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("knobs", "extra", "expected"),
    [
        pytest.param(
            "  compaction.tail_turns: [1, 2]\n",
            "calibrate: true\nconstrains: {max_overflows: 0}\n",
            [("schema.unknown-key", 6, 1)],
            id="unknown-key",
        ),
        pytest.param(
            "  compaction.tail_turns: [1, 2]\n  compaction.preserve_recent_tokens: []\n",
            "",
            [("tune.knob-no-values", 7, 38)],
            id="knob-without-values",
        ),
        pytest.param(
            "  compaction.tail_turns: [1, 2, 3]\n"
            "  compaction.preserve_recent_tokens: {min: 2000, max: 16000, step: 2000}\n",
            "search: {max_candidates: 20}\n",
            [("tune.too-many-candidates", 6, 1)],
            id="too-many-candidates",
        ),
        pytest.param(
            "  compaction.tail_turns: [1]\n  system.layers.when: ['true']\n",
            "",
            [("tune.knob-into-list", 7, 3)],
            id="knob-into-a-list",
        ),
        pytest.param(
            "  prompts.rules.0.when: ['true']\n",
            "",
            [("tune.knob-into-list", 6, 3)],
            id="knob-into-a-list-by-number",
        ),
        pytest.param(
            "  compaction.tail_turns: [1]\n",
            "search:\n  method: bayesian\n",
            [("schema.enum", 6, 11)],
            id="bad-search-method",
        ),
        pytest.param(
            "  compaction.tail_turn: [1, 2]\n",
            "",
            [("tune.knob-rejected", 6, 3)],
            id="knob-the-policy-has-not",
        ),
        pytest.param(
            "  compaction..tail_turns: [1]\n",
            "",
            [("tune.knob-path", 6, 3)],
            id="knob-not-a-dotted-path",
        ),
        pytest.param(
            "  compaction.tail_turns: [1, 2, 1]\n  compaction: [1]\n",
            "",
            [("tune.duplicate-value", 6, 33), ("tune.knob-overlap", 7, 3)],
            id="duplicate-value-and-overlap",
        ),
        pytest.param(
            "  compaction.tail_turns: {min: 3, max: 1, step: 1}\n",
            "",
            [("tune.empty-range", 6, 26)],
            id="empty-range",
        ),
    ],
)
def test_tune_file_errors_are_located(
    tmp_path: Path, knobs: str, extra: str, expected: list[tuple[str, int, int]]
) -> None:
    assert _refused(_tune_file(tmp_path, knobs, extra=extra)) == expected


def test_base_model_and_sessions_are_located(tmp_path: Path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(
        "version: 1\nbase: kilo-defalt\nmodel: anthropic/claude-sonnet-4-5\n"
        "sessions: [x.jsonl]\nknobs:\n  compaction.tail_turns: [1]\n",
        encoding="utf-8",
    )
    with pytest.raises(PolicyError) as info:
        load_tune_file(path)
    (d,) = info.value.diagnostics
    assert (d.code, d.location.line, d.location.col) == ("tune.unknown-base", 2, 7)
    assert d.hint is not None and "kilo-default" in d.hint

    path.write_text(path.read_text().replace("kilo-defalt", "kilo-default"), encoding="utf-8")
    assert _refused(path) == [("tune.session-not-found", 4, 12)]

    (tmp_path / "free.yaml").write_text(
        TINY_MODEL.replace(
            "prices: {input: 3.0, output: 15.0, cache_write: 3.75, cache_read: 0.3}\n", ""
        ),
        encoding="utf-8",
    )
    no_prices = _tune_file(tmp_path, "  compaction.tail_turns: [1]\n", model="free.yaml")
    with pytest.raises(PolicyError) as info:
        load_tune_file(no_prices)
    (d,) = info.value.diagnostics
    assert (d.code, d.location.line) == ("tune.no-prices", 3)
    assert "tune needs prices" in d.message


# --- candidates ----------------------------------------------------------------------------


def test_grid_is_the_product_in_order_with_the_baseline_first(tmp_path: Path) -> None:
    spec = load_tune_file(
        _tune_file(
            tmp_path,
            "  compaction.tail_turns: [1, 3]\n"
            "  compaction.preserve_recent_tokens: {min: 4000, max: 16000, step: 4000}\n"
            "  overflow.threshold_percent: [null, 80]\n",
        )
    )
    assert spec.knobs[1].values == (4000, 8000, 12000, 16000)
    cands = candidates(spec)
    assert len(cands) == 1 + 2 * 4 * 2
    base = cands[0]
    assert base.baseline and base.name == "kilo-default"
    # The base's own values, evaluated for the model: Kilo's clamp gives 8000 on a 200k window.
    assert dict(base.values) == {
        "compaction.tail_turns": 2,
        "compaction.preserve_recent_tokens": 8000,
        "overflow.threshold_percent": None,
    }
    first, second, last = cands[1], cands[2], cands[-1]
    assert first.name == "kilo-default-tuned-1" and not first.baseline
    assert list(first.values.values()) == [1, 4000, None]
    assert list(second.values.values()) == [1, 4000, 80]  # the last knob varies fastest
    assert list(cands[3].values.values()) == [1, 8000, None]
    assert list(last.values.values()) == [3, 16000, 80]
    assert [c.index for c in cands] == list(range(len(cands)))

    text = candidate_policy(spec, second)
    assert "extends: kilo-default" in text and "name: kilo-default-tuned-2" in text
    assert "  tail_turns: 1\n" in text and "threshold_percent: 80" in text


def test_ranges_with_a_step(tmp_path: Path) -> None:
    spec = load_tune_file(
        _tune_file(
            tmp_path,
            "  compaction.tail_turns: {min: 1, max: 10, step: 4}\n"
            "  compaction.min_progress: {min: 0.1, max: 0.3, step: 0.1}\n",
        )
    )
    assert spec.knobs[0].values == (1, 5, 9)  # 10 is not on a step
    assert spec.knobs[1].values == (0.1, 0.2, 0.3)  # rounded, not 0.30000000000000004
    assert len(candidates(spec)) == 1 + 9


def test_random_search_is_seeded_and_bounded(tmp_path: Path) -> None:
    knobs = (
        "  compaction.tail_turns: {min: 0, max: 9, step: 1}\n"
        "  compaction.preserve_recent_tokens: {min: 1000, max: 20000, step: 1000}\n"
    )

    def draw(seed: int, samples: int = 7) -> list[tuple[Any, ...]]:
        extra = f"search: {{method: random, samples: {samples}, seed: {seed}}}\n"
        spec = load_tune_file(_tune_file(tmp_path, knobs, extra=extra, name=f"t{seed}.yaml"))
        cands = candidates(spec)
        assert cands[0].baseline
        return [tuple(c.values.values()) for c in cands[1:]]

    first = draw(1)
    assert len(first) == len(set(first)) == 7
    assert draw(1) == first  # the same seed, the same draw
    assert draw(2) != first
    assert all(0 <= t <= 9 and 1000 <= p <= 20000 for t, p in first)
    every = draw(3, samples=1000)  # more samples than combinations: each one once
    assert len(every) == len(set(every)) == 200

    limit = "search: {method: random, samples: 30, max_candidates: 20}\n"
    col = limit.index("30") + 1
    assert _refused(_tune_file(tmp_path, knobs, extra=limit)) == [
        ("tune.too-many-candidates", 5, col)
    ]


# --- a real tune ---------------------------------------------------------------------------


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


@pytest.fixture(scope="module")
def real_tune(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tune through the command line on the Claude Code sessions (the shared one only
    when the shared corpus is there), over the two knobs that move the cost on them: the
    tail budget and the compaction threshold (the breakpoints and tail_turns do not).
    The tune runs once per test run, whichever worker gets there first; the others read
    its outputs."""
    sessions = [str(EXAMPLE)] + ([str(OPUS)] if OPUS.is_file() else [])
    with shared_by_workers(tmp_path_factory, "real-tune") as (tmp, first):
        out_dir = tmp / "tuned"
        if first:
            path = _tune_file(
                tmp,
                "  overflow.threshold_percent: [null, 80]\n"
                "  compaction.preserve_recent_tokens: [4000, 12000]\n",
                sessions=", ".join(sessions),
                extra="constraints: {max_overflows: 0, max_compactions: 3}\n",
            )
            with _captured() as (out, err):
                args = ["tune", str(path), "--out", str(out_dir), "--jobs", "2", "--no-progress"]
                code = main(args)
            ran = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
            (tmp / "run.json").write_text(json.dumps(ran), encoding="utf-8")
        ran = json.loads((tmp / "run.json").read_text(encoding="utf-8"))
    return {
        **ran,
        "dir": out_dir,
        "sessions": sessions,
        "report": json.loads((out_dir / "report.json").read_text(encoding="utf-8")),
    }


@pytest.mark.slow
def test_the_winner_is_no_dearer_than_the_baseline(real_tune: dict[str, Any]) -> None:
    assert real_tune["code"] == 0, real_tune["err"]
    report = real_tune["report"]
    rows = report["candidates"]
    assert len(rows) == 5 and rows[0]["baseline"] and rows[0]["name"] == "kilo-default"
    assert report["sessions"] == real_tune["sessions"] and report["failed"] == []
    winner = report["winner"]
    assert winner["cost_usd"] <= rows[0]["cost_usd"]
    assert winner["cost_usd"] == min(r["cost_usd"] for r in rows if r["feasible"])
    assert rows[winner["index"]]["winner"]
    assert all(r["status"] == "measured" and r["feasible"] for r in rows)
    for r in rows:
        assert r["cost_usd"] == pytest.approx(math.fsum(r["session_costs"]), abs=1e-12)
        assert r["floor_ratio"] >= 1 - 1e-9  # the floor is the cheapest candidate's
    if OPUS.is_file():  # the tail budget and the threshold move the cost on the long session
        assert len({round(r["cost_usd"], 6) for r in rows}) > 2
        assert winner["index"] != 0 and winner["cost_usd"] < rows[0]["cost_usd"]


@pytest.mark.slow
def test_every_number_is_what_simulate_gives(real_tune: dict[str, Any]) -> None:
    report = real_tune["report"]
    winner = report["winner"]
    row = report["candidates"][winner["index"]]
    policy = Path(winner["file"])
    plan = compile_policy(policy, SONNET)
    reports = [simulate(read_session(Path(s)), [plan])[0] for s in report["sessions"]]
    assert row["session_costs"] == pytest.approx([r.cost for r in reports], abs=1e-12)
    assert row["cost_usd"] == pytest.approx(math.fsum(r.cost or 0.0 for r in reports), abs=1e-12)
    assert row["compactions"] == sum(r.compactions for r in reports)
    assert row["max_compactions"] == max(r.compactions for r in reports)
    assert row["provider_overflows"] == sum(r.provider_overflows for r in reports)
    assert row["stopped"] == sum(r.stopped for r in reports)


@pytest.mark.slow
def test_the_winner_file_passes_check_and_verify(real_tune: dict[str, Any]) -> None:
    policy = real_tune["dir"] / "kilo-default-tuned.yaml"
    text = policy.read_text(encoding="utf-8")
    assert text.startswith("# kilo-default-tuned: kilo-default with the cheapest")
    assert "Measured: $" in text and "for kilo-default" in text
    # the header names the tune file and the sessions relative to the winner file
    header = [line for line in text.splitlines() if line.startswith("#")]
    named = [line.split("Tune file: ")[-1].strip("# ") for line in header[2:5]]
    assert named and not [n for n in named if n.startswith("/")], header
    compile_policy(policy, SONNET)
    with _captured() as (_, err):
        assert main(["check", str(policy)]) == 0, err.getvalue()
        assert main(["verify", "--policy", str(policy), "--model", SONNET]) == 0, err.getvalue()


@pytest.mark.slow
def test_the_html_report(real_tune: dict[str, Any]) -> None:
    page = (real_tune["dir"] / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower() and 'http-equiv="Content-Security-Policy"' in page
    assert 'data-chart="cost-compactions"' in page and "<svg" in page
    for i in range(5):
        assert page.count(f'<tr data-candidate="{i}"') == 1
    assert page.count('class="tag baseline"') == 1 and page.count('class="tag winner"') == 1
    assert 'data-label="winner"' in page and 'data-label="baseline"' in page
    assert "src=" not in page and "href=" not in page  # nothing loaded from anywhere


@pytest.mark.slow
def test_the_text_output(real_tune: dict[str, Any]) -> None:
    out = real_tune["out"]
    lines = out.splitlines()
    assert "4 candidates and the baseline (4 replayed)" in lines[0]
    header = next(line for line in lines if line.startswith("#"))
    assert "overflow.threshold_percent" in header and "cost $" in header
    assert any(line.rstrip().endswith("baseline") for line in lines)
    winner = next(line for line in lines if line.startswith("winner:"))
    assert winner.endswith(str(real_tune["dir"] / "kilo-default-tuned.yaml"))
    assert "report.html" in lines[-1]


# --- constraints nothing meets, skipped candidates, JSON -----------------------------------


def test_nothing_feasible_exits_1_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_MODEL, encoding="utf-8")
    path = _tune_file(
        tmp_path,
        "  compaction.preserve_recent_tokens: [2000, 4000]\n",
        model="tiny.yaml",
        extra="constraints: {max_compactions: 0}\n",
    )
    out_dir = tmp_path / "out"
    code = main(["tune", str(path), "--out", str(out_dir), "--executor", "serial"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "no candidate meets the constraints" in err
    report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    assert report["winner"] is None
    assert all(not r["feasible"] and r["max_compactions"] > 0 for r in report["candidates"])
    assert "max_compactions 0" in report["candidates"][0]["reasons"][0]
    assert (out_dir / "report.html").is_file()
    assert not (out_dir / "kilo-default-tuned.yaml").exists()


def test_json_output_and_skipped_candidates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _tune_file(
        tmp_path,
        '  compaction.preserve_recent_tokens: ["floor(budget.nope * 2)", 4000]\n'
        "  compaction.max_attempts: [0, 3]\n",
    )
    out_dir = tmp_path / "out"
    code = main(
        ["tune", str(path), "--out", str(out_dir), "--executor", "serial", "--format", "json"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["outputs"] == {
        "policy": str(out_dir / "kilo-default-tuned.yaml"),
        "json": str(out_dir / "report.json"),
        "html": str(out_dir / "report.html"),
    }
    status = [c["status"] for c in report["candidates"]]
    assert status == ["measured", "skipped", "skipped", "skipped", "measured"]
    # A value the policy schema refuses: located at that value in the tune file.
    (refused,) = report["candidates"][1]["diagnostics"]
    assert refused["code"] == "schema.range"
    assert refused["location"] == {"file": str(path), "line": 7, "col": 29}
    # A value that fails to compile: moved from the temporary policy to the tune file.
    (broken,) = report["candidates"][2]["diagnostics"]
    assert broken["code"] == "expr.unknown-name"
    assert broken["location"] == {"file": str(path), "line": 6, "col": 39}
    # The example session never compacts: every measured candidate costs the same, and the
    # baseline wins the tie.
    assert report["winner"]["index"] == 0


def test_the_documented_tune_file_loads() -> None:
    example = ROOT / "examples/tune/claude-code.tune.yaml"
    if not OPUS.is_file():
        assert _refused(example) == [("tune.session-not-found", 10, 5)]
        return
    spec = load_tune_file(example)
    assert spec.calibrate and spec.sessions[0].samefile(EXAMPLE) and spec.sessions[1].samefile(OPUS)
    assert len(candidates(spec)) == 1 + 6 * 3


def test_calibrated_sessions_without_usage_are_replayed_uncalibrated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A log without usage cannot be calibrated; simulate replays it uncalibrated with a
    # note instead of failing it, and every candidate is measured on it the same way.
    traj = ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj"  # SWE-agent logs no usage
    path = _tune_file(
        tmp_path,
        "  cache.breakpoints.non_system_last: [1]\n",
        sessions=f"{EXAMPLE}, {traj}",
        extra="calibrate: true\n",
    )
    out_dir = tmp_path / "out"
    code = main(["tune", str(path), "--out", str(out_dir), "--executor", "serial"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "1 candidate and the baseline" in out and "0 failed" in out
    # the summary does not claim a calibration the replay did not apply
    assert "calibrated (1 without usage uncalibrated)" in out
    assert f"note: {traj} replayed uncalibrated" in err
    report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    assert report["sessions"] == [str(EXAMPLE), str(traj)]
    assert report["uncalibrated"] == [str(traj)]
    assert report["failed"] == []
    assert report["winner"] is not None
    tuned = (out_dir / "kilo-default-tuned.yaml").read_text(encoding="utf-8")
    assert "calibrated (1 without usage uncalibrated)" in tuned


# ----------------------------------------------------- the committed tuned policy


TUNED = ROOT / "examples" / "tune" / "kilo-default-tuned.yaml"


def test_the_committed_winner_passes_check_verify_and_its_own_tests() -> None:
    from kilo_rules.tools.cli import main

    assert main(["check", str(TUNED)]) == 0
    assert main(["verify", "--policy", str(TUNED)]) == 0
    assert main(["test", str(TUNED.parent)]) == 0


@pytest.mark.slow
@pytest.mark.skipif(not OPUS.is_file(), reason="shared trajectories absent")
def test_the_committed_winner_is_cheaper_than_every_bundled_policy_with_no_overflow() -> None:
    from kilo_rules.engine.compiler.compile import compile_policy
    from kilo_rules.tools.simulation.simulate import session_document

    names = ("kilo-default", "cache-max", "long-run", "local-small")
    total: dict[str, float] = {}
    for path in (EXAMPLE, OPUS):
        session = read_session(str(path))
        plans = [compile_policy(p, "anthropic/claude-sonnet-4-5") for p in (TUNED, *names)]
        doc = session_document(session, plans, name=str(path), calibrate=True, steps=False)
        for r in doc["reports"]:
            assert r["provider_overflows"] == 0 or r["policy"] != "kilo-default-tuned"
            assert not r["stopped"] or r["policy"] != "kilo-default-tuned"
            total[r["policy"]] = total.get(r["policy"], 0.0) + r["cost_usd"]
    tuned = total.pop("kilo-default-tuned")
    assert all(tuned < cost for cost in total.values()), (tuned, total)
    assert tuned < 0.8 * total["kilo-default"]
