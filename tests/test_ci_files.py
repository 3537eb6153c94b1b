"""The example workflow and the composite action: what they run exists in the CLI.

Both files are parsed as YAML; every ``kilo-rules`` command in their shell steps is parsed
by the real argument parser (an option or choice the CLI lacks fails here, not in a user's
CI) and run on this repository's bundled policies. No network is used.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilo_rules.tools.checking.report import FORMATS
from kilo_rules.tools.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "policies.yml"
ACTION = ROOT / "action.yml"


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _commands(script: str, env: dict[str, str]) -> list[list[str]]:
    """The ``kilo-rules`` command lines of a shell ``script``, variables replaced by
    ``env`` and output redirections dropped."""
    out = []
    for raw in script.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("kilo-rules "):
            continue
        for name, value in env.items():
            line = line.replace(f'"${name}"', shlex.quote(value)).replace(f"${name}", value)
        line = re.sub(r"\s*>\s*\S+$", "", line)
        out.append(shlex.split(line)[1:])
    return out


def _parses(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)  # SystemExit(2) on anything the CLI lacks
    assert args.command == argv[0]


def test_workflow_checks_policies_as_sarif_and_annotations() -> None:
    wf = _load(WORKFLOW)
    assert set(wf[True]) == {"push", "pull_request"}  # YAML 1.1 reads the key `on` as true
    (job,) = wf["jobs"].values()
    assert job["permissions"]["security-events"] == "write"
    steps = job["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)
    upload = next(
        s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif@")
    )
    assert upload["if"] == "always()"
    commands = [c for s in steps if "run" in s for c in _commands(s["run"], {})]
    assert ["check", "policies/", "--format", "sarif"] in commands
    assert ["check", "policies/", "--format", "github"] in commands
    sarif_step = next(s for s in steps if "--format sarif" in s.get("run", ""))
    assert sarif_step["run"].rstrip().endswith(f"> {upload['with']['sarif_file']}")
    assert sarif_step.get("continue-on-error") is True
    assert any("pip install" in s.get("run", "") for s in steps)
    for argv in commands:
        _parses(argv)


def test_action_inputs_and_steps() -> None:
    action = _load(ACTION)
    inputs = action["inputs"]
    assert {"paths", "format", "version"} <= set(inputs)
    assert inputs["format"]["default"] in FORMATS
    for fmt in FORMATS:
        assert fmt in inputs["format"]["description"]
    runs = action["runs"]
    assert runs["using"] == "composite"
    steps = runs["steps"]
    assert steps[0]["uses"].startswith("actions/setup-python@")
    assert "pip install" in steps[1]["run"]
    for step in steps[1:]:
        assert step["shell"] == "bash"
        # An input pasted into a script would be run as shell code; they go through env.
        assert "${{" not in step["run"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_action_check_command_parses_with_each_format(fmt: str) -> None:
    action = _load(ACTION)
    check = action["runs"]["steps"][-1]
    defaults = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    given = {**defaults, "format": fmt}
    env = {}
    for var, expr in check["env"].items():
        found = re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", expr)
        assert found, f"{var}: {expr}"
        env[var] = given[found.group(1)]
    commands = _commands(check["run"], env)
    assert commands
    for argv in commands:
        assert argv[:1] == ["check"]
        assert argv[argv.index("--format") + 1] == fmt
        _parses(argv)


def test_the_workflow_commands_pass_on_the_bundled_policies(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    steps = _load(WORKFLOW)["jobs"]["check"]["steps"]
    for argv in [c for s in steps if "run" in s for c in _commands(s["run"], {})]:
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        if "sarif" in argv:
            assert json.loads(out)["runs"][0]["results"] == []
        else:
            assert out == ""
