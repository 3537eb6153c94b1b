"""Who may call the sidecar, attacked as issue 23 found it open: no token, a rebound Host,
a ``text/plain`` body from a browser, a check that echoed files the caller never sent."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.engine.base.sandbox import allow_read
from kilo_rules.tools.serving.sidecar import create_app
from kilo_rules.tools.serving.sidecar.access import Access
from kilo_rules.tools.serving.store import PolicyStore

from .conftest import MODEL, TOKEN, Live, small_session

ENDPOINTS = [
    ("POST", "/v1/build"),
    ("POST", "/v1/check"),
    ("GET", f"/v1/plan?model={MODEL}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
]


def error_of(r: Any) -> dict[str, Any]:
    err: dict[str, Any] = r.json()["error"]
    return err


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_needs_the_token(live: Live, method: str, path: str) -> None:
    body = json.dumps({"session": small_session(), "model": MODEL})
    json_type = {"content-type": "application/json"}
    with live.client(auth=False) as http:
        missing = http.request(method, path, content=body, headers=json_type)
        wrong = http.request(
            method, path, content=body, headers={**json_type, "authorization": "Bearer x" * 3}
        )
        basic = http.request(
            method, path, content=body, headers={**json_type, "authorization": f"Basic {TOKEN}"}
        )
    assert missing.status_code == 401 and error_of(missing)["code"] == "auth.missing"
    assert missing.headers["www-authenticate"] == 'Bearer realm="kilo-rules"'
    assert wrong.status_code == 401 and error_of(wrong)["code"] == "auth.invalid"
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert basic.status_code == 401 and error_of(basic)["code"] == "auth.missing"
    with live.client() as http:
        ok = http.request(method, path, content=body, headers=json_type)
    assert ok.status_code != 401, ok.text


def test_authentication_comes_before_the_body_is_read(live: Live) -> None:
    # A body announced and never sent: the sidecar answers 401 at once, without waiting
    # for it (the body time bound is 30 s) and without reading it.
    port = int(live.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/build HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 999999999\r\n\r\n{"
        )
        raw = b""
        while chunk := sock.recv(65536):  # the server closes the connection after it
            raw += chunk
    head, _, payload = raw.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 401"), head
    assert "connection: close" in head.lower()
    assert json.loads(payload)["error"]["code"] == "auth.missing"


def test_a_rebound_host_and_a_browser_body_are_refused_even_without_auth(
    policy_dir: Path, live_factory: Any
) -> None:
    # DNS rebinding: a page on evil.example, its name now pointing at 127.0.0.1, posts a
    # text/plain body (no preflight) and reads the answer as same-origin.
    live = live_factory(PolicyStore.from_directory(policy_dir), no_auth=True)
    body = json.dumps({"session": small_session(), "model": MODEL})
    port = live.url.rsplit(":", 1)[1]
    with live.client(auth=False) as http:
        rebound = http.post(
            "/v1/build",
            content=body,
            headers={"host": f"evil.example:{port}", "content-type": "application/json"},
        )
        plain = http.post("/v1/build", content=body, headers={"content-type": "text/plain"})
        latin = http.post(
            "/v1/build",
            content=body,
            headers={"content-type": "application/json; charset=latin-1"},
        )
        ok = http.post(
            "/v1/build", content=body, headers={"content-type": "application/json; charset=utf-8"}
        )
        v6 = http.get("/healthz", headers={"host": f"[::1]:{port}"})
    assert rebound.status_code == 421 and error_of(rebound)["code"] == "request.host"
    assert plain.status_code == 415 and error_of(plain)["code"] == "request.content-type"
    assert latin.status_code == 415
    assert ok.status_code == 200, ok.text
    assert v6.status_code == 200


def test_the_allowed_hosts_are_exact(policy_dir: Path, live_factory: Any) -> None:
    live = live_factory(
        PolicyStore.from_directory(policy_dir), allowed_hosts=["kilo.internal:8443"]
    )
    with live.client() as http:
        right = http.get("/healthz", headers={"host": "KILO.internal:8443"})
        port = http.get("/healthz", headers={"host": "kilo.internal:8444"})
        loopback = http.get("/healthz")
    assert right.status_code == 200
    assert port.status_code == 421 and loopback.status_code == 421


def test_open_probes_answer_without_a_token_and_nothing_else_does(
    policy_dir: Path, live_factory: Any
) -> None:
    live = live_factory(
        PolicyStore.from_directory(policy_dir), open_probes=True, allowed_hosts=["kilo:1"]
    )
    with live.client(auth=False) as http:
        probes = [http.get(p).status_code for p in ("/healthz", "/readyz", "/metrics")]
        plan = http.get("/v1/plan", params={"model": MODEL})
    assert probes == [200, 200, 200]
    assert plan.status_code == 401


def test_no_cors_unless_configured_and_then_only_those_origins(
    policy_dir: Path, live_factory: Any
) -> None:
    preflight = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }
    closed = live_factory(PolicyStore.from_directory(policy_dir))
    with closed.client() as http:
        r = http.get("/healthz", headers={"origin": "https://app.example.com"})
        pre = http.options("/v1/build", headers={"origin": "https://app.example.com", **preflight})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in pre.headers
    opened = live_factory(
        PolicyStore.from_directory(policy_dir), cors_origins=["https://app.example.com"]
    )
    with opened.client(auth=False) as http:
        good = http.options("/v1/build", headers={"origin": "https://app.example.com", **preflight})
        evil = http.options("/v1/build", headers={"origin": "https://evil.example", **preflight})
    assert good.status_code == 200
    assert good.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "access-control-allow-origin" not in evil.headers
    with opened.client(auth=False) as http:  # the preflight opens nothing by itself
        assert http.get("/v1/plan", params={"model": MODEL}).status_code == 401


def test_check_never_echoes_a_file_the_caller_did_not_send(
    policy_dir: Path, tmp_path: Path
) -> None:
    import anyio
    import httpx

    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "cfg.yaml").write_text(
        "version: 1\nname: x\nDB_PASSWORD_PROD: hunter2-s3cret\n", encoding="utf-8"
    )
    policy = f"version: 1\nname: t\nextends: {secret / 'cfg.yaml'}\nbogus: 1\n"
    store = PolicyStore.from_directory(policy_dir)
    app = create_app(store, tokens=[TOKEN])

    async def check() -> Any:
        # In process, so that the read roots (a context variable) reach the worker, as
        # `kilo-rules serve --allow-read DIR` gives them to its own.
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=headers
        ) as http:
            return await http.post("/v1/check", json={"policy": policy, "models": [MODEL]})

    try:
        with allow_read([secret]):
            r = anyio.run(check)
    finally:
        store.close()
    assert r.status_code == 200, r.text
    for leaked in ("DB_PASSWORD", "hunter2", "allowed keys: tokens"):
        assert r.text.count(leaked) <= (1 if leaked.startswith("allowed") else 0), leaked
    diags = r.json()["diagnostics"]
    hidden = [d for d in diags if d["location"]["file"] == "<not sent>"]
    assert [d["code"] for d in hidden] == ["schema.unknown-key"]
    assert "details" not in hidden[0]
    # What the caller sent is still reported in full.
    assert any("bogus" in d["message"] and d["location"]["file"] == "policy.yaml" for d in diags)


def test_tokens_are_never_logged_or_counted(
    policy_dir: Path, live_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "decisions.jsonl"
    live = live_factory(PolicyStore.from_directory(policy_dir), decision_log=log)
    wrong = "wrong-token-ABCDEFGHIJKLMNOP"
    caplog.set_level(logging.DEBUG)
    with live.client() as http:
        assert http.post("/v1/build", json={"session": small_session(), "model": MODEL}).is_success
        assert http.post("/v1/build", json={"model": MODEL}).status_code == 422
        metrics = http.get("/metrics").text
    with live.client(auth=False, headers={"authorization": f"Bearer {wrong}"}) as http:
        http.post("/v1/build", json={"session": small_session(), "model": MODEL})
    # The server's own loggers (the test's client logs what it sends, by design).
    server_logs = [r.getMessage() for r in caplog.records if not r.name.startswith("http")]
    seen = log.read_text(encoding="utf-8") + metrics + "\n".join(server_logs)
    for secret in (TOKEN, wrong, "Bearer", "authorization"):
        assert secret not in seen, secret


def test_an_app_is_made_with_tokens_or_explicitly_without(policy_dir: Path) -> None:
    store = PolicyStore.from_directory(policy_dir)
    try:
        with pytest.raises(ValueError, match="no token given"):
            create_app(store)
        with pytest.raises(ValueError, match="at least 16"):
            create_app(store, tokens=["short"])
        with pytest.raises(ValueError, match="contradict"):
            create_app(store, tokens=[TOKEN], no_auth=True)
    finally:
        store.close()


def test_tokens_are_kept_as_digests_only() -> None:
    access = Access.with_tokens([TOKEN, "another-token-0123456789"])
    assert TOKEN.encode() not in repr(access).encode()
    assert all(len(d) == 32 for d in access.digests)
    assert access.authenticated(f"Bearer {TOKEN}".encode()) is True
    assert access.authenticated(f"bearer  {TOKEN} ".encode()) is True
    assert access.authenticated(f"Bearer {TOKEN}x".encode()) is False
    assert access.authenticated(b"Bearer") is None
    assert access.authenticated(None) is None
