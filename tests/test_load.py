"""The YAML loader: source map positions and the limits that keep hostile input cheap."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kilo_rules.errors import PolicyError
from kilo_rules.load import Limits, load_yaml_file, parse_yaml

BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *[
            f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ],
    ]
)


def test_values_and_keys_are_located() -> None:
    doc = parse_yaml("a: 1\nb:\n  c: 'x y'\n  d: [1, 2, {e: f}]\n", "p.yaml")
    assert doc.data == {"a": 1, "b": {"c": "x y", "d": [1, 2, {"e": "f"}]}}
    assert str(doc.locate(("b", "d", 2, "e"))) == "p.yaml:4:17"
    assert str(doc.locate_key(("b", "c"))) == "p.yaml:3:3"
    assert str(doc.locate(("b", "nothing", 3))) == "p.yaml:2:1" or doc.locate(("b",)).line == 3


@pytest.mark.parametrize(
    ("text", "offset", "where"),
    [
        ("k: a + bb\n", 4, (1, 8)),  # plain
        ("k: 'a + bb'\n", 4, (1, 9)),  # single-quoted
        ('k: "a + bb"\n', 4, (1, 9)),  # double-quoted
        ("k: |\n  a +\n  bb\n", 4, (3, 3)),  # literal block
        ("k: >-\n  a\n  + bb\n", 4, (3, 5)),  # folded block
        ("k: a\n  + bb\n", 4, (2, 5)),  # multi-line plain
    ],
)
def test_positions_inside_scalars(text: str, offset: int, where: tuple[int, int]) -> None:
    doc = parse_yaml(text, "p.yaml")
    loc = doc.locate_in_scalar(("k",), offset)
    assert (loc.line, loc.col) == where, doc.data


def test_billion_laughs_stops_early() -> None:
    start = time.perf_counter()
    with pytest.raises(PolicyError) as err:
        parse_yaml(BOMB, "bomb.yaml")
    assert err.value.diagnostic.code == "yaml.expansion"
    # Not a timing assertion on the machine: the work is bounded by max_nodes, so even a
    # very slow machine finishes quickly; this only guards against unbounded expansion.
    assert time.perf_counter() - start < 30


def test_five_megabyte_file_is_refused_before_parsing(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_text("x: " + "a" * 5_000_000 + "\n", encoding="utf-8")
    with pytest.raises(PolicyError) as err:
        load_yaml_file(p)
    d = err.value.diagnostic
    assert d.code == "yaml.size"
    assert d.details["bytes"] == p.stat().st_size


def test_limits_are_configurable() -> None:
    with pytest.raises(PolicyError) as err:
        parse_yaml("a: [[[1]]]", "p.yaml", Limits(max_depth=4))
    assert err.value.diagnostic.code == "yaml.depth"
    assert parse_yaml("a: [[1]]", "p.yaml", Limits(max_depth=4)).data == {"a": [[1]]}


def test_aliases_within_limits_are_expanded() -> None:
    doc = parse_yaml("a: &x {k: 1}\nb: *x\n", "p.yaml")
    assert doc.data == {"a": {"k": 1}, "b": {"k": 1}}


def test_dates_stay_text_and_keys_must_be_scalars() -> None:
    assert parse_yaml("d: 2026-01-02\n").data == {"d": "2026-01-02"}
    with pytest.raises(PolicyError) as err:
        parse_yaml("? [a]\n: 1\n", "p.yaml")
    assert err.value.diagnostic.code == "yaml.key"


def test_empty_document_is_none() -> None:
    assert parse_yaml("", "p.yaml").data is None


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as err:
        load_yaml_file(tmp_path / "missing.yaml")
    assert err.value.diagnostic.code == "io.read"
