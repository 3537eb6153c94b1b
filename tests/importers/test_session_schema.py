"""Every imported log validates against the published ``schemas/session.v1.json``."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from kilo_rules.engine.formats.session import dump_session
from kilo_rules.engine.importers import import_file

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "trajectories"
SCHEMA = json.loads((ROOT / "schemas" / "session.v1.json").read_text(encoding="utf-8"))
LOGS = [
    ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl",
    ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj",
    SHARED / "claude-code-opus46-spotter-8463c716.jsonl",
    SHARED / "openhands-llama4-multiswebench-output.jsonl",
    SHARED / "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json",
    SHARED / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json",
]


@pytest.mark.slow
@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_imported_session_validates_against_the_json_schema(log: Path) -> None:
    if not log.exists():
        pytest.skip(f"{log} is not available (../shared is absent)")
    runs = 3 if "openhands" in log.name else 1
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for run in range(runs):
        data = json.loads(dump_session(import_file(log, run=run)))
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
