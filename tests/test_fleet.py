"""Simulating a corpus: expanding session arguments, running work in parallel, progress, and
the per-policy totals."""

from __future__ import annotations

import io
import math
import os
import pickle
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base.errors import (
    Diagnostic,
    KiloRulesError,
    Location,
    SessionError,
    render_text,
)
from kilo_rules.tools.simulation import fleet
from kilo_rules.tools.simulation.fleet import (
    Outcome,
    aggregate,
    aggregate_rows,
    expand_sessions,
    progress_reporter,
    run_corpus,
    worst_rows,
)
from tests import fleet_work
from tests.conftest import ROOT

SESSION = ROOT / "examples" / "sessions" / "claude-code-sonnet45-subagent-a2898e3.jsonl"


def touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}", encoding="utf-8")


def rel(paths: list[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


# --- expand_sessions ----------------------------------------------------------------------


def test_files_are_taken_as_named_whatever_their_extension(tmp_path: Path) -> None:
    touch(tmp_path, "b.jsonl", "a.log")
    specs = [str(tmp_path / "b.jsonl"), str(tmp_path / "a.log")]
    assert expand_sessions(specs) == [tmp_path / "b.jsonl", tmp_path / "a.log"]


def test_a_directory_gives_its_session_files_recursively_in_name_order(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "z.traj",
        "a.json",
        "notes.md",
        "sub/b.jsonl",
        "sub/deeper/c.json",
        "sub-x/d.jsonl",
        ".hidden.jsonl",
        ".git/e.json",
        "sub/.cache/f.jsonl",
    )
    found = expand_sessions([str(tmp_path)])
    assert rel(found, tmp_path) == [
        "a.json",
        "sub/b.jsonl",
        "sub/deeper/c.json",
        "sub-x/d.jsonl",
        "z.traj",
    ]


def test_a_directory_follows_no_symlink_out_of_it(tmp_path: Path) -> None:
    corpus, outside = tmp_path / "corpus", tmp_path / "outside"
    touch(corpus, "a.jsonl")
    touch(outside, "secret.jsonl", "nested/more.jsonl")
    (corpus / "out.jsonl").symlink_to(outside / "secret.jsonl")
    (corpus / "outdir").symlink_to(outside, target_is_directory=True)
    (corpus / "dangling.jsonl").symlink_to(tmp_path / "missing.jsonl")
    (corpus / "same.jsonl").symlink_to(corpus / "a.jsonl")  # inside: the same file, once
    assert expand_sessions([str(corpus)]) == [corpus / "a.jsonl"]


def test_globs_match_names_and_double_star_matches_any_depth(tmp_path: Path) -> None:
    touch(tmp_path, "run1.jsonl", "run2.jsonl", "run10.traj", "x/run3.jsonl", "x/y/run4.jsonl")
    assert rel(expand_sessions([str(tmp_path / "run?.jsonl")]), tmp_path) == [
        "run1.jsonl",
        "run2.jsonl",
    ]
    assert rel(expand_sessions([str(tmp_path / "run[13]*")]), tmp_path) == [
        "run1.jsonl",
        "run10.traj",
    ]
    assert rel(expand_sessions([str(tmp_path / "**" / "*.jsonl")]), tmp_path) == [
        "run1.jsonl",
        "run2.jsonl",
        "x/run3.jsonl",
        "x/y/run4.jsonl",
    ]


def test_a_glob_matching_directories_walks_them(tmp_path: Path) -> None:
    touch(tmp_path, "day1/a.jsonl", "day1/notes.md", "day2/b.json", "other/c.json")
    found = expand_sessions([str(tmp_path / "day*")])
    assert rel(found, tmp_path) == ["day1/a.jsonl", "day2/b.json"]


def test_relative_specs_stay_relative(in_tmp: Path) -> None:
    touch(in_tmp, "s/a.jsonl", "s/b.jsonl")
    assert expand_sessions(["s", "s/*.jsonl"]) == [Path("s/a.jsonl"), Path("s/b.jsonl")]


def test_an_existing_name_with_glob_characters_is_a_file(tmp_path: Path) -> None:
    touch(tmp_path, "run[1].jsonl", "run1.jsonl")
    assert expand_sessions([str(tmp_path / "run[1].jsonl")]) == [tmp_path / "run[1].jsonl"]


def test_duplicates_keep_their_first_place_in_spec_order(tmp_path: Path) -> None:
    touch(tmp_path, "a.jsonl", "b.jsonl", "c.jsonl")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "a.jsonl")
    specs = [
        str(tmp_path / "c.jsonl"),
        str(tmp_path),
        str(tmp_path / "*.jsonl"),
        str(tmp_path / "." / "b.jsonl"),
        str(tmp_path / "link.jsonl"),
    ]
    assert rel(expand_sessions(specs), tmp_path) == ["c.jsonl", "a.jsonl", "b.jsonl"]


def error_of(specs: list[str], **kwargs: Any) -> SessionError:
    with pytest.raises(SessionError) as info:
        expand_sessions(specs, **kwargs)
    return info.value


def test_a_missing_file_is_session_not_found_located_at_the_spec(tmp_path: Path) -> None:
    touch(tmp_path, "a.jsonl")
    specs = [str(tmp_path / "a.jsonl"), "nope.jsonl"]
    diag = error_of(specs).diagnostic
    assert diag.code == "simulate.session-not-found"
    assert diag.message == "the session 'nope.jsonl' does not exist"
    col = len(specs[0]) + 2
    assert (diag.location.file, diag.location.line, diag.location.col) == (
        "<command line>",
        1,
        col,
    )
    assert diag.location.end_col == col + len("nope.jsonl")
    # Rendered against the arguments, the caret sits under the spec.
    text = render_text([diag], {"<command line>": " ".join(specs)})
    caret = text.splitlines()[2]
    assert caret.endswith(" " * (col - 1) + "^" * len("nope.jsonl"))


def test_an_empty_directory_or_glob_is_no_sessions(tmp_path: Path) -> None:
    touch(tmp_path, "empty/notes.md", "empty/.hidden.jsonl")
    diag = error_of([str(tmp_path / "empty")]).diagnostic
    assert diag.code == "simulate.no-sessions"
    assert diag.message == (
        f"no session files (.json, .jsonl, .traj) in the directory {str(tmp_path / 'empty')!r}"
    )
    assert diag.location.col == 1

    touch(tmp_path, "a.jsonl")
    spec = str(tmp_path / "*.traj")
    diag = error_of([str(tmp_path / "a.jsonl"), spec]).diagnostic
    assert diag.code == "simulate.no-sessions"
    assert diag.message == f"no session files match {spec!r}"
    assert diag.location.col == len(str(tmp_path / "a.jsonl")) + 2


def test_no_spec_at_all_is_no_sessions() -> None:
    diag = error_of([]).diagnostic
    assert (diag.code, diag.message) == ("simulate.no-sessions", "no session given")


def test_more_files_than_the_limit_is_too_many_sessions(tmp_path: Path) -> None:
    touch(tmp_path, *(f"d/{n}.jsonl" for n in range(5)), "e.jsonl")
    assert len(expand_sessions([str(tmp_path / "d")], limit=5)) == 5

    diag = error_of([str(tmp_path / "d")], limit=4).diagnostic
    assert diag.code == "simulate.too-many-sessions"
    assert diag.message == (
        f"more than 4 sessions (the limit), counting those of {str(tmp_path / 'd')!r}"
    )
    assert diag.details == {"spec": str(tmp_path / "d"), "limit": 4}

    # Across specs: the one that crosses the limit is blamed; duplicates do not count.
    specs = [str(tmp_path / "d"), str(tmp_path / "d" / "0.jsonl"), str(tmp_path / "e.jsonl")]
    assert len(expand_sessions(specs[:2], limit=5)) == 5
    diag = error_of(specs, limit=5).diagnostic
    assert diag.code == "simulate.too-many-sessions"
    assert diag.details["spec"] == specs[2]

    with pytest.raises(ValueError, match="limit"):
        expand_sessions([str(tmp_path)], limit=0)


# --- run_corpus ---------------------------------------------------------------------------


def numbers(tmp_path: Path, values: list[str]) -> list[Path]:
    paths = []
    for n, value in enumerate(values):
        path = tmp_path / f"{n:03}.txt"
        path.write_text(value, encoding="utf-8")
        paths.append(path)
    return paths


def check_numbers(tmp_path: Path, executor: fleet.Executor, **kwargs: Any) -> None:
    values = [str(n * 7) for n in range(12)]
    values[5] = "five"
    paths = numbers(tmp_path, values)
    calls: list[tuple[int, int, Path]] = []

    outcomes = run_corpus(
        paths,
        fleet_work.read_number,
        executor=executor,
        progress=lambda done, total, path: calls.append((done, total, path)),
        **kwargs,
    )

    assert [o.path for o in outcomes] == paths
    assert [o.value for o in outcomes] == [None if n == 5 else n * 7 for n in range(12)]
    bad = outcomes[5]
    assert not bad.ok
    assert bad.error == "ValueError: invalid literal for int() with base 10: 'five'"
    assert all(o.ok and o.error is None for n, o in enumerate(outcomes) if n != 5)
    assert [c[0] for c in calls] == list(range(1, 13))
    assert {c[1] for c in calls} == {12}
    assert sorted(c[2] for c in calls) == paths


def test_serial_keeps_order_and_turns_an_exception_into_an_outcome(tmp_path: Path) -> None:
    check_numbers(tmp_path, "serial")


def test_process_pool_keeps_order_and_turns_an_exception_into_an_outcome(
    tmp_path: Path,
) -> None:
    check_numbers(tmp_path, "process", workers=2)


def test_the_process_pool_runs_the_work_in_other_processes(tmp_path: Path) -> None:
    paths = numbers(tmp_path, ["1"] * 4)
    outcomes = run_corpus(paths, fleet_work.process_id, executor="process", workers=2)
    pids = {o.value for o in outcomes}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


@pytest.mark.slow
def test_dask_starts_and_closes_a_local_cluster(tmp_path: Path) -> None:
    check_numbers(tmp_path, "dask", workers=2)


@pytest.mark.slow
def test_dask_runs_on_the_cluster_at_a_scheduler_address(tmp_path: Path) -> None:
    from dask.distributed import Client, LocalCluster

    paths = numbers(tmp_path, ["1"] * 6)
    # dashboard_address=None still serves on 8787; ":0" takes a free port, so a cluster
    # that another xdist worker started at the same time is no collision (a warning, here
    # an error).
    with LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:  # type: ignore[no-untyped-call]
            worker_pids = set(client.run(os.getpid).values())
        outcomes = run_corpus(
            paths,
            fleet_work.process_id,
            executor="dask",
            scheduler=cluster.scheduler_address,
            workers=1,  # the cluster's own workers run it: this is ignored
        )
        assert len(cluster.workers) == 2  # run_corpus left the cluster as it found it
    assert all(o.ok for o in outcomes)
    pids = {o.value for o in outcomes}
    assert os.getpid() not in pids
    assert pids <= worker_pids


def test_dask_without_the_extra_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "dask.distributed", None)
    with pytest.raises(KiloRulesError) as info:
        run_corpus(numbers(tmp_path, ["1"]), fleet_work.read_number, executor="dask")
    assert info.value.diagnostic.message == (
        "the distributed executor needs the distributed extra: "
        "pip install 'kilo-rules[distributed]'"
    )


def test_empty_corpus_starts_nothing() -> None:
    executors: list[fleet.Executor] = ["serial", "process", "dask"]
    for executor in executors:
        assert run_corpus([], fleet_work.read_number, executor=executor) == []


def test_workers_are_bounded_and_a_scheduler_needs_dask(tmp_path: Path) -> None:
    paths = numbers(tmp_path, ["1"])
    for workers in (0, 257, -1):
        with pytest.raises(ValueError, match="workers must be between 1 and 256"):
            run_corpus(paths, fleet_work.read_number, executor="serial", workers=workers)
    with pytest.raises(ValueError, match="dask"):
        run_corpus(paths, fleet_work.read_number, executor="process", scheduler="tcp://x:1")
    with pytest.raises(ValueError, match="unknown executor"):
        run_corpus(paths, fleet_work.read_number, executor="threads")  # type: ignore[arg-type]


def test_a_work_function_that_cannot_pickle_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    with pytest.raises(TypeError, match="module-level function"):
        run_corpus(numbers(tmp_path, ["1"]), lambda p: 1, executor="process", workers=1)


# --- one bad session fails alone ------------------------------------------------------------


EXECUTORS: list[fleet.Executor] = ["serial", "process", "dask"]


def check_located(tmp_path: Path, executor: fleet.Executor) -> None:
    paths = numbers(tmp_path, ["1", "two", "3", "4"])
    paths.append(tmp_path / "gone.txt")  # listed, then removed before it is read
    outcomes = run_corpus(paths, fleet_work.parse_number, executor=executor, workers=2)

    assert [o.value for o in outcomes] == [1, None, 3, 4, None]
    bad = outcomes[1]
    assert bad.error is not None and bad.error.startswith("SessionError: ")
    assert [(d.code, d.location, d.details) for d in bad.diagnostics] == [
        ("demo.not-a-number", Location(str(paths[1]), 1, 1), {"text": "two"})
    ]
    gone = outcomes[4].diagnostics
    assert [(d.code, d.location) for d in gone] == [("io.read", Location(str(paths[4]), 1, 1))]
    assert gone[0].message.startswith("cannot read the session: ")
    assert all(o.diagnostics == () for o in outcomes if o.ok)


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_kilo_rules_error_comes_back_as_its_located_diagnostics(
    tmp_path: Path, executor: fleet.Executor
) -> None:
    check_located(tmp_path, executor)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["process", "dask"])
def test_what_does_not_unpickle_fails_its_session_alone(
    tmp_path: Path, executor: fleet.Executor
) -> None:
    paths = numbers(tmp_path, ["1", "raise", "3", "value", "5", "6"])
    outcomes = run_corpus(paths, fleet_work.troublesome, executor=executor, workers=2)

    assert [o.value for o in outcomes] == [1, None, 3, None, 5, 6]
    raised, value = outcomes[1], outcomes[3]
    assert raised.error == "UnpicklableError: does not travel"
    assert [d.code for d in raised.diagnostics] == ["simulate.failed"]
    assert raised.diagnostics[0].location == Location(str(paths[1]), 1, 1)
    assert value.error == "RuntimeError: this value does not unpickle"
    assert [d.code for d in value.diagnostics] == ["simulate.failed"]


@pytest.mark.slow
def test_a_worker_that_dies_fails_only_its_session(tmp_path: Path) -> None:
    values = [str(n) for n in range(10)]
    values[4] = "die"
    paths = numbers(tmp_path, values)
    calls: list[Path] = []

    outcomes = run_corpus(
        paths,
        fleet_work.troublesome,
        executor="process",
        workers=2,
        progress=lambda done, total, path: calls.append(path),
    )

    assert [o.value for o in outcomes] == [None if n == 4 else n for n in range(10)]
    lost = outcomes[4]
    assert lost.error is not None and lost.error.startswith("BrokenProcessPool")
    assert [(d.code, d.location) for d in lost.diagnostics] == [
        ("simulate.worker-lost", Location(str(paths[4]), 1, 1))
    ]
    assert sorted(calls) == paths  # each session reported once, the lost one too


@pytest.mark.slow
def test_on_dask_a_session_whose_workers_keep_dying_fails_alone(tmp_path: Path) -> None:
    # The cluster retries it on fresh workers (allowed-failures, 3), then gives it up.
    paths = numbers(tmp_path, ["0", "1", "die", "3"])
    outcomes = run_corpus(paths, fleet_work.troublesome, executor="dask", workers=2)
    assert [o.value for o in outcomes] == [0, 1, None, 3]
    lost = outcomes[2]
    assert lost.error is not None and lost.error.startswith("KilledWorker")
    assert [(d.code, d.location) for d in lost.diagnostics] == [
        ("simulate.worker-lost", Location(str(paths[2]), 1, 1))
    ]


@pytest.mark.slow
def test_every_worker_dying_fails_each_session_named(tmp_path: Path) -> None:
    paths = numbers(tmp_path, ["die", "die", "die"])
    outcomes = run_corpus(paths, fleet_work.troublesome, executor="process", workers=2)
    assert [o.path for o in outcomes] == paths
    assert all([d.code for d in o.diagnostics] == ["simulate.worker-lost"] for o in outcomes)


def test_an_unpicklable_detail_travels_as_its_repr(tmp_path: Path) -> None:
    diag = Diagnostic("demo.x", "m", Location("f", 1, 1), details={"lock": threading.Lock()})
    text, (back,) = pickle.loads(fleet._portable(("E: m", (diag,))))
    assert text == "E: m" and back.details["lock"].startswith("<unlocked _thread.lock")
    assert (back.code, back.message, back.location) == (diag.code, diag.message, diag.location)


# --- a real corpus ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hundred_sessions_in_two_processes_add_up(tmp_path: Path) -> None:
    # The pool and the sums are under test, not the replay: the first 24 events of SESSION
    # (two requests, priced apart by the two policies, so a mix-up of policies shows)
    # replay a hundred times faster than the whole log.
    head = tmp_path / "head.jsonl"
    events = SESSION.read_text(encoding="utf-8").splitlines(keepends=True)
    head.write_text("".join(events[:24]), encoding="utf-8")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(100):
        # Copies, not links: the same file under a hundred names would be one session.
        shutil.copyfile(head, corpus / f"session-{n:03}.jsonl")
    paths = expand_sessions([str(corpus)])
    assert len(paths) == 100
    single = fleet_work.simulate_session(head)
    costs = {r["policy"]: r["cost_usd"] for r in single["reports"]}
    assert set(costs) == {"kilo-default", "cache-max"} and all(costs.values())
    assert costs["kilo-default"] != costs["cache-max"]
    assert all(r["requests_total"] >= 2 for r in single["reports"])
    calls: list[int] = []

    outcomes = run_corpus(
        paths,
        fleet_work.simulate_session,
        executor="process",
        workers=2,
        progress=lambda done, total, path: calls.append(done),
    )

    assert len(outcomes) == 100 and calls == list(range(1, 101))
    assert [o.error for o in outcomes] == [None] * 100
    docs = [o.value for o in outcomes if o.value is not None]
    assert [d["session"] for d in docs] == [str(p) for p in paths]
    agg = aggregate(docs)
    assert (agg["sessions"], agg["failed"]) == (100, 0)
    assert [p["policy"] for p in agg["policies"]] == ["kilo-default", "cache-max"]
    for entry in agg["policies"]:
        cost = costs[entry["policy"]]
        assert (entry["sessions"], entry["stopped"]) == (100, 0)
        assert math.isclose(entry["cost_usd"], 100 * cost, rel_tol=1e-9)
        assert entry["cost_p50"] == entry["cost_p90"] == entry["cost_max"] == cost
    assert len(agg["worst"]) == 10


# --- progress -----------------------------------------------------------------------------


def test_plain_progress_prints_at_most_once_a_second_and_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(fleet, "_now", lambda: clock[0])
    out = io.StringIO()
    with progress_reporter(1000, stream=out) as report:
        for done in range(1, 1001):
            clock[0] += 0.01  # a session every 10 ms: ten seconds in all
            report(done, 1000, Path(f"s/{done}.jsonl"))
    lines = out.getvalue().splitlines()
    assert 9 <= len(lines) <= 11
    assert lines[0] == "simulate: 100/1000 sessions (s/100.jsonl)"
    assert lines[-1] == "simulate: 1000/1000 sessions (s/1000.jsonl)"


def test_plain_progress_on_a_quick_run_prints_only_the_end() -> None:
    out = io.StringIO()
    with progress_reporter(3, stream=out) as report:
        for done in (1, 2, 3):
            report(done, 3, Path(f"{done}.json"))
    assert out.getvalue() == "simulate: 3/3 sessions (3.json)\n"


def test_plain_progress_of_an_interrupted_run_says_how_far_it_got() -> None:
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress_reporter(10, stream=out) as report:
        report(1, 10, Path("a.json"))
        report(2, 10, Path("b.json"))
        raise KeyboardInterrupt
    assert out.getvalue() == "simulate: 2/10 sessions (b.json)\n"


def test_a_terminal_gets_a_progress_bar() -> None:
    out = io.StringIO()
    with progress_reporter(4, stream=out, force_terminal=True) as report:
        for done in range(1, 5):
            report(done, 4, Path(f"corpus/session-{done}.jsonl"))
    text = out.getvalue()
    assert "\x1b[" in text  # drawn with terminal control sequences
    assert "simulate" in text and "4/4" in text and "session-4.jsonl" in text
    assert "simulate: " not in text  # not the plain lines


def test_forcing_no_terminal_gives_plain_lines() -> None:
    out = io.StringIO()
    with progress_reporter(1, stream=out, force_terminal=False) as report:
        report(1, 1, Path("a.json"))
    assert out.getvalue() == "simulate: 1/1 sessions (a.json)\n"


# --- aggregate ----------------------------------------------------------------------------

PRICES = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.3}


def report(policy: str, cost: float | None, *, stopped: bool = False, **extra: Any) -> Any:
    return {
        "policy": policy,
        "stopped": stopped,
        "compactions": 1,
        "provider_overflows": 0,
        "input": 1000,
        "cache_read": 600,
        "cache_write": 300,
        "output": 10,
        "cost_usd": cost,
        **extra,
    }


def doc(session: str, *reports: Any, floor: float | None = None, prices: Any = PRICES) -> Any:
    out: dict[str, Any] = {"version": 1, "session": session, "prices": prices}
    out["reports"] = list(reports)
    if floor is not None:
        out["floor"] = {"cost_usd": floor}
    return out


def by_policy(agg: Mapping[str, Any]) -> dict[str, Any]:
    return {p["policy"]: p for p in agg["policies"]}


def test_aggregate_sums_completed_sessions_and_counts_stopped_ones() -> None:
    docs = [
        doc("s1", report("a", 1.0), report("b", 2.0), floor=0.5),
        doc("s2", report("a", 3.0), report("b", 9.0, stopped=True), floor=1.0),
        doc("s3", report("a", 2.0), report("b", 4.0), floor=2.0),
        {"session": "s4", "error": "ValueError: broken"},
    ]
    agg = aggregate(docs)
    assert (agg["sessions"], agg["failed"]) == (4, 1)
    a, b = by_policy(agg)["a"], by_policy(agg)["b"]
    assert [p["policy"] for p in agg["policies"]] == ["a", "b"]
    assert a == {
        "policy": "a",
        "sessions": 3,
        "stopped": 0,
        "cost_usd": 6.0,
        "compactions": 3,
        "provider_overflows": 0,
        "input": 3000,
        "cache_read": 1800,
        "cache_write": 900,
        "output": 30,
        "floor_cost_usd": 3.5,
        "floor_ratio": 6.0 / 3.5,
        "cost_p50": 2.0,
        "cost_p90": 3.0,
        "cost_max": 3.0,
    }
    # s2 stopped under b: counted, but neither its cost, its tokens nor its floor add up.
    assert (b["sessions"], b["stopped"], b["cost_usd"], b["input"]) == (3, 1, 6.0, 2000)
    assert b["floor_cost_usd"] == 2.5
    assert (b["cost_p50"], b["cost_p90"], b["cost_max"]) == (2.0, 4.0, 4.0)


def test_nearest_rank_percentiles() -> None:
    docs = [doc(f"s{n}", report("a", float(n))) for n in range(1, 11)]
    a = by_policy(aggregate(docs))["a"]
    assert (a["cost_p50"], a["cost_p90"], a["cost_max"]) == (5.0, 9.0, 10.0)
    assert a["floor_cost_usd"] is None and a["floor_ratio"] is None  # no floors known


def test_a_document_without_prices_makes_the_costs_null() -> None:
    docs = [doc("s1", report("a", 1.0), floor=1.0), doc("s2", report("a", 1.0), prices=None)]
    a = by_policy(aggregate(docs))["a"]
    assert a["cost_usd"] is None and a["floor_ratio"] is None
    assert (a["cost_p50"], a["cost_p90"], a["cost_max"]) == (None, None, None)
    assert a["input"] == 2000


def test_a_policy_that_always_stopped_has_no_cost() -> None:
    a = by_policy(aggregate([doc("s1", report("a", 1.0, stopped=True), floor=1.0)]))["a"]
    assert (a["sessions"], a["stopped"], a["cost_usd"], a["floor_cost_usd"]) == (1, 1, None, None)
    assert a["cost_max"] is None


def test_worst_lists_stopped_first_then_by_floor_ratio_then_by_cost() -> None:
    docs = [
        doc("s1", report("a", 1.0), report("b", 3.0), floor=1.0),
        doc("s2", report("a", 1.0, floor_ratio=5.0), report("b", 1.0, stopped=True), floor=1.0),
        doc("s3", report("a", 7.0), report("b", 8.0)),  # no floor: ranked by cost
    ]
    worst = aggregate(docs, worst=5)["worst"]
    assert [(w["session"], w["policy"]) for w in worst] == [
        ("s2", "b"),
        ("s2", "a"),  # the report's own floor_ratio wins over cost / floor
        ("s1", "b"),
        ("s1", "a"),
        ("s3", "b"),  # after every pair measured against a floor
    ]
    assert worst[0] == {
        "session": "s2",
        "policy": "b",
        "cost_usd": 1.0,
        "floor_ratio": 1.0,
        "compactions": 1,
        "stopped": True,
    }
    assert worst[2]["floor_ratio"] == 3.0
    assert worst[4]["floor_ratio"] is None
    assert aggregate(docs, worst=0)["worst"] == []
    assert len(aggregate(docs)["worst"]) == 6
    with pytest.raises(ValueError, match="worst"):
        aggregate(docs, worst=-1)


def test_rows_for_the_tables() -> None:
    docs = [doc("s1", report("a", 1.5), floor=0.5), doc("s2", report("a", None), prices=None)]
    agg = aggregate([docs[0]])
    headers, rows = aggregate_rows(agg)
    assert headers[0] == "policy" and len(rows) == 1 and len(rows[0]) == len(headers)
    row = dict(zip(headers, rows[0], strict=True))
    assert (row["sessions"], row["input"], row["cost $"], row["vs floor"]) == (
        "1",
        "1,000",
        "1.5000",
        "3.00x",
    )
    _, rows = aggregate_rows(aggregate(docs))
    assert rows[0][headers.index("cost $")] == "-"
    headers, rows = worst_rows(agg)
    assert rows == [("s1", "a", "1.5000", "3.00x", "1", "")]
    assert len(headers) == len(rows[0])


def test_outcome_is_frozen() -> None:
    outcome = Outcome(Path("a"), 1, None)
    with pytest.raises(AttributeError):
        outcome.value = 2  # type: ignore[misc]
