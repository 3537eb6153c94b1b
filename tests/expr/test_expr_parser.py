"""Parsing: literals, precedence, locations, limits and the syntax-error table."""

from __future__ import annotations

import pytest

from kilo_rules.engine.base.errors import ExprError, Location
from kilo_rules.engine.frontend.expr import GRAMMAR_ERRORS, LIMITS, parse, text_locate
from kilo_rules.engine.frontend.expr.nodes import Binary, Conditional, Literal, Name, Unary


def value(text: str) -> object:
    root = parse(text).root
    assert isinstance(root, Literal)
    return root.value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1_000", 1000),
        ("20_000", 20000),
        ("1.5", 1.5),
        ("2e3", 2000.0),
        ("1_0.2_5", 10.25),
        ('"a\\"b"', 'a"b'),
        ("'it\\'s'", "it's"),
        ('"tab\\there"', "tab\there"),
        ('"\\u00e9"', "é"),
        ('"\\d+"', "\\d+"),
        ("true", True),
        ("false", False),
        ("null", None),
        ("50KB", 50_000),
        ("50KiB", 51_200),
        ("2MB", 2_000_000),
        ("2MiB", 2 * 1024 * 1024),
        ("1GB", 10**9),
        ("1GiB", 2**30),
        ("1.5MB", 1_500_000),
        ("100B", 100),
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("7d", 7 * 86400),
        ("1.5h", 5400),
    ],
)
def test_literals(text: str, expected: object) -> None:
    got = value(text)
    assert got == expected
    assert type(got) is type(expected)


def test_precedence() -> None:
    root = parse("a or b and not c == d ?? e + f * -g").root
    assert isinstance(root, Binary) and root.op == "or"
    right = root.right
    assert isinstance(right, Binary) and right.op == "and"
    negated = right.right
    assert isinstance(negated, Unary) and negated.op == "not"
    eq = negated.operand
    assert isinstance(eq, Binary) and eq.op == "=="
    coalesce = eq.right
    assert isinstance(coalesce, Binary) and coalesce.op == "??"
    add = coalesce.right
    assert isinstance(add, Binary) and add.op == "+"
    mul = add.right
    assert isinstance(mul, Binary) and mul.op == "*"
    assert isinstance(mul.right, Unary) and mul.right.op == "-"


def test_conditional_and_coalesce_group_right() -> None:
    root = parse("a if b else c if d else e").root
    assert isinstance(root, Conditional) and isinstance(root.orelse, Conditional)
    root = parse("a ?? b ?? c").root
    assert isinstance(root, Binary) and isinstance(root.right, Binary)
    root = parse("a - b - c").root
    assert isinstance(root, Binary) and isinstance(root.left, Binary)


def test_not_in_and_string_operators() -> None:
    for op in ("in", "not in", "contains", "startswith", "endswith", "matches"):
        root = parse(f"a {op} b").root
        assert isinstance(root, Binary) and root.op == op


def test_dotted_names_are_single_tokens() -> None:
    root = parse("model.limits.context").root
    assert isinstance(root, Name) and root.name == "model.limits.context"
    with pytest.raises(ExprError):
        parse("model. limits")


def test_spans_cover_brackets_and_operators() -> None:
    expr = parse("-x + (y)")
    assert expr.source(expr.root) == "-x + (y)"
    assert isinstance(expr.root, Binary)
    assert expr.source(expr.root.right) == "(y)"
    expr = parse("min([1, 2])")
    assert expr.source(expr.root) == "min([1, 2])"


def test_default_locate_is_multiline_aware() -> None:
    with pytest.raises(ExprError) as info:
        parse("a +\n  b +\n  * c")
    assert info.value.diagnostic.location.line == 3
    assert info.value.diagnostic.location.col == 3


def test_locate_maps_into_the_file() -> None:
    locate = text_locate("x ==", file="p.yaml", line=7, col=12)
    with pytest.raises(ExprError) as info:
        parse("x ==", locate=locate)
    loc = info.value.diagnostic.location
    assert (loc.file, loc.line, loc.col) == ("p.yaml", 7, 16)


def test_block_scalar_locate() -> None:
    text = "a and\nb and\nc d\n"
    locate = text_locate(text, file="p.yaml", line=4, col=5, indent=4)
    assert locate(0) == Location("p.yaml", 4, 5)
    assert locate(6) == Location("p.yaml", 5, 5)
    with pytest.raises(ExprError) as info:
        parse(text, locate=locate)
    loc = info.value.diagnostic.location
    assert (loc.line, loc.col) == (6, 7)


@pytest.mark.parametrize(
    ("message", "example"),
    [(message, example) for message, examples in GRAMMAR_ERRORS.items() for example in examples],
)
def test_grammar_error_table(message: str, example: str) -> None:
    with pytest.raises(ExprError) as info:
        parse(example)
    diagnostic = info.value.diagnostic
    assert diagnostic.code == "expr.syntax"
    assert diagnostic.message.startswith(message), (example, diagnostic.message)


def test_error_table_messages_are_distinct_from_the_fallback() -> None:
    with pytest.raises(ExprError) as info:
        parse("else")
    assert info.value.diagnostic.message == "unexpected 'else'"
    assert "a name" in info.value.diagnostic.details["expected"]


@pytest.mark.parametrize(
    "text",
    [
        "(" * (LIMITS.max_depth + 1) + "1" + ")" * (LIMITS.max_depth + 1),
        "[" * (LIMITS.max_depth + 1),
        "-" * 3000 + "1",
        "not " * 1000 + "true",
        " + ".join(["a"] * 1000),
        "a" * (LIMITS.max_length + 1),
        "[" + ", ".join(["1"] * (LIMITS.max_list_items + 1)) + "]",
        "99999999999999999999",
        "1e400",
        "9999999999GiB",
    ],
)
def test_limits(text: str) -> None:
    with pytest.raises(ExprError) as info:
        parse(text)
    assert info.value.diagnostic.code == "expr.limit"


def test_within_limits() -> None:
    depth = LIMITS.max_depth - 1
    parse("(" * depth + "1" + ")" * depth)
    parse("[" + ", ".join(["1"] * LIMITS.max_list_items) + "]")
    parse(str(LIMITS.max_int))
