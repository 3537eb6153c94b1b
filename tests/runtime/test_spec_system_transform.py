"""Kilo's system transform hook and the collapse after it (spec §9.1).

Kilo (``session/llm/request.ts@0361076:84-94``) builds the system array — one string by
default — then lets plugins mutate it through ``experimental.chat.system.transform``.
Afterwards, if ``system.length > 2`` and ``system[0]`` is still the original header, the
array becomes ``[header, system.slice(1).join("\\n")]``; a changed header collapses
nothing. A policy names its transforms in ``system.transforms``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.base.plugins import (
    SYSTEM_TRANSFORMS_GROUP,
    SystemTransformContext,
    find_system_transform,
    register_system_transform,
    system_transform_names,
    unregister_system_transform,
)
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.runtime.apply import StepResult, apply_plan
from kilo_rules.engine.runtime.context import Agent, StepInput, Workspace
from kilo_rules.engine.runtime.system import kilo_collapse, transform_system

from .helpers import model, session, user

SOUL = (Path(__file__).resolve().parents[2] / "policies/prompts/soul.txt").read_text().strip()

CONTEXT = SystemTransformContext(
    model_id="test/model",
    provider="anthropic",
    family="claude",
    api_id="claude-test",
    agent="code",
    session_id="s",
    step=1,
)


# ------------------------------------------------------------------ Kilo's transforms


def push_a(system: list[str], _: SystemTransformContext) -> None:
    """A Kilo-style plugin: ``output.system.push("A")``."""
    system.append("A")


def push_b(system: list[str], _: SystemTransformContext) -> None:
    system.append("B")


def new_header(system: list[str], _: SystemTransformContext) -> None:
    """``output.system[0] = "NEW HEADER"``."""
    system[0] = "NEW HEADER"


def returns_a_new_list(system: list[str], _: SystemTransformContext) -> list[str]:
    return [*system, "R"]


def raises(system: list[str], _: SystemTransformContext) -> None:
    system.append("half-done")  # changed in place before failing: must not leak
    raise RuntimeError("plugin broke")


def returns_a_number(system: list[str], _: SystemTransformContext) -> Any:
    return 42


def pushes_blank(system: list[str], _: SystemTransformContext) -> None:
    system.extend(["  ", "C"])


TRANSFORMS = {
    "push-a": push_a,
    "push-b": push_b,
    "new-header": new_header,
    "returns-new-list": returns_a_new_list,
    "raises": raises,
    "returns-number": returns_a_number,
    "pushes-blank": pushes_blank,
}


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    for name, fn in TRANSFORMS.items():
        register_system_transform(name, fn)
    yield
    for name in TRANSFORMS:
        unregister_system_transform(name)


def _find(name: str) -> Any:
    return TRANSFORMS.get(name)


# ------------------------------------------------------------------ the rule, as Kilo writes it


def test_spec_9_1_no_plugin_one_block() -> None:
    # system = [header]; no plugin; length 1 → sent as is.
    system, decisions = transform_system(["HEADER"], [], CONTEXT, _find)
    assert kilo_collapse(system, "HEADER", "\n") == ["HEADER"]
    assert decisions == []


def test_spec_9_1_one_push_gives_two_blocks() -> None:
    # [header] → push("A") → [header, "A"]; length 2 is not > 2 → 2 blocks.
    system, _ = transform_system(["HEADER"], ["push-a"], CONTEXT, _find)
    assert system == ["HEADER", "A"]
    assert kilo_collapse(system, "HEADER", "\n") == ["HEADER", "A"]


def test_spec_9_1_two_pushes_collapse_to_two() -> None:
    # [header] → push("A"), push("B") → [header, "A", "B"]; length 3 > 2 and system[0] is
    # the header → [header, "A\nB"].
    system, _ = transform_system(["HEADER"], ["push-a", "push-b"], CONTEXT, _find)
    assert system == ["HEADER", "A", "B"]
    assert kilo_collapse(system, "HEADER", "\n") == ["HEADER", "A\nB"]


def test_spec_9_1_changed_header_is_not_collapsed() -> None:
    # [header] → system[0] = "NEW HEADER", push("A"), push("B") → 3 blocks, not collapsed.
    system, decisions = transform_system(
        ["HEADER"], ["new-header", "push-a", "push-b"], CONTEXT, _find
    )
    assert system == ["NEW HEADER", "A", "B"]
    assert kilo_collapse(system, "HEADER", "\n") == ["NEW HEADER", "A", "B"]
    assert [d["result"]["header"] for d in decisions] == ["changed", "kept", "kept"]


# ------------------------------------------------------------------ through a policy


def _policy(tmp_path: Path, transforms: list[str], extra: str = "") -> Path:
    names = ", ".join(transforms)
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\n"
        "name: with-transforms\n"
        "extends: kilo-default\n"
        "system:\n"
        f"  transforms: [{names}]\n" + extra
    )
    return path


def _apply(tmp_path: Path, policy: Path, step: StepInput | None = None) -> StepResult:
    ws = Workspace(cwd=str(tmp_path), root=str(tmp_path), home=str(tmp_path))
    plan = compile_policy(policy, model())
    return apply_plan(plan, session(user("u1", "hi")), step or StepInput(workspace=ws))


def _system(result: StepResult) -> list[str]:
    return [b["text"] for b in result.request["system"]]


def _decisions(result: StepResult, rule: str) -> list[Any]:
    return [d for d in result.decisions if d.stage == "system" and d.rule == rule]


def test_spec_9_1_policy_no_plugin_one_block(tmp_path: Path) -> None:
    texts = _system(_apply(tmp_path, _policy(tmp_path, [])))
    assert len(texts) == 1


def test_spec_9_1_policy_one_push_gives_two_blocks(tmp_path: Path) -> None:
    result = _apply(tmp_path, _policy(tmp_path, ["push-a"]))
    header, *rest = _system(result)
    assert rest == ["A"]
    assert header.startswith(SOUL)  # the untouched header: every layer, joined
    (transform,) = _decisions(result, "transform")
    assert transform.inputs == {"name": "push-a", "blocks": 1}
    assert transform.result["blocks"] == 2
    assert transform.result["header"] == "kept"
    assert transform.at is not None and transform.at.file == str(tmp_path / "policy.yaml")
    (collapse,) = _decisions(result, "collapse")
    assert collapse.inputs == {"rule": "kilo", "blocks": 2, "header": "kept"}
    assert collapse.result == {"blocks": 2}


def test_spec_9_1_policy_two_pushes_collapse_to_two(tmp_path: Path) -> None:
    result = _apply(tmp_path, _policy(tmp_path, ["push-a", "push-b"]))
    texts = _system(result)
    assert len(texts) == 2
    assert texts[1] == "A\nB"
    (collapse,) = _decisions(result, "collapse")
    assert collapse.inputs == {"rule": "kilo", "blocks": 3, "header": "kept"}
    assert collapse.result == {"blocks": 2}


def test_spec_9_1_policy_changed_header_is_not_collapsed(tmp_path: Path) -> None:
    result = _apply(tmp_path, _policy(tmp_path, ["new-header", "push-a", "push-b"]))
    assert _system(result) == ["NEW HEADER", "A", "B"]
    (collapse,) = _decisions(result, "collapse")
    assert collapse.inputs["header"] == "changed"
    assert collapse.result == {"blocks": 3}


def test_collapse_none_sends_every_block(tmp_path: Path) -> None:
    policy = _policy(tmp_path, ["push-a", "push-b"], "  collapse: none\n")
    texts = _system(_apply(tmp_path, policy))
    assert texts[1:] == ["A", "B"]


def test_a_transform_may_return_a_new_list(tmp_path: Path) -> None:
    texts = _system(_apply(tmp_path, _policy(tmp_path, ["returns-new-list"])))
    assert texts[1:] == ["R"]


def test_a_raising_transform_is_a_warning_and_leaves_the_system_as_it_was(
    tmp_path: Path,
) -> None:
    result = _apply(tmp_path, _policy(tmp_path, ["push-a", "raises", "push-b"]))
    # push-a's and push-b's entries are kept; the failing one's in-place change is not.
    assert _system(result)[1:] == ["A\nB"]
    failed = _decisions(result, "transform")[1]
    assert failed.severity == "warning"
    assert failed.inputs == {"name": "raises", "blocks": 2}
    assert "RuntimeError: plugin broke" in failed.result["warning"]
    assert "half-done" not in "".join(_system(result))


def test_a_transform_returning_no_list_is_a_warning(tmp_path: Path) -> None:
    result = _apply(tmp_path, _policy(tmp_path, ["returns-number"]))
    assert len(_system(result)) == 1
    (d,) = _decisions(result, "transform")
    assert d.severity == "warning"
    assert "gave int, not a list of strings" in d.result["warning"]


def test_blank_pushed_blocks_are_not_sent(tmp_path: Path) -> None:
    policy = _policy(tmp_path, ["pushes-blank"], "  collapse: none\n")
    result = _apply(tmp_path, policy)
    assert _system(result)[1:] == ["C"]
    (collapse,) = _decisions(result, "collapse")
    assert collapse.result == {"blocks": 2, "dropped_blank": 1}


def test_a_transform_gone_by_the_step_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    ws = Workspace(cwd=str(tmp_path), root=str(tmp_path), home=str(tmp_path))
    plan = compile_policy(_policy(tmp_path, ["push-a"]), model())
    unregister_system_transform("push-a")
    result = apply_plan(plan, session(user("u1", "hi")), StepInput(workspace=ws))
    assert len(_system(result)) == 1
    (d,) = _decisions(result, "transform")
    assert d.severity == "warning"
    assert "no system transform named 'push-a'" in d.result["warning"]


def test_the_transform_is_told_about_the_request(tmp_path: Path) -> None:
    seen: list[SystemTransformContext] = []
    register_system_transform("spy", lambda system, ctx: seen.append(ctx))
    try:
        ws = Workspace(cwd=str(tmp_path), root=str(tmp_path), home=str(tmp_path))
        step = StepInput(agent=Agent(name="plan"), workspace=ws, step=3)
        _apply(tmp_path, _policy(tmp_path, ["spy"]), step)
    finally:
        unregister_system_transform("spy")
    assert seen == [
        SystemTransformContext(
            model_id="test/model",
            provider="anthropic",
            family="claude",
            api_id="claude-test",
            agent="plan",
            session_id="s",
            step=3,
        )
    ]


def test_kilo_default_runs_no_transform_and_records_no_collapse(tmp_path: Path) -> None:
    ws = Workspace(cwd=str(tmp_path), root=str(tmp_path), home=str(tmp_path))
    plan = compile_policy("kilo-default", model())
    assert plan.settings.system.transforms == ()
    assert plan.settings.system.collapse == "kilo"
    result = apply_plan(plan, session(user("u1", "hi")), StepInput(workspace=ws))
    assert not _decisions(result, "transform")
    assert not _decisions(result, "collapse")


# ------------------------------------------------------------------ naming transforms


def test_an_unknown_transform_is_a_located_error_with_did_you_mean(tmp_path: Path) -> None:
    policy = _policy(tmp_path, ["push-a", "psh-b"])
    with pytest.raises(PolicyError) as err:
        compile_policy(policy, model())
    (d,) = [d for d in err.value.diagnostics if d.code == "policy.unknown-transform"]
    assert "'psh-b'" in d.message
    assert d.hint is not None and "did you mean 'push-b'?" in d.hint
    assert (d.location.file, d.location.line) == (str(policy), 5)
    assert d.location.col == len("  transforms: [push-a, ") + 1


def test_registering_after_a_failed_compile_lets_it_compile(tmp_path: Path) -> None:
    policy = _policy(tmp_path, ["late"])
    with pytest.raises(PolicyError):
        compile_policy(policy, model())
    register_system_transform("late", push_a)
    try:
        assert compile_policy(policy, model()).settings.system.transforms == ("late",)
    finally:
        unregister_system_transform("late")


def test_register_refuses_what_is_not_callable() -> None:
    with pytest.raises(TypeError):
        register_system_transform("x", "not a function")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        register_system_transform("", push_a)


# ------------------------------------------------------------------ entry points


def _install_plugin(site: Path, module: str, entries: dict[str, str], body: str) -> None:
    """A distribution installed the way pip leaves it: a module and its dist-info."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(body)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{SYSTEM_TRANSFORMS_GROUP}]\n{lines}")


def test_an_installed_entry_point_is_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _install_plugin(
        site,
        "kr_team_plugin",
        {"team-rules": "kr_team_plugin:push_rules", "broken": "kr_team_plugin:missing"},
        "def push_rules(system, context):\n"
        "    system.append(f'Team rules for {context.model_id}.')\n",
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "kr_team_plugin", raising=False)
    assert {"team-rules", "broken"} <= set(system_transform_names())
    assert callable(find_system_transform("team-rules"))

    result = _apply(tmp_path, _policy(tmp_path, ["team-rules", "broken"]))
    assert _system(result)[1:] == ["Team rules for test/model."]
    ok, broken = _decisions(result, "transform")
    assert ok.severity == "info"
    assert broken.severity == "warning"
    assert "kr_team_plugin:missing failed to load" in broken.result["warning"]


def test_a_registered_transform_wins_over_an_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _install_plugin(
        site,
        "kr_shadowed_plugin",
        {"push-a": "kr_shadowed_plugin:other"},
        "def other(system, context):\n    system.append('from the plugin')\n",
    )
    monkeypatch.syspath_prepend(str(site))
    assert find_system_transform("push-a") is push_a
    unregister_system_transform("push-a")
    plugin = find_system_transform("push-a")
    assert plugin is not None and plugin.__module__ == "kr_shadowed_plugin"
    monkeypatch.delitem(sys.modules, "kr_shadowed_plugin", raising=False)


def test_the_plan_shows_the_transforms_and_the_collapse(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "version: 1\nname: p\nextends: kilo-default\nsystem:\n  transforms: [push-a, push-b]\n"
    )
    plan = compile_policy(p, model())
    assert "system transforms: push-a, push-b (then collapse kilo)" in str(plan)
    assert plan.to_json()["system"] == {"transforms": ["push-a", "push-b"], "collapse": "kilo"}
    bare = compile_policy("kilo-default", model())
    assert "system transforms: none (then collapse kilo)" in str(bare)
