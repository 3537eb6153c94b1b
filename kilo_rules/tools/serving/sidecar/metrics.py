"""The sidecar's Prometheus metrics, in a registry of its own.

Each app gets its own :class:`~prometheus_client.CollectorRegistry`, so that two apps in
one process (tests, a host embedding the sidecar) never share or double-register
counters, and ``/metrics`` shows this app's numbers only.

Under ``kilo-rules serve --workers N`` the numbers are every worker's, summed: the
process tree follows prometheus-client's multiprocess convention (:func:`share_values`:
each process writes its values to files of its own in one directory, and ``/metrics``,
whichever worker answers it, reads them all).
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
    multiprocess,
    values,
)

#: Build latency buckets, in seconds: a warm build of a small session takes about a
#: millisecond, a cold one on a long session a few hundred.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


#: Where :func:`share_values` keeps the values (prometheus-client's own variable).
SHARED_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def share_values(directory: Path) -> None:
    """From now on, every metric value this process and the processes it forks make is
    kept in a file of ``directory`` (one a process and kind), for :class:`Metrics` made
    with ``shared=directory`` to sum. A process-wide switch, as prometheus-client's
    multiprocess mode is: made once, by the supervisor of ``kilo-rules serve --workers``,
    never in a process that hosts other apps."""
    os.environ[SHARED_DIR_VARIABLE] = str(directory)
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]


def process_gone(directory: Path, pid: int) -> None:
    """Drop the live gauges of the process ``pid`` (it exited): its counters still count."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


class Metrics:
    """The counters, histogram and info of one app (``shared``: of every process that
    writes to that directory; see :func:`share_values`)."""

    def __init__(self, shared: Path | None = None) -> None:
        self.shared = shared
        self.registry = CollectorRegistry(auto_describe=True)
        self.builds = Counter(
            "kilo_rules_builds",
            "Builds answered, by HTTP status and wire provider (none when no request was built).",
            ("status", "provider"),
            registry=self.registry,
        )
        self.build_seconds = Histogram(
            "kilo_rules_build_seconds",
            "Time to answer a build, from the body read to the response encoded.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.swaps = Counter(
            "kilo_rules_revision_swaps",
            "Policy revisions swapped in after the first.",
            registry=self.registry,
        )
        self.rejected = Counter(
            "kilo_rules_revisions_rejected",
            "Policy revisions refused (invalid), each once however often it is re-checked; "
            "the revision served stayed.",
            registry=self.registry,
        )
        self.running = Gauge(
            "kilo_rules_builds_running",
            "Builds, checks and plans running on a worker thread, those already answered 504 "
            "included until they stop.",
            registry=self.registry,
            # Summed over the workers alive (prometheus-client's multiprocess mode).
            multiprocess_mode="livesum",
        )
        self.revision = Info(
            "kilo_rules_revision", "The policy revision served.", registry=self.registry
        )

    def build(self, status: int, provider: str | None, seconds: float) -> None:
        """Count one build answered with ``status``."""
        self.builds.labels(status=str(status), provider=provider or "none").inc()
        self.build_seconds.observe(seconds)

    def serving(self, revision: str | None) -> None:
        """Show ``revision`` as the one served (empty when none is loaded)."""
        self.revision.info({"revision": revision or ""})

    def render(self) -> bytes:
        """The exposition text of every metric."""
        if self.shared is None:
            return generate_latest(self.registry)
        # Read from every process's files now: a worker that has exited still counts.
        summed = CollectorRegistry()
        multiprocess.MultiProcessCollector(summed, path=str(self.shared))  # type: ignore[no-untyped-call]
        # An Info has no multiprocess form: the revision is the answering worker's own.
        summed.register(self.revision)
        return generate_latest(summed)
