"""What ``kilo-rules check`` loads to start: only what checking needs.

Each figure here is a count of modules, never a time: a module that slips back into the
import graph of ``check`` (a tokenizer, an HTTP client, the runtime, pydantic-settings for
an environment that sets nothing) costs every CI run a fresh process's import of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kilo_rules.tools.cli import main

#: Run in a fresh interpreter: ``kilo-rules check ARGS``, then report the modules loaded
#: and how many times lark analysed a grammar (the shipped tables make that unnecessary).
PROBE = """
import json, sys
import lark
built = []
init = lark.Lark.__init__
def counting(self, *args, **kwargs):
    built.append(1)
    init(self, *args, **kwargs)
lark.Lark.__init__ = counting
from kilo_rules.tools.cli import main
code = main(["check", *sys.argv[1:]])
print(json.dumps({"code": code, "grammars": len(built), "modules": sorted(sys.modules)}))
"""

#: Modules a clean check of policies has no use for.
NOT_LOADED = (
    "tiktoken",
    "httpx",
    "jinja2",
    "tenacity",
    "dask",
    "numpy",
    "asyncio",
    "ssl",
    "pydantic_settings",
    "kilo_rules.engine.base.net",
    "kilo_rules.engine.base.settings",
    "kilo_rules.engine.runtime",
    "kilo_rules.engine.compiler",
    "kilo_rules.engine.providers",
    "kilo_rules.engine.summarizers",
    "kilo_rules.tools.serving",
    "kilo_rules.tools.simulation",
    "kilo_rules.tools.checking.check_partial",
)

POLICY = """\
version: 1
name: team
extends: kilo-default
compaction:
  tail_turns: 2
output:
  max_tokens: "config.output_token_max ?? 8000"
"""


def _probe(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.lower().startswith("kilo_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.stdout, out.stderr
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    for i in range(3):
        (tmp_path / f"team-{i}.yaml").write_text(POLICY, encoding="utf-8")
    return tmp_path


def test_a_clean_check_loads_nothing_it_does_not_use(policies: Path) -> None:
    got = _probe(str(policies))
    assert got["code"] == 0
    modules = got["modules"]
    assert isinstance(modules, list)
    loaded = [m for m in modules if m.split(".")[0] in NOT_LOADED or m.startswith(NOT_LOADED)]
    assert loaded == []
    assert got["grammars"] == 0  # the parser came from the shipped tables


def test_a_setting_in_the_environment_is_still_read_and_checked(policies: Path) -> None:
    got = _probe(str(policies), env={"KILO_RULES_THRESHOLD_PERCENT": "500"})
    assert got["code"] == 2  # refused, as every command refuses a bad setting
    got = _probe(str(policies), env={"kilo_rules_net_max_redirects": "99"})
    assert got["code"] == 2  # any case: pydantic-settings compares names case-insensitively


def test_a_policy_with_errors_is_still_checked_past_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The partial checks load only when a policy has errors; they must still run then.
    (tmp_path / "bad.yaml").write_text(
        POLICY.replace("tail_turns: 2", "tail_turns: -1").replace("8000", "8000 +"),
        encoding="utf-8",
    )
    assert main(["check", str(tmp_path)]) == 1
    err = capsys.readouterr().out
    assert "tail_turns" in err
    assert "expr.syntax" in err or "missing right-hand operand" in err
