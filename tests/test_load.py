"""The YAML loader: source map positions and the limits that keep hostile input cheap."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.formats.load import Limits, load_yaml_file, parse_yaml

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


@pytest.mark.slow
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


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("a: x\x00y\n", (1, 5), "U+0000 (NUL)"),
        ("a: 1\nb: \x1b[31mred\n", (2, 4), "U+001B (ESC)"),
        ("a: 1\n  # \x7f\n", (2, 5), "U+007F (DEL)"),
        ('a: "ring \\a"\n', (1, 4), "U+0007"),  # written as an escape
        ('a: "\\x1b[0m"\n', (1, 4), "U+001B (ESC)"),
        ('a: "\\ud800"\n', (1, 4), "U+D800 (lone surrogate)"),
        ('a: "\\uffff"\n', (1, 4), "U+FFFF (non-character)"),
    ],
)
def test_control_characters_are_located_errors(
    text: str, where: tuple[int, int], fragment: str
) -> None:
    with pytest.raises(PolicyError) as err:
        parse_yaml(text, "p.yaml")
    d = err.value.diagnostic
    assert d.code == "yaml.character"
    assert (d.location.file, d.location.line, d.location.col) == ("p.yaml", *where)
    assert fragment in d.message


def test_tabs_line_breaks_and_printable_unicode_are_fine() -> None:
    doc = parse_yaml('a: "x\\ty"\nb: |\n  one\r\n  t\two\nd: café ✓ \U0001f600\n', "p.yaml")
    assert doc.data == {"a": "x\ty", "b": "one\nt\two\n", "d": "café ✓ \U0001f600"}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (".inf", ".inf is not a finite number"),
        ("-.Inf", "-.Inf is not a finite number"),
        ("1.0e+400", "1.0e+400 is not a finite number"),
        ("9007199254740993", "is out of range: numbers must be within ±2^53"),
        ("-9007199254740993", "is out of range"),
        ("0x7fffffffffffffffff", "is out of range"),
        ("1" + "0" * 5000, "is out of range"),  # beyond what int() parses at all
        ("9.1e+15", "is out of range"),
    ],
)
def test_numbers_must_be_finite_and_within_2_to_53(value: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_yaml(f"a: 1\nb: {value}\n", "p.yaml")
    d = err.value.diagnostic
    assert (d.code, d.location.line, d.location.col) == ("yaml.value", 2, 4)
    assert fragment in d.message


def test_numbers_at_the_bound_load() -> None:
    doc = parse_yaml("a: 9007199254740992\nb: -9007199254740992\nc: 1.0e+15\n", "p.yaml")
    assert doc.data == {"a": 2**53, "b": -(2**53), "c": 1e15}


@pytest.mark.slow
@pytest.mark.parametrize(
    "items",
    [
        ["1"] * 240_000,  # ~720 KB of small ints
        ["{a: 1}"] * 120_000,  # ~960 KB of small mappings
    ],
)
def test_value_limit_is_enforced_while_composing(items: list[str]) -> None:
    text = "version: 1\nname: p\nx: [" + ", ".join(items) + "]\n"
    started = time.perf_counter()
    with pytest.raises(PolicyError) as err:
        parse_yaml(text, "p.yaml")
    elapsed = time.perf_counter() - started
    d = err.value.diagnostic
    assert d.code == "yaml.nodes"
    assert d.message == "document holds more than 20,000 values"
    assert "alias" not in d.message
    assert d.location.line == 3 and d.location.col > 1000
    # Composing all of them took ~10 s; stopping at the limit takes a fraction of that.
    assert elapsed < 5


@pytest.mark.parametrize("with_libyaml", [True, False])
def test_value_count_excludes_keys_and_aliases(
    with_libyaml: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    monkeypatch.setattr(yaml, "__with_libyaml__", with_libyaml and yaml.__with_libyaml__)
    # Values: the root mapping, its list, 1, the inner mapping, 2, the list [3, 4], 3, 4,
    # the anchored 5, and e: 10 in all (keys and the alias are not new values); the alias
    # expands to an eleventh.
    text = "a: [1, {b: 2, c: [3, 4]}, &x 5, *x]\nd: e\n"
    assert parse_yaml(text, "p.yaml", Limits(max_nodes=11)).data["d"] == "e"
    with pytest.raises(PolicyError) as err:
        parse_yaml(text, "p.yaml", Limits(max_nodes=10))
    assert err.value.diagnostic.code == "yaml.expansion"
    with pytest.raises(PolicyError) as err:
        parse_yaml(text, "p.yaml", Limits(max_nodes=9))
    d = err.value.diagnostic
    assert (d.code, d.location.line, d.location.col) == ("yaml.nodes", 2, 4)


@pytest.mark.slow
def test_alias_expansion_has_its_own_message() -> None:
    with pytest.raises(PolicyError) as err:
        parse_yaml(BOMB, "bomb.yaml")
    assert "through its aliases" in err.value.diagnostic.message
