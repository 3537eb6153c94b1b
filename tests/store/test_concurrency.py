"""Many steps at once while the policy directory is rewritten, valid and invalid in turn:
no step fails, every step names a revision that passed its checks, and what it built is
what that revision says."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kilo_rules import PolicyStore, ReloadResult, StoreSettings
from kilo_rules.engine.formats.bundle import directory_revision

from ..runtime.helpers import model
from .helpers import SESSION, break_tree, marker_of, write_tree

READERS = 8
REWRITES = 100
SONNET = "anthropic/claude-sonnet-4-5"


@pytest.mark.slow
def test_steps_during_rewrites_see_only_checked_revisions(tmp_path: Path) -> None:
    root = tmp_path / "policies"
    write_tree(root, "v0", tail=1)
    broken = ["schema", "missing-file", "compile", "routes"]
    with PolicyStore.from_directory(root) as store:
        # revision -> (marker, tail_turns) of every revision that passed
        accepted = {store.revision: ("v0", 1)}
        rejected: set[str] = set()
        stop = threading.Event()
        seen: list[tuple[str, str]] = []  # (revision, marker in the request)
        tails: list[tuple[str, int]] = []  # (revision, tail_turns of its plan)
        failures: list[BaseException] = []
        start = threading.Barrier(READERS + 1)

        def reader(n: int) -> None:
            start.wait()
            while not stop.is_set():
                try:
                    if n % 2:
                        result = store.apply(SESSION, model())
                        seen.append((result.revision or "", marker_of(result.body())))
                    else:
                        with store.snapshot() as snap:
                            plan = snap.plan_for(SONNET)
                            tails.append((snap.revision, plan.settings.compaction.tail_turns))
                            result = snap.apply(SESSION, model())
                            assert result.revision == snap.revision
                            seen.append((snap.revision, marker_of(result.body())))
                except BaseException as exc:  # every failure counts, whatever it is
                    failures.append(exc)
                    return

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(READERS)]
        for t in threads:
            t.start()
        start.wait()
        try:
            for i in range(1, REWRITES + 1):
                if i % 2:
                    break_tree(root, broken[(i // 2) % len(broken)])
                    result = store.reload()
                    assert result.rejected, result.reason
                    assert result.candidate is not None
                    rejected.add(result.candidate)
                else:
                    tail = 1 + i % 5
                    write_tree(root, f"v{i}", tail=tail)
                    result = store.reload()
                    assert result.swapped, result.reason
                    accepted[result.revision] = (f"v{i}", tail)
        finally:
            stop.set()
            for t in threads:
                t.join(30)

        assert not failures, failures[:3]
        assert len(seen) > REWRITES  # the readers ran throughout
        assert rejected.isdisjoint(accepted)
        for revision, marker in seen:
            assert revision in accepted, revision
            assert marker == accepted[revision][0]
        for revision, tail in tails:
            assert tail == accepted[revision][1]
        assert len({r for r, _ in seen}) > 2  # swaps happened under the readers
        stats = store.stats()
        assert (stats.swaps, stats.rejected) == (1 + REWRITES // 2, REWRITES // 2)
        # Every retired revision's directory is gone: only the current one is left.
        assert len(list(store.work_dir.iterdir())) == 1


@pytest.mark.slow
def test_steps_while_the_watcher_races_the_writer(tmp_path: Path) -> None:
    root = tmp_path / "policies"
    write_tree(root, "v0")
    # Each valid tree's revision, computed on a copy. The watcher may also catch a tree half
    # written: refused, or valid as it stood (marker.txt truncated, say), a revision of its
    # own whose content this test does not know.
    expected: dict[str, str] = {}
    passed: set[str] = set()
    lock = threading.Lock()

    def heard(result: ReloadResult) -> None:
        if result.swapped:
            with lock:
                passed.add(result.revision)

    settings = StoreSettings(debounce_seconds=0.01, poll_seconds=0.05, poll_max_seconds=0.1)
    with PolicyStore.from_directory(root, settings=settings) as store:
        passed.add(store.revision)
        expected[store.revision] = "v0"
        store.add_listener(heard)
        store.start()
        stop = threading.Event()
        seen: list[tuple[str, str]] = []
        failures: list[BaseException] = []

        def reader() -> None:
            while not stop.is_set():
                try:
                    result = store.apply(SESSION, model())
                    seen.append((result.revision or "", result.body()))
                except BaseException as exc:
                    failures.append(exc)
                    return

        threads = [threading.Thread(target=reader) for _ in range(READERS // 2)]
        for t in threads:
            t.start()
        try:
            for i in range(1, 21):
                if i % 2:
                    break_tree(root, ["schema", "missing-file", "compile"][i % 3])
                else:
                    scratch = tmp_path / f"scratch{i}"
                    write_tree(scratch, f"v{i}")
                    expected[directory_revision(scratch).revision] = f"v{i}"
                    write_tree(root, f"v{i}")
                store.reload()
            final = directory_revision(root).revision
            assert store.revision == final
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert not failures, failures[:3]
        for revision, body in seen:
            assert revision in passed
            if revision in expected:
                assert marker_of(body) == expected[revision]
        assert marker_of(store.apply(SESSION, model()).body()) == "v20"
