"""Files a policy names are read only inside allowed roots, only when regular and within the
size cap; ``check`` and ``compile`` report the same located diagnostics for them."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import Diagnostic, PolicyError
from kilo_rules.engine.base.sandbox import allow_read, operator_roots
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.policy import Instructions
from kilo_rules.engine.frontend.checks import MAX_FILE_BYTES
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.system import discover_instruction_files, instruction_files
from kilo_rules.tools.checking.check import check_paths
from kilo_rules.tools.cli import main

from .runtime.helpers import session, user

MODEL = "anthropic/claude-sonnet-4-5"
HEAD = "version: 1\nname: t\nextends: kilo-default\n"

#: Every policy field that names a file: (label, YAML after HEAD with {v} for the value).
FIELDS = {
    "prompts.default": "prompts:\n  default: {v}\n  rules: []\n",
    "prompts.rules.prompt": "prompts:\n  rules:\n    - when: 'true'\n      prompt: {v}\n",
    "prompts.soul": "prompts:\n  soul: {v}\n",
    "layer path": "system:\n  layers:\n    - id: house\n      source: file\n      path: {v}\n",
    "soul layer path": "system:\n  layers:\n    - id: soul\n      source: soul\n      path: {v}\n",
    "compaction.summary.template": "compaction:\n  summary:\n    template: {v}\n",
}


def _policy(where: Path, field: str, value: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    p = where / "policy.yaml"
    p.write_text(HEAD + FIELDS[field].format(v=value), encoding="utf-8")
    return p


def _value_line(policy: Path, value: str) -> int:
    lines = policy.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(value))


def _errors(policy: Path) -> list[Diagnostic]:
    return [d for d in check_paths([str(policy)]).diagnostics if d.severity == "error"]


def _compile_errors(policy: Path) -> list[Diagnostic]:
    with pytest.raises(PolicyError) as info:
        compile_policy(str(policy), MODEL)
    return info.value.diagnostics


def _same(a: list[Diagnostic], b: list[Diagnostic]) -> None:
    def key(d: Diagnostic) -> tuple[str, str, str]:
        return (d.code, str(d.location), d.message)

    assert sorted(map(key, a)) == sorted(map(key, b))


def _refused(policy: Path, value: str, code: str) -> Diagnostic:
    """``check`` and compile both refuse ``policy`` with one ``code`` diagnostic, located
    at the YAML value that names the file, with the same diagnostics."""
    errors = _errors(policy)
    assert [d.code for d in errors] == [code], errors
    d = errors[0]
    assert Path(d.location.file) == policy
    assert d.location.line == _value_line(policy, value)
    _same(errors, _compile_errors(policy))
    return d


@pytest.mark.parametrize("field", FIELDS)
def test_proc_self_environ_is_refused_in_every_file_field(tmp_path: Path, field: str) -> None:
    policy = _policy(tmp_path / "pol", field, "/proc/self/environ")
    d = _refused(policy, "/proc/self/environ", "policy.file-outside-roots")
    assert "--allow-read" in (d.hint or "")


def test_build_never_puts_the_environment_into_the_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, "prompts.default", "/proc/self/environ")
    log = Path(__file__).parent.parent / "examples/sessions"
    sessions = sorted(log.glob("*.jsonl"))
    if not sessions:
        pytest.skip("no recorded session in this checkout")
    argv = ["build", "--policy", str(policy), "--model", MODEL, "--session", str(sessions[0])]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "policy.file-outside-roots" in captured.err
    assert "PATH=" not in captured.out


@pytest.mark.parametrize("field", ["prompts.default", "layer path", "compaction.summary.template"])
def test_absolute_path_outside_the_policy_tree(tmp_path: Path, field: str) -> None:
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("secret", encoding="utf-8")
    policy = _policy(tmp_path / "pol", field, str(secret))
    _refused(policy, str(secret), "policy.file-outside-roots")


def test_dot_dot_out_of_the_policy_tree(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret", encoding="utf-8")
    policy = _policy(tmp_path / "pol", "prompts.default", "../secret.txt")
    _refused(policy, "../secret.txt", "policy.file-outside-roots")


def test_dot_dot_that_stays_inside_is_fine(tmp_path: Path) -> None:
    (tmp_path / "pol" / "prompts").mkdir(parents=True)
    (tmp_path / "pol" / "prompts" / "p.txt").write_text("inside", encoding="utf-8")
    policy = _policy(tmp_path / "pol", "prompts.default", "prompts/../prompts/p.txt")
    assert _errors(policy) == []
    plan = compile_policy(str(policy), MODEL)
    assert plan.prompt is not None and plan.prompt.text == "inside"


def test_symlink_escaping_the_root_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("secret", encoding="utf-8")
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "link.txt").symlink_to(secret)
    policy = _policy(tmp_path / "pol", "prompts.default", "link.txt")
    d = _refused(policy, "link.txt", "policy.file-outside-roots")
    assert "symlink" in d.message
    assert d.details["resolved"] == str(secret.resolve())


def test_symlink_inside_the_root_is_followed(tmp_path: Path) -> None:
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "real.txt").write_text("real", encoding="utf-8")
    (tmp_path / "pol" / "link.txt").symlink_to(tmp_path / "pol" / "real.txt")
    policy = _policy(tmp_path / "pol", "prompts.default", "link.txt")
    plan = compile_policy(str(policy), MODEL)
    assert plan.prompt is not None and plan.prompt.text == "real"


def _promptly(fn: Callable[[], object], seconds: float = 10.0) -> object:
    """``fn()``'s result, failing (not hanging) when it does not return in time."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "blocked on the file instead of refusing it"
    return box[0]


def test_a_fifo_is_refused_promptly(tmp_path: Path) -> None:
    (tmp_path / "pol").mkdir()
    os.mkfifo(tmp_path / "pol" / "fifo.txt")
    policy = _policy(tmp_path / "pol", "prompts.default", "fifo.txt")
    report = _promptly(lambda: check_paths([str(policy)]))
    assert [d.code for d in report.errors] == ["policy.not-a-regular-file"]  # type: ignore[attr-defined]
    assert "FIFO" in report.errors[0].message  # type: ignore[attr-defined]
    raised = _promptly(lambda: compile_policy(str(policy), MODEL))
    assert isinstance(raised, PolicyError)
    assert raised.diagnostic.code == "policy.not-a-regular-file"


def test_an_extended_fifo_is_refused_promptly(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "base.yaml")
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nname: t\nextends: ./base.yaml\n", encoding="utf-8")
    report = _promptly(lambda: check_paths([str(policy)]))
    codes = [d.code for d in report.errors]  # type: ignore[attr-defined]
    assert codes == ["policy.not-a-regular-file"]


def test_dev_zero_is_refused_even_when_dev_is_allowed(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "prompts.default", "/dev/zero")
    _refused(policy, "/dev/zero", "policy.file-outside-roots")
    with allow_read(["/dev"]):
        errors = _errors(policy)
        assert [d.code for d in errors] == ["policy.not-a-regular-file"]
        assert "a device" in errors[0].message
        _same(errors, _compile_errors(policy))


def test_a_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    policy = _policy(tmp_path, "prompts.default", "big.txt")
    d = _refused(policy, "big.txt", "policy.file-too-large")
    assert d.details == {"bytes": MAX_FILE_BYTES + 1, "limit": MAX_FILE_BYTES}
    (tmp_path / "big.txt").write_bytes(b"x" * MAX_FILE_BYTES)
    assert _errors(policy) == []
    plan = compile_policy(str(policy), MODEL)
    assert plan.prompt is not None and len(plan.prompt.text) == MAX_FILE_BYTES


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pol" / "prompts").mkdir(parents=True)
    policy = _policy(tmp_path / "pol", "prompts.default", "prompts")
    _refused(policy, "prompts", "policy.not-a-regular-file")


def test_extends_outside_the_tree(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("version: 1\nname: base\n", encoding="utf-8")
    policy = tmp_path / "pol" / "policy.yaml"
    policy.parent.mkdir()
    policy.write_text("version: 1\nname: t\nextends: ../base.yaml\n", encoding="utf-8")
    _refused(policy, "../base.yaml", "policy.file-outside-roots")
    with allow_read([tmp_path]):
        assert _errors(policy) == []
        assert compile_policy(str(policy), MODEL).policy == "t"


def test_allow_read_widens_the_roots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "house.txt").write_text("House rules.", encoding="utf-8")
    value = str(shared / "house.txt")
    policy = _policy(tmp_path / "pol", "prompts.default", value)
    assert main(["check", str(policy)]) == 1
    assert main(["check", "--allow-read", str(shared), str(policy)]) == 0
    plan_argv = ["plan", "--policy", str(policy), "--model", MODEL, "--format", "json"]
    assert main(plan_argv) == 1
    capsys.readouterr()
    assert main([*plan_argv, "--allow-read", str(shared)]) == 0
    assert '"chars": 12' in capsys.readouterr().out
    # The widening lasts for the command only.
    assert operator_roots() == ()


def test_read_roots_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "p.txt").write_text(d.name, encoding="utf-8")
    policy = _policy(tmp_path / "pol", "prompts.default", str(b / "p.txt"))
    assert main(["check", str(policy)]) == 1
    monkeypatch.setenv("KILO_RULES_READ_ROOTS", f"{a}{os.pathsep}{b}")
    assert main(["check", str(policy)]) == 0
    assert main(["plan", "--policy", str(policy), "--model", MODEL]) == 0


def test_allow_read_must_name_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--allow-read", str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_check_error_stops_compile_and_warnings_do_not(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    # Without extends: layers of a base merge by id, so a repeated id would merge there.
    policy.write_text(
        "version: 1\nname: t\nsystem:\n  layers:\n    - {id: a, source: text, text: x}\n"
        "    - {id: a, source: text, text: y}\n",
        encoding="utf-8",
    )
    errors = _errors(policy)
    assert [d.code for d in errors] == ["policy.duplicate-layer"]
    _same(errors, _compile_errors(policy))
    warned = tmp_path / "warned.yaml"
    warned.write_text(HEAD + "cache:\n  rule: none\n  ttl: 5m\n", encoding="utf-8")
    report = check_paths([str(warned)])
    assert report.errors == [] and report.diagnostics
    assert compile_policy(str(warned), MODEL).policy == "t"


def test_a_missing_file_that_appears_is_seen_by_compile(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "prompts.default", "later.txt")
    assert [d.code for d in _compile_errors(policy)] == ["policy.missing-file"]
    (tmp_path / "later.txt").write_text("now here", encoding="utf-8")
    plan = compile_policy(str(policy), MODEL)
    assert plan.prompt is not None and plan.prompt.text == "now here"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("globs", "/etc/*", "relative to the workspace"),
        ("globs", "../*.md", "'..'"),
        ("project_files", "/etc/passwd", "relative to the workspace"),
        ("project_files", "docs/../../x.md", "'..'"),
        ("global_files", "/etc/passwd", "must start with ~/"),
        ("global_files", "~/../../etc/passwd", "'..'"),
    ],
)
def test_instruction_paths_are_checked(tmp_path: Path, key: str, value: str, why: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        HEAD + f"system:\n  instructions:\n    {key}: ['{value}']\n", encoding="utf-8"
    )
    errors = _errors(policy)
    assert [d.code for d in errors] == ["policy.instruction-path"]
    assert why in errors[0].message
    assert errors[0].location.line == 6
    _same(errors, _compile_errors(policy))


def test_instruction_globs_and_names_stay_in_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "rules.md").write_text("rules", encoding="utf-8")
    (tmp_path / "secret.md").write_text("secret", encoding="utf-8")
    (ws / "docs" / "escape.md").symlink_to(tmp_path / "secret.md")
    settings = Instructions(globs=("docs/*.md", "/etc/*", "../*.md"))
    files, skipped = discover_instruction_files(settings, Workspace(cwd=str(ws), root=str(ws)))
    assert [f.path for f in files] == [(ws / "docs" / "rules.md").resolve()]
    assert any("escape.md" in s and "outside" in s for s in skipped)
    assert any("'/etc/*'" in s for s in skipped)
    assert any("'../*.md'" in s for s in skipped)


def test_instruction_files_refused_at_run_time_become_warnings(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.md").write_text("secret", encoding="utf-8")
    (ws / "AGENTS.md").symlink_to(tmp_path / "secret.md")
    os.mkfifo(ws / "pipe.md")
    (ws / "big.md").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "AGENTS.md").symlink_to(tmp_path / "secret.md")
    settings = Instructions(
        global_files=("~/.config/AGENTS.md",), project_files=("AGENTS.md",), globs=("*.md",)
    )
    workspace = Workspace(cwd=str(ws), root=str(ws), home=str(home))
    assert _promptly(lambda: instruction_files(settings, workspace)) == []
    plan = compile_policy("kilo-default", MODEL)
    step = StepInput(workspace=Workspace(cwd=str(ws), root=str(ws), home=str(home)))
    result = _promptly(lambda: apply_plan(plan, session(user("u1", "hi")), step))
    text = "".join(b["text"] for b in result.request["system"])  # type: ignore[attr-defined]
    assert "secret" not in text
    warnings = [
        str(d.result)
        for d in result.decisions  # type: ignore[attr-defined]
        if d.rule == "instructions.file"
    ]
    assert any("outside" in w for w in warnings)


def test_a_fifo_named_as_the_policy_is_refused_promptly(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "policy.yaml")
    raised = _promptly(lambda: compile_policy(str(tmp_path / "policy.yaml"), MODEL))
    assert isinstance(raised, PolicyError)
    assert raised.diagnostic.code == "policy.not-a-regular-file"
