"""The sidecar tells its operator why it refuses a revision (``/v1/status``, ``/readyz``,
the 503 of a build), counts a refused revision once, locates everything in the watched
files, and never answers 200 with a body the provider would refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.tools.serving.store import PolicyStore

from .conftest import MODEL, TOKEN, Live, policy_text, small_session, write_policy

BAD = policy_text("bad") + "bogus: 1\n"


def rejected_total(http: Any) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("kilo_rules_revisions_rejected_total "):
            return float(line.split()[1])
    raise AssertionError("no rejection counter")


def two_turns() -> dict[str, Any]:
    session = small_session()
    session["messages"] += [
        {
            "id": "msg_2",
            "role": "assistant",
            "created": 1_700_000_001_000,
            "parent_id": "msg_1",
            "parts": [{"type": "text", "id": "prt_2", "text": "Which test?"}],
        },
        {
            "id": "msg_3",
            "role": "user",
            "created": 1_700_000_002_000,
            "parts": [{"type": "text", "id": "prt_3", "text": "test_x."}],
        },
    ]
    return session


def test_status_shows_the_refused_revision_counted_once(live: Live, policy_dir: Path) -> None:
    with live.client() as http:
        ok = http.get("/v1/status").json()
        assert ok["status"] == "ready" and ok["revision"] == live.store.revision
        assert ok["source"] == {"kind": "directory", "location": str(policy_dir)}
        assert ok["rejection"] is None and ok["problems"] == []

        (policy_dir / "main.yaml").write_text(BAD, encoding="utf-8")
        for _ in range(3):  # the watcher's re-checks of the same files
            assert live.store.reload().rejected
        assert rejected_total(http) == 1

        status = http.get("/v1/status").json()
        assert status["status"] == "ready" and status["revision"] == ok["revision"]
        rejection = status["rejection"]
        assert rejection["attempts"] == 3 and status["rejection_pending"]
        assert rejection["candidate"].startswith("sha256:")
        [error] = [d for d in rejection["diagnostics"] if d["severity"] == "error"]
        assert error["code"] == "schema.unknown-key"
        assert error["location"]["file"] == str(policy_dir / "main.yaml")
        assert str(live.store.work_dir) not in json.dumps(status)

        # Another bad edit is another rejection.
        (policy_dir / "main.yaml").write_text(BAD.replace("bogus", "other"), encoding="utf-8")
        assert live.store.reload().rejected
        assert rejected_total(http) == 2


def test_status_needs_a_token_even_with_open_probes(policy_dir: Path, live_factory: Any) -> None:
    live = live_factory(PolicyStore.from_directory(policy_dir), open_probes=True)
    with live.client(auth=False) as anyone:
        assert anyone.get("/v1/status").status_code == 401
        assert anyone.get("/readyz").status_code == 200


def test_a_sidecar_serving_nothing_says_why(policy_dir: Path, live_factory: Any) -> None:
    (policy_dir / "main.yaml").write_text(BAD, encoding="utf-8")
    live = live_factory(PolicyStore.from_directory(policy_dir), open_probes=True)
    with live.client() as http:
        ready = http.get("/readyz")
        assert ready.status_code == 503
        body = ready.json()["error"]
        assert body["code"] == "store.not-ready"
        assert "unknown key 'bogus'" in body["message"]
        errors = [d for d in body["diagnostics"] if d["severity"] == "error"]
        assert [d["location"]["file"] for d in errors] == [str(policy_dir / "main.yaml")]

        for answer in (
            http.post("/v1/build", json={"session": small_session(), "model": MODEL}),
            http.get("/v1/plan", params={"model": MODEL}),
        ):
            assert answer.status_code == 503
            assert answer.json()["error"]["diagnostics"] == body["diagnostics"]

        status = http.get("/v1/status").json()
        assert status["status"] == "not-ready" and status["revision"] is None
        assert rejected_total(http) == 1  # refused before the app was made: counted still
        assert status["problems"] == body["diagnostics"]
        assert str(live.store.work_dir) not in json.dumps(status)

    # An open probe answers whoever asks: the policy's text stays out of its answer.
    with live.client(auth=False) as anyone:
        probe = anyone.get("/readyz")
        assert probe.status_code == 503
        assert probe.json()["error"]["diagnostics"] == []
        assert "bogus" not in probe.text and str(policy_dir) not in probe.text
    with live.client(auth=False, headers={"authorization": f"Bearer {TOKEN}"}) as caller:
        assert caller.get("/readyz").json()["error"]["diagnostics"] == body["diagnostics"]


def test_the_plan_names_the_watched_files(live: Live, policy_dir: Path) -> None:
    with live.client() as http:
        answer = http.get("/v1/plan", params={"model": MODEL})
    assert answer.status_code == 200
    plan = answer.json()["plan"]
    assert plan["policy_file"] == str(policy_dir / "main.yaml")
    assert [layer["at"].rsplit(":", 2)[0] for layer in plan["layers"]][-1] == str(
        policy_dir / "main.yaml"
    )
    assert str(live.store.work_dir) not in answer.text


def test_an_apply_time_error_names_the_watched_file(policy_dir: Path, live_factory: Any) -> None:
    # Compiles, and passes the canary (one turn), but divides by zero on two turns.
    policy = policy_text("rev-A") + (
        "prune:\n  protect_tokens: floor(1000 / (session.turns - 2)) + 5000\n"
    )
    (policy_dir / "main.yaml").write_text(policy, encoding="utf-8")
    live = live_factory(PolicyStore.from_directory(policy_dir))
    with live.client() as http:
        answer = http.post("/v1/build", json={"session": two_turns(), "model": MODEL})
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert error["code"] == "policy.apply-failed"
    assert error["diagnostics"][0]["location"]["file"] == str(policy_dir / "main.yaml")
    assert str(live.store.work_dir) not in answer.text


def test_a_session_without_messages_is_refused_located(live: Live) -> None:
    session = small_session()
    session["messages"] = []
    with live.client() as http:
        answer = http.post("/v1/build", json={"session": session, "model": MODEL})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "session.empty"
    [diagnostic] = error["diagnostics"]
    assert diagnostic["details"]["path"] == ["session", "messages"]
    assert diagnostic["location"]["file"] == "<request>"
    assert diagnostic["location"]["line"] == 1 and diagnostic["location"]["col"] > 1


# The engine builds this body and the tests' own acceptance check would stop it inside the
# build; here the sidecar must be the one that refuses it.
@pytest.mark.unchecked_bodies
@pytest.mark.parametrize(("provider", "path"), [(None, "messages[0]"), ("gemini", "contents[0]")])
def test_a_body_the_provider_would_refuse_is_not_a_200(
    live: Live, provider: str | None, path: str
) -> None:
    session = small_session()
    session["messages"][0]["role"] = "assistant"  # opens on an assistant turn
    body: dict[str, Any] = {"session": session, "model": MODEL}
    if provider is not None:
        body["step"] = {"provider": provider}
    with live.client() as http:
        answer = http.post("/v1/build", json=body)
        assert http.post("/v1/build", json={**body, "session": small_session()}).is_success
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "acceptance.first-role"
    [diagnostic] = error["diagnostics"]
    assert diagnostic["details"] == {"path": ["session"], "rule": "first-role", "body_path": path}
    assert diagnostic["location"]["file"] == "<request>"


def test_a_different_revision_after_a_good_one_serves_again(live: Live, policy_dir: Path) -> None:
    (policy_dir / "main.yaml").write_text(BAD, encoding="utf-8")
    assert live.store.reload().rejected
    write_policy(policy_dir, "rev-B")
    assert live.store.reload().swapped
    with live.client() as http:
        status = http.get("/v1/status").json()
    assert status["revision"] == live.store.revision
    assert status["rejection"] is not None and not status["rejection_pending"]
