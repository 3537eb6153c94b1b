"""The directory watcher (watchfiles, by file events or polling) and the store's retries
through the shared policy (kilo_rules.engine.base.retry), cancellation included."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import watchfiles

import kilo_rules.tools.serving.store as store_module
from kilo_rules import PolicyStore, StoreSettings
from kilo_rules.engine.base.cancel import CancelToken, cancellable
from kilo_rules.engine.base.errors import CancellationError
from kilo_rules.engine.base.safefs import write_atomic

from ..runtime.helpers import model
from .helpers import SESSION, marker_of, wait_for, write_tree

FAST = StoreSettings(debounce_seconds=0.05, poll_seconds=60.0)


def marker(store: PolicyStore) -> str:
    return marker_of(store.apply(SESSION, model()).body())


def prompt(root: Path) -> Path:
    return root / "prompts" / "marker.txt"


@pytest.mark.slow
@pytest.mark.parametrize("polling", [False, True], ids=["events", "polling"])
def test_a_rename_and_an_in_place_write_are_both_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, polling: bool
) -> None:
    if polling:
        monkeypatch.setenv("WATCHFILES_FORCE_POLLING", "1")
    root = tmp_path / "p"
    write_tree(root, "A")
    # poll_seconds is a minute: only the watcher can see these changes in time.
    with PolicyStore.from_directory(root, settings=FAST, watch=True) as store:
        assert marker(store) == "A"
        # Renamed over the old file (a new inode), as editors and write_atomic do.
        write_atomic(prompt(root), b"MARKER<B>\n")
        wait_for(lambda: marker(store) == "B")
        # Written in place (the same inode, truncated and rewritten).
        inode = prompt(root).stat().st_ino
        with prompt(root).open("r+b") as fh:
            fh.truncate(0)
            fh.write(b"MARKER<C>\n")
        assert prompt(root).stat().st_ino == inode
        wait_for(lambda: marker(store) == "C")


@pytest.mark.slow
def test_where_file_events_fail_the_watcher_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[object] = []

    def watch(*paths: Any, **kw: Any) -> Any:
        asked.append(kw.get("force_polling"))
        raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr(watchfiles, "watch", watch)
    root = tmp_path / "p"
    write_tree(root, "A")
    with PolicyStore.from_directory(root, settings=FAST, watch=True) as store:
        wait_for(lambda: asked == [False])
        write_atomic(prompt(root), b"MARKER<B>\n")
        wait_for(lambda: marker(store) == "B")


def test_a_directory_that_keeps_changing_is_read_through_the_retry_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "p"
    write_tree(root, "A")
    with PolicyStore.from_directory(root) as store:
        first = store.revision
        waits: list[float] = []
        monkeypatch.setattr(store_module, "_pause", waits.append)
        copies = [0]

        def rewritten(self: Any, manifest: Any, dest: Path) -> bool:
            copies[0] += 1
            dest.mkdir(mode=0o700)
            return False  # a file no longer matches its hash

        monkeypatch.setattr(store_module._DirectorySource, "_copy", rewritten)
        write_tree(root, "B")
        result = store.reload()
        assert result.reason == f"source unavailable: {root} kept changing while it was read"
        assert copies[0] == store_module.COPY_ATTEMPTS
        # Equal jitter over steps of 0.02 s and 0.04 s: each wait in [step / 2, step].
        assert len(waits) == store_module.COPY_ATTEMPTS - 1
        assert 0.01 <= waits[0] <= 0.02 and 0.02 <= waits[1] <= 0.04
        assert store.revision == first and store.stats().rejected == 0


def test_a_cancelled_reload_stops_and_refuses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "p"
    write_tree(root, "A")
    with PolicyStore.from_directory(root) as store:
        first = store.revision
        token = CancelToken()
        copies = [0]
        real_copy = store_module._DirectorySource._copy

        def flaky(self: Any, manifest: Any, dest: Path) -> bool:
            copies[0] += 1
            if copies[0] == 1:
                dest.mkdir(mode=0o700)
                return False
            return real_copy(self, manifest, dest)

        def pause(seconds: float) -> None:
            token.cancel("the sidecar's request was abandoned")

        monkeypatch.setattr(store_module._DirectorySource, "_copy", flaky)
        monkeypatch.setattr(store_module, "_pause", pause)
        write_tree(root, "B")
        with cancellable(token), pytest.raises(CancellationError):
            store.reload()
        assert copies[0] == 1  # stopped at the wait, not read again
        stats = store.stats()
        assert store.revision == first and stats.rejected == 0
        # Not cancelled, the same change goes through.
        assert store.reload().swapped and marker(store) == "B"
        assert len(list(store.work_dir.iterdir())) == 1  # the cancelled attempt left nothing


def test_the_poll_backoff_is_the_shared_policy_with_full_jitter() -> None:
    rng = random.Random(3)
    twin = random.Random(3)
    draws = [store_module.backoff_delay(n, 10.0, 300.0, rng) for n in (1, 2, 3, 9)]
    expected = [
        store_module.Backoff(10.0, 300.0, "full").delay(n + 1, twin.uniform) for n in (1, 2, 3, 9)
    ]
    assert draws == expected
