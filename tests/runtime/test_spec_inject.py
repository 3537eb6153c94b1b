"""Per-step injection (spec §8 steps 3-4, 8) and on-demand instructions."""

from __future__ import annotations

from pathlib import Path

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import ToolPart
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import Agent, StepInput, Workspace

from .helpers import assistant, model, session, text, tool, user


def _texts(message: dict) -> list[str]:
    return [
        b["text"] for b in message["content"] if isinstance(b, dict) and b.get("type") == "text"
    ]


def test_plan_mode_reminder_on_the_last_user_message(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    s = session(user("u1", "first"), assistant("a1", text("t", "ok")), user("u2", "plan it"))
    result = apply_plan(
        plan, s, StepInput(agent=Agent(name="plan"), workspace=Workspace(cwd=str(tmp_path)))
    )
    last = result.request["messages"][-1]
    texts = _texts(last)
    assert texts[0] == "plan it"
    assert texts[1].startswith("You are in plan mode")
    assert texts[2].startswith("<environment_details>")  # the environment block stays last
    assert not any("plan mode" in t for t in _texts(result.request["messages"][0]))


def test_build_switch_reminder_after_plan_mode(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    s = session(user("u1", "go"))
    step = StepInput(
        agent=Agent(name="code"), previous_agent="plan", workspace=Workspace(cwd=str(tmp_path))
    )
    texts = _texts(apply_plan(plan, s, step).request["messages"][-1])
    assert any(t.startswith("You are now in build mode") for t in texts)
    plain = _texts(
        apply_plan(plan, s, StepInput(workspace=Workspace(cwd=str(tmp_path)))).request["messages"][
            -1
        ]
    )
    assert not any("build mode" in t for t in plain)


def test_max_steps_prompt_on_the_last_allowed_step(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    s = session(user("u1", "go"), assistant("a1", tool("t1"), finish="tool-calls"))
    ws = Workspace(cwd=str(tmp_path))
    last = apply_plan(plan, s, StepInput(step=5, max_steps=5, workspace=ws)).request["messages"][-1]
    assert last["role"] == "assistant"
    assert last["content"][-1]["text"].startswith("The maximum number of steps")
    before = apply_plan(plan, s, StepInput(step=4, max_steps=5, workspace=ws)).request["messages"][
        -1
    ]
    assert "maximum number of steps" not in str(before)


def test_interjection_wraps_a_message_sent_mid_tool_loop(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "version: 1\nname: p\nextends: kilo-default\n"
        "reminders:\n  interjection: '<user-interjection>{message}</user-interjection>'\n",
        encoding="utf-8",
    )
    plan = compile_policy(p, model())
    s = session(
        user("u1", "fix the bug"),
        assistant("a1", tool("t1"), finish="tool-calls"),
        user("u2", "also add a test"),
    )
    result = apply_plan(plan, s, StepInput(workspace=Workspace(cwd=str(tmp_path))))
    texts = _texts(result.request["messages"][-1])
    assert texts[0] == "<user-interjection>also add a test</user-interjection>"
    assert _texts(result.request["messages"][0])[0] == "fix the bug"
    kilo = apply_plan(
        compile_policy("kilo-default", model()),
        s,
        StepInput(workspace=Workspace(cwd=str(tmp_path))),
    )
    assert _texts(kilo.request["messages"][-1])[0] == "also add a test"


def test_on_demand_instructions_once_per_assistant_message(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "AGENTS.md").write_text("root rules")
    (repo / "pkg" / "AGENTS.md").write_text("pkg rules")
    (repo / "pkg" / "a.py").write_text("a")
    (repo / "pkg" / "b.py").write_text("b")

    def read(pid: str, path: str) -> ToolPart:
        return ToolPart(
            id=pid, call_id=f"c{pid}", tool="read", input={"filePath": path}, output="x"
        )

    s = session(
        user("u1", "look"),
        assistant("a1", read("1", "pkg/a.py"), read("2", "pkg/b.py"), finish="tool-calls"),
        assistant("a2", read("3", "pkg/a.py"), finish="tool-calls"),
    )
    plan = compile_policy("kilo-default", model())
    result = apply_plan(plan, s, StepInput(workspace=Workspace(cwd=str(repo), root=str(repo))))
    body = str(result.request)
    # the root AGENTS.md is in the system prompt, so only pkg/AGENTS.md is attached:
    # once for a1 (not again for its second read) and once for a2
    assert body.count("Instructions from: " + str((repo / "pkg" / "AGENTS.md").resolve())) == 2
    assert "root rules" in result.request["system"][0]["text"]
    rules = [d for d in result.decisions if d.rule == "on_demand"]
    assert len(rules) == 2
