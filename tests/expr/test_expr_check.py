"""Static checking: names, types, null safety, functions and regexes."""

from __future__ import annotations

import pytest

from kilo_rules.engine.frontend.expr import (
    BOOL,
    FLOAT,
    INT,
    NUMBER,
    STR,
    Type,
    check,
    default_vocabulary,
    infer,
    list_of,
    nullable,
    parse,
)

VOCAB = default_vocabulary().extended({"budget.usable": INT, "output.max_tokens": INT})


def type_of(text: str) -> Type:
    result, diagnostics = infer(parse(text), VOCAB)
    assert diagnostics == [], diagnostics
    return result


def codes(text: str, expected: Type | None = None) -> list[str]:
    return [d.code for d in check(parse(text), VOCAB, expected=expected)]


def only(text: str, expected: Type | None = None) -> tuple[str, str, str | None]:
    diagnostics = check(parse(text), VOCAB, expected=expected)
    assert len(diagnostics) == 1, diagnostics
    return diagnostics[0].code, diagnostics[0].message, diagnostics[0].hint


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2", INT),
        ("1 + 2.0", FLOAT),
        ("7 / 2", FLOAT),
        ("7 // 2", INT),
        ("7 % 2", INT),
        ("-model.limits.context", INT),
        ('"a" + model.id', STR),
        ("model.limits.input ?? model.limits.context", INT),
        ("model.prices.input ?? 0", NUMBER),
        ("model.limits.input ?? null", nullable(INT)),
        ("null ?? 3", INT),
        ("1 if model.reasoning else 2.5", NUMBER),
        ("1 if model.reasoning else null", nullable(INT)),
        ("[1, 2]", list_of(INT)),
        ("[1, null]", list_of(nullable(INT))),
        ("[]", list_of(Type(frozenset()))),
        ("min(1, 2)", INT),
        ("max(1, 2.5)", NUMBER),
        ("min([1, 2])", INT),
        ("clamp(floor(budget.usable * 0.25), 2000, 8000)", INT),
        ("round(1.5)", INT),
        ("abs(-1.5)", FLOAT),
        ("len(model.modalities)", INT),
        ("len(model.id)", INT),
        ("str(model.limits.input)", STR),
        ("int('3')", INT),
        ("float(3)", FLOAT),
        ("any([true, false])", BOOL),
        ("all([])", BOOL),
        ("sum([1, 2])", INT),
        ("coalesce(model.limits.input, 0)", INT),
        ("coalesce(model.limits.input, config.output_token_max)", nullable(INT)),
        ("model.limits.input == null", BOOL),
        ('"image" in model.modalities', BOOL),
        ('"gpt" in model.api_id', BOOL),
        ('model.api_id contains "gpt" and not (model.api_id contains "codex")', BOOL),
        ('model.api_id matches "gpt-(4|o1|o3)"', BOOL),
        ('regex_match(model.api_id, "^claude")', BOOL),
        ("model.name == model.id", BOOL),
        ("model.limits.input == model.limits.context", BOOL),
        ("5m > 30s", BOOL),
        ('"a" < "b"', BOOL),
    ],
)
def test_types(text: str, expected: Type) -> None:
    assert type_of(text) == expected


def test_narrowing_after_null_test() -> None:
    usable = (
        "model.limits.input - min(20000, output.max_tokens) if model.limits.input != null "
        "else model.limits.context - output.max_tokens"
    )
    assert type_of(usable) == INT
    assert (
        type_of("model.limits.context if model.limits.input == null else model.limits.input") == INT
    )
    assert type_of("model.limits.input != null and model.limits.input > 100") == BOOL
    assert type_of("model.limits.input == null or model.limits.input > 100") == BOOL
    assert type_of("not (model.limits.input == null) and model.limits.input > 1") == BOOL
    # The narrowing does not leak to the other branch.
    assert codes("model.limits.input if model.limits.input == null else 0", INT) == ["expr.type"]
    assert codes("model.limits.input != null or model.limits.input > 100") == ["expr.type"]


def test_unknown_name_suggests() -> None:
    code, message, hint = only("model.limit.context")
    assert code == "expr.unknown-name"
    assert message == "unknown name model.limit.context"
    assert hint == "did you mean model.limits.context?"


def test_group_name() -> None:
    code, message, hint = only("model.limits + 1")
    assert code == "expr.unknown-name"
    assert "group" in message
    assert hint is not None and "model.limits.context" in hint


def test_extended_names_are_known() -> None:
    assert codes("budget.usable * 2") == []
    assert codes("budget.usable * 2", INT) == []
    assert codes("budget.unusable") == ["expr.unknown-name"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("model.id > 3", "cannot compare str with int"),
        ("model.id == 3", "can never be equal"),
        ("1 + true", "'+' needs a number"),
        ('1 + "a"', "'+' on strings needs a string"),
        ("-model.id", "'-' needs a number"),
        ("not 1", "'not' needs a bool"),
        ("1 and true", "'and' needs a bool"),
        ("1 if 2 else 3", "the condition needs a bool"),
        ("1 if true else 'a'", "both branches must have one type"),
        ("[1, 'a']", "list items must all have one type"),
        ("3 in model.modalities", "can never be in"),
        ("3 in model.id", "'in' on a string needs a string"),
        ("1 in 2", "needs a string or a list"),
        ("model.id startswith 1", "'startswith' needs a string"),
        ("lower(1)", "lower(): argument 1 is int"),
        ("min('a', 'b')", "min(): argument 1 is str"),
        ("min(model.id)", "a list of numbers"),
        ("any([1])", "a list of booleans"),
        ("coalesce(1, 'a')", "does not mix"),
        ("model.limits.input ?? 'x'", "both sides of '??'"),
        ("model.limits.input + 1", "model.limits.input may be null"),
        ("floor(model.prices.input)", "may be null"),
        ("model.limits.input > 5", "may be null"),
        ("config.compaction.auto and true", "may be null"),
    ],
)
def test_type_errors(text: str, fragment: str) -> None:
    code, message, _ = only(text)
    assert code == "expr.type"
    assert fragment in message, message


def test_null_hint() -> None:
    _, _, hint = only("model.limits.input * 2")
    assert hint is not None and "model.limits.input ?? ..." in hint


def test_expected_type() -> None:
    assert codes("model.reasoning", BOOL) == []
    assert codes("1", FLOAT) == []  # ints widen to floats
    code, message, _ = only("1.5", INT)
    assert (code, message) == ("expr.type", "expected int, but this expression is float")
    code, message, hint = only("budget.usable * 0.5", INT)
    assert hint is not None and "floor()" in hint
    code, message, hint = only("model.limits.input", INT)
    assert "may be null" in message
    assert codes("model.limits.input", nullable(INT)) == []
    assert codes("model.limits.context", BOOL) == ["expr.type"]


def test_functions_arity_and_names() -> None:
    code, message, hint = only("clamp(1, 2)")
    assert (code, message) == ("expr.arity", "clamp() takes 3 arguments, got 2")
    assert hint == "clamp(x, lo, hi: number) -> number"
    assert only("min()")[0] == "expr.arity"
    code, message, hint = only("flor(1.5)")
    assert (code, message, hint) == (
        "expr.unknown-function",
        "unknown function flor()",
        "did you mean floor()?",
    )
    assert only("model.limits.context(1)")[0] == "expr.unknown-function"


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("(a)\\1", "backreferences"),
        ("(?P<x>a)(?P=x)", "backreferences"),
        ("foo(?=bar)", "lookahead"),
        ("(?!x)y", "lookahead"),
        ("(?<=a)b", "lookbehind"),
        ("(?<!a)b", "lookbehind"),
        ("a++", "bad repetition operator"),
        ("a{1001}", "invalid repetition size"),
        ("\\Z", "invalid escape sequence"),
        ("[", "invalid regular expression: missing ]"),
        ("a{", None),
        ("x" * 513, "limit of 512"),
    ],
)
def test_regex_checks(pattern: str, fragment: str | None) -> None:
    text = f"model.id matches {pattern!r}"
    diagnostics = check(parse(text), VOCAB)
    if fragment is None:
        assert diagnostics == []
        return
    assert [d.code for d in diagnostics] == ["expr.regex"]
    assert fragment in diagnostics[0].message
    assert diagnostics[0].location.col == len("model.id matches ") + 1


@pytest.mark.parametrize(
    "pattern",
    [
        "gpt-(4|o1|o3)",
        "^claude-[0-9]+(\\.[0-9]+)?$",
        "(ab)+",
        "[(a+)+]*",
        "(a+)?",
        "\\d+-\\d+",
        "(?i)kimi",
        # Exponential under a backtracking engine, linear under RE2.
        "(a+)+$",
        "(a|aa)*b",
        "(?:x+y?)+z",
        ".*.*.*.*.*.*.*.*.*.*x",
        "(a?){24}a{24}$",
    ],
)
def test_safe_regexes_pass(pattern: str) -> None:
    assert codes(f"model.id matches {pattern!r}") == []
    assert codes(f"regex_match(model.id, {pattern!r})") == []


def test_errors_are_collected_and_sorted() -> None:
    diagnostics = check(parse("lower(1) + model.limit.context + fo(1)"), VOCAB)
    assert [(d.code, d.location.col) for d in diagnostics] == [
        ("expr.type", 7),
        ("expr.unknown-name", 12),
        ("expr.unknown-function", 34),
    ]


def test_one_mistake_is_reported_once() -> None:
    assert codes("clamp(floor(nope * 2) + 1, 0, 10) > 3") == ["expr.unknown-name"]
