"""Shared fixtures."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test inside an empty temporary directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# CI runs property tests derandomised, so a run can be repeated exactly; locally they
# explore new examples every time.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _engine_bodies_are_acceptable(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every body the engine builds in any test keeps the providers' acceptance rules.

    The runtime's render stage looks ``kilo_rules.engine.providers.render_json`` up when it
    runs, so wrapping it here checks each body a step renders with ``check_body`` (for the
    model it was built for); tests that call a renderer directly, with hand-made requests,
    hold the unwrapped function. A test that builds a refused body on purpose says so with
    ``@pytest.mark.unchecked_bodies``. The window rule is left to the tests that replay
    sessions: a single apply may build an over-window request that the runtime then
    compacts. A test that runs ``check_body`` itself on every body the engine builds in it,
    with a context at least as strict, says so with ``@pytest.mark.checks_every_body``
    and is not checked twice."""
    if request.node.get_closest_marker("unchecked_bodies"):
        return
    if request.node.get_closest_marker("checks_every_body"):
        return
    import kilo_rules.engine.providers as providers
    from kilo_rules.engine.providers.acceptance import BodyContext, check_body

    render_json = providers.render_json

    def checked(model_request: Any, api: str, fragments: Any = None) -> bytes:
        wire = render_json(model_request, api, fragments)
        body = json.loads(wire.decode("utf-8", "surrogatepass"))
        problems = check_body(body, api, BodyContext(model_request.model))
        assert not problems, "\n".join(str(p) for p in problems)
        return wire

    monkeypatch.setattr(providers, "render_json", checked)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers this conftest reads."""
    config.addinivalue_line(
        "markers",
        "checks_every_body: runs check_body itself on every body it builds (the conftest "
        "does not check them again)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests marked slow first, in their collected order, then the rest.

    ``make test`` spreads the suite over pytest-xdist workers, which take tests in this
    order; a replay of several minutes that started last would keep one worker busy
    long after the others ran out of work. Nothing here may depend on the order, so
    reordering is also a check that no test relies on another having run before it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@contextlib.contextmanager
def shared_by_workers(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[tuple[Path, bool]]:
    """A directory every pytest-xdist worker of this run sees, and whether the caller is the
    first to get it (and must fill it before the block ends).

    A module-scoped fixture runs once per worker that runs one of its tests, and work
    stealing spreads a module's tests over every worker: an expensive result (a whole
    tune) would be computed once per core. Here the first worker computes it under a file
    lock while the others wait for it, then read what it left. A block that raises leaves
    the directory unfinished, so the next worker tries again (and fails the same way)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's root, above each worker's own basetemp
    where = base / f"shared-{name}"
    done = where / ".done"
    with (base / f"shared-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            first = not done.exists()
            if first:
                if where.exists():
                    shutil.rmtree(where)
                where.mkdir()
            yield where, first
            if first:
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
