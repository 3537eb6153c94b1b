"""``kilo-rules gateway --workers 2``: the real command, its supervisor and two worker
processes on 127.0.0.1, in front of the fake upstream of this process. Requests are answered
by both workers, a conversation compacted by one worker is sent with the same bytes by the
other (the shared SQLite ledger), ``/metrics`` sums both workers' counts, and SIGTERM to the
supervisor ends every process with exit 0."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx

from kilo_rules.tools.serving.gateway import GatewaySettings
from kilo_rules.tools.serving.sidecar.workers import WORKER_HEADER

from .gateway_server import AUTH, TOKEN, small_model
from .upstream import Upstream

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="--workers needs os.fork")

MODEL = "claude-small"
HEADERS = {
    **AUTH,
    "x-api-key": "sk-ant-test",
    "anthropic-version": "2023-06-01",
    "content-type": "application/json",
}


@dataclass
class Running:
    proc: subprocess.Popen[str]
    url: str
    err: list[str] = field(default_factory=list)

    def stderr(self) -> str:
        return "".join(self.err)


def children(pid: int) -> set[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return {int(p) for p in out.stdout.split()}


@contextlib.contextmanager
def gateway(upstream: Upstream, tmp_path: Path, *extra: str) -> Iterator[Running]:
    """``kilo-rules gateway --workers 2 --port 0`` over every model on the ``gateway``
    policy, ``claude-small`` a 16k-token model; yields once /healthz answers. SIGTERM at the
    end if it still runs."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "routes.yaml").write_text("version: 1\nroutes: []\ndefault: gateway\n")
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    models = tmp_path / "models.json"
    descriptor = small_model(MODEL, "anthropic", 16_000).model_dump(mode="json")
    models.write_text(json.dumps([descriptor]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILO_RULES_")}
    env.update(TMPDIR=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "kilo_rules", "gateway", "--workers", "2", "--port", "0"),
            *("--dir", str(policies), "--models", str(models), "--token-file", str(tokens)),
            *("--anthropic-url", upstream.url, "--openai-url", upstream.url),
            *("--ledger", str(tmp_path / "ledger.sqlite3"), "--log-level", "warning"),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    running = Running(proc, "")
    found = threading.Event()

    def read() -> None:  # the whole of stderr, so that the pipe never fills
        assert proc.stderr is not None
        for line in proc.stderr:
            running.err.append(line)
            url = re.search(r"ANTHROPIC_BASE_URL=(http://\S+)", line)
            if url:
                running.url = url.group(1)
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            if found.is_set():
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{running.url}/healthz", headers=AUTH).status_code == 200:
                        break
            assert proc.poll() is None, running.stderr()
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        reader.join(5)
        assert proc.stderr is not None
        proc.stderr.close()


def stop(running: Running) -> None:
    """SIGTERM to the supervisor: it ends, exit 0, within a few seconds, workers first."""
    workers = children(running.proc.pid)
    started = time.monotonic()
    running.proc.send_signal(signal.SIGTERM)
    code = running.proc.wait(15)
    assert code == 0, running.stderr()
    assert time.monotonic() - started < 5
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def history(turns: int, words: int = 150) -> list[dict[str, Any]]:
    """A synthetic agent history: the task, then ``turns`` tool calls and their results."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "Task: fix the bug in src/app.py."}]
    for i in range(turns):
        call = {
            "type": "tool_use",
            "id": f"toolu_{i}",
            "name": "bash",
            "input": {"cmd": f"cat {i}"},
        }
        text = f"file {i}: " + " ".join(f"w{i}x{j}" for j in range(words))
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": text}
        out += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    return out


TOOLS = [
    {
        "name": "bash",
        "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def body(messages: list[dict[str, Any]]) -> bytes:
    # The messages last: the body's bytes up to their closing bracket are a prefix of the
    # next turn's, as an agent's are.
    data = {"model": MODEL, "max_tokens": 512, "tools": TOOLS, "messages": messages}
    return json.dumps(data).encode()


def post(url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    """On a connection of its own, so that either worker may take it."""
    r = httpx.post(f"{url}/v1/messages", content=body(messages), headers=HEADERS, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_workers_is_a_typed_setting_defaulting_to_one(monkeypatch: Any) -> None:
    assert GatewaySettings().workers == 1
    monkeypatch.setenv("KILO_RULES_GATEWAY_WORKERS", "3")
    assert GatewaySettings().workers == 3
    monkeypatch.setenv("KILO_RULES_GATEWAY_WORKERS", "0")
    with pytest.raises(ValueError, match="workers"):
        GatewaySettings()


def test_a_ledger_that_cannot_open_is_one_line_before_any_fork(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kilo_rules.tools.cli import main

    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "routes.yaml").write_text("version: 1\nroutes: []\ndefault: gateway\n")
    (tmp_path / "tokens").write_text(TOKEN + "\n")
    args = ["gateway", "--workers", "2", "--port", "0", "--dir", str(policies)]
    args += ["--token-file", str(tmp_path / "tokens"), "--ledger", str(tmp_path)]  # a directory
    assert main(args) == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if "cannot open the ledger" in x]
    assert line.startswith("kilo-rules gateway: cannot open the ledger")
    assert line.endswith("(--ledger FILE, or --no-ledger)")


@pytest.mark.slow
def test_two_workers_answer_and_metrics_sum_both(upstream: Upstream, tmp_path: Path) -> None:
    with gateway(upstream, tmp_path) as gw:
        messages = history(2)
        answers: list[httpx.Response] = []
        with ThreadPoolExecutor(8) as pool:
            for _ in range(20):
                answers += pool.map(lambda _: post(gw.url, messages), range(16))
                if len({r.headers[WORKER_HEADER] for r in answers}) > 1:
                    break
        pids = {int(r.headers[WORKER_HEADER]) for r in answers}
        assert pids == children(gw.proc.pid) and len(pids) == 2
        assert all(r.headers["x-kilo-rules-revision"] for r in answers)
        # Whichever worker answers /metrics, it counts both workers' requests.
        line = 'kilo_rules_gateway_requests_total{api="anthropic-messages",status="200"}'
        for _ in range(4):
            text = httpx.get(f"{gw.url}/metrics", headers=AUTH).text
            [count] = [x for x in text.splitlines() if x.startswith(line + " ")]
            assert float(count.rsplit(" ", 1)[1]) == len(answers)
            assert "kilo_rules_gateway_cache_read_share{" in text
            assert "kilo_rules_builds" not in text  # the pool's sidecar metrics stay out
        stop(gw)


def two_connections(url: str) -> dict[int, httpx.Client]:
    """A keep-alive client on each worker (a connection stays with the worker that took
    it): connections are opened until both workers have one."""
    clients: dict[int, httpx.Client] = {}
    spare: list[httpx.Client] = []
    deadline = time.monotonic() + 30
    while len(clients) < 2:
        assert time.monotonic() < deadline, "one worker took every connection"
        client = httpx.Client(headers=HEADERS, timeout=60)
        pid = int(client.get(f"{url}/healthz").headers[WORKER_HEADER])
        if pid in clients:
            spare.append(client)  # kept open: the next connection is accepted anew
        else:
            clients[pid] = client
    for client in spare:
        client.close()
    return clients


@pytest.mark.slow
def test_a_compaction_by_one_worker_is_sent_byte_for_byte_by_the_other(
    upstream: Upstream, tmp_path: Path
) -> None:
    turns = history(30)
    sent: list[tuple[int, list[str], bytes]] = []  # (worker, rules, upstream body)
    with gateway(upstream, tmp_path) as gw:
        clients = two_connections(gw.url)
        order = list(clients.values())
        try:
            for n, k in enumerate(range(21, 61, 2)):  # 20 turns, alternating workers
                r = order[n % 2].post(f"{gw.url}/v1/messages", content=body(turns[:k]))
                assert r.status_code == 200, r.text
                assert upstream.received[-1].refused is None
                rules = r.headers.get("x-kilo-rules-rules", "").split(",")
                sent.append((int(r.headers[WORKER_HEADER]), rules, upstream.received[-1].body))
        finally:
            for client in order:
                client.close()
        stop(gw)
    assert {pid for pid, _, _ in sent} == set(clients)
    compacted = [n for n, (_, rules, _) in enumerate(sent) if "compaction" in rules]
    assert compacted, "the history never compacted"
    hits = 0
    for n in range(compacted[0] + 1, len(sent)):
        (before_pid, _, before), (pid, rules, now) = sent[n - 1], sent[n]
        if "compaction" in rules:
            continue  # a rolling compaction: a new head from here
        assert "ledger.hit" in rules
        assert pid != before_pid
        # The other worker sent the compacted head byte for byte: the provider's cache hits.
        assert len(json.loads(now)["messages"]) < 21 + 2 * n
        assert now.startswith(before[: before.rindex(b"]")])
        hits += 1
    assert hits
