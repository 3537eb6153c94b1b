"""Every error kilo-rules raises survives a pickle round trip: a worker process of a corpus
run (a process pool, a Dask cluster) sends its errors to the parent that way, and an error
that does not unpickle there breaks the whole pool instead of failing one session."""

from __future__ import annotations

import importlib
import multiprocessing
import pickle
import pkgutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

import kilo_rules
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location
from kilo_rules.engine.base.regex import RegexError
from kilo_rules.engine.base.safefs import ReadRefused
from kilo_rules.engine.summarizers.protocol import SummarizerError

DIAGS = (
    Diagnostic(
        "demo.second",
        "the later one",
        Location("b.yaml", 9, 2, 9, 7),
        details={"limit": 3, "seen": [1, 2]},
        hint="sort it out",
    ),
    Diagnostic("demo.first", "the best one", Location("a.yaml", 1, 4), severity="warning"),
)


def _every_module() -> None:
    # A subclass exists only once its module is imported; __main__ would run the CLI.
    for info in pkgutil.walk_packages(kilo_rules.__path__, "kilo_rules."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def _subclasses(cls: type[KiloRulesError]) -> list[type[KiloRulesError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def _status_error() -> KiloRulesError:
    from kilo_rules.engine.summarizers.http import _StatusError

    return _StatusError(
        "429 slow down", retryable=True, overflow=False, status=429, retry_after=2.5
    )


#: The errors whose constructor is not KiloRulesError's, built as their raisers build them.
OWN_CONSTRUCTORS: dict[str, Callable[[], KiloRulesError]] = {
    "kilo_rules.engine.summarizers.protocol.SummarizerError": lambda: SummarizerError(
        "the summary request timed out", retryable=True, details={"attempt": 2}
    ),
    "kilo_rules.engine.summarizers.http._StatusError": _status_error,
    "kilo_rules.engine.base.regex.RegexError": lambda: RegexError(list(DIAGS), "backreference"),
}


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _instances() -> list[KiloRulesError]:
    _every_module()
    out: list[KiloRulesError] = []
    for cls in _subclasses(KiloRulesError):
        if cls.__init__ is KiloRulesError.__init__:
            error = cls(list(DIAGS))
            error.add_note("a note added on the way up")
            out.append(error)
        else:
            assert _name(cls) in OWN_CONSTRUCTORS, (
                f"{_name(cls)} has its own __init__: add it to OWN_CONSTRUCTORS"
            )
            out.append(OWN_CONSTRUCTORS[_name(cls)]())
    return out


def _facts(error: BaseException) -> dict[str, Any]:
    return {
        "type": type(error),
        "args": error.args,
        "str": str(error),
        "attributes": vars(error),
    }


def test_every_subclass_is_found() -> None:
    names = {_name(type(e)) for e in _instances()}
    # The walk reaches subclasses defined outside errors.py, not only those beside it.
    assert {
        "kilo_rules.engine.base.errors.PolicyError",
        "kilo_rules.engine.base.errors.ModelUnservableError",
        "kilo_rules.engine.base.errors.CancellationError",
        "kilo_rules.engine.runtime.mutations.MutationError",
        "kilo_rules.engine.text.tokens.TokenizerUnavailableError",
        *OWN_CONSTRUCTORS,
    } <= names


@pytest.mark.parametrize("error", _instances(), ids=lambda e: type(e).__name__)
def test_an_error_pickles_to_an_equal_error(error: KiloRulesError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert _facts(back) == _facts(error)
    assert back.diagnostics == error.diagnostics
    assert back.diagnostic == error.diagnostic


def test_an_error_crosses_a_process_boundary() -> None:
    error = SummarizerError("the summary request timed out", retryable=True)
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        back = pool.submit(pickle.loads, pickle.dumps(error)).result()
    assert _facts(back) == _facts(error)


def test_read_refused_keeps_its_reason_and_path() -> None:
    error = ReadRefused("not-regular", "/tmp/fifo", "/tmp/fifo: not a regular file")
    back = pickle.loads(pickle.dumps(error))
    assert (back.reason, back.path, str(back)) == (error.reason, error.path, str(error))
