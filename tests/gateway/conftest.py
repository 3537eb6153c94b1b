"""The fake provider for the gateway's tests: one per test module, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("uvicorn")

from .upstream import Upstream, running_upstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    """A running :class:`Upstream`, shared by the tests of a module (reset before each)."""
    with running_upstream() as up:
        yield up


@pytest.fixture(autouse=True)
def _fresh_upstream(request: pytest.FixtureRequest) -> None:
    """A test that uses ``upstream`` starts with no requests, empty caches, the default
    knobs and the default window."""
    if "upstream" in request.fixturenames:
        up: Upstream = request.getfixturevalue("upstream")
        up.reset()
