"""Any ``--config KEY=VALUE`` string through the CLI's config parsing ends as a config whose
every value is typed and in range, or as the package's typed error — never anything else."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.engine.base.settings import CONFIG_FIELDS
from kilo_rules.tools.cli import _options as opt
from tests.fuzz.budget import FUZZ

_NAMES = [n.removeprefix("config.") for n in CONFIG_FIELDS] + list(CONFIG_FIELDS)
_VALUES = st.one_of(
    st.text(max_size=30),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "1e999", "-0", "NaN", "Infinity", " 42 ", "0x10", ""]),
)
_KEYS = st.one_of(st.sampled_from(_NAMES), st.text(max_size=30))
_PAIRS = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", _KEYS, _VALUES),
    st.text(max_size=60),
)


def _valid(name: str, value: object) -> bool:
    field, inverted = CONFIG_FIELDS[name]
    if inverted:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if not math.isfinite(value):
        return False
    if field == "output_token_max":
        return isinstance(value, int) and value > 0
    if field == "compaction_reserved":
        return isinstance(value, int) and value >= 0
    return 0 < value <= 100


@pytest.mark.slow
@FUZZ
@given(st.lists(_PAIRS, max_size=4))
def test_config_pairs_become_a_valid_config_or_a_typed_error(pairs: list[str]) -> None:
    try:
        config = opt.config(pairs)
    except KiloRulesError as exc:
        assert exc.diagnostics
        assert all(d.code.startswith("config.") for d in exc.diagnostics)
        return
    for name, value in config.items():
        assert name in CONFIG_FIELDS
        assert _valid(name, value), (name, value)
