"""kilo-rules diff: plan differences with both origins, and the first step two policies'
replays of a session differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import Session, TokenUsage
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.tools.checking.diff import diff_policies, diff_session, elide, request_diff
from kilo_rules.tools.cli import main

from .runtime.helpers import assistant, model, session, text, tool, user

ROOT = Path(__file__).resolve().parents[1]
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"
MINI_SWE = TRAJECTORIES / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json"
CLAUDE = "anthropic/claude-sonnet-4-5"

BASE = "version: 1\nname: a\nextends: kilo-default\ncompaction:\n  tail_turns: 2\n"
CHANGED = """version: 1
name: b
extends: kilo-default
compaction:
  tail_turns: 3
system:
  layers:
    - {id: team, source: text, text: Team rules.}
overrides:
  - name: claude-prune
    when: 'model.family == "claude"'
    set:
      prune:
        protect_turns: 4
"""


def _policies(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(BASE)
    b.write_text(CHANGED)
    return a, b


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_a_value_an_override_and_a_layer_are_reported_with_both_origins(tmp_path: Path) -> None:
    a, b = _policies(tmp_path)
    result, _ = diff_policies(a, b, [model(), model(id="t/gpt", family="gpt")])
    claude, gpt = result.models
    tail = next(v for v in claude.values if v.name == "compaction.tail_turns")
    assert (tail.a, tail.b) == (2, 3)
    assert tail.a_at is not None and tail.b_at is not None
    assert (Path(tail.a_at.file), tail.a_at.line) == (a, _line_of(a, "tail_turns"))
    assert (Path(tail.b_at.file), tail.b_at.line) == (b, _line_of(b, "tail_turns"))
    # the override sets a value for claude only, and is located in B
    (override,) = claude.overrides
    assert (override.name, override.side) == ("claude-prune", "b")
    assert override.at is not None and Path(override.at.file) == b
    assert override.at.line == _line_of(b, "claude-prune")
    protect = next(v for v in claude.values if v.name == "prune.protect_turns")
    assert protect.b == 4 and protect.b_at is not None and Path(protect.b_at.file) == b
    assert not gpt.overrides and all(v.name != "prune.protect_turns" for v in gpt.values)
    (layer,) = claude.layers
    assert (layer.id, layer.kind, layer.a_at) == ("team", "added", None)
    assert layer.b_at is not None and layer.b_at.line == _line_of(b, "id: team")


def test_the_text_output_names_each_difference_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _policies(tmp_path)
    code = main(["diff", str(a), str(b), "--model", CLAUDE])
    out = capsys.readouterr().out
    assert code == 0
    row = next(line for line in out.splitlines() if "compaction.tail_turns" in line)
    assert f"a.yaml:{_line_of(a, 'tail_turns')}" in row
    assert f"b.yaml:{_line_of(b, 'tail_turns')}" in row
    assert "override claude-prune: applied in b only" in out
    assert "+ team (only in b" in out
    assert main(["diff", str(a), str(b), "--model", CLAUDE, "--exit-code"]) == 1


def test_identical_policies_say_no_differences_and_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(BASE)
    copy = tmp_path / "copy.yaml"
    copy.write_text(BASE.replace("name: a", "name: copy"))
    for extra in ([], ["--exit-code"]):
        assert main(["diff", str(a), str(copy), "--model", "anthropic/*", *extra]) == 0
        out = capsys.readouterr().out
        assert "no differences on 8 model(s)" in out
        assert out.rstrip().endswith("no differences")


def test_json_and_github_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _policies(tmp_path)
    assert main(["diff", str(a), str(b), "--model", CLAUDE, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["same"] is False
    (m,) = doc["models"]
    tail = next(v for v in m["values"] if v["name"] == "compaction.tail_turns")
    assert tail["a"]["value"] == 2 and tail["b"]["at"].endswith(f":{_line_of(b, 'tail_turns')}:15")
    assert main(["diff", str(a), str(b), "--model", CLAUDE, "--format", "github"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tail_line = next(line for line in lines if "compaction.tail_turns differs" in line)
    assert tail_line.startswith("::warning file=")
    assert f"b.yaml,line={_line_of(b, 'tail_turns')}," in tail_line
    assert all("b.yaml" in line for line in lines)


def test_model_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "kilo-default", "kilo-default", "--model", "nope/*"]) == 2
    assert "matches no model" in capsys.readouterr().err
    assert main(["diff", "kilo-default", "kilo-default"]) == 0
    # one model per provider and family of the catalog
    assert "no differences on 17 model(s)" in capsys.readouterr().out


# ---------------------------------------------------------------------------- sessions


def _growing_session(steps: int) -> Session:
    """A task then ``steps`` tool calls of about 1,000 tokens each."""
    messages = [user("u1", "Fix the bug in a.py.")]
    for i in range(steps):
        body = f"line {i}: " + "x " * 2000
        parts = (text(f"t{i}", f"step {i}"), tool(f"p{i}", body))
        # each step later than the last: the overflow check reads the newest finished one
        messages.append(assistant(f"m{i}", *parts, created=1_700_000_001_000 + i))
    return session(*messages)


def _threshold_policies(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "late.yaml", tmp_path / "early.yaml"
    a.write_text("version: 1\nname: late\nextends: kilo-default\n")
    # B compacts at a lower count: its overflow limit is 8k below the usable window
    b.write_text(
        "version: 1\nname: early\nextends: kilo-default\n"
        'overflow:\n  limit: "budget.usable - 8000"\n'
    )
    return a, b


def _first_compaction(plan_ref: Path, s: Session) -> int:
    """The request number of the first step that compacted, the plan replayed alone."""
    plan = compile_policy(plan_ref, SMALL)
    runtime = Runtime(plan)
    live = s.model_copy(update={"messages": []})
    n = 0
    for msg in s.messages:
        if msg.role == "assistant":
            n += 1
            result = runtime.step(live)
            if result.compactions:
                return n
            # answered with the usage of the request built, as a provider would report it
            usage = TokenUsage(input=result.input_tokens)
            live = result.session
            msg = msg.model_copy(update={"tokens": usage})
        live = live.model_copy(update={"messages": [*live.messages, msg]})
    raise AssertionError("no compaction")


SMALL = model(limits={"context": 24_000, "output": 4_000})


def test_the_first_divergence_is_where_b_compacts_first(tmp_path: Path) -> None:
    a, b = _threshold_policies(tmp_path)
    s = _growing_session(30)
    early = _first_compaction(b, s)
    plan_a, plan_b = compile_policy(a, SMALL), compile_policy(b, SMALL)
    out = diff_session(plan_a, plan_b, s, name="synthetic")
    assert out.first is not None
    assert out.first.step == early
    assert out.identical >= early - 1  # every step before it sent the same request
    assert out.compactions_b > out.compactions_a
    made_by_b_only = {(c.stage, c.rule) for c in out.first.decisions if not c.a_made}
    assert ("compaction", "summary") in made_by_b_only
    assert not out.first.same_request
    assert any(line.startswith("+") for line in out.first.diff())
    # the same step when --steps stops there, and nothing when it stops before
    assert diff_session(plan_a, plan_b, s, steps=early).first is not None
    before = diff_session(plan_a, plan_b, s, steps=early - 1)
    assert before.first is None and before.steps == before.identical == early - 1


def test_the_same_policy_never_diverges(tmp_path: Path) -> None:
    a, _ = _threshold_policies(tmp_path)
    plan = compile_policy(a, SMALL)
    out = diff_session(plan, plan, _growing_session(30))
    assert out.first is None and out.steps == out.identical == 30
    assert out.compactions_a == out.compactions_b > 0


def test_long_strings_are_cut_in_the_middle_and_keep_differing() -> None:
    one, two = "a" * 200 + "X" + "a" * 200, "a" * 200 + "Y" + "a" * 200
    assert elide(one) != elide(two) and len(elide(one)) < 200
    assert elide({"k": [one]}, None) == {"k": [one]}
    diff = request_diff({"k": one}, {"k": two}, labels=("A", "B"))
    assert diff[:2] == ["--- A", "+++ B"]
    assert any("…[" in line for line in diff)
    assert not any("…[" in line for line in request_diff({"k": one}, {"k": two}, full=True))


@pytest.mark.slow
@pytest.mark.skipif(not MINI_SWE.is_file(), reason="the shared trajectories are absent")
def test_a_real_session_diverges_where_compaction_first_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "deepseek-32k.yaml"
    small.write_text(
        "id: deepseek/deepseek-chat@32k\nprovider: deepseek\nfamily: deepseek\n"
        "api_id: deepseek-chat\napi: openai-compatible\n"
        "limits: {context: 32000, output: 8192}\ncache: {kind: automatic}\n"
    )
    code = main(
        ["diff", "kilo-default", "long-run", "--session", str(MINI_SWE), "--model", str(small)]
    )
    out = capsys.readouterr().out
    assert code == 0
    plans = [compile_policy(p, model(**_inline(small))) for p in ("kilo-default", "long-run")]
    result = diff_session(*plans, read_session(MINI_SWE))
    assert result.first is not None
    # the policies differ in their compaction only: the requests are the same until one
    # compacts, and kilo-default stops once its three compactions per turn are spent
    assert result.identical == result.first.step - 1 > 0
    assert any(c.stage == "compaction" for c in result.first.decisions)
    assert result.stopped_a is not None and result.stopped_b is None
    assert f"first divergence: step {result.first.step} " in out
    assert "kilo-default stopped at step" in out


def _inline(path: Path) -> dict[str, object]:
    import yaml

    data: dict[str, object] = yaml.safe_load(path.read_text())
    return data
