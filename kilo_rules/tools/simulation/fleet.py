"""Simulating a corpus of recorded sessions: which files, run where, and what they add up to.

:func:`expand_sessions` turns the session arguments of the command line (files,
directories, globs) into one ordered list of files. :func:`run_corpus` runs a caller-given
function on each of them in worker processes (a local process pool, or a Dask cluster for
corpora that outgrow one machine) and keeps going when one of them fails, even when its
worker dies: that session alone fails, with located diagnostics; :func:`not_a_log` tells a
file a folder or glob matched that is no log at all (to skip) from a broken log (a
failure). :func:`progress_reporter` shows how far it got. :func:`aggregate` sums the per-session
simulation documents (:mod:`~kilo_rules.tools.simulation.documents`) per policy and finds the
sessions that cost the most.

Running knows nothing of policies or sessions: the work is any picklable function of a
path, so that it can run in another process. rich (the ``report`` extra) and Dask (the
``distributed`` extra) are imported only when they are used.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import multiprocessing
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Literal, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location, SessionError
from kilo_rules.engine.formats.load import read_error
from kilo_rules.tools.simulation.documents import (
    CorpusAggregate,
    FailedSession,
    PolicyAggregate,
    PolicyReport,
    SessionDocument,
    WorstSession,
)

__all__ = [
    "COMMAND_LINE",
    "MAX_TASKS_PER_CHILD",
    "MAX_WORKERS",
    "SESSION_SUFFIXES",
    "Executor",
    "Outcome",
    "Progress",
    "aggregate",
    "aggregate_documents",
    "aggregate_rows",
    "expand_sessions",
    "named_files",
    "not_a_log",
    "progress_reporter",
    "run_corpus",
    "worst_rows",
]

T = TypeVar("T")

#: The pseudo-file that errors about command-line arguments are located in.
COMMAND_LINE = "<command line>"

#: The names a directory walk picks up: the formats the importers read.
SESSION_SUFFIXES = (".json", ".jsonl", ".traj")

#: The most worker processes :func:`run_corpus` starts on one machine.
MAX_WORKERS = 256

#: Sessions a pool worker simulates before it is replaced by a fresh process. A worker
#: keeps caches (compiled plans, token counts) and whatever a session leaks; replacing it
#: bounds that memory, and costs one interpreter start (about 1-2 s) per this many sessions.
MAX_TASKS_PER_CHILD = 64

#: How often plain progress lines are printed at most (seconds), so that CI logs stay short.
PLAIN_INTERVAL = 1.0

Executor = Literal["process", "dask", "serial"]

#: ``progress(done, total, path)``: called once per finished session, ``done`` counting up.
Progress = Callable[[int, int, Path], None]

_GLOB_MAGIC = frozenset("*?[")

_DISTRIBUTED_MISSING = (
    "the distributed executor needs the distributed extra: pip install 'kilo-rules[distributed]'"
)

# Tests replace this to drive the plain reporter's throttle without sleeping.
_now = time.monotonic


# --- which sessions -----------------------------------------------------------------------


def _at(specs: Sequence[str], index: int) -> Location:
    """The spec's place in the specs joined by spaces, so that rendering the diagnostic with
    that text as the ``<command line>`` source puts the caret under the spec."""
    col = 1 + sum(len(s) + 1 for s in specs[:index])
    return Location(COMMAND_LINE, 1, col, 1, col + max(len(specs[index]), 1))


def _is_session_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(SESSION_SUFFIXES)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _walk(directory: Path) -> Iterator[Path]:
    """Session files below ``directory``, in no particular order. Hidden names are skipped;
    a symlinked directory is not entered and a symlinked file counts only when it points
    inside ``directory``, so that a link cannot pull in files from elsewhere."""
    root = directory.resolve()

    def refuse(exc: OSError) -> None:
        raise exc

    for top, dirs, files in os.walk(directory, onerror=refuse, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not _is_session_name(name):
                continue
            path = Path(top, name)
            if path.is_symlink():
                try:
                    target = path.resolve(strict=True)
                except (OSError, RuntimeError):  # dangling, or a loop of links
                    continue
                if not _inside(target, root) or not target.is_file():
                    continue
            elif not path.is_file():  # a FIFO or a socket with a session's name
                continue
            yield path


def _glob(spec: str) -> Iterator[Path]:
    """The glob's matches: files as matched, directories walked. No directory symlink is
    followed (``ln -s . a`` would make ``**`` endless); a walk cut short by its bounds is
    an error, not a silently smaller corpus."""
    walked = safefs.glob_spec(spec)
    if walked.cut is not None:
        raise OSError(f"the pattern's walk {walked.cut}; narrow the pattern")
    for match in walked.matches:
        path = Path(match)
        if path.is_dir():
            yield from _walk(path)
        elif path.is_file():
            yield path


def _too_many(specs: Sequence[str], index: int, limit: int) -> SessionError:
    return SessionError(
        Diagnostic(
            "simulate.too-many-sessions",
            f"more than {limit:,} sessions (the limit), counting those of {specs[index]!r}",
            _at(specs, index),
            details={"spec": specs[index], "limit": limit},
            hint="simulate a smaller corpus, or split it and simulate the parts one by one",
        )
    )


def expand_sessions(specs: Sequence[str], *, limit: int = 100_000) -> list[Path]:
    """The session files the command line names, in order, each once.

    Each spec is a file (taken whatever its name), a directory (every file whose name ends
    in ``.json``, ``.jsonl`` or ``.traj`` directly or recursively below it; hidden files
    and directories skipped, no symlink followed out of it) or a glob (``*``, ``?``,
    ``[...]``; ``**`` matches any number of directories; hidden names only when the
    pattern spells the dot; files matched are taken whatever their names, directories
    matched are walked as above). A path that exists is never read as a glob. Files come
    in spec order, then in name order within a spec (compared component by component, so
    that a directory's files stay together); a file named twice, by another path or through a
    link, is kept at its first place. Paths are returned as spelled, not resolved.

    Raises :class:`~kilo_rules.engine.base.errors.SessionError` located at the spec on the command
    line: ``simulate.session-not-found`` for a missing file or an unreadable directory,
    ``simulate.no-sessions`` for a directory or glob with no session in it (or no spec at
    all), and ``simulate.too-many-sessions`` as soon as there are more than ``limit``
    files (so that a mistaken ``/`` is not walked to the end).
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not specs:
        raise SessionError(
            Diagnostic(
                "simulate.no-sessions",
                "no session given",
                Location(COMMAND_LINE, 1, 1),
                hint="name session files, directories of sessions or globs",
            )
        )
    seen: set[Path] = set()
    out: list[Path] = []
    for index in range(len(specs)):
        for path in _expand_one(specs, index, limit):
            key = path.resolve()
            if key not in seen:
                seen.add(key)
                out.append(path)
        if len(out) > limit:
            raise _too_many(specs, index, limit)
    return out


def _expand_one(specs: Sequence[str], index: int, limit: int) -> list[Path]:
    """One spec's files, sorted, each once."""
    spec = specs[index]
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = _walk(path)
        what = f"no session files ({', '.join(SESSION_SUFFIXES)}) in the directory {spec!r}"
    elif _GLOB_MAGIC.intersection(spec):
        found = _glob(spec)
        what = f"no session files match {spec!r}"
    else:
        problem = "is not a file or a directory" if path.exists() else "does not exist"
        raise SessionError(
            Diagnostic(
                "simulate.session-not-found",
                f"the session {spec!r} {problem}",
                _at(specs, index),
                details={"spec": spec},
            )
        )
    # Sorted before de-duplication, so that of two names for one file the first in name
    # order is kept; the distinct files are counted as they come, to stop a huge tree early.
    raw: list[Path] = []
    distinct: set[Path] = set()
    try:
        for hit in found:
            raw.append(hit)
            distinct.add(hit.resolve())
            if len(distinct) > limit:
                raise _too_many(specs, index, limit)
    except OSError as exc:
        where = exc.filename or spec
        raise SessionError(
            Diagnostic(
                "simulate.session-not-found",
                f"cannot read the directory {str(where)!r}: {exc.strerror or exc}",
                _at(specs, index),
                details={"spec": spec, "path": str(where)},
            )
        ) from exc
    if not raw:
        raise SessionError(
            Diagnostic(
                "simulate.no-sessions",
                what,
                _at(specs, index),
                details={"spec": spec},
                hint="hidden files, and in directories names with other extensions, are skipped",
            )
        )
    kept: dict[Path, Path] = {}
    for hit in sorted(raw):
        kept.setdefault(hit.resolve(), hit)
    return list(kept.values())


def named_files(specs: Sequence[str]) -> frozenset[Path]:
    """The files the specs name themselves (resolved), as opposed to those a directory or a
    glob matched: what is named must be a session, what is matched may be anything."""
    return frozenset(Path(spec).resolve() for spec in specs if Path(spec).is_file())


# --- files that are not logs --------------------------------------------------------------

#: Import failures that say a file is no recorded log at all, rather than a broken one: JSON
#: that no importer recognises, bytes that are not UTF-8 text, a file with nothing in it.
_NOT_A_LOG = frozenset({"import.format", "import.encoding", "import.empty"})

#: How much of a file that is not JSON is read to see whether it starts like JSON.
_HEAD_BYTES = 4096


def not_a_log(outcome: Outcome[Any], named: frozenset[Path] = frozenset()) -> str | None:
    """Why a failed outcome's file is not a recorded log at all (to skip it with a note
    rather than count it failed), or None: it succeeded, it is a log that is broken (a
    truncated one, a Session v1 file that does not validate), or it is in ``named``
    (:func:`named_files`: a file given by name must be a session).

    Not a log: a file no importer recognises (``import.format``), one that is not UTF-8
    (``import.encoding``), an empty one (``import.empty``), and one that is not JSON
    (``import.json``) and does not even start like JSON (a README, ``SOURCES.md``, a CSV).
    A file that starts with ``{`` or ``[`` and then breaks is a broken log."""
    if outcome.ok or not outcome.diagnostics or outcome.path.resolve() in named:
        return None
    first = outcome.diagnostics[0]
    if first.location.file != str(outcome.path):  # about something else: the policy, ...
        return None
    if first.code in _NOT_A_LOG:
        return first.message
    if first.code == "import.json" and not _starts_like_json(outcome.path):
        return first.message
    return None


def _starts_like_json(path: Path) -> bool:
    """Whether the file's first character (past a BOM and white space) opens a JSON object
    or array; True when that cannot be read, so that the file counts as a broken log."""
    try:
        head = safefs.read_head(path, _HEAD_BYTES)
    except OSError:  # ReadRefused too: a FIFO put there since is not read
        return True
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    return not text or text[:1] in (b"{", b"[")


# --- running them -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What the work gave for one session: its value, or the error it raised, never both.

    A failure has ``error`` (``"TypeName: message"``) and its located ``diagnostics``: those
    of a :class:`~kilo_rules.engine.base.errors.KiloRulesError`, else one located at the session
    file (``io.read`` and friends for a file that cannot be read, ``simulate.failed`` for any
    other exception, ``simulate.worker-lost`` when the process running it died)."""

    path: Path
    value: T | None
    error: str | None
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the work finished without raising."""
        return self.error is None


def _error_text(exc: BaseException) -> str:
    message = str(exc)
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def _diagnostics(exc: BaseException, path: Path) -> tuple[Diagnostic, ...]:
    """The located diagnostics of what ``work(path)`` raised."""
    if isinstance(exc, KiloRulesError):
        return tuple(exc.diagnostics)
    if isinstance(exc, OSError):
        return (read_error(exc, str(path), "the session"),)
    return (
        Diagnostic(
            "simulate.failed",
            f"the session could not be replayed: {_error_text(exc)}",
            Location(str(path), 1, 1),
            details={"exception": type(exc).__name__},
        ),
    )


def _lost(path: Path, exc: BaseException) -> tuple[str, tuple[Diagnostic, ...]]:
    """The failure of a session whose worker process died under it."""
    why = _error_text(exc)
    return why, (
        Diagnostic(
            "simulate.worker-lost",
            "the worker process replaying this session died (killed, or out of memory)",
            Location(str(path), 1, 1),
            details={"cause": why},
            hint="replay it alone (--executor serial) to see what it needs",
        ),
    )


# The failure of one session as it crosses from a worker to this process: the error's text
# and its diagnostics, pickled in the worker and read back here under a guard, so that no
# error (nor any value) that fails to unpickle can break the pool for the other sessions.
_Failure = tuple[str, tuple[Diagnostic, ...]]


def _portable(failure: _Failure) -> bytes:
    try:
        return pickle.dumps(failure)
    except Exception:
        # A detail that does not pickle (a live object in an error's details) travels as
        # its repr: the message and the location are what the report needs.
        text, diags = failure
        plain = tuple(
            replace(d, details={str(k): repr(v) for k, v in d.details.items()}) for d in diags
        )
        return pickle.dumps((text, plain))


# Set in each pool worker by _init_worker: where it says which session it starts, so that
# when a worker dies the parent knows which sessions were running (a pool broken by one
# death fails every session still running or waiting, with nothing to tell them apart).
_started: Any = None


def _init_worker(started: Any) -> None:
    global _started
    _started = started


def _call(work: Callable[[Path], Any], index: int, path: Path) -> tuple[bool, bytes]:
    """``work(path)`` in a worker: ``(True, pickled value)`` or ``(False, pickled failure)``."""
    if _started is not None:
        _started.put(index)
    try:
        value = work(path)
    except Exception as exc:  # one bad session must not end the run
        return False, _portable((_error_text(exc), _diagnostics(exc, path)))
    try:
        return True, pickle.dumps(value)
    except Exception as exc:
        return False, _portable((_error_text(exc), _diagnostics(exc, path)))


def _default_workers() -> int:
    # The CPUs this process may run on, which a container or taskset can make fewer than
    # the machine has.
    if hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:  # pragma: no cover - macOS and Windows
        count = os.cpu_count() or 1
    return max(1, min(count, MAX_WORKERS))


def run_corpus(
    paths: Sequence[Path],
    work: Callable[[Path], T],
    *,
    executor: Executor = "process",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Progress | None = None,
) -> list[Outcome[T]]:
    """``work(path)`` for every path, one :class:`Outcome` per path in input order.

    An exception raised by ``work`` becomes that path's ``Outcome.error`` and
    ``Outcome.diagnostics``; the others still run. A worker process that dies (killed, out
    of memory) fails only the session it was running (``simulate.worker-lost``): the
    sessions it took down with it are run again, each alone, to find which one it was.
    ``progress(done, total, path)`` is called in this process as each path finishes, in the
    order they finish.

    ``executor``:

    - ``"process"``: a pool of ``workers`` processes (default: the CPUs available), started
      fresh (spawn or forkserver, never fork: the caller may hold threads) and each
      replaced after :data:`MAX_TASKS_PER_CHILD` paths. ``work`` and its results must
      pickle (``work`` a module-level function).
    - ``"dask"``: a Dask cluster; the one at ``scheduler`` (an address such as
      ``tcp://10.0.0.5:8786``) when given, else a local cluster of ``workers`` processes
      started and closed by this call. Needs the ``distributed`` extra
      (:class:`~kilo_rules.engine.base.errors.KiloRulesError` otherwise). A session whose workers
      keep dying is failed by the cluster (its ``allowed-failures``), the others run on.
    - ``"serial"``: one after another in this process.

    ``workers`` must be between 1 and :data:`MAX_WORKERS`; it is ignored by ``"serial"``
    and when a ``scheduler`` is given, whose cluster has its own workers.
    """
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be between 1 and {MAX_WORKERS}, got {workers}")
    if scheduler is not None and executor != "dask":
        raise ValueError(f"a scheduler address needs the dask executor, not {executor!r}")
    paths = list(paths)
    if executor == "serial":
        return _run_serial(paths, work, progress)
    if executor == "process":
        return _run_processes(paths, work, workers, progress)
    if executor == "dask":
        return _run_dask(paths, work, workers, scheduler, progress)
    raise ValueError(f"unknown executor {executor!r}: process, dask or serial")


class _Collector(Generic[T]):
    """Outcomes filled in as paths finish, in any order, and the progress calls."""

    def __init__(self, paths: list[Path], progress: Progress | None) -> None:
        self.paths = paths
        self.progress = progress
        self.slots: list[Outcome[T] | None] = [None] * len(paths)
        self.done = 0

    def value(self, index: int, value: T) -> None:
        self._put(index, Outcome(self.paths[index], value, None))

    def error(self, index: int, exc: BaseException) -> None:
        path = self.paths[index]
        self.failure(index, (_error_text(exc), _diagnostics(exc, path)))

    def failure(self, index: int, failure: _Failure) -> None:
        text, diags = failure
        self._put(index, Outcome(self.paths[index], None, text, diags))

    def reply(self, index: int, reply: tuple[bool, bytes]) -> None:
        """Record what :func:`_call` sent back."""
        ok, data = reply
        try:
            loaded = pickle.loads(data)
        except Exception as exc:  # a value or an error that does not unpickle here
            self.error(index, exc)
            return
        if ok:
            self.value(index, loaded)
        else:
            self.failure(index, loaded)

    def _put(self, index: int, outcome: Outcome[T]) -> None:
        self.slots[index] = outcome
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, len(self.paths), outcome.path)

    def outcomes(self) -> list[Outcome[T]]:
        missing = [self.paths[i] for i, slot in enumerate(self.slots) if slot is None]
        if missing:  # an executor returned without an answer for every path: a bug here
            raise RuntimeError(f"no outcome for {len(missing)} sessions, e.g. {missing[0]}")
        return [slot for slot in self.slots if slot is not None]


def _run_serial(
    paths: list[Path], work: Callable[[Path], T], progress: Progress | None
) -> list[Outcome[T]]:
    results: _Collector[T] = _Collector(paths, progress)
    for index, path in enumerate(paths):
        try:
            value = work(path)
        except Exception as exc:  # one bad session must not end the run
            results.error(index, exc)
        else:
            results.value(index, value)
    return results.outcomes()


def _start_method() -> str:
    # forkserver forks each worker from a small clean server (quicker than spawn where it
    # exists: Linux); fork itself could copy a lock another thread of the caller holds.
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _check_picklable(work: Callable[[Path], Any]) -> None:
    # The pool would pickle it in a background thread and fail every path one by one with
    # the same error: say it once, before anything starts.
    try:
        pickle.dumps(work)
    except Exception as exc:
        raise TypeError(
            f"the work function must pickle to run in worker processes (a module-level "
            f"function, not a lambda or a closure): {_error_text(exc)}"
        ) from exc


def _run_processes(
    paths: list[Path],
    work: Callable[[Path], T],
    workers: int | None,
    progress: Progress | None,
) -> list[Outcome[T]]:
    results: _Collector[T] = _Collector(paths, progress)
    if not paths:
        return results.outcomes()
    _check_picklable(work)
    count = min(workers or _default_workers(), len(paths))
    pending = list(range(len(paths)))
    retried = False
    while pending:
        # A worker that dies breaks the whole pool: every session not finished comes back
        # here, and those that had started (the one that died among them) are told apart.
        broken, running = _pool_round(results, pending, work, count)
        if running:
            _alone(results, sorted(running), work, count)
        elif broken and retried:
            # Broken twice with no session running (a worker that cannot even start):
            # each alone, so that the sessions that can run still do.
            _alone(results, sorted(broken), work, count)
            broken = set()
        retried = bool(broken) and not running
        pending = [i for i in pending if i in broken and i not in running]
    return results.outcomes()


def _alone(
    results: _Collector[T], indices: list[int], work: Callable[[Path], T], count: int
) -> None:
    """Run each of ``indices`` in a pool of its own, ``count`` at once: a worker that dies
    now takes down only its own session, which is then the one that killed it."""
    context = multiprocessing.get_context(_start_method())
    for start in range(0, len(indices), count):
        batch = indices[start : start + count]
        pools = [ProcessPoolExecutor(max_workers=1, mp_context=context) for _ in batch]
        try:
            futures = {
                pool.submit(_call, work, i, results.paths[i]): i
                for pool, i in zip(pools, batch, strict=True)
            }
            for future in as_completed(futures):
                index = futures[future]
                exc = future.exception()
                if isinstance(exc, BrokenProcessPool):
                    results.failure(index, _lost(results.paths[index], exc))
                elif exc is not None:
                    results.error(index, exc)
                else:
                    results.reply(index, future.result())
        finally:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)


def _pool_round(
    results: _Collector[T], indices: list[int], work: Callable[[Path], T], count: int
) -> tuple[set[int], set[int]]:
    """Run ``indices`` in a fresh pool of at most ``count`` workers, recording what finishes.
    Returns those a broken pool failed, and which of them had started."""
    context = multiprocessing.get_context(_start_method())
    started = context.SimpleQueue()
    seen: set[int] = set()
    broken: dict[int, BaseException] = {}
    pool = ProcessPoolExecutor(
        max_workers=min(count, len(indices)),
        mp_context=context,
        max_tasks_per_child=MAX_TASKS_PER_CHILD,
        initializer=_init_worker,
        initargs=(started,),
    )
    try:
        futures = {pool.submit(_call, work, i, results.paths[i]): i for i in indices}
        for future in as_completed(futures):
            index = futures[future]
            # Read as they come, so that the queue's pipe never fills and blocks a worker.
            _drain(started, seen)
            exc = future.exception()
            if isinstance(exc, BrokenProcessPool):
                broken[index] = exc
            elif exc is not None:  # the pool could not send the task or return its reply
                results.error(index, exc)
            else:
                results.reply(index, future.result())
    except BaseException:
        # Interrupted, or progress raised: drop what has not started instead of running
        # the rest of the corpus before the error surfaces.
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        _drain(started, seen)
    pool.shutdown(wait=True)
    started.close()
    return set(broken), seen.intersection(broken)


def _drain(started: Any, seen: set[int]) -> None:
    while not started.empty():
        seen.add(started.get())


def _distributed_missing(exc: ImportError) -> KiloRulesError:
    return KiloRulesError(
        Diagnostic(
            "simulate.distributed-missing",
            _DISTRIBUTED_MISSING,
            Location(COMMAND_LINE, 1, 1),
            details={"missing": exc.name or str(exc)},
        )
    )


def _run_dask(
    paths: list[Path],
    work: Callable[[Path], T],
    workers: int | None,
    scheduler: str | None,
    progress: Progress | None,
) -> list[Outcome[T]]:
    try:
        from dask.distributed import Client, LocalCluster
        from dask.distributed import as_completed as dask_completed
    except ImportError as exc:
        raise _distributed_missing(exc) from exc
    results: _Collector[T] = _Collector(paths, progress)
    if not paths:
        return results.outcomes()
    # distributed's constructors and as_completed carry no annotations, hence the ignores.
    with contextlib.ExitStack() as stack:
        if scheduler is not None:
            client = stack.enter_context(Client(scheduler))  # type: ignore[no-untyped-call]
        else:
            cluster = stack.enter_context(
                LocalCluster(  # type: ignore[no-untyped-call]
                    n_workers=min(workers or _default_workers(), len(paths)),
                    threads_per_worker=1,
                    processes=True,
                    # ":0", not None: None still binds 8787, so two clusters clash.
                    dashboard_address=":0",
                    # A failing session is reported in its Outcome; the workers' own
                    # log of it (a traceback per session) would bury the progress.
                    silence_logs=logging.CRITICAL,
                )
            )
            client = stack.enter_context(Client(cluster))  # type: ignore[no-untyped-call]
        # pure=False: the same path run twice is two runs (the file may have changed).
        # Through _call, as in a pool: a session's error comes back as data, not raised.
        futures = client.map(functools.partial(_call, work), range(len(paths)), paths, pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        try:
            for future in dask_completed(futures):  # type: ignore[no-untyped-call]
                i = index[future.key]
                if future.status == "error":
                    error = future.exception()
                    if type(error).__name__ == "KilledWorker":  # its workers kept dying
                        results.failure(i, _lost(paths[i], error))
                    else:
                        results.error(i, error)
                elif future.status == "cancelled":
                    results.error(i, RuntimeError("cancelled by the cluster"))
                else:
                    results.reply(i, future.result())
        finally:
            # On an error or an interrupt, tell the scheduler to drop what has not run.
            client.cancel(futures)
    return results.outcomes()


# --- progress -----------------------------------------------------------------------------


def _rich_available() -> bool:
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def progress_reporter(
    total: int,
    *,
    stream: TextIO | None = None,
    force_terminal: bool | None = None,
) -> Iterator[Progress]:
    """A ``progress(done, total, path)`` callback for :func:`run_corpus`, drawn on
    ``stream`` (default: standard error) while the block runs.

    On a terminal, with rich installed (the ``report`` extra), a progress bar: done/total,
    elapsed time, time remaining and the file that just finished. Anywhere else plain lines
    ``simulate: 12/100 sessions (path)``, at most one a second plus the last one, so that
    CI logs stay short. ``force_terminal`` True or False overrides the terminal detection.
    """
    out = sys.stderr if stream is None else stream
    if force_terminal is None:
        isatty = getattr(out, "isatty", None)
        terminal = bool(isatty()) if callable(isatty) else False
    else:
        terminal = force_terminal
    if terminal and _rich_available():
        with _rich_reporter(total, out) as report:
            yield report
    else:
        with _plain_reporter(total, out) as report:
            yield report


@contextlib.contextmanager
def _rich_reporter(total: int, stream: TextIO) -> Iterator[Progress]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    bar = Bar(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[file]}", markup=False),
        # Forced: the caller decided this is a terminal (a test may hand in a StringIO).
        console=Console(file=stream, force_terminal=True),
    )
    task = bar.add_task("simulate", total=total, file="")

    def report(done: int, total: int, path: Path) -> None:
        bar.update(task, completed=done, total=total, file=path.name)

    with bar:
        yield report


@contextlib.contextmanager
def _plain_reporter(total: int, stream: TextIO) -> Iterator[Progress]:
    last_printed = _now()
    state: dict[str, Any] = {"done": 0, "total": total, "path": None, "shown": 0}

    def line() -> None:
        path = state["path"]
        where = f" ({path})" if path is not None else ""
        stream.write(f"simulate: {state['done']}/{state['total']} sessions{where}\n")
        stream.flush()
        state["shown"] = state["done"]

    def report(done: int, total: int, path: Path) -> None:
        nonlocal last_printed
        state.update(done=done, total=total, path=path)
        now = _now()
        if done >= total or now - last_printed >= PLAIN_INTERVAL:
            line()
            last_printed = now

    try:
        yield report
    finally:
        # An interrupted run still says how far it got.
        if state["done"] != state["shown"]:
            line()


# --- adding them up -----------------------------------------------------------------------


def _nearest_rank(values: Sequence[float], percent: float) -> float:
    ordered = sorted(values)
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


class _LooseReport(BaseModel):
    """What :func:`aggregate` reads of a report given as a mapping: the keys it needs, each
    with the value its absence means (a hand-made or older document may leave some out)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    policy: str = ""
    stopped: bool = False
    compactions: int = 0
    provider_overflows: int = 0
    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    cost_usd: float | None = None
    floor_ratio: float | None = None


class _LooseFloor(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    cost_usd: float | None = None


class _LooseDocument(BaseModel):
    """What :func:`aggregate` reads of a session document given as a mapping."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    session: str = ""
    prices: dict[str, Any] | None = None
    floor: _LooseFloor | None = None
    reports: list[_LooseReport] = []


_Report = PolicyReport | _LooseReport
_Session = SessionDocument | _LooseDocument


def _floor_cost(doc: _Session) -> float | None:
    return None if doc.floor is None else doc.floor.cost_usd


def _report_cost(doc: _Session, report: _Report) -> float | None:
    return None if doc.prices is None else report.cost_usd


def _report_ratio(doc: _Session, report: _Report) -> float | None:
    if report.floor_ratio is not None:
        return report.floor_ratio
    cost, floor = _report_cost(doc, report), _floor_cost(doc)
    return cost / floor if cost is not None and floor else None


class _PolicyTotals:
    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.sessions = 0
        self.stopped = 0
        self.completed = 0
        self.compactions = self.overflows = self.input = 0
        self.read = self.write = self.output = 0
        self.costs: list[float] = []
        self.cost_known = True
        self.floor = 0.0
        self.floor_known = True

    def add(self, doc: _Session, report: _Report) -> None:
        self.sessions += 1
        if report.stopped:
            # Its totals cover part of the session: adding them would make a policy that
            # gives up look cheap.
            self.stopped += 1
            return
        self.completed += 1
        self.compactions += report.compactions
        self.overflows += report.provider_overflows
        self.input += report.input
        self.read += report.cache_read
        self.write += report.cache_write
        self.output += report.output
        cost = _report_cost(doc, report)
        if cost is None:
            self.cost_known = False
        else:
            self.costs.append(cost)
        floor = _floor_cost(doc)
        if floor is None:
            self.floor_known = False
        else:
            self.floor += floor

    def document(self) -> PolicyAggregate:
        priced = self.cost_known and bool(self.costs)
        cost = math.fsum(self.costs) if priced else None
        floor = self.floor if self.floor_known and self.completed else None
        return PolicyAggregate(
            policy=self.policy,
            sessions=self.sessions,
            stopped=self.stopped,
            cost_usd=cost,
            compactions=self.compactions,
            provider_overflows=self.overflows,
            input=self.input,
            cache_read=self.read,
            cache_write=self.write,
            output=self.output,
            floor_cost_usd=floor,
            floor_ratio=cost / floor if cost is not None and floor else None,
            cost_p50=_nearest_rank(self.costs, 50) if priced else None,
            cost_p90=_nearest_rank(self.costs, 90) if priced else None,
            cost_max=max(self.costs) if priced else None,
        )


def _typed(doc: SessionDocument | FailedSession | Mapping[str, Any]) -> _Session | None:
    """A session document to add up, None for a session that failed."""
    if isinstance(doc, FailedSession):
        return None
    if isinstance(doc, SessionDocument):
        return doc
    if doc.get("error") is not None:
        return None
    return _LooseDocument.model_validate(doc)


def aggregate(
    docs: Sequence[SessionDocument | FailedSession | Mapping[str, Any]], *, worst: int = 10
) -> dict[str, Any]:
    """:func:`aggregate_documents` as JSON data, of documents or of their JSON.

    A mapping is read leniently, as a hand-made or older document may be written: a
    non-null ``error`` makes it a failed session, and of the others only ``session``,
    ``prices``, ``floor.cost_usd`` and each report's ``policy``, ``stopped``, token sums,
    ``cost_usd`` and ``floor_ratio`` are read, each absent one taken as null, zero or
    false."""
    return _aggregate([_typed(d) for d in docs], worst).to_json()


def aggregate_documents(
    docs: Sequence[SessionDocument | FailedSession], *, worst: int = 10
) -> CorpusAggregate:
    """Per-policy totals over per-session simulation documents, and the worst sessions.

    Each document is what ``kilo-rules simulate --format json`` prints for one session; a
    :class:`~kilo_rules.tools.simulation.documents.FailedSession` is a session whose
    simulation failed, counted in ``failed`` and nowhere else.

    Each policy, in the order first seen: ``sessions`` simulated and how many ``stopped``
    early; ``cost_usd``, the token sums, ``compactions`` and ``provider_overflows`` over
    the sessions that did *not* stop (a stopped run's totals are partial);
    ``floor_cost_usd`` (the floors of the same sessions) and ``floor_ratio``; the
    per-session cost distribution ``cost_p50``, ``cost_p90`` (nearest rank) and
    ``cost_max``. A cost is null when a document has no prices or no session completed; a
    floor when a document has none.

    ``worst`` lists that many (session, policy) pairs, stopped ones first, then by
    ``floor_ratio`` (those without one by cost), highest first.
    """
    return _aggregate([_typed(d) for d in docs], worst)


def _aggregate(docs: Sequence[_Session | None], worst: int) -> CorpusAggregate:
    if worst < 0:
        raise ValueError(f"worst must be 0 or more, got {worst}")
    totals: dict[str, _PolicyTotals] = {}
    pairs: list[WorstSession] = []
    failed = 0
    for doc in docs:
        if doc is None:
            failed += 1
            continue
        for report in doc.reports:
            totals.setdefault(report.policy, _PolicyTotals(report.policy)).add(doc, report)
            pairs.append(
                WorstSession(
                    session=doc.session,
                    policy=report.policy,
                    cost_usd=_report_cost(doc, report),
                    floor_ratio=_report_ratio(doc, report),
                    compactions=report.compactions,
                    stopped=report.stopped,
                )
            )
    pairs.sort(key=_worst_key)
    return CorpusAggregate(
        policies=[t.document() for t in totals.values()],
        worst=pairs[:worst],
        sessions=len(docs),
        failed=failed,
    )


def _worst_key(pair: WorstSession) -> tuple[int, int, float, str, str]:
    ratio, cost = pair.floor_ratio, pair.cost_usd
    # Lower sorts first: stopped, then measured against a floor, then by cost only, then
    # pairs with nothing to rank by; ties in session then policy order.
    if ratio is not None:
        rank, value = 0, -ratio
    elif cost is not None:
        rank, value = 1, -cost
    else:
        rank, value = 2, 0.0
    return (0 if pair.stopped else 1, rank, value, pair.session, pair.policy)


_POLICY_HEADERS: tuple[str, ...] = (
    "policy",
    "sessions",
    "stopped",
    "compactions",
    "overflows",
    "input",
    "cache read",
    "cache write",
    "output",
    "cost $",
    "p50 $",
    "p90 $",
    "max $",
    "floor $",
    "vs floor",
)

_WORST_HEADERS: tuple[str, ...] = (
    "session",
    "policy",
    "cost $",
    "vs floor",
    "compactions",
    "stopped",
)


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _as_aggregate(agg: CorpusAggregate | Mapping[str, Any]) -> CorpusAggregate:
    return agg if isinstance(agg, CorpusAggregate) else CorpusAggregate.model_validate(agg)


def aggregate_rows(
    agg: CorpusAggregate | Mapping[str, Any],
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The policy table of an aggregate (:func:`aggregate_documents`, or :func:`aggregate`'s
    JSON) as text cells: the headers and one row per policy (the policy name first, then
    numbers, to right-align)."""
    rows: list[tuple[str, ...]] = [
        (
            p.policy,
            f"{p.sessions:,}",
            f"{p.stopped:,}",
            f"{p.compactions:,}",
            f"{p.provider_overflows:,}",
            f"{p.input:,}",
            f"{p.cache_read:,}",
            f"{p.cache_write:,}",
            f"{p.output:,}",
            _money(p.cost_usd),
            _money(p.cost_p50),
            _money(p.cost_p90),
            _money(p.cost_max),
            _money(p.floor_cost_usd),
            _ratio(p.floor_ratio),
        )
        for p in _as_aggregate(agg).policies
    ]
    return _POLICY_HEADERS, rows


def worst_rows(
    agg: CorpusAggregate | Mapping[str, Any],
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The worst-sessions list of an aggregate (:func:`aggregate_documents`, or
    :func:`aggregate`'s JSON) as text cells: the headers and one row per (session, policy)
    pair, worst first."""
    rows: list[tuple[str, ...]] = [
        (
            w.session,
            w.policy,
            _money(w.cost_usd),
            _ratio(w.floor_ratio),
            f"{w.compactions:,}",
            "yes" if w.stopped else "",
        )
        for w in _as_aggregate(agg).worst
    ]
    return _WORST_HEADERS, rows
