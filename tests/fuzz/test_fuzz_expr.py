"""Expression strings through every stage — parse, check, compile, evaluate (compiled and
interpreted) — end as a value or as the package's typed error, never anything else; and a
literal pattern ``check`` accepts never fails to compile at run time."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.engine.base.regex import RegexError, compile_regex
from kilo_rules.engine.frontend.expr import (
    BOOL,
    check,
    compile_expr,
    compile_source,
    infer,
    interpret,
    parse,
)
from tests.expr.test_expr_fuzz import CONTEXT, NULLS, SHAPED, TOKENS, VOCAB, ZEROS
from tests.fuzz.budget import FUZZ

#: Patterns that backtrack exponentially in Python's re, and ones RE2 refuses.
REGEX_LITERALS = st.sampled_from(
    [
        "'.*.*.*.*.*.*.*.*.*.*x'",
        "'(a?){24}a{24}$'",
        "'(a+)+$'",
        "'(a|aa)*c'",
        "'(x)\\\\1'",
        "'a(?=b)'",
        "'(?<!a)b'",
        "'a{1001}'",
        "'\\\\pL{1000}'",
        "'(?i)claude'",
        "'['",
        "'\\\\Z'",
    ]
)
SOUP = st.lists(st.one_of(TOKENS, REGEX_LITERALS), max_size=25).map(" ".join)
# A long subject, so that a pattern that backtracks would show as a hung test.
LONG = {**CONTEXT, "model.id": "a" * 5_000, "model.api_id": "a" * 5_000 + "!"}


def _everything(text: str) -> None:
    """Every stage on ``text``; only typed errors may escape a stage."""
    try:
        expr = parse(text)
    except KiloRulesError as exc:
        assert exc.diagnostics
        return
    evaluators: list[Any] = [lambda ctx: interpret(expr, ctx)]
    with contextlib.suppress(KiloRulesError):  # a constant part that always fails
        evaluators.append(compile_expr(expr))
    result, problems = infer(expr, VOCAB)
    check(expr, VOCAB, expected=BOOL)
    if not problems:
        try:
            evaluators.append(compile_source(text, expected=result, vocab=VOCAB))
        except KiloRulesError as exc:
            assert {d.code for d in exc.diagnostics} == {"expr.eval"}
    for evaluate in evaluators:
        for context in (CONTEXT, NULLS, ZEROS, LONG):
            try:
                evaluate(context)
            except KiloRulesError as exc:
                assert exc.diagnostics


@pytest.mark.slow
@FUZZ
@given(st.text(max_size=80))
def test_any_text(text: str) -> None:
    _everything(text)


@pytest.mark.slow
@FUZZ
@given(SOUP)
def test_token_soup_with_hostile_patterns(text: str) -> None:
    _everything(text)


@pytest.mark.slow
@FUZZ
@given(st.one_of(SHAPED, st.tuples(SHAPED, REGEX_LITERALS).map(lambda t: f"{t[0]} matches {t[1]}")))
def test_grammar_shaped(text: str) -> None:
    _everything(text)


def _literal(pattern: str) -> str:
    escaped = pattern.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


PATTERNS = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="ab()[]{}|*+?.^$\\1-9=!<PZ:,dws", max_size=30),
)


@pytest.mark.slow
@FUZZ
@given(PATTERNS)
def test_literal_patterns_check_agrees_with_run_time(pattern: str) -> None:
    for text in (
        f"model.id matches {_literal(pattern)}",
        f"regex_match(model.id, {_literal(pattern)})",
    ):
        try:
            expr = parse(text)
        except KiloRulesError:
            continue  # e.g. a pattern that makes the literal longer than an expression may be
        refused = [d for d in check(expr, VOCAB, expected=BOOL) if d.code == "expr.regex"]
        try:
            compile_regex(pattern)
            compiles = len(pattern) <= 512
        except RegexError as exc:
            assert exc.diagnostic.code == "regex.invalid"
            compiles = False
        assert bool(refused) == (not compiles), (pattern, refused)
        if compiles:
            for context in (CONTEXT, LONG):
                value = compile_source(text, expected=BOOL, vocab=VOCAB)(context)
                assert isinstance(value, bool)
