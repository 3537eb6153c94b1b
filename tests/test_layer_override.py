"""Changing an inherited system layer by its id: the fields given are merged onto the
inherited layer, so an override need not restate its ``source``."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import Diagnostic, PolicyError
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.frontend.resolve import resolve_policy
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.tools.checking.check import check_paths

from .runtime.helpers import model, session, user

SOUL = (Path(__file__).resolve().parents[1] / "policies/prompts/soul.txt").read_text().strip()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _child(tmp_path: Path, layers: str, extends: str = "kilo-default") -> Path:
    return _write(
        tmp_path / "child.yaml",
        f"version: 1\nname: child\nextends: {extends}\nsystem:\n  layers:\n{layers}",
    )


def _errors(policy: Path) -> list[Diagnostic]:
    with pytest.raises(PolicyError) as err:
        compile_policy(policy, model())
    return err.value.diagnostics


def test_a_layer_is_switched_off_by_id_alone(tmp_path: Path) -> None:
    policy = _child(tmp_path, "    - {id: soul, when: false}\n")
    merged = resolve_policy(policy).data["system"]["layers"]
    assert merged[0] == {"id": "soul", "source": "soul", "when": False}
    plan = compile_policy(policy, model())
    assert [layer.id for layer in plan.layers] == [
        "agent",
        "family",
        "environment",
        "instructions",
        "skills",
        "user",
    ]
    ws = Workspace(cwd=str(tmp_path), root=str(tmp_path), home=str(tmp_path))
    result = apply_plan(plan, session(user("u1", "hi")), StepInput(workspace=ws))
    (text,) = [b["text"] for b in result.request["system"]]
    assert SOUL not in text
    assert check_paths([str(policy)]).diagnostics == []


def test_fields_merge_one_by_one_onto_the_inherited_layer(tmp_path: Path) -> None:
    _write(
        tmp_path / "base.yaml",
        "version: 1\nname: base\nsystem:\n  layers:\n"
        "    - {id: note, source: text, text: from the base, when: 'agent.name == \"code\"'}\n",
    )
    policy = _child(tmp_path, "    - {id: note, text: from the child}\n", "./base.yaml")
    (layer,) = resolve_policy(policy).data["system"]["layers"]
    assert layer == {
        "id": "note",
        "source": "text",
        "text": "from the child",
        "when": 'agent.name == "code"',
    }
    (planned,) = compile_policy(policy, model()).layers
    assert (planned.source, planned.text) == ("text", "from the child")
    assert planned.condition is not None  # the inherited condition, still decided per step


def test_a_complete_new_layer_is_appended(tmp_path: Path) -> None:
    policy = _child(tmp_path, "    - {id: team, source: text, text: Team rules.}\n")
    plan = compile_policy(policy, model())
    assert plan.layers[-1].id == "team"
    assert plan.layers[-1].text == "Team rules."


def test_an_id_that_matches_no_inherited_layer_needs_a_source(tmp_path: Path) -> None:
    policy = _child(tmp_path, "    - {id: sould, when: false}\n")
    (d,) = [d for d in _errors(policy) if d.code == "policy.unknown-layer"]
    assert d.message == "layer 'sould' has no source and matches no inherited layer"
    assert (d.location.file, d.location.line, d.location.col) == (str(policy), 6, 7)
    assert d.hint is not None and d.hint.startswith("did you mean 'soul'?")
    (reported,) = check_paths([str(policy)]).diagnostics
    assert reported.code == "policy.unknown-layer"


def test_a_policy_without_extends_needs_a_source_on_every_layer(tmp_path: Path) -> None:
    policy = _write(
        tmp_path / "alone.yaml",
        "version: 1\nname: alone\nsystem:\n  layers:\n    - {id: soul}\n",
    )
    (d,) = _errors(policy)
    assert (d.code, d.message) == ("policy.unknown-layer", "layer 'soul' has no source")
    assert d.location.line == 5


def test_an_override_layer_needs_a_source(tmp_path: Path) -> None:
    policy = _write(
        tmp_path / "ov.yaml",
        "version: 1\nname: ov\nextends: kilo-default\noverrides:\n"
        "  - when: true\n    set:\n      system:\n        layers:\n"
        "          - {id: soul, when: false}\n",
    )
    (d,) = [d for d in _errors(policy) if d.code == "policy.unknown-layer"]
    assert d.message == "layer 'soul' of an override has no source"
    assert d.location.line == 9
