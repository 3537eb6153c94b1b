"""PolicyStore over a directory: revisions swapped whole, refused ones never served, the
files of a revision fixed while it serves, steps in flight kept on their snapshot."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import jsonschema
import pytest

import kilo_rules.tools.serving.store as store_module
from kilo_rules import PolicyStore, ReloadResult, StoreError, StoreSettings
from kilo_rules.engine.base.errors import CatalogError, PolicyError
from kilo_rules.engine.base.sandbox import allow_read
from kilo_rules.engine.formats.bundle import directory_revision
from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.engine.runtime.apply import StepResult, apply_plan
from kilo_rules.tools.serving.store import CANARY_SESSION

from ..runtime.helpers import model
from .helpers import (
    FIRST,
    SESSION,
    SONNET,
    Compiles,
    break_tree,
    compiles,
    marker_of,
    wait_for,
    write_tree,
)

__all__ = ["compiles"]  # the fixture, imported for pytest

DECISIONS = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "decisions.v1.json").read_text()
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    write_tree(root, "A", tail=2)
    return root


def revisions(store: PolicyStore) -> list[str]:
    return sorted(p.name for p in store.work_dir.iterdir())


# ------------------------------------------------------------------ swap and reject


def test_a_new_revision_is_swapped_in(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        first = store.revision
        assert first == directory_revision(tree).revision
        result = store.apply(SESSION, model())
        assert result.revision == first
        assert marker_of(result.body()) == "A"

        write_tree(tree, "B", tail=4)
        reloaded = store.reload()
        assert reloaded.swapped
        assert reloaded.reason == "new revision"
        assert reloaded.previous == first
        assert reloaded.revision == store.revision == directory_revision(tree).revision
        assert not reloaded.errors
        after = store.apply(SESSION, model())
        assert after.revision == store.revision != first
        assert marker_of(after.body()) == "B"
        assert store.plan_for(model()).settings.compaction.tail_turns == 4
        stats = store.stats()
        assert (stats.swaps, stats.rejected, stats.reloads) == (2, 0, 2)
        assert stats.last_error is None


@pytest.mark.parametrize("how", ["schema", "missing-file", "compile", "routes"])
def test_a_bad_revision_is_rejected_and_the_good_one_keeps_serving(tree: Path, how: str) -> None:
    with PolicyStore.from_directory(tree) as store:
        good = store.revision
        store.plan_for(model())  # in use: a revision must compile for it
        break_tree(tree, how)
        result = store.reload()
        assert not result.swapped
        assert result.rejected and result.reason.startswith("rejected: ")
        assert result.revision == store.revision == good
        assert result.candidate == directory_revision(tree).revision
        assert result.errors
        # Diagnostics name the source directory, not the store's private copy.
        for d in result.diagnostics:
            assert str(store.work_dir) not in str(d.location) + d.message
        assert any(d.location.file.startswith(str(tree)) for d in result.errors)
        served = store.apply(SESSION, model())
        assert served.revision == good and marker_of(served.body()) == "A"
        stats = store.stats()
        assert stats.rejected == 1 and stats.last_error == result.reason

        write_tree(tree, "C")
        fixed = store.reload()
        assert fixed.swapped and store.stats().last_error is None
        assert marker_of(store.apply(SESSION, model()).body()) == "C"


def test_a_half_written_directory_is_rejected_then_accepted_once_whole(tmp_path: Path) -> None:
    root = tmp_path / "p"
    write_tree(root, "A")
    with PolicyStore.from_directory(root) as store:
        good = store.revision
        # The routes file arrives before the policy it names.
        (root / "routes.yaml").write_text(
            (root / "routes.yaml").read_text().replace("./team.yaml", "./next.yaml")
        )
        half = store.reload()
        assert half.rejected
        assert any(d.code == "routes.missing-policy" for d in half.errors)
        assert store.revision == good
        (root / "next.yaml").write_text((root / "team.yaml").read_text())
        assert store.reload().swapped


def test_the_compile_error_of_a_model_in_use_rejects_the_revision(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        store.plan_for(SONNET)
        break_tree(tree, "compile")
        result = store.reload()
        assert result.rejected
        assert [d.code for d in result.errors] == ["plan.dynamic"]
        assert result.errors[0].location.file == str(tree / "team.yaml")


# ------------------------------------------------------------ unchanged, preload


def test_an_unchanged_revision_is_not_compiled_again(tree: Path, compiles: Compiles) -> None:
    with PolicyStore.from_directory(tree) as store:
        assert compiles.calls == [FIRST]  # the routed policy, before anyone asks
        store.plan_for(SONNET)
        store.plan_for(SONNET)
        store.apply(SESSION, SONNET)
        assert compiles.calls == [FIRST, SONNET]  # once per (revision, model)

        assert store.reload().reason == "unchanged"
        write_tree(tree, "A", tail=2)  # the same bytes written again: new mtimes
        again = store.reload()
        assert again.reason == "unchanged" and not again.swapped
        assert compiles.count == 2

        write_tree(tree, "B")
        assert store.reload().swapped
        assert compiles.calls[2:] == [FIRST, SONNET]  # the model in use, before the swap
        store.apply(SESSION, SONNET)
        assert compiles.count == 4
        assert store.stats().reloads == 4


def test_preloaded_models_compile_at_every_reload(tree: Path, compiles: Compiles) -> None:
    settings = StoreSettings(preload=(SONNET,))
    with PolicyStore.from_directory(tree, settings=settings) as store:
        assert compiles.calls == [FIRST, SONNET]
        store.plan_for(SONNET)
        assert compiles.count == 2
        write_tree(tree, "B")
        assert store.reload().swapped
        assert compiles.calls == [FIRST, SONNET, FIRST, SONNET]
        # A preloaded model that no longer compiles rejects the revision.
        break_tree(tree, "compile")
        assert store.reload().rejected


def test_an_unknown_preloaded_model_is_refused_at_once(tree: Path) -> None:
    with pytest.raises(CatalogError):
        PolicyStore.from_directory(tree, settings=StoreSettings(preload=("nope/model",)))


def test_models_in_use_are_bounded(tree: Path, compiles: Compiles) -> None:
    ids = [m.id for m in bundled_catalog().models if m.family == "claude" and m.id != FIRST][:3]
    with PolicyStore.from_directory(tree, settings=StoreSettings(max_models=2)) as store:
        for mid in ids:
            store.plan_for(mid)
        write_tree(tree, "B")
        before = compiles.count
        assert store.reload().swapped
        # The routed policy's first model, then those in use: the least recently used is
        # forgotten.
        assert compiles.calls[before:] == [FIRST, *ids[1:]]


# --------------------------------------------------------------- snapshots and files


def test_a_step_in_flight_finishes_on_the_revision_it_started_with(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(plan: object, session: object, step: object = None) -> StepResult:
        if session is not CANARY_SESSION:  # the reload's own check is not held
            entered.set()
            assert release.wait(10)
        return apply_plan(plan, session, step)  # type: ignore[arg-type]

    with PolicyStore.from_directory(tree) as store:
        old = store.revision
        monkeypatch.setattr(store_module, "apply_plan", held)
        out: list[StepResult] = []
        worker = threading.Thread(target=lambda: out.append(store.apply(SESSION, model())))
        worker.start()
        assert entered.wait(10)

        write_tree(tree, "B")
        assert store.reload().swapped
        # The old revision's directory stays while the step holds it.
        assert len(revisions(store)) == 2

        release.set()
        worker.join(10)
        assert out[0].revision == old
        assert marker_of(out[0].body()) == "A"
        # The old revision's directory went with the step that held it.
        assert len(revisions(store)) == 1

        monkeypatch.setattr(store_module, "apply_plan", apply_plan)
        now = store.apply(SESSION, model())
        assert now.revision == store.revision != old
        assert marker_of(now.body()) == "B"


def test_a_snapshot_answers_from_one_revision(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store, store.snapshot() as snap:
        write_tree(tree, "B", tail=5)
        assert store.reload().swapped
        assert snap.revision != store.revision
        assert snap.route_for(model()).route == "claude"
        assert snap.plan_for(SONNET).settings.compaction.tail_turns == 2
        assert marker_of(snap.apply(SESSION, model()).body()) == "A"
        assert store.plan_for(SONNET).settings.compaction.tail_turns == 5


def test_a_revision_keeps_its_files_while_the_source_changes(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        store.plan_for(model())
        # Rewritten without a reload: a model first asked for now still compiles from the
        # files the revision was checked with.
        (tree / "prompts" / "marker.txt").write_text("MARKER<live>\n")
        (tree / "team.yaml").write_text("not: [valid\n")
        assert marker_of(store.apply(SESSION, SONNET).body()) == "A"
        # Compiled from the store's copy, and reported where the operator wrote it.
        plan = store.plan_for(SONNET)
        assert plan.policy_file == str(tree / "team.yaml")
        assert not Path(plan.policy_file).is_relative_to(store.work_dir)


def test_symlinks_in_the_directory_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("MARKER<secret>\n")
    root = tmp_path / "p"
    write_tree(root, "A")
    (root / "prompts" / "marker.txt").unlink()
    (root / "prompts" / "marker.txt").symlink_to(secret)
    with PolicyStore.from_directory(root) as store:
        assert store.revision == ""
        assert store.stats().rejected == 1
        with pytest.raises(StoreError) as info:
            store.plan_for(model())
        assert info.value.diagnostic.code == "store.not-ready"
        assert "'prompts/marker.txt' does not exist" in info.value.diagnostic.message


def test_a_routed_policy_must_lie_inside_the_revision(tmp_path: Path) -> None:
    root = tmp_path / "p"
    write_tree(root, "A")
    outside = tmp_path / "outside"
    write_tree(outside, "X")
    routes = root / "routes.yaml"
    routes.write_text("version: 1\nroutes: []\ndefault: ../outside/team.yaml\n")
    with PolicyStore.from_directory(root) as store:
        # Relative to the revision's own copy, where nothing outside the tree is.
        assert "outside the directories a policy may read" in (store.stats().last_error or "")
    # Even where the operator allows reads, a routed policy outside the tree would be
    # served under a revision that does not hash it.
    routes.write_text(f"version: 1\nroutes: []\ndefault: {outside / 'team.yaml'}\n")
    with allow_read([tmp_path]), PolicyStore.from_directory(root) as store:
        assert store.revision == ""
        last = store.stats().last_error or ""
        assert "is outside the revision" in last


def test_a_missing_directory_is_unavailable_until_it_appears(tmp_path: Path) -> None:
    root = tmp_path / "later"
    with PolicyStore.from_directory(root) as store:
        assert store.revision == ""
        stats = store.stats()
        assert stats.unavailable == 1 and stats.rejected == 0
        assert (stats.last_error or "").startswith("source unavailable: ")
        with pytest.raises(StoreError) as info:
            store.apply(SESSION, model())
        assert info.value.diagnostic.code == "store.not-ready"
        write_tree(root, "A")
        assert store.reload().swapped
        assert marker_of(store.apply(SESSION, model()).body()) == "A"


def test_a_model_whose_compile_fails_is_not_remembered(tree: Path, compiles: Compiles) -> None:
    other = next(m.id for m in bundled_catalog().models if m.id not in (FIRST, SONNET))
    (tree / "team.yaml").write_text(
        f"version: 1\nname: team\noverrides:\n  - when: 'model.id == \"{SONNET}\"'\n"
        '    set:\n      cache:\n        when: "session.turns > 3"\n'
    )
    with PolicyStore.from_directory(tree) as store:
        with pytest.raises(PolicyError) as info:
            store.plan_for(SONNET)
        assert str(store.work_dir) not in str(info.value)  # shown as the source's file
        assert info.value.diagnostic.location.file == str(tree / "team.yaml")
        store.plan_for(other)
        write_tree(tree, "B")
        before = compiles.count
        assert store.reload().swapped  # not held back by the model that never compiled
        assert compiles.calls[before:] == [FIRST, other]


# --------------------------------------------------------------------- results, API


def test_the_turn_result_names_its_revision(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        result = store.apply(SESSION, model())
        doc = result.to_json()
        assert doc["revision"] == store.revision
        jsonschema.validate(doc, DECISIONS)
        direct = apply_plan(store.plan_for(model()), SESSION)
        assert direct.revision is None and "revision" not in direct.to_json()


def test_listeners_hear_every_attempt(tree: Path) -> None:
    heard: list[ReloadResult] = []

    def broken(result: ReloadResult) -> None:
        raise RuntimeError("a listener's bug")

    with PolicyStore.from_directory(tree) as store:
        store.add_listener(broken)
        store.add_listener(heard.append)
        store.reload()
        break_tree(tree, "schema")
        store.reload()
        write_tree(tree, "B")
        store.reload()
        assert [r.reason.split(":")[0] for r in heard] == ["unchanged", "rejected", "new revision"]
        assert any(d["code"] == "schema.unknown-key" for d in heard[1].to_json()["diagnostics"])


def test_a_closed_store_serves_nothing_and_leaves_no_files(tree: Path) -> None:
    store = PolicyStore.from_directory(tree)
    plan = store.plan_for(model())
    work = store.work_dir
    store.close()
    store.close()  # twice is fine
    assert not work.exists()
    with pytest.raises(StoreError) as info:
        store.plan_for(model())
    assert info.value.diagnostic.code == "store.closed"
    assert marker_of(apply_plan(plan, SESSION).body()) == "A"  # a plan is self-contained


# ------------------------------------------------------------------------ watching


@pytest.mark.parametrize("watcher", ["watchfiles", "polling"])
def test_a_watched_directory_reloads_on_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watcher: str
) -> None:
    if watcher == "polling":
        monkeypatch.setenv("WATCHFILES_FORCE_POLLING", "1")  # as on a volume without events
    root = tmp_path / "p"
    write_tree(root, "A")
    settings = StoreSettings(debounce_seconds=0.05, poll_seconds=5.0)
    with PolicyStore.from_directory(root, settings=settings, watch=True) as store:
        first = store.revision
        write_tree(root, "B")
        wait_for(lambda: store.revision not in ("", first))
        assert marker_of(store.apply(SESSION, model()).body()) == "B"
        second = store.revision

        break_tree(root, "schema")
        wait_for(lambda: store.stats().rejected >= 1)
        assert store.revision == second

        write_tree(root, "C")
        wait_for(lambda: store.revision not in (first, second))
        assert marker_of(store.apply(SESSION, model()).body()) == "C"


def test_a_watched_directory_that_appears_later_is_picked_up(tmp_path: Path) -> None:
    root = tmp_path / "later"
    settings = StoreSettings(debounce_seconds=0.02, poll_seconds=5.0)
    with PolicyStore.from_directory(root, settings=settings, watch=True) as store:
        assert store.revision == ""
        write_tree(root, "A")
        wait_for(lambda: store.revision != "")
        assert marker_of(store.apply(SESSION, model()).body()) == "A"
