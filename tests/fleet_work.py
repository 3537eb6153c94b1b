"""Work functions for tests/test_fleet.py, at module level so that worker processes
(a process pool, a Dask cluster) can import them by name."""

from __future__ import annotations

import os
import signal
from functools import cache
from pathlib import Path
from typing import Any

from kilo_rules.engine.compiler.plan import Plan

MODEL = "anthropic/claude-sonnet-4-5"
POLICIES = ("kilo-default", "cache-max")


def read_number(path: Path) -> int:
    """The integer the file holds; a file holding anything else raises ValueError."""
    return int(path.read_text(encoding="utf-8"))


def process_id(path: Path) -> int:
    """The id of the process the work ran in."""
    return os.getpid()


@cache
def _plans() -> tuple[Plan, ...]:
    # Once per worker process: every session of the corpus replays under the same plans.
    from kilo_rules.engine.compiler.compile import compile_policy

    return tuple(compile_policy(p, MODEL) for p in POLICIES)


def simulate_session(path: Path) -> dict[str, Any]:
    """The simulation document of one session under POLICIES on MODEL, without steps."""
    from kilo_rules.engine.importers import read_session
    from kilo_rules.tools.simulation.simulate import simulate

    plans = _plans()
    reports = simulate(read_session(path), plans)
    prices = plans[0].model.prices
    return {
        "session": str(path),
        "model": MODEL,
        "prices": prices.model_dump(mode="json") if prices else None,
        "reports": [r.to_json(steps=False) for r in reports],
    }


def parse_number(path: Path) -> int:
    """The integer the file holds; anything else is a located SessionError, a file that
    cannot be read an OSError."""
    from kilo_rules.engine.base.errors import Diagnostic, Location, SessionError

    text = path.read_text(encoding="utf-8")
    if not text.strip().isdigit():
        raise SessionError(
            Diagnostic(
                "demo.not-a-number",
                f"expected a number, found {text.strip()!r}",
                Location(str(path), 1, 1),
                details={"text": text},
            )
        )
    return int(text)


class UnpicklableError(Exception):
    """An error whose pickle does not load: its constructor wants two arguments, and
    Exception pickles as ``cls(*args)`` with one."""

    def __init__(self, message: str, extra: int) -> None:
        super().__init__(message)
        self.extra = extra


class _Sticky:
    """A value that pickles but does not unpickle."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse, ())


def _refuse() -> None:
    raise RuntimeError("this value does not unpickle")


def troublesome(path: Path) -> Any:
    """A number, or for a file holding ``raise`` an error that does not unpickle, ``value``
    a value that does not unpickle, ``die`` a worker process killed under the work."""
    text = path.read_text(encoding="utf-8").strip()
    if text == "raise":
        raise UnpicklableError("does not travel", 1)
    if text == "value":
        return _Sticky()
    if text == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    return parse_number(path)
