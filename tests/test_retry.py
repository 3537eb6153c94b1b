"""The one retry policy (kilo_rules.engine.base.retry): its backoff, its deadline and its
checkpoints, with injected waits (nothing here sleeps)."""

from __future__ import annotations

import pytest

from kilo_rules.engine.base.cancel import CancelToken, cancellable
from kilo_rules.engine.base.errors import CancellationError
from kilo_rules.engine.base.retry import Backoff, RetryState, cancellable_sleep, retrying


def top(low: float, high: float) -> float:
    return high


def bottom(low: float, high: float) -> float:
    return low


def test_backoff_doubles_to_its_cap_with_either_jitter() -> None:
    full = Backoff(1.0, 10.0, "full")
    assert [full.delay(n, top) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert [full.delay(n, bottom) for n in (1, 2, 5)] == [0.0, 0.0, 0.0]
    equal = Backoff(2.0, 30.0, "equal")
    assert [equal.delay(n, bottom) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    with pytest.raises(ValueError):
        full.delay(0, top)
    with pytest.raises(ValueError):
        Backoff(1.0, 1.0, "none")  # type: ignore[arg-type]


class Flaky:
    """Fails ``times`` times with ``error``, then answers."""

    def __init__(self, times: int, error: Exception) -> None:
        self.calls = 0
        self.times = times
        self.error = error

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return "ok"


def give_up(state: RetryState, deadline: bool) -> None:
    assert state.outcome is not None
    raise RuntimeError(f"gave up after {state.attempt_number} (deadline={deadline})")


def policy(sleeps: list[float], **kw: object) -> object:
    opts: dict[str, object] = {
        "attempts": 4,
        "wait": Backoff(1.0, 60.0, "full").wait(top),
        "retry_if": lambda exc: isinstance(exc, ConnectionError),
        "give_up": give_up,
        "sleep": sleeps.append,
    }
    opts.update(kw)
    return retrying(**opts)  # type: ignore[arg-type]


def test_retries_what_it_is_told_to_and_nothing_else() -> None:
    sleeps: list[float] = []
    flaky = Flaky(2, ConnectionError("down"))
    assert policy(sleeps)(flaky) == "ok"  # type: ignore[operator]
    assert flaky.calls == 3 and sleeps == [1.0, 2.0]
    other = Flaky(2, ValueError("a bug"))
    with pytest.raises(ValueError):
        policy(sleeps)(other)  # type: ignore[operator]
    assert other.calls == 1


def test_gives_up_after_the_attempts_or_before_the_deadline() -> None:
    sleeps: list[float] = []
    with pytest.raises(RuntimeError, match=r"after 4 \(deadline=False\)"):
        policy(sleeps)(Flaky(9, ConnectionError()))  # type: ignore[operator]
    assert sleeps == [1.0, 2.0, 4.0]
    now = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    sleeps.clear()
    slow = policy(sleeps, sleep=sleep, clock=lambda: now[0], total_deadline=3.5, attempts=9)
    with pytest.raises(RuntimeError, match=r"after 3 \(deadline=True\)"):
        slow(Flaky(9, ConnectionError()))  # type: ignore[operator]
    assert sleeps == [1.0, 2.0]  # at 3 s, a third wait (4 s) would end past 3.5 s


def test_a_cancelled_token_stops_the_retries() -> None:
    token = CancelToken()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        token.cancel()

    flaky = Flaky(9, ConnectionError())
    with cancellable(token), pytest.raises(CancellationError):
        policy(sleeps, sleep=sleep)(flaky)  # type: ignore[operator]
    assert flaky.calls == 1 and sleeps == [1.0]
    with cancellable(token), pytest.raises(CancellationError):
        policy(sleeps)(flaky)  # type: ignore[operator]
    assert flaky.calls == 1  # cancelled before the first attempt: no attempt at all


def test_a_wait_never_outlasts_the_deadline_of_the_token() -> None:
    waits: list[float] = []
    with cancellable(CancelToken.after(30.0)):
        cancellable_sleep(waits.append)(3600.0)
    assert len(waits) == 1 and 0.0 < waits[0] <= 30.0
    cancellable_sleep(waits.append)(3600.0)
    assert waits[-1] == 3600.0  # no token: the wait asked for
