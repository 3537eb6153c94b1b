"""``/v1/check``, ``/v1/plan``, the probes, ``/metrics`` and the decision log."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from kilo_rules.tools.serving.sidecar.decisionlog import (
    MAX_LINE_BYTES,
    BuildRecord,
    DecisionLog,
    encode_line,
)
from kilo_rules.tools.serving.store import PolicyStore

from .conftest import MODEL, Live, policy_text, small_session, write_policy

JSON = {"content-type": "application/json"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition: (name, sorted labels) → value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_probes(live: Live) -> None:
    with live.client() as http:
        health = http.get("/healthz")
        ready = http.get("/readyz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "revision": live.store.revision}


def test_plan_of_a_model_under_the_current_revision(live: Live) -> None:
    with live.client() as http:
        r = http.get("/v1/plan", params={"model": MODEL})
        unknown = http.get("/v1/plan", params={"model": "openai/gpt5"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["revision"] == live.store.revision
    assert body["model"] == MODEL
    assert body["plan"] == json.loads(json.dumps(live.store.plan_for(MODEL).to_json()))
    assert unknown.status_code == 404
    assert "did you mean 'openai/gpt-5'" in unknown.json()["error"]["message"]


def test_check_reports_a_policy_text_located_in_policy_yaml(live: Live) -> None:
    bad = "version: 1\nname: p\nextends: kilo-default\nbudget:\n  usable: 'model.limits.contxt'\n"
    with live.client() as http:
        clean = http.post("/v1/check", json={"policy": policy_text("x")})
        wrong = http.post("/v1/check", json={"policy": bad})
        unknown_key = http.post("/v1/check", json={"policy": "version: 1\nname: p\nbogus: 1\n"})
    assert clean.status_code == 200 and clean.json()["ok"] is True, clean.text
    assert wrong.status_code == 200
    body = wrong.json()
    assert body["ok"] is False and body["errors"] >= 1
    first = body["diagnostics"][0]
    assert first["location"]["file"] == "policy.yaml" and first["location"]["line"] == 5
    assert "kilo-rules-check-" not in wrong.text  # no server path leaks
    assert unknown_key.json()["diagnostics"][0]["code"] == "schema.unknown-key"


def test_check_reports_routes_and_models(live: Live) -> None:
    routes = (
        "version: 1\nroutes:\n  - match: {family: claude}\n    policy: nope\n"
        "default: ./policy.yaml\n"
    )
    with live.client() as http:
        r = http.post(
            "/v1/check", json={"policy": policy_text("x"), "routes": routes, "models": [MODEL]}
        )
        unknown = http.post("/v1/check", json={"policy": policy_text("x"), "models": ["nope/x"]})
        empty = http.post("/v1/check", json={})
        extra = http.post("/v1/check", json={"policy": "x", "path": "/etc/passwd"})
    assert r.status_code == 200, r.text
    codes = {d["code"]: d for d in r.json()["diagnostics"]}
    assert codes["routes.unknown-policy"]["location"]["file"] == "routes.yaml"
    assert unknown.status_code == 404
    assert unknown.json()["error"]["diagnostics"][0]["details"]["path"] == ["models", 0]
    assert empty.status_code == 422
    assert extra.status_code == 422
    assert extra.json()["error"]["diagnostics"][0]["details"]["path"] == ["path"]


def test_metrics_count_builds_by_status_and_provider(live: Live) -> None:
    good = {"session": small_session(), "model": MODEL}
    with live.client() as http:
        for _ in range(3):
            assert http.post("/v1/build", json=good).status_code == 200
        assert http.post("/v1/build", json={**good, "step": {"provider": "openai"}}).is_success
        assert http.post("/v1/build", json={**good, "model": "x/y"}).status_code == 404
        assert http.post("/v1/build", content=b"{", headers=JSON).status_code == 422
        text = http.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    got = samples(text.text)
    builds = "kilo_rules_builds_total"
    assert got[(builds, (("provider", "anthropic"), ("status", "200")))] == 3
    assert got[(builds, (("provider", "openai"), ("status", "200")))] == 1
    assert got[(builds, (("provider", "none"), ("status", "404")))] == 1
    assert got[(builds, (("provider", "none"), ("status", "422")))] == 1
    assert got[("kilo_rules_build_seconds_count", ())] == 6
    assert got[("kilo_rules_revision_swaps_total", ())] == 0
    assert got[("kilo_rules_revisions_rejected_total", ())] == 0
    assert got[("kilo_rules_revision_info", (("revision", live.store.revision),))] == 1


def test_metrics_count_swaps_and_rejections_from_the_store(live: Live, policy_dir: Path) -> None:
    seen: list[Any] = []
    live.store.add_listener(seen.append)
    write_policy(policy_dir, "rev-B")
    assert live.store.reload().swapped
    (policy_dir / "main.yaml").write_text(policy_text("bad") + "bogus: 1\n")
    assert live.store.reload().rejected
    # The same bad files re-checked (a watched directory is, every poll_seconds) are the
    # rejection already counted; another bad edit is a new one.
    again = live.store.reload()
    assert again.rejected and again.repeated
    (policy_dir / "main.yaml").write_text(policy_text("bad") + "bogus: 2\n")
    other = live.store.reload()
    assert other.rejected and not other.repeated
    with live.client() as http:
        got = samples(http.get("/metrics").text)
    swaps = sum(r.swapped for r in seen)
    rejected = sum(r.rejected and not r.repeated for r in seen)
    assert (swaps, rejected) == (1, 2)
    assert live.store.stats().rejected == 2
    assert got[("kilo_rules_revision_swaps_total", ())] == swaps
    assert got[("kilo_rules_revisions_rejected_total", ())] == rejected
    assert got[("kilo_rules_revision_info", (("revision", live.store.revision),))] == 1


def test_each_app_has_its_own_registry(policy_dir: Path, live_factory: Any) -> None:
    one = live_factory(PolicyStore.from_directory(policy_dir))
    two = live_factory(PolicyStore.from_directory(policy_dir))
    with one.client() as a, two.client() as b:
        a.post("/v1/build", json={"session": small_session(), "model": MODEL})
        mine, other = samples(a.get("/metrics").text), samples(b.get("/metrics").text)
    key = ("kilo_rules_builds_total", (("provider", "anthropic"), ("status", "200")))
    assert mine[key] == 1 and key not in other


def test_the_decision_log_has_one_line_per_build(live: Live, tmp_path: Path) -> None:
    good = {"session": small_session(), "model": MODEL}
    with live.client() as http:
        ok = http.post("/v1/build", json=good).json()
        http.post("/v1/build", json={**good, "model": "x/y"})
    lines = (tmp_path / "decisions.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["revision"] == live.store.revision == ok["revision"]
    assert first["model"] == MODEL and first["provider"] == "anthropic"
    assert first["status"] == 200 and first["decisions"] == len(ok["decisions"])
    assert set(first["rules"]) == {d["rule"] for d in ok["decisions"]}
    assert first["duration_ms"] > 0 and first["time"].endswith("Z")
    assert second["status"] == 404 and second["error"] == "model.unknown"
    assert second["model"] == "x/y" and second["provider"] is None


@pytest.mark.slow
def test_decision_log_lines_are_bounded_and_whole_under_threads(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    huge = BuildRecord(
        "r", "m" * 10_000, "p", [f"rule-{i}" * 20 for i in range(2000)], 2000, 1.0, 200
    )
    assert len(encode_line(huge)) <= MAX_LINE_BYTES
    line = json.loads(encode_line(huge))
    assert line["rules_truncated"] is True and line["decisions"] == 2000
    assert len(line["model"]) == 256

    def write() -> None:
        for _ in range(50):
            log.write(huge)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (tmp_path / "d.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 400
    assert all(json.loads(x)["decisions"] == 2000 for x in lines)
