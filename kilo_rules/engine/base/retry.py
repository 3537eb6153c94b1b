"""One retry policy for everything in kilo-rules that tries again: the HTTP summarizer's
requests and the policy store's reloads (its poller's backoff, a directory re-read while
it changes).

It is built on :mod:`tenacity`, not hand-rolled and not on ``stamina``. ``stamina`` is an
opinionated layer over tenacity (its own defaults, instrumentation hooks, a process-wide
testing switch); what the callers here need is the layer underneath, which tenacity
exposes directly: an injectable ``sleep``, ``clock`` and random draw (so tests never wait
for real), a wait that a server's ``Retry-After`` replaces, and a total deadline that
refuses to *start* a retry that could only end after it.

The project's settings: exponential steps of ``base * 2**(n - 1)`` seconds after the
``n``-th failure, capped at ``cap``, drawn with *full* jitter (uniform in ``[0, step]``,
the poller's: many stores spread out over the whole interval) or *equal* jitter (uniform in
``[step / 2, step]``, the summarizer's: concurrent clients spread out, none retries at
once). Every wait starts and ends with :func:`~kilo_rules.engine.base.cancel.checkpoint`, so
work run under :func:`~kilo_rules.engine.base.cancel.cancellable` stops between attempts, and
a wait never outlasts the token's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import tenacity
from tenacity.wait import wait_base

from kilo_rules.engine.base.cancel import checkpoint, current

__all__ = [
    "Backoff",
    "RetryState",
    "Uniform",
    "cancellable_sleep",
    "retrying",
    "step_delay",
]

T = TypeVar("T")

#: A random draw in ``[a, b]``, as :meth:`random.Random.uniform` makes it.
Uniform = Callable[[float, float], float]
#: What a retry callback is given: tenacity's record of the call so far.
RetryState = tenacity.RetryCallState

_JITTER_LOW = {"full": 0.0, "equal": 0.5}


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: the wait after the ``n``-th failure in a row is
    drawn between ``low * step`` and ``step``, with ``step = min(cap, base * 2**(n - 1))``
    and ``low`` 0 for ``"full"`` jitter, 1/2 for ``"equal"``."""

    base: float
    cap: float
    jitter: Literal["full", "equal"] = "equal"

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff base and cap must not be negative")
        if self.jitter not in _JITTER_LOW:
            raise ValueError(f"jitter is 'full' or 'equal', not {self.jitter!r}")

    def wait(self, uniform: Uniform) -> wait_base:
        """This backoff as a tenacity wait strategy, drawing with ``uniform``."""
        return _Jittered(
            tenacity.wait_exponential(multiplier=self.base, max=self.cap, exp_base=2),
            _JITTER_LOW[self.jitter],
            uniform,
        )

    def delay(self, failures: int, uniform: Uniform) -> float:
        """Seconds to wait after ``failures`` failures in a row (at least 1)."""
        return step_delay(self.wait(uniform), failures)


class _Jittered(wait_base):
    """A tenacity wait drawn between ``low`` times another wait's value and that value."""

    def __init__(self, step: wait_base, low: float, uniform: Uniform) -> None:
        self._step = step
        self._low = low
        self._uniform = uniform

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        high = float(self._step(retry_state))
        return float(self._uniform(high * self._low, high))


def step_delay(wait: Callable[[tenacity.RetryCallState], float], failures: int) -> float:
    """What ``wait`` answers after ``failures`` failed attempts, outside any call: for a
    schedule (a poller) that waits between rounds rather than retrying one call."""
    if failures < 1:
        raise ValueError("a delay follows at least one failure")
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = failures
    return float(wait(state))


def cancellable_sleep(sleep: Callable[[float], None] = time.sleep) -> Callable[[float], None]:
    """``sleep`` between two checkpoints, cut to the deadline of the token in force: a
    cancelled or timed-out caller stops at the wait instead of after the next attempt."""

    def wait(seconds: float) -> None:
        checkpoint()
        token = current()
        if token is not None:
            seconds = min(seconds, token.remaining())
        sleep(max(0.0, seconds))
        checkpoint()

    return wait


def retrying(
    *,
    attempts: int,
    wait: Callable[[tenacity.RetryCallState], float],
    retry_if: Callable[[BaseException], bool],
    give_up: Callable[[tenacity.RetryCallState, bool], Any],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    total_deadline: float | None = None,
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
) -> tenacity.Retrying:
    """A tenacity ``Retrying`` with the project's rules.

    At most ``attempts`` calls; an exception for which ``retry_if`` is true is retried
    after ``wait``, any other propagates at once, as does a
    :class:`~kilo_rules.engine.base.errors.CancellationError` (every attempt begins with a
    checkpoint, and ``sleep`` is wrapped by :func:`cancellable_sleep`). With
    ``total_deadline`` (seconds of ``clock``, from when this is called), a retry whose
    wait would end at or past it is not started. When retries stop, ``give_up`` is called
    with the state and whether the deadline (not the attempt count) stopped them; it
    raises the caller's error, or returns the call's result."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    start = clock()

    class past_deadline(tenacity.stop.stop_base):  # noqa: N801 - read as a condition
        def __call__(self, state: tenacity.RetryCallState) -> bool:
            if total_deadline is None:
                return False
            return state.upcoming_sleep >= total_deadline - (clock() - start)

    def at_end(state: tenacity.RetryCallState) -> Any:
        return give_up(state, state.attempt_number < attempts)

    def before(state: tenacity.RetryCallState) -> None:
        checkpoint()

    return tenacity.Retrying(
        stop=tenacity.stop_any(tenacity.stop_after_attempt(attempts), past_deadline()),
        wait=wait,
        retry=tenacity.retry_if_exception(retry_if),
        sleep=cancellable_sleep(sleep),
        before=before,
        before_sleep=before_sleep,
        retry_error_callback=at_end,
    )
