"""kilo-default reproduces Kilo's system prompt (§9): assembly, family ladder, skills,
instruction discovery."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kilo_rules.engine.base.net import NetworkSettings, use_network
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.policy import Instructions
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import Agent, Skill, StepInput, Workspace
from kilo_rules.engine.runtime.system import assemble, instruction_files, instructions_text

from .helpers import model, session, user

PROMPTS = Path(__file__).resolve().parents[2] / "policies" / "prompts"


def _system_texts(result_request: dict) -> list[str]:
    return [b["text"] for b in result_request["system"]]


@pytest.mark.parametrize(
    ("api_id", "provider", "prompt_meta", "want"),
    [
        ("gpt-4o", "openai", None, "beast.txt"),
        ("o1-preview", "openai", None, "beast.txt"),
        ("o3-mini", "openai", None, "beast.txt"),
        ("gpt-5-codex", "openai", None, "codex.txt"),
        ("gpt-5", "openai", None, "gpt.txt"),
        ("gpt-5-ling", "openai", None, "gpt.txt"),  # `gpt` is checked before isLing
        ("gemini-2.5-pro", "google", None, "gemini.txt"),
        ("claude-sonnet-4-5", "anthropic", None, "anthropic.txt"),
        ("arcee-ai/Trinity-Large", "openrouter", None, "trinity.txt"),
        ("moonshotai/Kimi-K2", "openrouter", None, "kimi.txt"),
        ("k3", "moonshotai", None, "kimi.txt"),  # by provider id (system.test.ts@c9861e9)
        ("inclusionai/ling-1t", "openrouter", None, "ling.txt"),
        ("some-multilingual-model", "openrouter", None, "default.txt"),
        ("kling-v1", "openrouter", None, "default.txt"),
        ("deepseek-chat", "deepseek", None, "default.txt"),
        ("meta/muse-spark", "openrouter", None, "meta.txt"),
        ("claude-sonnet-4-5", "anthropic", "anthropic_without_todo", "default.txt"),
        ("anything", "openrouter", "codex", "codex.txt"),
        ("anything", "openrouter", "gpt55", "gpt-5.5.txt"),
    ],
)
def test_spec_9_2_family_prompt_ladder(
    api_id: str, provider: str, prompt_meta: str | None, want: str
) -> None:
    m = model(api_id=api_id, provider=provider, prompt=prompt_meta, api="openai-compatible")
    plan = compile_policy("kilo-default", m)
    assert plan.prompt is not None
    assert Path(plan.prompt.file).name == want


def test_spec_9_2_muse_model_name_is_filled_in() -> None:
    glimmer = compile_policy("kilo-default", model(api_id="meta/muse-glimmer-1", api="openai"))
    spark = compile_policy("kilo-default", model(api_id="meta/muse-2", api="openai"))
    assert glimmer.prompt and "Muse Glimmer" in glimmer.prompt.text
    assert spark.prompt and "Muse Spark" in spark.prompt.text
    assert "{{MODEL_NAME}}" not in spark.prompt.text


def test_spec_9_1_one_system_block_by_default(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    result = apply_plan(
        plan, session(user("u1", "hi")), StepInput(workspace=Workspace(cwd=str(tmp_path)))
    )
    texts = _system_texts(result.request)
    assert len(texts) == 1
    soul = (PROMPTS / "soul.txt").read_text().strip()
    family = (PROMPTS / "anthropic.txt").read_text().strip()
    assert texts[0].startswith(soul + "\n" + family + "\n")
    assert f"Working directory: {tmp_path}" in texts[0]


def test_spec_9_1_agent_prompt_replaces_family_prompt(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    step = StepInput(
        agent=Agent(prompt="You review code only."), workspace=Workspace(cwd=str(tmp_path))
    )
    text = _system_texts(apply_plan(plan, session(user("u1", "hi")), step).request)[0]
    assert "You review code only." in text
    assert (PROMPTS / "anthropic.txt").read_text().strip() not in text


def test_spec_9_1_user_system_override_is_appended_last(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    s = session(user("u1", "hi", system="Answer in French."))
    text = _system_texts(
        apply_plan(plan, s, StepInput(workspace=Workspace(cwd=str(tmp_path)))).request
    )[0]
    assert text.endswith("Answer in French.")


def test_spec_9_1_collapse_header_rest() -> None:
    texts = [("a", "A"), ("b", ""), ("c", "C"), ("d", "D")]
    assert assemble(texts, blocks=1, collapse="header-rest", separator="\n") == ["A\nC\nD"]
    assert assemble(texts, blocks=2, collapse="header-rest", separator="\n") == ["A", "C\nD"]
    assert assemble(texts, blocks=2, collapse="join", separator="\n") == ["A\nC\nD"]
    assert assemble([("a", " ")], blocks=1, collapse="join", separator="\n") == []


def test_spec_9_3_skills_sorted_stable_and_described_only(tmp_path: Path) -> None:
    plan = compile_policy("kilo-default", model())
    skills = (Skill("zeta", "last"), Skill("alpha", "first"), Skill("nodesc", None))
    step = StepInput(agent=Agent(skills=skills), workspace=Workspace(cwd=str(tmp_path)))
    text = _system_texts(apply_plan(plan, session(user("u1", "hi")), step).request)[0]
    assert text.index("- alpha: first") < text.index("- zeta: last")
    assert "nodesc" not in text
    off = StepInput(
        agent=Agent(skills=skills, skills_enabled=False), workspace=Workspace(cwd=str(tmp_path))
    )
    assert "alpha" not in _system_texts(apply_plan(plan, session(user("u1", "hi")), off).request)[0]


def test_instruction_find_up_first_name_wins_without_stacking(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    deep = root / "pkg" / "sub"
    deep.mkdir(parents=True)
    (root / "AGENTS.md").write_text("root agents")
    (root / "pkg" / "AGENTS.md").write_text("pkg agents")
    (deep / "CLAUDE.md").write_text("claude file")
    home = tmp_path / "home"
    (home / ".config" / "kilo").mkdir(parents=True)
    (home / ".config" / "kilo" / "AGENTS.md").write_text("global")
    settings = Instructions(
        global_files=("~/.config/kilo/AGENTS.md", "~/.claude/CLAUDE.md"),
        project_files=("AGENTS.md", "CLAUDE.md"),
    )
    ws = Workspace(cwd=str(deep), root=str(root), home=str(home))
    files = instruction_files(settings, ws)
    # global first-found, then the nearest AGENTS.md (first name wins over a nearer CLAUDE.md)
    assert files == [
        (home / ".config/kilo/AGENTS.md").resolve(),
        (root / "pkg/AGENTS.md").resolve(),
    ]


def test_instruction_find_up_stops_at_the_workspace_root(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("outside")
    root = tmp_path / "repo"
    root.mkdir()
    settings = Instructions(project_files=("AGENTS.md",))
    assert instruction_files(settings, Workspace(cwd=str(root), root=str(root))) == []


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/rules.md":
            body = b"Use tabs."
            self.send_response(200)
        elif self.path == "/big.md":
            body = b"x" * 5000
            self.send_response(200)
        else:
            body = b"nope"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_instruction_urls_fetched_and_failures_become_warnings(server: str, tmp_path: Path) -> None:
    settings = Instructions(
        urls=(f"{server}/rules.md", f"{server}/missing.md", f"{server}/big.md"),
        url_timeout_seconds=5.0,
        url_max_bytes=1000,
    )
    # The operator allows the local server's loopback address (refused by default).
    with use_network(NetworkSettings(private_hosts=("127.0.0.1",))):
        text, loaded, decisions = instructions_text(
            settings, StepInput(workspace=Workspace(cwd=str(tmp_path)))
        )
    assert loaded == [f"{server}/rules.md"]
    assert text == f"Instructions from: {server}/rules.md\nUse tabs."
    warnings = [d for d in decisions if "warning" in d]
    assert len(warnings) == 2
    assert "404" in warnings[0]["warning"]
    assert "larger than 1000 bytes" in warnings[1]["warning"]
    assert [w["code"] for w in warnings] == ["net.status", "net.too-large"]
