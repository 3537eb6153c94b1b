"""A build past its time bound really stops, and the build slots count work still running:
issue 23 found six 4.5 MB bodies answered 504 while six threads kept building."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.engine.base import cancel
from kilo_rules.engine.base.errors import CancellationError
from kilo_rules.engine.formats.session import dump_session
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime import apply
from kilo_rules.tools.serving.store import PolicyStore

from .conftest import MODEL, TRAJECTORIES, Live, small_session

LONGEST = TRAJECTORIES / "claude-code-opus46-spotter-8463c716.jsonl"


def running(live: Live) -> int:
    """The sidecar's gauge of builds on worker threads, read from /metrics."""
    with live.client() as http:
        text = http.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("kilo_rules_builds_running "):
            return int(float(line.split()[1]))
    raise AssertionError("no kilo_rules_builds_running in /metrics")


def drained(live: Live, within: float = 60.0) -> bool:
    """Whether every build thread has ended within a (generous) bound."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if running(live) == 0:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def big_body() -> bytes:
    """A body of about 5 MB: the longest recorded session, its messages three times over
    (ids made unique), as the issue's bodies were."""
    session = json.loads(dump_session(read_session(LONGEST)))
    messages = []
    for k in range(3):
        for m in session["messages"]:
            parts = []
            for p in m["parts"]:
                q = {**p, "id": f"{p['id']}_{k}"}
                if "call_id" in p:
                    q["call_id"] = f"{p['call_id']}_{k}"
                parts.append(q)
            messages.append({**m, "id": f"{m['id']}_{k}", "parts": parts})
    body = json.dumps({"session": {**session, "messages": messages}, "model": MODEL})
    assert len(body) > 4_000_000
    return body.encode()


@pytest.mark.slow
def test_big_bodies_past_the_bound_stop_and_give_their_slots_back(
    policy_dir: Path, live_factory: Any, big_body: bytes
) -> None:
    live = live_factory(
        PolicyStore.from_directory(policy_dir), max_concurrent_builds=2, build_timeout=0.05
    )
    sidecar = live.app.state.sidecar
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, sidecar.slots().running)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for round_ in range(3):  # repeated rounds: nothing accumulates
            with ThreadPoolExecutor(6) as pool, live.client() as http:
                answers = list(
                    pool.map(
                        lambda _: http.post(
                            "/v1/build",
                            content=big_body,
                            headers={"content-type": "application/json"},
                        ),
                        range(6),
                    )
                )
            # A build of a body seen in an earlier round may reuse its parse and finish
            # inside the bound; the first round's run past it.
            codes = [r.json()["error"]["code"] for r in answers if r.status_code != 200]
            assert {r.status_code for r in answers} <= {200, 503, 504}, codes
            assert "build.timeout" in codes or round_ > 0  # the first round's parse is cold
            busy = [r for r in answers if r.status_code == 503]
            assert all(r.headers["retry-after"] == "1" for r in busy)
            assert all(r.json()["error"]["code"] == "server.busy" for r in busy)
            assert drained(live), "a cancelled build kept running"
    finally:
        stop.set()
        watcher.join()
    assert peak <= 2, "more builds ran at once than the limit"
    with live.client() as http:  # and the sidecar still builds
        ok = http.post("/v1/build", json={"session": small_session(), "model": MODEL})
    assert ok.status_code in (200, 504)


@pytest.fixture
def endless(
    policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PolicyStore, threading.Event]]:
    """(a store loaded with the real engine, an event set when the build stopped), then
    a lower stage that never ends by itself: a long loop that checks in, as the engine's
    loops do. The store loads first: its canary must not meet the endless stage."""
    store = PolicyStore.from_directory(policy_dir)
    stopped = threading.Event()
    stages = dict(apply.STAGES)

    def spin(st: Any) -> None:
        try:
            while True:
                cancel.checkpoint()
        finally:
            stopped.set()

    stages["lower"] = spin
    monkeypatch.setattr(apply, "STAGES", stages)
    yield store, stopped


def test_a_build_that_would_never_end_is_stopped(
    live_factory: Any, endless: tuple[PolicyStore, threading.Event]
) -> None:
    store, stopped = endless
    live = live_factory(store, max_concurrent_builds=1, build_timeout=0.3)
    body = {"session": small_session(), "model": MODEL}
    with live.client() as http:
        first = http.post("/v1/build", json=body)
    assert first.status_code == 504 and first.json()["error"]["code"] == "build.timeout"
    assert stopped.wait(30), "the build thread did not stop"
    assert drained(live)


def test_a_slot_held_by_cancelled_work_is_not_given_to_new_requests(
    policy_dir: Path, live_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Work that ignores cancellation (one long C call) keeps its slot until it returns.
    release = threading.Event()
    store = PolicyStore.from_directory(policy_dir)  # loaded (and canaried) by the real engine
    stages = dict(apply.STAGES)
    stages["lower"] = lambda st: release.wait(30)
    monkeypatch.setattr(apply, "STAGES", stages)
    live = live_factory(store, max_concurrent_builds=1, build_timeout=0.3)
    body = {"session": small_session(), "model": MODEL}
    try:
        with live.client() as http:
            first = http.post("/v1/build", json=body)
            second = http.post("/v1/build", json=body)
            assert running(live) == 1
    finally:
        release.set()
    assert first.status_code == 504
    assert second.status_code == 503 and second.json()["error"]["code"] == "server.busy"
    assert drained(live)


def test_checkpoints_raise_only_under_a_cancelled_token() -> None:
    cancel.checkpoint()  # no token: nothing happens
    token = cancel.CancelToken()
    with cancel.cancellable(token):
        cancel.checkpoint()
        token.cancel("stop")
        with pytest.raises(CancellationError, match="stop"):
            cancel.checkpoint()
    cancel.checkpoint()
    with cancel.cancellable(cancel.CancelToken.after(0)), pytest.raises(CancellationError):
        cancel.checkpoint()


def test_the_token_follows_the_work_into_a_worker_thread() -> None:
    import anyio
    import anyio.to_thread

    token = cancel.CancelToken()
    token.cancel()

    async def main() -> Any:
        with cancel.cancellable(token):
            return await anyio.to_thread.run_sync(cancel.current)

    assert anyio.run(main) is token


def test_the_gauge_ends_at_the_count_of_builds_still_running() -> None:
    # Releases on many threads at once: each tells the gauge what it counted, and a slow
    # gauge must not let an older count land after a newer one (the gauge stayed at 1
    # with nothing running).
    import random

    import anyio

    from kilo_rules.tools.serving.sidecar.slots import Slots

    told: list[int] = []

    def gauge(running: int) -> None:
        time.sleep(random.random() / 500)
        told.append(running)

    slots = Slots(8, gauge)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(slots.run, lambda: time.sleep(0.01), cancel.CancelToken(), 10.0)

    for _ in range(20):
        told.clear()
        anyio.run(main)
        assert slots.running == 0
        assert told[-1] == 0, told
