"""Build slots: how many builds may run at once, counted until their threads return.

A build past its time bound is answered 504 at once, but the thread it runs on keeps
going until the engine's next checkpoint (``kilo_rules.engine.base.cancel``) stops it. A slot is
therefore given back by the worker thread itself, when the build has really ended, not
when the request was answered: while cancelled builds drain, new requests wait for a slot
(at most as many as there are slots, and within their own time bound) or are refused 503,
and the number of threads building can never exceed the limit.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from kilo_rules.engine.base.cancel import CancelToken, cancellable

__all__ = ["Slots"]

T = TypeVar("T")


class Slots:
    """At most ``capacity`` functions running on worker threads; ``on_change(running)`` is
    told of each change (a gauge), from whichever thread made it, in the order the changes
    were made."""

    def __init__(self, capacity: int, on_change: Callable[[int], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._running = 0
        self._waiters: deque[tuple[anyio.Event, anyio.lowlevel.EventLoopToken]] = deque()
        self._on_change = on_change
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def running(self) -> int:
        """Functions running now (those whose callers stopped waiting included)."""
        return self._running

    async def run(self, fn: Callable[[], T], token: CancelToken, timeout: float) -> T | None:
        """``fn()`` on a worker thread under ``token``, within ``timeout`` seconds from now.
        None when no slot came free in time (or too many wait already); ``TimeoutError``
        when ``fn`` overran, after ``token`` was cancelled so that it stops."""
        with anyio.move_on_after(timeout) as waiting:
            acquired = await self._acquire()
        if waiting.cancelled_caught or not acquired:
            return None
        claim = threading.Lock()
        claimed = False

        def work() -> T | None:
            nonlocal claimed
            with claim:
                if claimed:  # the caller gave up before this thread picked it up
                    return None
                claimed = True
            try:
                with cancellable(token):
                    return fn()
            finally:
                self._release(in_loop=False)

        if self._limiter is None:  # made on first use, inside the event loop using it
            self._limiter = anyio.CapacityLimiter(self.capacity)
        try:
            with anyio.fail_after(max(0.0, token.remaining())):
                return await anyio.to_thread.run_sync(
                    work, abandon_on_cancel=True, limiter=self._limiter
                )
        except BaseException:
            token.cancel("the caller stopped waiting")
            with claim:
                never_started = not claimed
                claimed = True
            if never_started:
                self._release(in_loop=True)
            raise

    async def _acquire(self) -> bool:
        event: anyio.Event | None = None
        try:
            while True:
                with self._lock:
                    if self._running < self.capacity:
                        self._running += 1
                        self._changed()
                        break
                    if event is None and len(self._waiters) >= self.capacity:
                        return False
                    event = anyio.Event()
                    self._waiters.append((event, anyio.lowlevel.current_token()))
                await event.wait()
        except BaseException:
            self._leave(event)
            raise
        return True

    def _leave(self, event: anyio.Event | None) -> None:
        """A waiter that stops waiting: if it had been woken, the slot it was woken for
        goes to the next one."""
        if event is None:
            return
        with self._lock:
            for item in self._waiters:
                if item[0] is event:
                    self._waiters.remove(item)
                    return
        self._wake_next(in_loop=True)

    def _release(self, *, in_loop: bool) -> None:
        with self._lock:
            self._running -= 1
            self._changed()
        self._wake_next(in_loop=in_loop)

    def _wake_next(self, *, in_loop: bool) -> None:
        """Wake the first waiter if a slot is free (``in_loop``: called on the event
        loop's thread, where the event is set directly)."""
        with self._lock:
            if not self._waiters or self._running >= self.capacity:
                return
            event, loop = self._waiters.popleft()
        if in_loop:
            event.set()
            return
        # RuntimeError: the event loop has ended (the server stopped); nobody is left.
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(event.set, token=loop)

    def _changed(self) -> None:
        # Called with the lock held: told outside it, a count made earlier could reach
        # the gauge after a later one and leave it showing builds that have ended.
        if self._on_change is not None:
            self._on_change(self._running)
