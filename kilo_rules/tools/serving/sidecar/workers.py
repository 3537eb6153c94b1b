"""``kilo-rules serve --workers N``: N worker processes answering on one listening socket.

One interpreter runs one thread of Python at a time, so a sidecar of one process builds
one request at a time however many cores it has. This is the pre-fork model (gunicorn's,
nginx's): the supervisor, the process ``serve`` starts as, binds the socket and holds the
:class:`~kilo_rules.tools.serving.store.PolicyStore`, and forks the workers from itself;
each inherits the socket, the settings and the revision already checked and compiled, and
runs its own uvicorn server on the socket (the kernel hands each connection to one).

A worker serves the revision it was forked with for its whole life, so no worker serves a
revision the store did not accept, and none answers with an older revision after a newer
one. When the store swaps a revision in (or refuses one, which ``/v1/status`` reports),
the supervisor retires every worker (SIGTERM: it stops accepting, answers the requests in
flight within the grace period, then exits) and forks new ones from the store as it is
now: a revision is validated and compiled once, in the supervisor, whatever the number of
workers. A model a worker builds for is reported to the supervisor, whose store compiles
it and checks every later revision for it, as a store of one process does.

Metrics follow prometheus-client's multiprocess convention (:func:`~kilo_rules.tools.
serving.sidecar.metrics.share_values`): ``/metrics``, whichever worker answers, sums every
worker's builds, those of retired workers included; swaps and rejections are counted by the
supervisor. Decision-log lines are appended whole by each worker (``O_APPEND``). Every
response carries the answering worker's pid in ``kilo-rules-worker``.

A worker that dies is replaced; workers that keep exiting as soon as they start stop the
server (exit 2). SIGTERM or SIGINT to the supervisor stops the workers gracefully, then
returns; a worker whose supervisor is gone (killed) stops by itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.tools.serving.sidecar.metrics import Metrics, process_gone, share_values

if TYPE_CHECKING:
    from kilo_rules.tools.serving.store import PolicyStore, ReloadResult

__all__ = ["WORKER_HEADER", "WorkerPool"]

log = logging.getLogger("kilo_rules.tools.serving.sidecar")

#: The response header naming the pid of the worker that answered.
WORKER_HEADER = "kilo-rules-worker"
#: Seconds between the supervisor's looks at its workers (and at a signal received).
_TICK = 0.05
#: A worker that exits with an error within this many seconds of its start failed to start.
_QUICK_EXIT = 5.0

#: Makes a worker's app: given the metrics to count in and where to report models.
AppFactory = Callable[[Metrics, Callable[[str], None]], Any]
#: Makes the uvicorn configuration of a worker's app.
ConfigFactory = Callable[[Any], uvicorn.Config]


@dataclass
class _Worker:
    pid: int
    started: float
    #: When it must be gone (retired workers only): SIGKILL past this.
    deadline: float | None = None


class _Tagged:
    """A worker's ASGI app: ``app``, with :data:`WORKER_HEADER` on every HTTP response, and
    ``connection: close`` on those answered while the worker is answering others too.

    A keep-alive connection stays with the worker that accepted it, and agents that start
    together may all land on one worker while another idles. A busy worker closes the
    connection after the answer, so the client's next request is accepted anew, most
    likely by a worker with its interpreter free (on loopback a new connection costs a
    fraction of a millisecond; a build, milliseconds)."""

    def __init__(self, app: Any, pid: int) -> None:
        self.app = app
        self.header = (WORKER_HEADER.encode(), str(pid).encode())
        self.active = 0  # requests in progress (one event loop: no lock)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                extra = [self.header]
                if self.active > 1:
                    extra.append((b"connection", b"close"))
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        self.active += 1
        try:
            await self.app(scope, receive, tagged)
        finally:
            self.active -= 1


class _OneAtATime(socket.socket):
    """The listening socket as a worker hands it to asyncio, which ``listen``s on it again
    with the backlog it will also take as the number of connections to accept at each
    wake-up: here that stays the supervisor's backlog, and the number is 1 (see
    :meth:`WorkerPool._work`)."""

    def listen(self, backlog: int = 0, /) -> None:
        pass  # the supervisor's listen() stands: the kernel's queue is shared by all


class WorkerPool:
    """``count`` worker processes serving ``make_app``'s app on ``sock``, over ``store``.

    :meth:`run` (on the main thread) serves until SIGTERM or SIGINT; the caller closes the
    store and the socket after it. ``grace``: seconds a retired worker has to answer what
    it is answering before it is killed."""

    def __init__(
        self,
        store: PolicyStore,
        sock: socket.socket,
        count: int,
        make_app: AppFactory,
        make_config: ConfigFactory,
        *,
        grace: float,
        command: str = "serve",
    ) -> None:
        if count < 2:
            raise ValueError("a worker pool has at least 2 workers")
        if not hasattr(os, "fork"):
            raise ValueError("--workers above 1 needs os.fork (Linux, macOS)")
        self.store = store
        self.sock = sock
        self.count = count
        self.grace = grace
        self.command = command  # the CLI command its messages name
        self._make_app = make_app
        self._make_config = make_config
        self._workers: dict[int, _Worker] = {}
        self._retiring: dict[int, _Worker] = {}
        self._results: deque[ReloadResult] = deque()
        self._wake = threading.Event()
        # Held across every fork, and by the supervisor's threads around what they do with
        # the store: a child never inherits a lock one of them held.
        self._forking = threading.Lock()
        self._stopping = False
        self._quick_failures = 0
        self._shared = Path(tempfile.mkdtemp(prefix="kilo-rules-metrics-"))
        self._alive_r, self._alive_w = os.pipe()
        self._models_r, self._models_w = os.pipe()
        self.metrics: Metrics | None = None

    @property
    def pids(self) -> list[int]:
        """The pids of the workers serving now (not those retiring)."""
        return list(self._workers)

    # -- the supervisor ---------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT: 0, or 2 when the workers cannot start."""
        share_values(self._shared)
        self.metrics = Metrics(self._shared)
        # A revision refused while the store first loaded counts, as in one process.
        self.metrics.rejected.inc(self.store.stats().rejected)
        self.store.add_listener(self._on_reload)
        threading.Thread(
            target=self._read_models, name="kilo-rules-serve models", daemon=True
        ).start()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        failed = False
        try:
            while not self._stopping:
                self._reap()
                if self._quick_failures >= 2 * self.count:
                    failed = True
                    break
                self._take_results()
                while len(self._workers) < self.count and not self._stopping:
                    self._spawn()
                self._kill_overdue()
                self._wake.wait(_TICK)
                self._wake.clear()
        finally:
            self._stop_all()
            for s, handler in previous.items():
                signal.signal(s, handler)
            for fd in (self._alive_r, self._alive_w, self._models_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            shutil.rmtree(self._shared, ignore_errors=True)
        if failed:
            print(
                f"kilo-rules {self.command}: the workers could not start (each exited at "
                "once; the reason is above)",
                file=sys.stderr,
            )
            return 2
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A flag only: the loop looks at it every tick (an Event set here could deadlock
        # with the wait it interrupts).
        self._stopping = True

    def _on_reload(self, result: ReloadResult) -> None:
        """A store listener (the store's thread): handed to the main loop."""
        self._results.append(result)
        self._wake.set()

    def _take_results(self) -> None:
        roll = False
        assert self.metrics is not None
        while self._results:
            result = self._results.popleft()
            if result.swapped:
                self.metrics.swaps.inc()
                roll = True
            elif result.rejected and not result.repeated:
                self.metrics.rejected.inc()
                roll = True  # for /v1/status: a worker's store is the one it was forked from
        if roll:
            self._retire_all()

    def _retire_all(self) -> None:
        """Retire every worker; the loop forks their replacements at once."""
        deadline = time.monotonic() + self.grace + 5
        for pid, worker in self._workers.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            worker.deadline = deadline
            self._retiring[pid] = worker
        self._workers.clear()

    def _spawn(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # not written twice, by the child too
        with self._forking, self.store.quiesced():
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = self._work()
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                # Never back into the supervisor's frames: they would close its store.
                os._exit(code)
        self._workers[pid] = _Worker(pid, time.monotonic())

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            process_gone(self._shared, pid)
            code = os.waitstatus_to_exitcode(status)
            self._retiring.pop(pid, None)
            worker = self._workers.pop(pid, None)
            if worker is None or self._stopping:
                continue
            quick = code != 0 and time.monotonic() - worker.started < _QUICK_EXIT
            self._quick_failures = self._quick_failures + 1 if quick else 0
            log.warning("%s worker %d exited (%d); starting another", self.command, pid, code)

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for pid, worker in list(self._retiring.items()):
            if worker.deadline is not None and now > worker.deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                worker.deadline = None  # reaped at the next look

    def _stop_all(self) -> None:
        """SIGTERM every worker and wait for them (SIGKILL past the grace period)."""
        self._stopping = True
        self._retire_all()
        while self._retiring:
            self._reap()
            self._kill_overdue()
            if self._retiring:
                time.sleep(_TICK)

    def _read_models(self) -> None:
        """Compile in the store each model a worker reports (a thread of the supervisor)."""
        pending = b""
        while True:
            try:
                chunk = os.read(self._models_r, 4096)
            except OSError:
                return
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                model = line.decode("utf-8", "replace")
                try:
                    with self._forking:
                        self.store.plan_for(model)
                except KiloRulesError:
                    pass  # closed, or not servable: the worker's own answer said so
                except Exception:
                    log.exception("compiling %s for the supervisor's store failed", model)

    # -- a worker ----------------------------------------------------------------------------

    def _work(self) -> int:
        """A worker's life, in the forked child: serve until SIGTERM or the supervisor's end."""
        os.close(self._alive_w)
        os.close(self._models_r)
        os.set_blocking(self._models_w, False)  # a build never waits for the supervisor
        # uvicorn handles SIGTERM and SIGINT, then raises them again for the handler it
        # found: a no-op, so that the worker returns and exits 0.
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda signum, frame: None)
        app = _Tagged(self._make_app(Metrics(self._shared), self._tell), os.getpid())
        config = self._make_config(app)
        # Every worker is woken by a connection arriving, and asyncio accepts up to
        # ``backlog`` of them at each wake-up: one worker would take a burst of new
        # connections (8 agents starting together) whole and keep them, keep-alive, while
        # the other idled. One at a time, the worker whose loop is freer takes the next.
        config.backlog = 1
        server = uvicorn.Server(config)
        listening = _OneAtATime(fileno=os.dup(self.sock.fileno()))
        threading.Thread(
            target=self._orphaned, args=(server,), name="kilo-rules-serve parent", daemon=True
        ).start()
        try:
            server.run(sockets=[listening])
        except SystemExit as exc:  # uvicorn could not start (it logged why)
            return exc.code if isinstance(exc.code, int) else 1
        return 0

    def _tell(self, model: str) -> None:
        if "\n" in model:
            return
        os.write(self._models_w, model.encode() + b"\n")  # one write: whole within PIPE_BUF

    def _orphaned(self, server: uvicorn.Server) -> None:
        """Stop ``server`` once the supervisor is gone (its end of the pipe closed)."""
        with contextlib.suppress(OSError):
            while os.read(self._alive_r, 1):
                pass
        server.should_exit = True
        time.sleep(self.grace + 5)
        os._exit(1)
