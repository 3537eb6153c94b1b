"""Source maps: the nearest-ancestor lookup and the JSON locator."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import Location
from kilo_rules.engine.base.source import JsonPath, JsonText, lookup, nearest


def test_nearest_returns_the_entry_and_the_rest_below_it() -> None:
    table = {(): "root", ("a",): "a", ("a", 0, "b"): "b"}
    assert nearest(table, ("a", 0, "b")) == ("b", ())
    assert nearest(table, ("a", 0, "c", 2)) == ("a", (0, "c", 2))
    assert nearest(table, ("z",)) == ("root", ("z",))
    assert nearest({("a",): 1}, ("b",)) is None


DOC = '{\n  "a": [1, {"b": "x"}],\n  "c": {"d": null}\n}\n'


def test_values_are_located_where_they_start() -> None:
    src = JsonText("f.json", DOC)
    assert str(src.locate(("a", 1, "b"))) == "f.json:2:18"
    assert str(src.locate(("c",))) == "f.json:3:8"
    assert str(src.locate()) == "f.json:1:1"


def test_a_missing_value_falls_back_to_the_container_that_lacks_it() -> None:
    src = JsonText("f.json", DOC)
    assert src.locate(("c", "nope")) == src.locate(("c",))
    assert src.locate(("a", 7)) == src.locate(("a",))  # index out of range
    assert src.locate(("a", "key")) == src.locate(("a",))  # a key asked of an array
    assert src.locate(("a", 0, "deeper")) == src.locate(("a", 0))  # below a scalar


def test_a_record_of_a_json_lines_file_counts_lines_from_its_own() -> None:
    assert JsonText("log.jsonl", '{"a": {"b": 1}}', line=7).locate(("a", "b")) == Location(
        "log.jsonl", 7, 13
    )
    assert JsonText("log.jsonl", "", line=7).locate(("a",)) == Location("log.jsonl", 7, 1)


def test_columns_count_characters_and_only_newline_ends_a_line() -> None:
    text = '{"\u00e9\\"\U0001f600": "\u2028", "k":\r\n 5}'
    assert JsonText("f", text).locate(("k",)) == Location("f", 2, 2)
    assert JsonText("f", text).locate(('\u00e9"\U0001f600',)) == Location("f", 1, 10)


def test_a_repeated_key_is_located_at_the_value_json_keeps() -> None:
    text = '{"a": {"x": 1, "y": 2},\n "a": {"x": 3}}'
    assert json.loads(text)["a"] == {"x": 3}
    src = JsonText("f", text)
    assert src.locate(("a", "x")) == Location("f", 2, 13)
    assert src.locate(("a", "y")) == Location("f", 2, 7)  # the kept "a" has no "y"


def test_locations_answers_many_paths_and_their_ancestors_at_once() -> None:
    where = JsonText("f", DOC).locations([("a", 1, "b"), ("c", "d"), ("c", "e")])
    assert set(where) == {(), ("a",), ("a", 1), ("a", 1, "b"), ("c",), ("c", "d")}


def test_deep_nesting_needs_no_recursion() -> None:
    depth = 900  # as deep as json.loads itself goes with the default recursion limit
    text = "[" * depth + "1" + "]" * depth
    assert JsonText("f", text).locate((0,) * depth) == Location("f", 1, depth + 1)


def test_text_that_does_not_scan_keeps_what_was_found() -> None:
    src = JsonText("f", '{"a": [1, {"b": }, {"c": 2}]}')
    assert src.locate(("a", 1, "c")) == Location("f", 1, 11)
    assert src.locate(("a", 2, "c")) == Location("f", 1, 7)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=25,
)


def _paths(value: Any, path: JsonPath = ()) -> list[JsonPath]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


@given(_json, st.sampled_from([None, 0, 2, "\t"]), st.booleans())
def test_every_value_decodes_from_where_it_is_located(
    value: Any, indent: int | str | None, ascii_only: bool
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    lines = text.split("\n")
    paths = _paths(value)
    where = JsonText("f", text).locations(paths)
    assert set(where) == set(paths)
    decoder = json.JSONDecoder()
    for path, loc in where.items():
        offset = sum(len(ln) + 1 for ln in lines[: loc.line - 1]) + loc.col - 1
        assert decoder.raw_decode(text, offset)[0] == lookup(value, path)
