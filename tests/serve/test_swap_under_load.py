"""The acceptance test of hot reload: revisions swapped under load, none torn, none bad.

Eight client threads build requests against a real server while the policy directory is
rewritten 1,000 times, alternating two valid revisions (their system layer text and
compaction tail differ) with invalid ones (schema errors), the store reloading after each
rewrite. Every request must succeed, every response must carry what the revision it names
holds (no step mixes two revisions), no invalid revision may ever be served, and the
sidecar's metrics must count the swaps and rejections the store reported.

The policies here are standalone (no ``extends:``), so that a reload costs a few
milliseconds and the thousand of them fit in well under a minute.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.tools.serving.store import PolicyStore, ReloadResult

from .conftest import MODEL, ROUTES, Live, small_session
from .test_endpoints import samples

REWRITES = 1000
CLIENTS = 8
MARKER = re.compile(r"swap-[AB]")


def standalone(marker: str, tail_turns: int, extra: str = "") -> str:
    """A policy with every default but a marker layer and the compaction tail."""
    return (
        "version: 1\n"
        "name: main\n"
        "compaction:\n"
        f"  tail_turns: {tail_turns}\n"
        "system:\n"
        "  layers:\n"
        "    - id: marker\n"
        "      source: text\n"
        f"      text: {marker}\n" + extra
    )


TAIL = {"swap-A": 2, "swap-B": 3}
VALID = {marker: standalone(marker, tail) for marker, tail in TAIL.items()}
INVALID = (
    standalone("swap-bad", 2, "bogus: 1\n"),  # an unknown key
    standalone("swap-bad", 2).replace("tail_turns: 2", "tail_turns: [2]"),  # a wrong type
)


def rewrite(root: Path, text: str) -> None:
    (root / "main.yaml").write_text(text, encoding="utf-8")


@pytest.mark.slow
def test_a_thousand_swaps_under_load(tmp_path: Path, live_factory: Any) -> None:
    root = tmp_path / "policies"
    root.mkdir()
    (root / "routes.yaml").write_text(ROUTES, encoding="utf-8")
    rewrite(root, VALID["swap-A"])
    store = PolicyStore.from_directory(root)
    expected: dict[str, str] = {store.revision: "swap-A"}  # revision -> marker it serves
    rejected: set[str] = set()
    heard: list[ReloadResult] = []
    store.add_listener(heard.append)
    live: Live = live_factory(store)

    stop = threading.Event()
    lock = threading.Lock()
    builds: list[tuple[int, str, list[str]]] = []  # status, revision, markers in the request
    plans: list[tuple[str, int]] = []  # revision, the plan's compaction.tail_turns
    failures: list[str] = []
    body = json.dumps({"session": small_session(), "model": MODEL})

    def client() -> None:
        mine: list[tuple[int, str, list[str]]] = []
        my_plans: list[tuple[str, int]] = []
        try:
            with live.client(timeout=30.0) as http:
                n = 0
                while not stop.is_set():
                    n += 1
                    if n % 8 == 0:
                        p = http.get("/v1/plan", params={"model": MODEL})
                        if p.status_code != 200:
                            mine.append((p.status_code, "", [p.text[:300]]))
                            continue
                        plan = p.json()
                        tail = plan["plan"]["values"]["compaction.tail_turns"]["value"]
                        my_plans.append((plan["revision"], tail))
                        continue
                    r = http.post(
                        "/v1/build", content=body, headers={"content-type": "application/json"}
                    )
                    if r.status_code != 200:
                        mine.append((r.status_code, "", [r.text[:300]]))
                        continue
                    got = r.json()
                    system = json.dumps(got["request"]["system"])
                    mine.append((200, got["revision"], MARKER.findall(system)))
        except Exception as exc:  # a transport error is a failed request too
            with lock:
                failures.append(repr(exc))
        with lock:
            builds.extend(mine)
            plans.extend(my_plans)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    swaps = rejections = 0
    try:
        for i in range(REWRITES):
            if i % 2 == 0:
                marker = "swap-B" if i % 4 == 0 else "swap-A"
                rewrite(root, VALID[marker])
                result = store.reload()
                assert result.swapped, result.reason
                expected[result.revision] = marker
                swaps += 1
            else:
                rewrite(root, INVALID[(i // 2) % 2])
                result = store.reload()
                assert result.rejected and result.candidate, result.reason
                rejected.add(result.candidate)
                rejections += 1
            time.sleep(0.001)  # let the clients in between reloads
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    elapsed = time.monotonic() - started

    assert not failures, failures[:5]
    bad_status = [b for b in builds if b[0] != 200]
    assert not bad_status, bad_status[:5]
    assert len(builds) >= 500, f"only {len(builds)} builds in {elapsed:.0f} s"
    served = {rev for _, rev, _ in builds}
    assert served <= set(expected), served - set(expected)
    assert not served & rejected, "an invalid revision was served"
    assert len(served) == 2, "both valid revisions were served under load"
    torn = [(rev, seen) for _, rev, seen in builds if seen != [expected[rev]]]
    assert not torn, torn[:5]
    assert plans
    torn_plans = [(rev, tail) for rev, tail in plans if tail != TAIL[expected[rev]]]
    assert not torn_plans, torn_plans[:5]

    assert sum(r.swapped for r in heard) == swaps == REWRITES // 2
    assert sum(r.rejected for r in heard) == rejections == REWRITES // 2
    with live.client() as http:
        metrics = samples(http.get("/metrics").text)
    assert metrics[("kilo_rules_revision_swaps_total", ())] == swaps
    assert metrics[("kilo_rules_revisions_rejected_total", ())] == rejections
    counted = sum(v for (name, _), v in metrics.items() if name == "kilo_rules_builds_total")
    assert counted == len(builds)  # every build answered was counted
