"""``--config KEY=VALUE`` is checked against the typed settings: unknown names get a
did-you-mean, ranges hold, numbers are finite, and a bad pair exits 2."""

from __future__ import annotations

import json

import pytest

from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.base.settings import CONFIG_FIELDS, Settings, check_config, parse_config
from kilo_rules.engine.compiler.compile import CONFIG_NAMES, compile_policy
from kilo_rules.tools.cli import EXIT_USAGE, main

MODEL = "anthropic/claude-sonnet-4-5"
PLAN_JSON = ["plan", "--model", MODEL, "--format", "json"]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_a_typo_is_refused_with_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails([*PLAN_JSON, "--config", "output_token_mx=8000"], capsys)
    assert "config.unknown-key" in err
    assert "unknown config name 'output_token_mx'" in err
    assert "did you mean 'output_token_max'?" in err


def test_a_settings_field_name_points_at_its_config_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _fails([*PLAN_JSON, "--config", "threshold_percent=50"], capsys)
    assert "did you mean 'compaction.threshold_percent'?" in err


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("output_token_max=-5", "greater than 0"),
        ("output_token_max=0", "greater than 0"),
        ("output_token_max=1e999", "finite number"),
        ("output_token_max=Infinity", "finite number"),
        ("output_token_max=8000.5", "valid integer"),
        ("output_token_max=true", "valid integer"),
        ("compaction.threshold_percent=0", "greater than 0"),
        ("compaction.threshold_percent=100.5", "less than or equal to 100"),
        ("compaction.threshold_percent=nan", "finite number"),
        ("compaction.reserved=-1", "greater than or equal to 0"),
        ("compaction.auto=maybe", "valid boolean"),
        ("config.compaction.prune=2", "valid boolean"),
    ],
)
def test_values_out_of_range_are_refused(
    pair: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails([*PLAN_JSON, "--config", pair], capsys)
    assert "config.value" in err
    assert message in err


def test_a_pair_without_equals_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails([*PLAN_JSON, "--config", "output_token_max"], capsys)
    assert "config.syntax" in err and "KEY=VALUE" in err


def test_every_bad_pair_is_reported_at_once() -> None:
    with pytest.raises(PolicyError) as info:
        parse_config(["nope=1", "output_token_max=-1", "compaction.auto"])
    codes = sorted(d.code for d in info.value.diagnostics)
    assert codes == ["config.syntax", "config.unknown-key", "config.value"]


def test_good_values_are_typed_and_reach_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *PLAN_JSON,
        "--config",
        "output_token_max=8000",
        "--config",
        "config.compaction.threshold_percent=75.5",
        "--config",
        "compaction.auto=false",
        "--config",
        "compaction.reserved=0",
    ]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["config"] == {
        "config.output_token_max": 8000,
        "config.compaction.threshold_percent": 75.5,
        "config.compaction.auto": False,
        "config.compaction.reserved": 0,
    }
    assert "Infinity" not in json.dumps(plan)


def test_config_names_are_typed_once() -> None:
    assert set(CONFIG_NAMES) == set(CONFIG_FIELDS)
    assert all(f in Settings.model_fields for f, _ in CONFIG_FIELDS.values())


def test_compile_checks_config_from_a_program_too() -> None:
    with pytest.raises(PolicyError) as info:
        compile_policy("kilo-default", MODEL, config={"output_token_max": -5})
    assert info.value.diagnostic.code == "config.value"
    assert check_config({"output_token_max": "8000"}) == {"config.output_token_max": 8000}


def test_environment_values_keep_their_ranges(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KILO_RULES_THRESHOLD_PERCENT", "inf")
    assert main(PLAN_JSON) == EXIT_USAGE
    assert "threshold_percent" in capsys.readouterr().err
