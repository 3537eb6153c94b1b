"""The bundled policies build the same bytes on the real sessions as when the snapshot was
recorded: a guard for restructurings that must not change behaviour.

For every recorded session, bundled policy and wire API, the request ``Plan.apply`` builds
at a few points of the session (after every fifth of its messages) is hashed; the hashes are
kept in ``snapshots/renders.json``. A change that is meant to change requests re-records
them with ``KILO_RULES_UPDATE_SNAPSHOT=1 pytest tests/runtime/test_render_snapshot.py`` and
says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace

from .test_trajectories import LOGS, MODELS

SNAPSHOT = Path(__file__).parent / "snapshots" / "renders.json"
POLICIES = ("kilo-default", "local-small", "cache-max")
CUTS = 5  # request points per session
# A workspace that exists nowhere: no instruction file of this machine (a global
# ~/.claude/CLAUDE.md, an AGENTS.md above the checkout) can reach the requests.
NOWHERE = "/nonexistent/kilo-rules-snapshot"
STEP = StepInput(workspace=Workspace(cwd=NOWHERE, root=NOWHERE, home=f"{NOWHERE}/home"))


@cache
def _session(path: Path) -> Session:
    return read_session(path, run=0)


def _prefixes(session: Session) -> list[Session]:
    n = len(session.messages)
    ends = sorted({max(1, n * k // CUTS) for k in range(1, CUTS + 1)})
    return [session.model_copy(update={"messages": session.messages[:end]}) for end in ends]


def _hashes(log: Path, policy: str) -> dict[str, str]:
    out: dict[str, str] = {}
    session = _session(log)
    for api, entry in MODELS.items():
        plan = compile_policy(policy, entry)
        for prefix in _prefixes(session):
            body = apply_plan(plan, prefix, STEP).body()
            key = f"{api}@{len(prefix.messages)}"
            out[key] = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_bundled_policies_build_the_recorded_bytes(log: Path, policy: str) -> None:
    if not log.exists():
        pytest.skip(f"{log} is not available (../shared is absent)")
    recorded = json.loads(SNAPSHOT.read_text(encoding="utf-8")) if SNAPSHOT.exists() else {}
    key = f"{log.name}:{policy}"
    got = _hashes(log, policy)
    if os.environ.get("KILO_RULES_UPDATE_SNAPSHOT"):
        recorded[key] = got
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", "utf-8")
        return
    assert key in recorded, f"no snapshot for {key}: record it (see the module docstring)"
    changed = sorted(k for k in got if recorded[key].get(k) != got[k])
    assert not changed, f"{key}: requests changed at {changed}"
