"""Latency of a build through the sidecar against the same build in process.

Run with ``python benchmarks/bench_serve.py [session.jsonl] [--builds N]
[--part latency|load|resend] [--load-builds N] [--rounds R] [--resend-steps S]`` (latency
and load by default). The session
defaults to the largest Claude Code trajectory in ``../shared/data/trajectories`` (or the
small example in ``examples/sessions``), taken as ``bench_runtime.py`` takes it: its
recorded compaction left out, the step built the one before the last assistant message.

The sidecar runs as an operator runs it (``kilo-rules serve --dir`` in its own process, on
127.0.0.1) over a policy directory routing every model to kilo-default; the client posts
the same body N times, one at a time, with httpx, and times each answer read whole. The
yardstick, measured in the same run, is what the sidecar saves a client from doing itself:
``json.loads`` of the same body, ``session_from_data`` and ``apply`` on a warm plan. The
ratios of the two latencies' p50 and p99 are what hold across machines; the difference is
the sidecar's cost: HTTP both ways (the client's included), the response encoded, the hand-off
to a worker thread. The sidecar's own part is read from its ``Server-Timing`` header.

The load part (issue 30) runs the sidecar with ``--workers 1`` and ``--workers 2`` and
posts the same body from 1, 2 and 8 clients at once (threads of this process, each on a
keep-alive connection of its own, as many agents each hold one), ``--load-builds`` in all
per point, the points in turn, ``--rounds`` times: the throughput (builds answered a
second) and the p50 and p99 of a build's latency as a client sees it. The yardsticks, from
the same run, are the same server with one client (targets at 8 clients: throughput >=
1.5x, p50 <= 4x) and the same builds on 8 threads of one process (what the sidecar of one
process could at best do with 8 clients). The ratios need idle cores to mean anything: the
last line gives the load average.

The resend part (issue 30) posts the session as an agent does, grown step by step: the
bodies of its last ``--resend-steps`` cut points, each once, oldest first, to a fresh
sidecar, and reads each build's time in the sidecar from ``Server-Timing`` (the first, which
meets the session cold, apart). The yardsticks, in process on the same bodies: the same
builds reading each session from scratch (``json.loads`` and ``session_from_data``, what
the sidecar did before it kept a reader), and reading it through one ``SessionReader``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

# The same session and model as the runtime benchmark, so the two read side by side.
from bench_runtime import FALLBACK, LARGEST, MODEL

from kilo_rules.engine.formats.catalog import model_from_data
from kilo_rules.engine.formats.session import Session, SessionReader, session_from_data
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.tools.serving.store import PolicyStore
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

ROUTES = "version: 1\nroutes: []\ndefault: kilo-default\n"


def percentile(times: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``times``, nearest rank."""
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Seconds of each of ``n`` calls of ``fn`` (after two untimed ones). The garbage
    collector runs when it would: the sidecar's full collections land in its requests, so
    the in-process builds keep theirs too, and the two tails compare like for like."""
    for _ in range(2):
        fn()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_sidecar(policies: Path, port: int, workers: int = 1) -> subprocess.Popen[bytes]:
    """``kilo-rules serve --workers N`` on 127.0.0.1:``port``, ready to answer."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "kilo_rules", "serve", "--dir", str(policies)),
            *("--port", str(port), "--log-level", "warning", "--workers", str(workers)),
            # A benchmark on loopback: no token to read back before timing.
            "--no-auth",
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the sidecar exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the sidecar did not get ready")


def concurrently(
    fn: Callable[[int], object], clients: int, builds: int
) -> tuple[float, list[float]]:
    """(wall seconds, each call's seconds) of ``builds`` calls of ``fn`` from ``clients``
    threads at once (``fn`` is given the thread's number), started together."""
    each = [builds // clients + (i < builds % clients) for i in range(clients)]
    times: list[list[float]] = [[] for _ in range(clients)]
    gate = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        gate.wait()
        for _ in range(each[i]):
            start = time.perf_counter()
            fn(i)
            times[i].append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, [t for ts in times for t in ts]


def _point(
    port: int, body: bytes, clients: int, builds: int
) -> tuple[float, list[float], Counter[str]]:
    """(builds a second, each build's seconds, builds by answering worker) of ``builds``
    posted by ``clients`` clients at once, each on a keep-alive connection of its own."""
    headers = {"content-type": "application/json"}
    pids: Counter[str] = Counter()
    https = [httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) for _ in range(clients)]

    def post(i: int) -> None:
        r = https[i].post("/v1/build", content=body, headers=headers)
        r.raise_for_status()
        pids[r.headers.get("kilo-rules-worker", "main")] += 1

    try:
        concurrently(post, clients, 2 * clients)  # each worker's caches warm
        pids.clear()
        wall, times = concurrently(post, clients, builds)
    finally:
        for h in https:
            h.close()
    return builds / wall, times, pids


def load(
    policies: Path, body: bytes, builds: int, rounds: int, in_process: Callable[[], object]
) -> None:
    """Throughput and latency with 1, 2 and 8 clients, ``--workers`` 1 and 2: both servers
    up at once, the points taken in turn, ``rounds`` times, so that a machine whose speed
    drifts (a shared one) moves every point of a round alike; the ratios are each round's,
    their median reported."""
    wall, _ = concurrently(lambda i: in_process(), 8, builds)
    local = builds / wall
    print(
        f"\nload: {builds} builds a point, {rounds} rounds; in process on 8 threads: "
        f"{local:6.1f} builds/s"
    )
    print(
        f"{'round':>5} {'workers':>7} {'clients':>7} {'builds/s':>9} {'p50':>9} {'p99':>9}  "
        "by worker"
    )
    ports = {w: free_port() for w in (1, 2)}
    procs = {w: start_sidecar(policies, ports[w], w) for w in ports}
    ratios: dict[int, list[tuple[float, float, float]]] = {1: [], 2: []}
    try:
        for n in range(rounds):
            for workers, port in ports.items():
                base: tuple[float, float] | None = None
                for clients in (1, 2, 8):
                    rate, times, pids = _point(port, body, clients, builds)
                    p50 = percentile(times, 0.5)
                    shares = "/".join(str(c) for _, c in pids.most_common())
                    print(
                        f"{n + 1:>5} {workers:>7} {clients:>7} {rate:9.2f} {p50 * 1e3:6.0f} ms "
                        f"{percentile(times, 0.99) * 1e3:6.0f} ms  {shares}"
                    )
                    if base is None:
                        base = (rate, p50)
                    elif clients == 8:
                        ratios[workers].append((rate / base[0], p50 / base[1], rate / local))
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(60)
    for workers, got in ratios.items():
        speedup, slower, vs_local = (statistics.median(r[i] for r in got) for i in range(3))
        print(
            f"workers={workers}, 8 clients vs 1 (median of {len(got)} rounds): throughput "
            f"{speedup:4.2f}x (target >= 1.5x), p50 {slower:4.2f}x (target <= 4x); "
            f"vs in process on 8 threads {vs_local:4.2f}x"
        )
    print(f"cpus: {os.cpu_count()}; load average at the end: {os.getloadavg()[0]:.1f}")


def _body(session: Session, upto: int) -> bytes:
    cut = session.model_copy(update={"messages": session.messages[:upto]})
    return json.dumps(
        {"session": json.loads(cut.model_dump_json(exclude_none=True)), "model": MODEL}
    ).encode()


def resend(policies: Path, session: Session, steps: int) -> None:
    """A fresh sidecar and in-process builds over the session resent with one more message
    each step (its last ``steps`` cut points, oldest first)."""
    n = len(session.messages)
    bodies = [_body(session, k) for k in range(max(1, n - steps), n + 1)]
    print(
        f"\nresend: {len(bodies)} bodies, {n - len(bodies) + 1} to {n} messages, "
        f"{len(bodies[0]) / 1e6:.2f} to {len(bodies[-1]) / 1e6:.2f} MB"
    )
    here = StepInput(workspace=Workspace(cwd=str(Path.cwd().resolve())))
    with PolicyStore.from_directory(policies) as store:
        plan = store.plan_for(model_from_data(MODEL))

        def scratch(body: bytes) -> object:
            return apply_plan(plan, session_from_data(json.loads(body)["session"]), here)

        reader = SessionReader()

        def reused(body: bytes) -> object:
            # The session's own text, as the sidecar hands it to its reader.
            text = body.decode()
            start, end = text.index(":") + 1, text.rindex(', "model"')
            return apply_plan(plan, reader.read(text[start:end]), here)

        local: dict[str, list[float]] = {"scratch": [], "reader": []}
        for label, fn in (("scratch", scratch), ("reader", reused)):
            fn(bodies[0])  # the plan's caches and the reader warm, as the sidecar's are
            for body in bodies[1:]:
                start = time.perf_counter()
                fn(body)
                local[label].append(time.perf_counter() - start)
    port = free_port()
    proc = start_sidecar(policies, port)
    server: list[float] = []
    statuses: Counter[int] = Counter()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            headers = {"content-type": "application/json"}
            for body in bodies:
                r = http.post("/v1/build", content=body, headers=headers)
                statuses[r.status_code] += 1
                server.append(float(r.headers["server-timing"].partition("dur=")[2]) / 1e3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    first, server = server[0], server[1:]
    print(f"{'':<44} {'p50':>11} {'mean':>11}")
    for label, times in (
        ("in process, session read from scratch", local["scratch"]),
        ("in process, session through a SessionReader", local["reader"]),
        ("in the sidecar (Server-Timing)", server),
    ):
        print(
            f"{label:<44} {percentile(times, 0.5) * 1e3:8.1f} ms "
            f"{statistics.fmean(times) * 1e3:8.1f} ms"
        )
    p50 = percentile(server, 0.5)
    print(
        f"sidecar per build / in process from scratch, p50: "
        f"{p50 / percentile(local['scratch'], 0.5):5.2f}x; / through a reader: "
        f"{p50 / percentile(local['reader'], 0.5):5.2f}x; the first build (cold): "
        f"{first * 1e3:.1f} ms; answers {dict(statuses)}"
    )


def main(argv: list[str]) -> None:
    """Print the latencies and their ratios."""
    builds = 100
    load_builds, rounds, resend_steps = 32, 3, 30
    part = "all"
    args = []
    it = iter(argv)
    for a in it:
        if a == "--builds":
            builds = int(next(it))
        elif a == "--part":
            part = next(it)
        elif a == "--load-builds":
            load_builds = int(next(it))
        elif a == "--rounds":
            rounds = int(next(it))
        elif a == "--resend-steps":
            resend_steps = int(next(it))
        elif not a.startswith("--"):
            args.append(a)
    path = Path(args[0]) if args else (LARGEST if LARGEST.exists() else FALLBACK)
    full = without_recorded_compactions(read_session(path))
    last_assistant = max(i for i, m in enumerate(full.messages) if m.role == "assistant")
    step = full.model_copy(update={"messages": full.messages[:last_assistant]})
    body = json.dumps(
        {"session": json.loads(step.model_dump_json(exclude_none=True)), "model": MODEL}
    ).encode()
    print(
        f"session: {path.name}: {len(step.messages)} messages, body {len(body) / 1e6:.2f} MB, "
        f"{builds} builds each way"
    )

    with tempfile.TemporaryDirectory() as tmp:
        policies = Path(tmp) / "policies"
        policies.mkdir()
        (policies / "routes.yaml").write_text(ROUTES, encoding="utf-8")
        if part == "resend":
            resend(policies, step, resend_steps)
            return

        # In process: the same store, a warm plan, the step the sidecar builds (its own
        # working directory as the workspace, as when a request names none).
        with PolicyStore.from_directory(policies) as store:
            plan = store.plan_for(model_from_data(MODEL))
            here = StepInput(workspace=Workspace(cwd=str(Path.cwd().resolve())))

            def in_process() -> object:
                data = json.loads(body)
                return apply_plan(plan, session_from_data(data["session"]), here)

            if part == "load":
                load(policies, body, load_builds, rounds, in_process)
                return
            local = timed(in_process, builds)
            expected = apply_plan(plan, session_from_data(json.loads(body)["session"]), here)
            if part == "all":
                load(policies, body, load_builds, rounds, in_process)

        port = free_port()
        proc = start_sidecar(policies, port)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
                headers = {"content-type": "application/json"}

                server: list[float] = []

                def through_sidecar() -> object:
                    r = http.post("/v1/build", content=body, headers=headers)
                    r.raise_for_status()
                    server.append(float(r.headers["server-timing"].partition("dur=")[2]) / 1e3)
                    return r.content

                answer_bytes = through_sidecar()
                assert isinstance(answer_bytes, bytes)
                answer = json.loads(answer_bytes)
                assert answer["request"] == json.loads(json.dumps(expected.request)), (
                    "the sidecar built another request"
                )
                remote = timed(through_sidecar, builds)
                server = server[-builds:]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)

    def ms(t: float) -> str:
        return f"{t * 1e3:8.1f} ms"

    print(f"{'':<34} {'p50':>11} {'p99':>11} {'mean':>11}")
    for label, times in (
        ("in process: loads+validate+apply", local),
        ("through the sidecar", remote),
        ("  of which in the sidecar", server),
    ):
        print(
            f"{label:<34} {ms(percentile(times, 0.5))} {ms(percentile(times, 0.99))} "
            f"{ms(statistics.fmean(times))}"
        )
    for q in (0.5, 0.99):
        ratio = percentile(remote, q) / percentile(local, q)
        inside = percentile(server, q) / percentile(local, q)
        print(
            f"sidecar / in process, p{round(q * 100)}: {ratio:5.2f}x "
            f"(the sidecar's own part: {inside:5.2f}x)"
        )
    overhead = percentile(remote, 0.5) - percentile(local, 0.5)
    print(
        f"sidecar cost at p50: {overhead * 1e3:.1f} ms for {len(body) / 1e6:.2f} MB up and "
        f"{len(answer_bytes) / 1e6:.2f} MB down; cpus: {os.cpu_count()}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
