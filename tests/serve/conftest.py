"""A real sidecar for the tests: uvicorn on 127.0.0.1 in a thread, over a PolicyStore of a
temporary policy directory.

Each test module starts with ``pytest.importorskip`` of the serve extra, so the directory
is skipped cleanly where it is not installed; this file imports it only inside fixtures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.threaded import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"
RECORDED = TRAJECTORIES / "claude-code-sonnet45-subagent-a2898e3.jsonl"
MODEL = "anthropic/claude-sonnet-4-5"

ROUTES = "version: 1\nroutes: []\ndefault: ./main.yaml\n"
#: The bearer token of the sidecars the fixtures start (unless a test gives its own).
TOKEN = "test-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def policy_text(marker: str, tail_turns: int = 2) -> str:
    """A policy that extends kilo-default with a system layer whose text is ``marker``, so
    that the revision a request was built under shows in the request itself."""
    return (
        "version: 1\n"
        "name: main\n"
        "extends: kilo-default\n"
        "compaction:\n"
        f"  tail_turns: {tail_turns}\n"
        "system:\n"
        "  layers:\n"
        "    - id: marker\n"
        "      source: text\n"
        f"      text: {marker!r}\n"
    )


def write_policy(root: Path, marker: str, tail_turns: int = 2) -> None:
    """Write a valid revision into ``root``."""
    (root / "routes.yaml").write_text(ROUTES, encoding="utf-8")
    (root / "main.yaml").write_text(policy_text(marker, tail_turns), encoding="utf-8")


def small_session(text: str = "Fix the failing test in tests/test_x.py.") -> dict[str, Any]:
    """A Session v1 document of one user message."""
    return {
        "version": 1,
        "id": "ses_small",
        "messages": [
            {
                "id": "msg_1",
                "role": "user",
                "created": 1_700_000_000_000,
                "parts": [{"type": "text", "id": "prt_1", "text": text}],
            }
        ],
    }


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A policy directory holding routes.yaml and main.yaml (marker ``rev-A``)."""
    root = tmp_path / "policies"
    root.mkdir()
    write_policy(root, "rev-A")
    return root


@dataclass
class Live:
    """A running sidecar: its base URL, the app and the store behind it."""

    url: str
    app: Any
    store: Any
    server: Any

    def client(self, **kwargs: Any) -> Any:
        """An httpx client of this server, sending :data:`TOKEN` (``auth=False``: none)."""
        import httpx

        headers = dict(AUTH) if kwargs.pop("auth", True) else {}
        headers.update(kwargs.pop("headers", {}))
        return httpx.Client(
            base_url=self.url, timeout=kwargs.pop("timeout", 60.0), headers=headers, **kwargs
        )


@contextlib.contextmanager
def serving(app: Any, **limits: Any) -> Iterator[tuple[str, Any]]:
    """Run ``app`` under uvicorn on 127.0.0.1 (a free port) in a thread until the block
    ends, configured as ``kilo-rules serve`` configures it (``limits``: head_timeout,
    keep_alive_timeout, max_connections); yields the base URL and the server."""
    from kilo_rules.tools.serving.sidecar.protocol import uvicorn_config

    config = uvicorn_config(app, log_level="warning", lifespan="off", access_log=False, **limits)
    with serve_in_thread(config, "the sidecar") as (url, server):
        yield url, server


@pytest.fixture
def live_factory(tmp_path: Path) -> Iterator[Any]:
    """Start sidecars over stores: ``live_factory(store, **create_app_options)`` (with
    ``tokens=[TOKEN]`` unless the options say otherwise; ``limits={...}`` go to
    :func:`serving`). Each is shut down, and its store closed, at teardown."""
    from kilo_rules.tools.serving.sidecar import create_app

    stack = contextlib.ExitStack()

    def start(store: Any, limits: dict[str, Any] | None = None, **options: Any) -> Live:
        if not options.get("no_auth"):
            options.setdefault("tokens", [TOKEN])
        app = create_app(store, **options)
        stack.callback(store.close)
        url, server = stack.enter_context(serving(app, **(limits or {})))
        return Live(url, app, store, server)

    with stack:
        yield start


@pytest.fixture
def live(policy_dir: Path, live_factory: Any, tmp_path: Path) -> Live:
    """A sidecar over ``policy_dir``, writing a decision log to ``tmp_path/decisions.jsonl``."""
    from kilo_rules.tools.serving.store import PolicyStore

    store = PolicyStore.from_directory(policy_dir)
    result: Live = live_factory(store, decision_log=tmp_path / "decisions.jsonl")
    return result
