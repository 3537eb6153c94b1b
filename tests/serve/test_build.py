"""``POST /v1/build`` through a real server: the same request as an in-process apply, and
every refusal typed and located."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.engine.formats.session import dump_session, session_from_data
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import Agent, StepInput, Workspace
from kilo_rules.tools.serving.store import PolicyStore

from .conftest import MODEL, RECORDED, TRAJECTORIES, Live, small_session


def in_process(store: PolicyStore, session: dict[str, Any], step: StepInput) -> dict[str, Any]:
    """What the server should answer, built here: the store's plan, applied directly, as
    JSON (the wire turns tuples into lists)."""
    plan = store.plan_for(MODEL)
    result = apply_plan(plan, session_from_data(session), step)
    wire: dict[str, Any] = json.loads(json.dumps(result.to_json()))
    return wire


def here() -> StepInput:
    """The step the sidecar builds when the request names no workspace."""
    return StepInput(workspace=Workspace(cwd=str(Path.cwd().resolve())))


def test_a_small_session_builds_the_same_request_as_in_process(live: Live) -> None:
    session = small_session()
    with live.client() as http:
        r = http.post("/v1/build", json={"session": session, "model": MODEL})
    assert r.status_code == 200, r.text
    got = r.json()
    want = in_process(live.store, session, here())
    assert got["revision"] == live.store.revision and got["revision"].startswith("sha256:")
    assert got["request"] == want["request"]
    assert got["decisions"] == want["decisions"]
    assert got["mutations"] == want["mutations"]
    assert got["provider"] == "anthropic"
    assert "rev-A" in json.dumps(got["request"]["system"])
    assert got["fits"] is True and got["input_tokens"] > 0 and got["context"] > 0


def test_the_step_options_reach_the_engine(live: Live) -> None:
    session = small_session()
    step = {"step": 3, "max_steps": 3, "agent": {"name": "plan"}, "provider": "openai"}
    with live.client() as http:
        r = http.post("/v1/build", json={"session": session, "model": MODEL, "step": step})
    assert r.status_code == 200, r.text
    want = in_process(
        live.store,
        session,
        StepInput(
            agent=Agent(name="plan"),
            workspace=Workspace(cwd=str(Path.cwd().resolve())),
            step=3,
            max_steps=3,
            provider="openai",
        ),
    )
    assert r.json()["provider"] == "openai"
    assert r.json()["request"] == want["request"]


@pytest.mark.parametrize(
    "log", sorted(TRAJECTORIES.glob("claude-code-*.jsonl")) or [RECORDED], ids=lambda p: p.stem
)
def test_a_recorded_session_builds_the_same_request_as_in_process(live: Live, log: Path) -> None:
    if not log.is_file():
        pytest.skip(f"{log} is not here")
    session = json.loads(dump_session(read_session(log)))
    with live.client() as http:
        r = http.post("/v1/build", json={"session": session, "model": MODEL})
    assert r.status_code == 200, r.text[:2000]
    got = r.json()
    want = in_process(live.store, session, here())
    assert got["revision"] == live.store.revision
    assert got["request"] == want["request"]
    assert got["decisions"] == want["decisions"]
    assert got["mutations"] == want["mutations"]
    assert len(got["request"]["messages"]) > 10


def test_an_inline_model_is_built_for(live: Live) -> None:
    model = {
        "id": "local/qwen",
        "provider": "ollama",
        "family": "qwen",
        "api_id": "qwen2.5-coder:7b",
        "api": "openai-compatible",
        "limits": {"context": 32768, "output": 4096},
    }
    with live.client() as http:
        r = http.post("/v1/build", json={"session": small_session(), "model": model})
        bad = http.post("/v1/build", json={"session": small_session(), "model": {"id": "x"}})
    assert r.status_code == 200, r.text
    assert r.json()["provider"] == "openai-compatible"
    assert r.json()["request"]["model"] == "qwen2.5-coder:7b"
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "model.invalid"


def error_of(response: Any) -> dict[str, Any]:
    """The typed error of a refused request (and that it is one)."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "diagnostics"}
    assert "Traceback" not in response.text
    return error


def test_an_invalid_session_is_422_located_in_the_body(live: Live) -> None:
    session = small_session()
    session["messages"][0]["role"] = "robot"
    text = json.dumps({"model": MODEL, "session": session}, indent=1)
    with live.client() as http:
        r = http.post("/v1/build", content=text, headers={"content-type": "application/json"})
    assert r.status_code == 422
    error = error_of(r)
    assert error["code"] == "session.invalid"
    [diag] = error["diagnostics"]
    assert diag["details"]["path"] == ["session", "messages", 0, "role"]
    line = next(i for i, s in enumerate(text.splitlines(), 1) if '"robot"' in s)
    assert diag["location"]["file"] == "<request>"
    assert diag["location"]["line"] == line
    assert text.splitlines()[line - 1][diag["location"]["col"] - 1 :].startswith('"robot"')


@pytest.mark.parametrize(
    ("body", "code", "path"),
    [
        (b"{not json", "request.json", None),
        (b"[1, 2]", "request.invalid", None),
        (b'\xff{"a": 1}', "request.encoding", None),
        (json.dumps({"model": MODEL}).encode(), "request.invalid", None),
        (
            json.dumps({"session": {}, "model": MODEL, "extra": 1}).encode(),
            "request.invalid",
            ["extra"],
        ),
        (
            json.dumps({"session": small_session(), "model": 5}).encode(),
            "request.invalid",
            ["model"],
        ),
        (
            json.dumps({"session": small_session(), "model": MODEL, "step": {"step": 0}}).encode(),
            "request.invalid",
            ["step", "step"],
        ),
        (
            json.dumps(
                {"session": small_session(), "model": MODEL, "step": {"provider": "x"}}
            ).encode(),
            "request.invalid",
            ["step", "provider"],
        ),
        (
            json.dumps({"session": {**small_session(), "messages": "no"}, "model": MODEL}).encode(),
            "session.invalid",
            ["session", "messages"],
        ),
        (("[" * 5000 + "]" * 5000).encode(), "request.depth", None),
        (
            json.dumps(
                {
                    "session": small_session(),
                    "model": MODEL,
                    "step": {"options": {"a": [[[[]]]] * 1}},
                }
            )
            .replace("[[[[]]]]", "[" * 200 + "]" * 200)
            .encode(),
            "request.depth",
            None,
        ),
    ],
)
def test_bad_bodies_are_422_with_typed_located_diagnostics(
    live: Live, body: bytes, code: str, path: list[Any] | None
) -> None:
    with live.client() as http:
        r = http.post("/v1/build", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert error["code"] == code
    assert error["diagnostics"], error
    for d in error["diagnostics"]:
        assert d["location"]["file"] == "<request>" and d["location"]["line"] >= 1
    if path is not None:
        assert error["diagnostics"][0]["details"]["path"] == path


def test_a_duplicate_id_in_the_session_is_422(live: Live) -> None:
    session = small_session()
    session["messages"].append({**session["messages"][0]})
    with live.client() as http:
        r = http.post("/v1/build", json={"session": session, "model": MODEL})
    assert r.status_code == 422
    assert error_of(r)["code"] == "session.duplicate-id"


def test_an_unknown_model_is_404_with_did_you_mean(live: Live) -> None:
    with live.client() as http:
        r = http.post(
            "/v1/build", json={"session": small_session(), "model": "anthropic/claude-sonet-4-5"}
        )
    assert r.status_code == 404
    error = error_of(r)
    assert error["code"] == "model.unknown"
    assert "did you mean 'anthropic/claude-sonnet-4-5'" in error["message"]


def test_a_body_over_the_cap_is_413_before_parsing(policy_dir: Path, live_factory: Any) -> None:
    live = live_factory(PolicyStore.from_directory(policy_dir), max_body_bytes=2_000)
    big = json.dumps({"session": small_session("x" * 5_000), "model": MODEL}).encode()
    with live.client() as http:
        declared = http.post("/v1/build", content=big, headers={"content-type": "application/json"})

        def chunks() -> Any:  # no Content-Length: the count stops it
            for i in range(0, len(big), 500):
                yield big[i : i + 500]

        streamed = http.post(
            "/v1/build", content=chunks(), headers={"content-type": "application/json"}
        )
        small = http.post("/v1/build", json={"session": small_session(), "model": MODEL})
    for r in (declared, streamed):
        assert r.status_code == 413
        assert error_of(r)["code"] == "request.too-large"
    assert small.status_code == 200


def test_no_revision_loaded_is_503_and_not_ready(tmp_path: Path, live_factory: Any) -> None:
    root = tmp_path / "broken"
    root.mkdir()
    (root / "routes.yaml").write_text("version: 1\nroutes: []\ndefault: ./main.yaml\n")
    (root / "main.yaml").write_text("version: 1\nname: main\nbogus: 1\n")
    store = PolicyStore.from_directory(root)
    assert store.revision == ""
    live = live_factory(store)
    with live.client() as http:
        build = http.post("/v1/build", json={"session": small_session(), "model": MODEL})
        ready = http.get("/readyz")
        plan = http.get("/v1/plan", params={"model": MODEL})
        health = http.get("/healthz")
    assert build.status_code == 503 and error_of(build)["code"] == "store.not-ready"
    assert ready.status_code == 503 and error_of(ready)["code"] == "store.not-ready"
    assert plan.status_code == 503
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_a_build_over_the_time_bound_is_504(
    policy_dir: Path, live_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    store = PolicyStore.from_directory(policy_dir)
    release = threading.Event()
    original = store.apply

    def slow(*args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "apply", slow)
    live = live_factory(store, build_timeout=0.3)
    try:
        with live.client() as http:
            r = http.post("/v1/build", json={"session": small_session(), "model": MODEL})
    finally:
        release.set()
    assert r.status_code == 504
    assert error_of(r)["code"] == "build.timeout"


def test_a_workspace_outside_the_roots_is_refused(
    policy_dir: Path, live_factory: Any, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "AGENTS.md").write_text("Always run the linter.\n")
    live = live_factory(PolicyStore.from_directory(policy_dir), workspace_roots=(work,))
    inside = {"cwd": str(work / "sub")}
    outside = {"cwd": str(tmp_path)}
    with live.client() as http:
        ok = http.post(
            "/v1/build",
            json={"session": small_session(), "model": MODEL, "step": {"workspace": inside}},
        )
        refused = http.post(
            "/v1/build",
            json={"session": small_session(), "model": MODEL, "step": {"workspace": outside}},
        )
        relative = http.post(
            "/v1/build",
            json={"session": small_session(), "model": MODEL, "step": {"workspace": {"cwd": "x"}}},
        )
    assert ok.status_code == 200, ok.text
    assert "Always run the linter." in json.dumps(ok.json()["request"])
    for r in (refused, relative):
        assert r.status_code == 422
        error = error_of(r)
        assert error["code"] == "request.workspace"
        assert error["diagnostics"][0]["details"]["path"] == ["step", "workspace", "cwd"]


def test_unknown_paths_and_methods_are_typed_errors(live: Live) -> None:
    with live.client() as http:
        missing = http.get("/v2/nothing")
        method = http.get("/v1/build")
        query = http.get("/v1/plan")
    assert missing.status_code == 404 and error_of(missing)["code"] == "http.not-found"
    assert method.status_code == 405 and error_of(method)["code"] == "http.method-not-allowed"
    assert query.status_code == 422 and error_of(query)["code"] == "request.invalid"


@pytest.mark.parametrize(
    ("raised", "status", "code"),
    [
        ("eval", 500, "policy.apply-failed"),
        ("policy", 500, "policy.apply-failed"),
        ("session", 422, "session.invalid"),
    ],
)
def test_a_policy_failing_while_applied_is_5xx_a_bad_session_4xx(
    policy_dir: Path,
    live_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
    raised: str,
    status: int,
    code: str,
) -> None:
    from kilo_rules.engine.base.errors import (
        Diagnostic,
        EvalError,
        Location,
        PolicyError,
        SessionError,
    )
    from kilo_rules.engine.runtime import apply

    where = Location("main.yaml", 9, 5)
    error = {
        "eval": EvalError(Diagnostic("expr.eval", "division by zero", where)),
        "policy": PolicyError(Diagnostic("policy.invalid", "two caps contradict", where)),
        "session": SessionError(Diagnostic("session.invalid", "messages[0]: no parts")),
    }[raised]

    def fail(st: Any) -> None:
        raise error

    store = PolicyStore.from_directory(policy_dir)  # loaded (and canaried) by the real engine
    monkeypatch.setattr(apply, "STAGES", {**apply.STAGES, "system": fail})
    live = live_factory(store)
    with live.client() as http:
        r = http.post("/v1/build", json={"session": small_session(), "model": MODEL})
    assert r.status_code == status, r.text
    assert error_of(r)["code"] == code
