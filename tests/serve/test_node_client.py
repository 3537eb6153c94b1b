"""examples/node-client against a real sidecar: another language reads the contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from .conftest import MODEL, ROOT, TOKEN, Live, small_session

CLIENT = ROOT / "examples/node-client/build.mjs"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not on PATH")


def run_client(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    env = {k: v for k, v in os.environ.items() if k != "KILO_RULES_TOKEN"}
    if token is not None:
        env["KILO_RULES_TOKEN"] = token
    return subprocess.run(
        [NODE, str(CLIENT), *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )


@pytest.fixture
def live(policy_dir: Path, live_factory: Any) -> Live:
    """A sidecar that wants the test token (the client sends it from $KILO_RULES_TOKEN)."""
    from kilo_rules.tools.serving.store import PolicyStore

    result: Live = live_factory(PolicyStore.from_directory(policy_dir))
    return result


def test_the_node_client_sends_the_token_from_a_file_and_is_refused_without(
    live: Live, tmp_path: Path
) -> None:
    path = tmp_path / "session.json"
    path.write_text(json.dumps(small_session()), encoding="utf-8")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    args = ("--url", live.url, "--model", MODEL, "--session", str(path))
    done = run_client(*args, "--token-file", str(token_file), token=None)
    assert done.returncode == 0, done.stderr
    refused = run_client(*args, token=None)
    assert refused.returncode == 1 and "HTTP 401 auth.missing" in refused.stderr


def test_the_node_client_prints_provider_revision_and_messages(live: Live, tmp_path: Path) -> None:
    session = small_session()
    session["messages"].append(
        {
            "id": "msg_2",
            "role": "assistant",
            "created": 1_700_000_001_000,
            "finish": "stop",
            "parts": [{"type": "text", "id": "prt_2", "text": "Which test?"}],
        }
    )
    session["messages"].append(
        {
            "id": "msg_3",
            "role": "user",
            "created": 1_700_000_002_000,
            "parts": [{"type": "text", "id": "prt_3", "text": "test_x."}],
        }
    )
    path = tmp_path / "session.json"
    path.write_text(json.dumps(session), encoding="utf-8")
    done = run_client("--url", live.url, "--model", MODEL, "--session", str(path))
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert lines["provider"] == "anthropic"
    assert lines["revision"] == live.store.revision
    assert lines["messages"] == "3"


def test_the_node_client_exits_non_zero_on_http_errors(live: Live, tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    path.write_text(json.dumps(small_session()), encoding="utf-8")
    unknown = run_client(
        "--url", live.url, "--model", "anthropic/claude-sonet-4-5", "--session", str(path)
    )
    assert unknown.returncode == 1
    assert "HTTP 404 model.unknown" in unknown.stderr and "did you mean" in unknown.stderr
    bad = dict(small_session(), messages=[{"id": "m", "role": "robot"}])
    path.write_text(json.dumps(bad), encoding="utf-8")
    invalid = run_client("--url", live.url, "--model", MODEL, "--session", str(path))
    assert invalid.returncode == 1
    assert "HTTP 422 session.invalid" in invalid.stderr and "<request>:1:" in invalid.stderr
    usage = run_client("--url", live.url)
    assert usage.returncode == 2 and "--model is required" in usage.stderr
