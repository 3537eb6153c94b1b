"""What every command shares: the table, cut values and ``--full``, the format switch, the
exit codes in ``--help``, a quiet end on a closed pipe, paths relative to the working
directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import Location
from kilo_rules.tools.cli import EXIT_CODES, EXIT_OK, EXIT_USAGE, main
from kilo_rules.tools.cli._table import ELLIPSIS, FULL_HINT, render_table, shorten

ROOT = Path(__file__).resolve().parent.parent
SESSION = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
CONTINUE_TEXT = (
    "Continue if you have next steps, or stop and ask for clarification if you are unsure "
    "how to proceed."
)


# ---------------------------------------------------------------- table and cut values


def test_the_table_aligns_columns_under_a_rule() -> None:
    table = render_table(("name", "n"), [("a", "1"), ("long name", "1,000")], right={1})
    assert table.splitlines() == [
        "name           n",
        "---------  -----",
        "a              1",
        "long name  1,000",
    ]


def test_the_table_never_cuts_and_refuses_a_ragged_row() -> None:
    assert "x" * 300 in render_table(("a",), [("x" * 300,)])
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        render_table(("a", "b"), [("only one",)])


def test_a_cut_value_ends_in_an_ellipsis_and_keeps_the_width() -> None:
    assert shorten("abcdef", 4) == "abc" + ELLIPSIS
    assert shorten("abcd", 4) == "abcd"
    assert shorten("abcdef", None) == "abcdef"


def test_plan_cuts_long_values_visibly_and_full_shows_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--model", "openai/gpt-5"]) == EXIT_OK
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "compaction.continue_text" in x]
    assert f'"Continue if you have next steps, or stop and ask for clari{ELLIPSIS}' in line
    assert FULL_HINT in out
    assert main(["plan", "--model", "openai/gpt-5", "--full"]) == EXIT_OK
    out = capsys.readouterr().out
    assert json.dumps(CONTINUE_TEXT) in out
    assert ELLIPSIS not in out and FULL_HINT not in out


def test_explain_cuts_long_inputs_visibly_and_full_shows_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["build", "--model", "openai/gpt-5", "--session", str(SESSION), "--explain"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    (layers,) = [x for x in out.splitlines() if x.startswith(" system   layers")]
    assert f"layers={ELLIPSIS}" not in layers and ELLIPSIS in layers
    assert FULL_HINT in out
    assert main([*argv, "--full"]) == EXIT_OK
    out = capsys.readouterr().out
    (layers,) = [x for x in out.splitlines() if x.startswith(" system   layers")]
    assert ELLIPSIS not in layers and '"environment"' in layers
    assert FULL_HINT not in out


# ---------------------------------------------------------------- format, help, exit codes


def test_models_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--format", "json"]) == EXIT_OK
    models = json.loads(capsys.readouterr().out)
    assert "anthropic/claude-sonnet-4-5" in {m["id"] for m in models}


def test_the_old_json_switch_says_what_replaced_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == EXIT_USAGE
    assert "unrecognized arguments: --json (use --format json)" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["build"], ["import"]], ids=["top", "build", "import"])
def test_help_lists_the_exit_codes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code, meaning in EXIT_CODES:
        assert f"  {code}  {meaning}" in out


def test_the_exit_codes_page_lists_every_code() -> None:
    page = (ROOT / "docs/cli.md").read_text(encoding="utf-8")
    for code, _ in EXIT_CODES:
        assert f"\n| {code} | `EXIT_" in page


def test_no_command_prints_help_and_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert "usage: kilo-rules" in capsys.readouterr().err


def test_a_policy_that_cannot_be_read_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["plan", "--policy", str(missing), "--model", "openai/gpt-5"]) == EXIT_USAGE
    assert "error[io.read]" in capsys.readouterr().err


# ---------------------------------------------------------------- a closed pipe


def _into_a_closed_pipe(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m kilo_rules argv`` with stdout a pipe whose reader has gone, as
    ``| head -1`` leaves it once head has its line."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "kilo_rules", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [["models"], ["plan", "--model", "openai/gpt-5", "--format", "json"], ["--help"]],
    ids=["models", "plan-json", "help"],
)
def test_a_closed_pipe_ends_quietly_with_0(argv: list[str]) -> None:
    done = _into_a_closed_pipe(*argv)
    # models also says on stderr how many models it listed, when it gets that far
    assert b"Broken pipe" not in done.stderr and b"Traceback" not in done.stderr
    assert done.returncode == EXIT_OK


def test_head_gets_its_line_and_the_command_exits_0() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "kilo_rules", "models"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == EXIT_OK
    assert first.split()[0] == b"id"
    assert b"Broken pipe" not in err


# ---------------------------------------------------------------- relative paths


def test_a_location_under_the_working_directory_is_shown_relative(tmp_path: Path) -> None:
    inside = Location(str(tmp_path / "pol" / "a.yaml"), 3, 4, 3, 9)
    assert inside.relative(tmp_path) == Location(str(Path("pol", "a.yaml")), 3, 4, 3, 9)


def test_a_location_elsewhere_or_in_a_pseudo_file_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = Location(str(ROOT / "policies" / "kilo-default.yaml"), 1, 1)
    assert elsewhere.relative(tmp_path) == elsewhere
    stdin = Location("<stdin>", 2, 1)
    monkeypatch.chdir(tmp_path)
    assert stdin.relative() == stdin
    assert Location("a.yaml", 1, 1).relative() == Location("a.yaml", 1, 1)
