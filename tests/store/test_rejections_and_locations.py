"""What an operator sees of a refused revision: counted and logged once however often the
same files are re-checked, kept in ``status()`` with its diagnostics, and every location
the store hands out (rejections, plans, decisions, apply-time errors) named in the source
the operator wrote, never in the store's private copy."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from kilo_rules import PolicyStore, StoreError
from kilo_rules.engine.base.errors import EvalError
from kilo_rules.engine.formats.bundle import build_bundle

from ..runtime.helpers import model
from .helpers import (
    POLICY,
    SESSION,
    SONNET,
    Compiles,
    break_tree,
    compiles,
    marker_of,
    write_tree,
)

__all__ = ["compiles"]  # the fixture, imported for pytest

STORE_LOG = "kilo_rules.tools.serving.store"
#: One logged diagnostic: ``file:line:col: severity[code]: message``.
LINE = re.compile(r"^(?P<file>[^:]+):\d+:\d+: (error|warning)\[(?P<code>[\w.-]+)\]: .+$")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    write_tree(root, "A")
    return root


def diagnostic_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == STORE_LOG and LINE.match(r.getMessage()) is not None
    ]


def private(store: PolicyStore, text: str) -> bool:
    return str(store.work_dir) in text


# ------------------------------------------------------------------ counted once


def test_a_refused_revision_is_counted_and_logged_once_however_often_it_is_rechecked(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=STORE_LOG)
    with PolicyStore.from_directory(tree) as store:
        break_tree(tree, "schema")
        results = [store.reload() for _ in range(3)]
        assert all(r.rejected for r in results)
        assert [r.repeated for r in results] == [False, True, True]
        assert store.stats().rejected == 1
        # One line per diagnostic (the routes' warning too), once for the three reloads.
        lines = diagnostic_lines(caplog)
        assert lines == [str(d) for d in results[0].diagnostics]
        [error] = results[0].errors
        found = LINE.match(str(error))
        assert found is not None
        assert found["file"] == str(tree / "team.yaml")
        assert found["code"] == "schema.unknown-key"

        # Another bad edit is another rejection, logged in its turn.
        (tree / "team.yaml").write_text("version: 1\nname: team\nother: 1\n", encoding="utf-8")
        assert not store.reload().repeated
        assert store.stats().rejected == 2
        assert len(diagnostic_lines(caplog)) == 2 * len(lines)


def test_the_same_refused_files_after_a_good_revision_are_a_new_rejection(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        good = store.revision
        break_tree(tree, "schema")
        assert store.reload().rejected
        write_tree(tree, "A")  # back to what is served: the bad edit is over
        assert store.reload().reason == "unchanged"
        break_tree(tree, "schema")
        again = store.reload()
        assert again.rejected and not again.repeated
        write_tree(tree, "B")
        assert store.reload().swapped
        break_tree(tree, "schema")
        assert not store.reload().repeated
        assert store.stats().rejected == 3
        assert store.revision not in ("", good)


def test_a_log_line_cannot_be_forged_by_a_policy_file(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=STORE_LOG)
    with PolicyStore.from_directory(tree) as store:
        # A key holding a newline is quoted in the message; the log line stays one line.
        (tree / "team.yaml").write_text(
            'version: 1\nname: team\n"x\\nerror[forged]: y": 1\n', encoding="utf-8"
        )
        assert store.reload().rejected
    messages = [r.getMessage() for r in caplog.records if r.name == STORE_LOG]
    assert messages and all("\n" not in m for m in messages)
    assert any("\\n" in m for m in messages)


# ------------------------------------------------------------------ status


def test_status_keeps_the_last_rejection_with_its_diagnostics(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        ok = store.status()
        assert ok.ready and ok.revision == store.revision and ok.kind == "directory"
        assert ok.source == str(tree) and ok.rejection is None and ok.problems == ()
        assert ok.swapped_at is not None

        break_tree(tree, "schema")
        first = store.reload()
        store.reload()
        status = store.status()
        assert status.ready and status.revision == ok.revision  # the good one still serves
        rejection = status.rejection
        assert rejection is not None and status.rejection_pending
        assert rejection.candidate == first.candidate is not None
        assert rejection.attempts == 2
        assert rejection.first_at <= rejection.last_at
        assert rejection.diagnostics == first.diagnostics
        assert rejection.errors[0].location.file == str(tree / "team.yaml")
        data = status.to_json()
        assert data["rejection"]["attempts"] == 2
        assert data["rejection"]["first_at"].endswith("Z")
        assert data["source"] == {"kind": "directory", "location": str(tree)}
        assert not private(store, json.dumps(data))

        write_tree(tree, "B")
        assert store.reload().swapped
        after = store.status()
        assert after.rejection == rejection and not after.rejection_pending


def test_a_store_serving_nothing_says_why(tree: Path) -> None:
    break_tree(tree, "schema")
    with PolicyStore.from_directory(tree) as store:
        status = store.status()
        assert not status.ready and status.revision == ""
        assert status.problems == status.rejection.diagnostics  # type: ignore[union-attr]
        assert [d.code for d in status.problems if d.severity == "error"] == ["schema.unknown-key"]
        with pytest.raises(StoreError) as caught:
            store.plan_for(model())
        error = caught.value.diagnostic
        assert error.code == "store.not-ready"
        assert "schema.unknown-key" in [c["code"] for c in error.details["causes"]]


def test_a_source_that_cannot_be_read_is_the_problem_shown(tmp_path: Path) -> None:
    with PolicyStore.from_directory(tmp_path / "missing") as store:
        [problem] = store.status().problems
        assert problem.code == "store.unavailable"
        assert "is not a directory" in problem.message
        assert problem.location.file == str(tmp_path / "missing")


# ------------------------------------------------------------------ locations


def test_a_plan_and_its_decisions_name_the_watched_files(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        plan = store.plan_for(SONNET)
        text = json.dumps(plan.to_json())
        assert not private(store, text)
        assert plan.policy_file == str(tree / "team.yaml")
        assert plan.layers[0].location.file == str(tree / "team.yaml")
        assert str(tree / "team.yaml") in text
        assert plan.locate("compaction.tail_turns").file == str(tree / "team.yaml")
        result = store.apply(SESSION, SONNET)
        cited = [d.at.file for d in result.decisions if d.at is not None]
        assert str(tree / "team.yaml") in cited
        assert not any(private(store, f) for f in cited)
        assert marker_of(result.body()) == "A"  # still built from the store's own copy


def test_a_bundle_plan_names_the_files_inside_the_bundle(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    write_tree(tree, "A")
    bundle = tmp_path / "team.tar.gz"
    build_bundle(tree, bundle)
    with PolicyStore.from_bundle(bundle) as store:
        plan = store.plan_for(SONNET)
        assert plan.policy_file == f"{bundle}!/team.yaml"
        assert not private(store, json.dumps(plan.to_json()))


def test_an_error_raised_while_applying_names_the_watched_file(tree: Path) -> None:
    # Compiles, and passes the canary (one turn), but divides by zero on two turns.
    policy = POLICY.format(tail=2) + (
        "prune:\n  protect_tokens: floor(1000 / (session.turns - 2)) + 5000\n"
    )
    (tree / "team.yaml").write_text(policy, encoding="utf-8")
    with PolicyStore.from_directory(tree) as store:
        assert store.revision
        with pytest.raises(EvalError) as caught:
            store.apply(SESSION, SONNET)
        error = caught.value
        assert error.diagnostic.location.file == str(tree / "team.yaml")
        assert not private(store, str(error))
        assert not any(private(store, json.dumps(d.to_json())) for d in error.diagnostics)


# ------------------------------------------------------------------ the bundled policies


def test_the_bundled_policies_serve_every_model_on_kilo_default(compiles: Compiles) -> None:
    with PolicyStore.from_bundled() as store:
        status = store.status()
        assert status.ready and status.kind == "bundled" and status.source == "<bundled>"
        assert store.plan_for(SONNET).policy == "kilo-default"
        assert store.apply(SESSION, SONNET).revision == store.revision
        before = compiles.count
        assert store.reload().reason == "unchanged"
        assert compiles.count == before
        # Nothing to watch or poll: the background thread ends at once.
        store.start()
        thread = store._thread
        assert thread is not None
        thread.join(10)
        assert not thread.is_alive()
