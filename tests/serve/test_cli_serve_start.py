"""How ``kilo-rules serve`` starts: what it serves with nothing configured, what it says
on stderr about a refused revision, and the exit code of a port it cannot listen on."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx

from kilo_rules.tools.cli import main

from .conftest import MODEL, policy_text, small_session
from .test_cli_serve import free_port

SERVE = [sys.executable, "-m", "kilo_rules", "serve"]
Auth = dict[str, str]


def quiet_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without any KILO_RULES_STORE_*/SERVE_* of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILO_RULES_")}
    return {
        **env,
        "TMPDIR": str(tmp_path),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        **extra,
    }


@contextlib.contextmanager
def started(args: list[str], tmp_path: Path, **env: str) -> Iterator[tuple[Any, str, Auth]]:
    """Run ``serve`` on a free port until the generated token exists and /healthz answers;
    yields the process, its URL and the auth header. SIGTERM at the end."""
    port = free_port()
    proc = subprocess.Popen(
        [*SERVE, *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=quiet_env(tmp_path, **env),
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    token_file = tmp_path / "run" / "kilo-rules" / f"serve-{port}.token"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                auth = {"authorization": f"Bearer {token_file.read_text().strip()}"}
                if httpx.get(f"{url}/healthz", timeout=1, headers=auth).status_code == 200:
                    break
            except (FileNotFoundError, httpx.TransportError):
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the sidecar did not start"
            time.sleep(0.1)
        yield proc, url, auth
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


@pytest.mark.slow
def test_with_nothing_configured_serve_serves_the_bundled_policies(tmp_path: Path) -> None:
    with started([], tmp_path) as (proc, url, auth):
        ready = httpx.get(f"{url}/readyz", headers=auth)
        assert ready.status_code == 200
        plan = httpx.get(f"{url}/v1/plan", params={"model": MODEL}, headers=auth).json()
        assert plan["plan"]["policy"] == "kilo-default"
        build = httpx.post(
            f"{url}/v1/build", json={"session": small_session(), "model": MODEL}, headers=auth
        )
        assert build.status_code == 200
        status = httpx.get(f"{url}/v1/status", headers=auth).json()
        assert status["source"] == {"kind": "bundled", "location": "<bundled>"}
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    [line] = [x for x in err.splitlines() if "bundled policies" in x]
    assert line == (
        "kilo-rules serve: no --dir, --bundle or --url (nor KILO_RULES_STORE_*): serving the "
        f"bundled policies, every model on kilo-default; revision {ready.json()['revision']}"
    )


@pytest.mark.slow
def test_a_refused_revision_is_on_stderr_once_per_revision(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "routes.yaml").write_text("version: 1\nroutes: []\ndefault: ./main.yaml\n")
    (policies / "main.yaml").write_text(policy_text("bad") + "bogus: 1\n")
    with started(
        ["--dir", str(policies), "--watch"],
        tmp_path,
        KILO_RULES_STORE_POLL_SECONDS="0.1",
        KILO_RULES_STORE_DEBOUNCE_SECONDS="0.05",
    ) as (proc, url, auth):
        assert httpx.get(f"{url}/readyz", headers=auth).status_code == 503
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/status", headers=auth).json()["rejection"]["attempts"] < 3:
            assert time.monotonic() < deadline, "the directory was not re-checked"
            time.sleep(0.1)
        metrics = httpx.get(f"{url}/metrics", headers=auth).text
        # Refused at start, before the app existed, and re-checked since: one rejection.
        assert "kilo_rules_revisions_rejected_total 1.0" in metrics
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    line = re.compile(
        re.escape(str(policies / "main.yaml")) + r":11:1: error\[schema\.unknown-key\]: "
        r"unknown key 'bogus'$"
    )
    assert len([x for x in err.splitlines() if line.search(x)]) == 1, err
    assert (
        f"kilo-rules serve: serving {policies}; no revision has passed its checks yet "
        "(GET /v1/status says why)"
    ) in err.splitlines()


def test_a_port_in_use_exits_2_saying_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*SERVE, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=quiet_env(tmp_path),
            cwd=tmp_path,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_socket_listens_as_soon_as_it_is_bound() -> None:
    from kilo_rules.tools.cli.serve import _bind

    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        # So another process binding the port meanwhile (SO_REUSEADDR too) is refused.
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError):
                other.bind(sock.getsockname())
    finally:
        sock.close()


def test_a_server_that_cannot_start_exits_2_not_3(
    policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import kilo_rules.tools.cli.serve as serve_cli

    # Two sidecars started at once on one port, both bound with SO_REUSEADDR: the other
    # one listened first, so this one's listen fails when the server starts.
    ours = socket.socket()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ours.bind(("127.0.0.1", 0))
    port = ours.getsockname()[1]
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", port))
    other.listen()
    monkeypatch.setattr(serve_cli, "_bind", lambda host, p: ours)
    monkeypatch.setattr(gc, "freeze", lambda: None)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("KILO_RULES_STORE_WORK_DIR", str(tmp_path / "work"))
    try:
        code = main(["serve", "--dir", str(policy_dir), "--port", str(port)])
    finally:
        other.close()
        ours.close()
    assert code == 2
    err = capsys.readouterr().err
    assert f"kilo-rules serve: cannot listen on 127.0.0.1:{port}: address already in use" in err
    assert not (tmp_path / "run" / "kilo-rules" / f"serve-{port}.token").exists()


def test_a_server_uvicorn_cannot_start_exits_2_not_3(
    policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import uvicorn

    def refuses(self: Any, sockets: Any = None) -> None:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE, its reason logged by uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", refuses)
    monkeypatch.setattr(gc, "freeze", lambda: None)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("KILO_RULES_STORE_WORK_DIR", str(tmp_path / "work"))
    assert main(["serve", "--dir", str(policy_dir), "--port", "0"]) == 2
    assert "kilo-rules serve: the server could not start on 127.0.0.1:" in capsys.readouterr().err
    assert not list((tmp_path / "work").iterdir())  # the store was closed
