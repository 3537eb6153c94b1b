"""Compilation and evaluation: values, folding, runtime errors and fallbacks."""

from __future__ import annotations

from typing import Any

import pytest

from kilo_rules.engine.base.errors import EvalError, ExprError
from kilo_rules.engine.frontend.expr import (
    BOOL,
    FLOAT,
    INT,
    NO_FALLBACK,
    NUMBER,
    STR,
    CompiledExpr,
    Type,
    compile_expr,
    compile_source,
    default_vocabulary,
    interpret,
    list_of,
    nullable,
    parse,
    text_locate,
)

VOCAB = default_vocabulary().extended(
    {
        "budget.usable": INT,
        "output.max_tokens": INT,
        "threshold.percent": nullable(NUMBER),
    }
)

CONTEXT: dict[str, Any] = {
    "model.id": "anthropic/claude-sonnet-4-5",
    "model.api_id": "claude-sonnet-4-5",
    "model.provider": "anthropic",
    "model.limits.context": 200_000,
    "model.limits.input": None,
    "model.limits.output": 64_000,
    "model.prices.input": 3.0,
    "model.modalities": ["text", "image"],
    "model.prompt": None,
    "budget.usable": 168_000,
    "output.max_tokens": 32_000,
    "threshold.percent": 75,
    "session.last.count": 150_000,
    "request.mid_tool_loop": False,
}


def run(text: str, expected: Type, context: dict[str, Any] | None = None, **kw: Any) -> Any:
    compiled = compile_source(text, expected=expected, vocab=VOCAB, **kw)
    ctx = CONTEXT if context is None else context
    result = compiled(ctx)
    # The reference interpreter must agree on every example.
    assert interpret(compiled.expr, ctx) == result
    return result


@pytest.mark.parametrize(
    ("text", "expected", "value"),
    [
        (
            "model.limits.input - min(20000, output.max_tokens) if model.limits.input != null "
            "else model.limits.context - output.max_tokens",
            INT,
            168_000,
        ),
        ("clamp(floor(budget.usable * 0.25), 2000, 8000)", INT, 8000),
        ("clamp(floor(budget.usable * 0.01), 2000, 8000)", INT, 2000),
        ('model.api_id contains "claude" or model.provider == "anthropic"', BOOL, True),
        ('lower(model.api_id) contains "kimi"', BOOL, False),
        ('model.api_id matches "gpt-(4|o1|o3)"', BOOL, False),
        ('model.api_id matches "^claude-sonnet"', BOOL, True),
        (
            "session.last.count >= min(budget.usable, floor(model.limits.context * "
            "(threshold.percent ?? 100) / 100))",
            BOOL,
            True,
        ),
        ("(model.limits.input ?? model.limits.context) - 20_000", INT, 180_000),
        ('model.prompt ?? "default"', STR, "default"),
        ("round(2.5)", INT, 3),
        ("round(-2.5)", INT, -2),
        ("round(2.4999)", INT, 2),
        ("round(0.49999999999999994)", INT, 0),
        ("floor(-1.5)", INT, -2),
        ("ceil(1.2)", INT, 2),
        ("7 // 2", INT, 3),
        ("-7 // 2", INT, -4),
        ("-7 % 3", INT, 2),
        ("7 / 2", FLOAT, 3.5),
        ("abs(-3)", INT, 3),
        ("len('héllo')", INT, 5),
        ("len(model.modalities)", INT, 2),
        ("upper('ab') + lower('CD')", STR, "ABcd"),
        ("int('42') + int(2.9) + int(-2.9)", INT, 42),
        ("float('1.5')", FLOAT, 1.5),
        ("str(true) + str(null) + str(1.5) + str(['a'])", STR, 'truenull1.5["a"]'),
        ("any([false, true]) and all([true]) and not any([])", BOOL, True),
        ("sum([1, 2.5])", NUMBER, 3.5),
        ("max([3, 9, 4])", INT, 9),
        ("coalesce(null, model.limits.input, 7)", INT, 7),
        ('"image" in model.modalities', BOOL, True),
        ('"audio" not in model.modalities', BOOL, True),
        ('model.modalities contains "text"', BOOL, True),
        ('"sonnet" in model.api_id', BOOL, True),
        ('model.api_id startswith "claude" and model.api_id endswith "4-5"', BOOL, True),
        ("[1, 2] == [1, 2] and 1 == 1.0", BOOL, True),
        ("50KB + 1KiB + 1MB + 1MiB", INT, 50_000 + 1024 + 10**6 + 2**20),
        ("1h + 5m + 30s + 1d", INT, 3600 + 300 + 30 + 86400),
        ("'a' if false else 'b' if true else 'c'", STR, "b"),
        ("1 if request.mid_tool_loop else 2", INT, 2),
        ("[budget.usable, 1]", list_of(INT), [168_000, 1]),
        ("null", nullable(INT), None),
    ],
)
def test_values(text: str, expected: Type, value: Any) -> None:
    got = run(text, expected)
    assert got == value
    assert type(got) is type(value)


def test_constant_folding() -> None:
    compiled = compile_source("20_000 * 2", expected=INT, vocab=VOCAB)
    assert compiled.is_constant and compiled.constant == 40_000
    assert compiled({}) == 40_000
    compiled = compile_source("min(1h, 2 * 30m) + len([1, 2, 3])", expected=INT, vocab=VOCAB)
    assert compiled.is_constant and compiled.constant == 3603
    compiled = compile_source("budget.usable - 20_000 * 2", expected=INT, vocab=VOCAB)
    assert not compiled.is_constant
    with pytest.raises(ValueError, match="not constant"):
        _ = compiled.constant
    # Short-circuits fold even when the other side reads names.
    assert compile_source("false and model.reasoning", expected=BOOL, vocab=VOCAB).is_constant
    assert compile_source("true or model.reasoning", expected=BOOL, vocab=VOCAB).is_constant
    assert compile_source("1 if true else budget.usable", expected=INT, vocab=VOCAB).constant == 1
    assert compile_source("5 ?? budget.usable", expected=INT, vocab=VOCAB).constant == 5


def test_constant_lists_are_not_shared() -> None:
    compiled = compile_source("[1, 2]", expected=list_of(INT), vocab=VOCAB)
    first = compiled({})
    first.append(3)
    assert compiled({}) == [1, 2]


def test_constant_that_always_fails_is_a_compile_error() -> None:
    with pytest.raises(ExprError) as info:
        compile_source("budget.usable + 1 // 0", expected=INT, vocab=VOCAB)
    diagnostic = info.value.diagnostic
    assert diagnostic.code == "expr.eval"
    assert "division by zero" in diagnostic.message
    assert diagnostic.location.col == len("budget.usable + ") + 1


@pytest.mark.parametrize(
    ("text", "expected", "context", "fragment"),
    [
        ("budget.usable // (output.max_tokens - 32000)", INT, {}, "division by zero"),
        ("budget.usable % (output.max_tokens - 32000)", INT, {}, "division by zero"),
        ("budget.usable / (output.max_tokens - 32000)", FLOAT, {}, "division by zero"),
        (
            "budget.usable * budget.usable * budget.usable * budget.usable",
            INT,
            {"budget.usable": 10**6},
            "out of range",
        ),
        ("budget.usable * 1e10 * 1e10", FLOAT, {}, "out of range"),
        ("clamp(budget.usable, 10, 5)", INT, {}, "lower bound 10 is above upper bound 5"),
        ("int(model.id)", INT, {}, "int() cannot read"),
        ("float(model.id)", FLOAT, {"model.id": "inf"}, "out of range"),
    ],
)
def test_runtime_errors(text: str, expected: Type, context: dict[str, Any], fragment: str) -> None:
    compiled = compile_source(text, expected=expected, vocab=VOCAB)
    ctx = {**CONTEXT, **context}
    with pytest.raises(EvalError) as info:
        compiled(ctx)
    diagnostic = info.value.diagnostic
    assert diagnostic.code == "expr.eval"
    assert fragment in diagnostic.message
    assert f"(in `{text}`)" in diagnostic.message
    with pytest.raises(EvalError):
        interpret(compiled.expr, ctx)


def test_empty_list_fails_at_runtime() -> None:
    vocab = VOCAB.extended({"sizes": list_of(INT)})
    compiled = compile_source("max(sizes)", expected=INT, vocab=vocab)
    assert compiled({"sizes": [3, 1]}) == 3
    with pytest.raises(EvalError, match=r"max\(\) of an empty list"):
        compiled({"sizes": []})


def test_runtime_error_location_and_details() -> None:
    text = "budget.usable +\n  1 // (output.max_tokens - 32000)"
    compiled = compile_source(
        text, expected=INT, vocab=VOCAB, locate=text_locate(text, "policy.yaml", 10, 15, indent=2)
    )
    with pytest.raises(EvalError) as info:
        compiled(CONTEXT)
    diagnostic = info.value.diagnostic
    assert (diagnostic.location.file, diagnostic.location.line, diagnostic.location.col) == (
        "policy.yaml",
        11,
        5,
    )
    assert diagnostic.details["subexpression"] == "1 // (output.max_tokens - 32000)"
    assert diagnostic.details["expression"] == text


def test_fallback_replaces_runtime_failures() -> None:
    compiled = compile_source(
        "budget.usable // (output.max_tokens - 32000)", expected=INT, vocab=VOCAB, fallback=0
    )
    assert compiled(CONTEXT) == 0
    assert compiled({**CONTEXT, "output.max_tokens": 32_001}) == 168_000


def test_fallback_does_not_hide_missing_names() -> None:
    compiled = compile_source("budget.usable * 2", expected=INT, vocab=VOCAB, fallback=0)
    with pytest.raises(EvalError) as info:
        compiled({})
    assert info.value.diagnostic.details["kind"] == "missing-name"
    assert "no value for budget.usable" in info.value.diagnostic.message


def test_fallback_must_fit_the_expected_type() -> None:
    with pytest.raises(ExprError) as info:
        compile_source("budget.usable", expected=INT, vocab=VOCAB, fallback="zero")
    assert "fallback" in info.value.diagnostic.message
    compile_source("budget.usable", expected=nullable(INT), vocab=VOCAB, fallback=None)


def test_null_reaching_arithmetic_at_runtime() -> None:
    # A context that breaks the vocabulary's promise is still a typed error, never a crash.
    compiled = compile_source("budget.usable + 1", expected=INT, vocab=VOCAB)
    with pytest.raises(EvalError) as info:
        compiled({"budget.usable": None})
    assert "budget.usable is null" in info.value.diagnostic.message


def test_compile_expr_without_check_still_fails_cleanly() -> None:
    compiled = compile_expr(parse("a + b"))
    assert compiled({"a": 1, "b": 2}) == 3
    with pytest.raises(EvalError, match="cannot be applied to int and str"):
        compiled({"a": 1, "b": "x"})
    with pytest.raises(EvalError):
        compile_expr(parse("a and b"))({"a": 1, "b": True})
    with pytest.raises(EvalError):
        compile_expr(parse("x * 'ab'"))({"x": 10**9})
    with pytest.raises(ExprError) as info:
        compile_expr(parse("nope(1)"))
    assert info.value.diagnostic.code == "expr.unknown-function"


def test_compiled_metadata() -> None:
    compiled = compile_source(
        "budget.usable + model.limits.context + budget.usable", expected=INT, vocab=VOCAB
    )
    assert isinstance(compiled, CompiledExpr)
    assert compiled.names == ("budget.usable", "model.limits.context")
    assert compiled.type == INT
    assert compiled.fallback is NO_FALLBACK
    assert compiled.text.startswith("budget.usable")
    assert compiled.evaluate(CONTEXT) == 2 * 168_000 + 200_000


def test_regex_is_checked_at_runtime_when_not_literal() -> None:
    vocab = VOCAB.extended({"pattern": STR})
    compiled = compile_source("model.id matches pattern", expected=BOOL, vocab=vocab)
    assert compiled({**CONTEXT, "pattern": "claude"}) is True
    with pytest.raises(EvalError, match="backreferences") as caught:
        compiled({**CONTEXT, "pattern": "(a)\\1"})
    assert caught.value.diagnostic.code == "expr.eval"
    with pytest.raises(EvalError, match="lookahead"):
        compiled({**CONTEXT, "pattern": "a(?=b)"})


@pytest.mark.parametrize(
    ("source", "subject"),
    [
        ('model.id matches ".*.*.*.*.*.*.*.*.*.*x"', "a" * 20_000),
        ('model.id matches "(a?){24}a{24}$"', "a" * 20_000 + "b"),
        ('regex_match(model.id, "(a|aa)*c")', "a" * 20_000),
    ],
)
def test_patterns_that_backtrack_run_in_linear_time(source: str, subject: str) -> None:
    """These take seconds to years under a backtracking engine; RE2 answers at once."""
    import time

    compiled = compile_source(source, expected=BOOL, vocab=VOCAB)
    started = time.perf_counter()
    assert compiled({**CONTEXT, "model.id": subject}) is False
    assert time.perf_counter() - started < 1.0
