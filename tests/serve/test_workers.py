"""``kilo-rules serve --workers 2``: the real server, its supervisor and two worker processes
on 127.0.0.1. Requests are answered by both workers, a revision swapped in reaches every
worker and a refused one none, /metrics and the decision log count every worker's builds,
and no worker outlives the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx

from kilo_rules.tools.cli.serve import ServeSettings
from kilo_rules.tools.serving.sidecar.workers import WORKER_HEADER

from .conftest import MODEL, policy_text, small_session, write_policy
from .test_cli_serve_start import Auth, started

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="--workers needs os.fork")

WATCHED = {"KILO_RULES_STORE_POLL_SECONDS": "0.1", "KILO_RULES_STORE_DEBOUNCE_SECONDS": "0.05"}
BODY = json.dumps({"session": small_session(), "model": MODEL})


def build(url: str, auth: Auth) -> tuple[int, str]:
    """(the answering worker's pid, the marker of the revision the request was built under),
    on a connection of its own, so that any worker may take it."""
    headers = {**auth, "content-type": "application/json"}
    r = httpx.post(f"{url}/v1/build", content=BODY, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    text = json.dumps(r.json()["request"])
    marker = next((m for m in ("rev-A", "rev-B") if m in text), "none")
    return int(r.headers[WORKER_HEADER]), marker


def spread(url: str, auth: Auth, rounds: int = 20) -> list[tuple[int, str]]:
    """Builds sent 8 at a time until two workers have answered (at most ``rounds`` of 16)."""
    answers: list[tuple[int, str]] = []
    with ThreadPoolExecutor(8) as pool:
        for _ in range(rounds):
            answers += pool.map(lambda _: build(url, auth), range(16))
            if len({pid for pid, _ in answers}) > 1:
                break
    return answers


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def metric(url: str, auth: Auth, line_start: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=auth).text
    [line] = [x for x in text.splitlines() if x.startswith(line_start + " ")]
    return float(line.rsplit(" ", 1)[1])


def gone(pid: int, *, zombie: bool = False) -> bool:
    """Whether ``pid`` has exited and been reaped (``zombie``: or exited, unreaped: an
    orphan's reaper is the container's init, which may never reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return zombie and state in ("Z", "X")


def children(pid: int) -> set[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return {int(p) for p in out.stdout.split()}


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    root.mkdir()
    write_policy(root, "rev-A")
    return root


def test_workers_is_a_typed_setting_defaulting_to_one(monkeypatch: Any) -> None:
    assert ServeSettings().workers == 1
    monkeypatch.setenv("KILO_RULES_SERVE_WORKERS", "3")
    assert ServeSettings().workers == 3
    monkeypatch.setenv("KILO_RULES_SERVE_WORKERS", "0")
    with pytest.raises(ValueError, match="workers"):
        ServeSettings()


@pytest.mark.slow
def test_two_workers_answer_and_every_build_is_counted_once(policies: Path, tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    args = ["--dir", str(policies), "--workers", "2", "--decision-log", str(log)]
    with started(args, tmp_path) as (proc, url, auth):
        answers = spread(url, auth)
        pids = {pid for pid, _ in answers}
        assert len(pids) == 2, answers
        assert pids == children(proc.pid)
        assert {marker for _, marker in answers} == {"rev-A"}
        # Whichever worker answers /metrics, it sums both workers' builds.
        for _ in range(4):
            total = metric(url, auth, 'kilo_rules_builds_total{provider="anthropic",status="200"}')
            assert total == len(answers)
        assert metric(url, auth, "kilo_rules_build_seconds_count") == len(answers)
        assert metric(url, auth, "kilo_rules_builds_running") == 0
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = log.read_text().splitlines()
    assert len(lines) == len(answers)
    assert {json.loads(line)["status"] for line in lines} == {200}


@pytest.mark.slow
def test_a_swap_reaches_every_worker_and_a_refused_revision_none(
    policies: Path, tmp_path: Path
) -> None:
    args = ["--dir", str(policies), "--watch", "--workers", "2"]
    with started(args, tmp_path, **WATCHED) as (proc, url, auth):
        first = spread(url, auth)
        assert {marker for _, marker in first} == {"rev-A"}
        before = {pid for pid, _ in first}

        write_policy(policies, "rev-B")
        wait_for(lambda: build(url, auth)[1] == "rev-B", "rev-B was not served")
        after = spread(url, auth)
        # Every worker serves rev-B: those of rev-A were retired, not one of them answers.
        assert {marker for _, marker in after} == {"rev-B"}
        assert len({pid for pid, _ in after}) == 2
        assert not before & {pid for pid, _ in after}
        assert metric(url, auth, "kilo_rules_revision_swaps_total") == 1

        (policies / "main.yaml").write_text(policy_text("rev-C") + "bogus: 1\n")
        wait_for(
            lambda: metric(url, auth, "kilo_rules_revisions_rejected_total") == 1,
            "the broken revision was not refused",
        )
        answers = spread(url, auth)
        assert {marker for _, marker in answers} == {"rev-B"}
        assert len({pid for pid, _ in answers}) == 2
        # Each worker's status names the refusal, whichever answers.
        wait_for(
            lambda: all(
                httpx.get(f"{url}/v1/status", headers=auth).json().get("rejection") is not None
                for _ in range(8)
            ),
            "a worker's status does not show the refused revision",
        )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "unknown key 'bogus'" in err


@pytest.mark.slow
def test_no_worker_outlives_the_server(policies: Path, tmp_path: Path) -> None:
    args = ["--dir", str(policies), "--workers", "2"]
    with started(args, tmp_path) as (proc, url, auth):
        wait_for(lambda: len(children(proc.pid)) == 2, "two workers did not start")
        workers = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert all(gone(pid) for pid in workers)

    # A supervisor killed outright cannot stop them: they stop by themselves.
    with started(args, tmp_path) as (proc, url, auth):
        wait_for(lambda: len(children(proc.pid)) == 2, "two workers did not start")
        workers = children(proc.pid)
        proc.kill()
        proc.communicate(timeout=60)
        wait_for(
            lambda: all(gone(pid, zombie=True) for pid in workers),
            "a worker outlived its supervisor",
        )
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/healthz", headers=auth, timeout=5)


@pytest.mark.slow
def test_a_worker_that_dies_is_replaced(policies: Path, tmp_path: Path) -> None:
    args = ["--dir", str(policies), "--workers", "2"]
    with started(args, tmp_path) as (proc, url, auth):
        wait_for(lambda: len(children(proc.pid)) == 2, "two workers did not start")
        victim = min(children(proc.pid))
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: len(children(proc.pid) - {victim}) == 2, "the dead worker was not replaced"
        )
        assert {marker for _, marker in spread(url, auth)} == {"rev-A"}
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_a_busy_worker_closes_the_connection_after_its_answer() -> None:
    import asyncio

    from kilo_rules.tools.serving.sidecar.workers import _Tagged

    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    tagged = _Tagged(app, 4711)

    async def call(path: str) -> dict[bytes, bytes]:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        await tagged({"type": "http", "path": path}, None, send)
        return dict(sent[0]["headers"])

    async def main() -> tuple[dict[bytes, bytes], dict[bytes, bytes], dict[bytes, bytes]]:
        slow = asyncio.create_task(call("/slow"))
        await asyncio.sleep(0)  # the slow request is in progress
        busy = await call("/fast")
        release.set()
        alone = await slow
        return busy, alone, await call("/fast")

    busy, alone, idle = asyncio.run(main())
    assert busy == {WORKER_HEADER.encode(): b"4711", b"connection": b"close"}
    assert alone == idle == {WORKER_HEADER.encode(): b"4711"}


def test_each_model_built_for_is_reported_once(policy_dir: Path, live_factory: Any) -> None:
    """What a worker tells its supervisor, whose store then checks later revisions for it."""
    from kilo_rules.tools.serving.store import PolicyStore

    told: list[str] = []
    live = live_factory(PolicyStore.from_directory(policy_dir), on_model=told.append)
    inline = {
        "id": "t/inline",
        "provider": "anthropic",
        "family": "claude",
        "api_id": "claude-t",
        "api": "anthropic",
        "limits": {"context": 200_000, "output": 8_000},
    }
    with live.client() as http:
        statuses = [
            http.post("/v1/build", json={"session": small_session(), "model": model}).status_code
            for model in (MODEL, MODEL, inline, "openai/gpt-5", "no/such-model")
        ]
    assert statuses == [200, 200, 200, 200, 404]
    # Built, by catalog id, once each: not a model described inline, not one that failed.
    assert told == [MODEL, "openai/gpt-5"]
