"""Cooperative cancellation: a deadline the long loops of the engine look at.

Python cannot stop a thread, so work that must end when its caller gives up (a sidecar
build past its time bound) checks in now and then. The caller runs it inside
:func:`cancellable` with a :class:`CancelToken`; the engine calls :func:`checkpoint`
between its stages and inside its loops over messages and chunks, which raises
:class:`~kilo_rules.engine.base.errors.CancellationError` once the token is cancelled or its
deadline passed. Outside any :func:`cancellable` block a checkpoint costs one context-variable read
and never raises, so library callers and the CLI see no difference.

The token is held in a context variable, so it follows the work into threads started with
a copy of the context (``anyio.to_thread.run_sync`` copies it); a caller that starts a
thread otherwise enters :func:`cancellable` in that thread with the token it was given.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator

from kilo_rules.engine.base.errors import CancellationError, Diagnostic

__all__ = ["CancelToken", "cancellable", "checkpoint", "current"]


class CancelToken:
    """Whether some work should stop: cancelled by :meth:`cancel` (from any thread), or
    past its ``deadline`` (a :func:`time.monotonic` instant, None for none)."""

    __slots__ = ("_cancelled", "_reason", "deadline")

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self._cancelled = threading.Event()
        self._reason = "the work was cancelled"

    @classmethod
    def after(cls, seconds: float) -> CancelToken:
        """A token whose deadline is ``seconds`` from now."""
        return cls(time.monotonic() + seconds)

    def cancel(self, reason: str = "the work was cancelled") -> None:
        """Ask the work to stop at its next checkpoint."""
        self._reason = reason
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        """True once cancelled or past the deadline."""
        if self._cancelled.is_set():
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def remaining(self) -> float:
        """Seconds to the deadline (infinite without one, 0 once cancelled)."""
        if self._cancelled.is_set():
            return 0.0
        if self.deadline is None:
            return float("inf")
        return max(0.0, self.deadline - time.monotonic())

    def raise_if_cancelled(self) -> None:
        """Raise :class:`CancellationError` when :attr:`cancelled`."""
        if self.cancelled:
            reason = self._reason if self._cancelled.is_set() else "the deadline passed"
            raise CancellationError(Diagnostic("cancelled", reason))


_CURRENT: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar(
    "kilo_rules_cancel", default=None
)


def current() -> CancelToken | None:
    """The token of the work running here, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def cancellable(token: CancelToken) -> Iterator[CancelToken]:
    """Run the block under ``token``: its checkpoints raise once the token is cancelled."""
    reset = _CURRENT.set(token)
    try:
        yield token
    finally:
        _CURRENT.reset(reset)


def checkpoint() -> None:
    """Raise :class:`~kilo_rules.engine.base.errors.CancellationError` if the work running here was
    cancelled or is past its deadline; otherwise return at once."""
    token = _CURRENT.get()
    if token is not None:
        token.raise_if_cancelled()
