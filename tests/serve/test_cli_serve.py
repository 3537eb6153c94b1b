"""``kilo-rules serve`` as an operator runs it: a process, a port, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import httpx

from .conftest import MODEL, ROOT, small_session

BLOCKED = """
import sys
for name in ("fastapi", "uvicorn", "prometheus_client", "starlette"):
    sys.modules[name] = None  # as if the serve extra were not installed
from kilo_rules.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_the_serve_extra_serve_exits_2_naming_the_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, "serve", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'kilo-rules[serve]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_core_package_does_not_import_the_serve_extra() -> None:
    code = (
        "import sys, kilo_rules, kilo_rules.tools.cli, kilo_rules.tools.serving.store\n"
        "from kilo_rules.tools.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'starlette') "
        "if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_openapi_option_prints_the_committed_document() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kilo_rules", "serve", "--openapi"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    committed = (ROOT / "schemas/openapi.json").read_text(encoding="utf-8")
    assert done.stdout == committed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_serve_answers_then_shuts_down_cleanly_on_sigterm(policy_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    work = tmp_path / "work"
    log = tmp_path / "decisions.jsonl"
    runtime = tmp_path / "run"
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "KILO_RULES_STORE_WORK_DIR": str(work),
        "XDG_RUNTIME_DIR": str(runtime),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kilo_rules",
            "serve",
            "--dir",
            str(policy_dir),
            "--port",
            str(port),
            "--decision-log",
            str(log),
            "--watch",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        # No token was configured on a loopback address: the sidecar makes one, in a file
        # only this user can read, and refuses a caller without it.
        token_file = runtime / "kilo-rules" / f"serve-{port}.token"
        deadline = time.monotonic() + 30
        while True:
            try:
                auth = {"authorization": f"Bearer {token_file.read_text().strip()}"}
                if httpx.get(f"{url}/readyz", timeout=1, headers=auth).status_code == 200:
                    break
            except FileNotFoundError:
                pass
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the sidecar did not get ready"
            time.sleep(0.1)
        assert token_file.stat().st_mode & 0o777 == 0o600
        body = {"session": small_session(), "model": MODEL}
        assert httpx.post(f"{url}/v1/build", json=body).status_code == 401
        r = httpx.post(f"{url}/v1/build", json=body, headers=auth)
        assert r.status_code == 200
        assert list(work.iterdir()), "the store keeps its revisions under its work dir"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert not token_file.exists(), "the generated token goes with the process"
    assert [json.loads(line)["status"] for line in log.read_text().splitlines()] == [200]
    # The store was closed: its revision directories are gone.
    assert not any(p.name.startswith("kilo-rules-store-") for p in work.iterdir())


def test_a_signed_bundle_is_served_only_with_its_key(policy_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from kilo_rules.engine.formats.bundle import build_bundle, generate_keypair, sign_bundle
    from kilo_rules.tools.cli import build_parser
    from kilo_rules.tools.cli.serve import open_store

    bundle = tmp_path / "policies.tar.gz"
    manifest = build_bundle(policy_dir, bundle)
    private, public = generate_keypair()
    sign_bundle(bundle, private)
    good, other = tmp_path / "good.pub", tmp_path / "other.pub"
    good.write_bytes(public)
    other.write_bytes(generate_keypair()[1])
    argv = ["serve", "--bundle", str(bundle), "--cache-dir", str(tmp_path / "cache")]
    with open_store(build_parser().parse_args([*argv, "--public-key", str(good)])) as store:
        assert store.revision == manifest.revision
    with open_store(build_parser().parse_args([*argv, "--public-key", str(other)])) as store:
        assert store.revision == ""  # refused: the sidecar answers 503 until a good one
        assert "signature" in (store.stats().last_error or "")
    with pytest.raises(ValueError, match="--watch goes with a policy directory"):
        open_store(build_parser().parse_args([*argv, "--watch"]))


def test_a_non_loopback_address_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILO_RULES_SERVE_")}
    argv = [sys.executable, "-m", "kilo_rules", "serve", "--dir", str(tmp_path)]
    done = subprocess.run(
        [*argv, "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "no token is configured" in done.stderr and "--no-auth" in done.stderr


def test_token_files_and_default_hosts(tmp_path: Path) -> None:
    from kilo_rules.tools.cli.serve import default_hosts, read_tokens

    good = tmp_path / "tokens"
    good.write_text("# the agents\nabcdefghijklmnop0123\n\nsecond-token-XYZ-0123456\n")
    assert read_tokens(good) == ["abcdefghijklmnop0123", "second-token-XYZ-0123456"]
    weak = tmp_path / "weak"
    weak.write_text("short-secret\n")
    with pytest.raises(ValueError, match=r"weak:1: a token must be at least 16") as info:
        read_tokens(weak)
    assert "short-secret" not in str(info.value)
    assert default_hosts("0.0.0.0", 8080) == ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"]
    assert default_hosts("10.1.2.3", 80)[0] == "10.1.2.3:80"
    assert default_hosts("::1", 80)[:2] == ["[::1]:80", "localhost:80"]


def test_allow_rollback_reaches_the_store_settings(tmp_path: Path) -> None:
    import argparse

    from kilo_rules.tools.cli.serve import open_store

    policies = tmp_path / "p"
    policies.mkdir()
    (policies / "team.yaml").write_text(
        "version: 1\nname: team\nextends: kilo-default\n", encoding="utf-8"
    )
    base: dict[str, Any] = {"dir": str(policies), "bundle": None, "url": None, "public_key": None}
    base |= {"cache_dir": None, "watch": False, "poll": None}
    for flag in (False, True):
        store = open_store(argparse.Namespace(**base, allow_rollback=flag))
        try:
            assert store.settings.allow_rollback is flag
        finally:
            store.close()
