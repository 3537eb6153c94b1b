"""The shipped LALR tables: current, used, and the same parser the grammar builds."""

from __future__ import annotations

import base64
import pickle
import zlib
from typing import Any

import pytest
from lark import Lark, Tree, UnexpectedInput

from kilo_rules.engine.frontend.expr import GRAMMAR_ERRORS
from kilo_rules.engine.frontend.expr.build_tables import tables_module
from kilo_rules.engine.frontend.expr.tables import (
    OPTIONS,
    decode,
    grammar_text,
    lalr_parser,
    shipped_tables,
)

VALID = [
    "1 + 2 * 3",
    "a.b.c ?? 4 if model.family == 'claude' else min(1, [2, 3])",
    "not x and y or -z // 2 % 3",
    "'a' in names and session.turns >= 10",
    "50KB + 2MiB",
    "x not in [1, 2] and s matches '\\\\d+'",
]


def test_the_shipped_tables_are_built_from_this_grammar_by_this_lark() -> None:
    # Fails after an edit of grammar.lark (or a new lark) until build_tables is run again:
    # the parser would still work, built from the grammar in every process, only slower.
    assert shipped_tables(grammar_text()) is not None


def _outcome(parser: Lark, text: str) -> Any:
    try:
        return parser.parse(text)
    except UnexpectedInput as exc:
        # State numbers may differ between two builds; what was expected where does not.
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", ()) or ())
        return type(exc).__name__, exc.pos_in_stream, expected


@pytest.fixture(scope="module")
def parsers() -> tuple[Lark, Lark]:
    """(built from the grammar, loaded from the shipped tables)."""
    return Lark(grammar_text(), **OPTIONS), lalr_parser(grammar_text())


@pytest.mark.parametrize(
    "text", VALID + [example for examples in GRAMMAR_ERRORS.values() for example in examples]
)
def test_the_loaded_parser_parses_as_the_built_one(parsers: tuple[Lark, Lark], text: str) -> None:
    built, loaded = parsers
    assert _outcome(loaded, text) == _outcome(built, text)


def test_tables_not_built_from_the_grammar_given_are_not_used() -> None:
    other = 'start: "x" NUMBER\n%import common.NUMBER\n'
    assert shipped_tables(other) is None
    assert lalr_parser(other).parse("x1") == Tree("start", ["1"])


def test_a_generated_module_round_trips() -> None:
    namespace: dict[str, Any] = {}
    exec(tables_module(grammar_text()), namespace)
    tables = decode(namespace["TABLES"])
    parser: Lark = Lark._load_from_dict(  # type: ignore[no-untyped-call]
        tables["data"], tables["memo"], propagate_positions=True
    )
    assert parser.parse("1 + a") == Lark(grammar_text(), **OPTIONS).parse("1 + a")


def test_tables_that_name_a_global_are_refused() -> None:
    blob = base64.b64encode(zlib.compress(pickle.dumps({"f": print}))).decode("ascii")
    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.print"):
        decode(blob)
