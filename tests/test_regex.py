"""kilo_rules.engine.base.regex: every pattern runs on RE2, in time linear in the text."""

from __future__ import annotations

import time

import pytest

from kilo_rules.engine.base.errors import KiloRulesError, Location
from kilo_rules.engine.base.regex import (
    CACHE_SIZE,
    MAX_PATTERN_LENGTH,
    RegexError,
    compile_regex,
    regex_problem,
)


@pytest.mark.parametrize(
    ("pattern", "subject"),
    [
        (".*.*.*.*.*.*.*.*.*.*x", "a" * 50_000),
        ("(a?){24}a{24}$", "a" * 50_000 + "b"),
        ("(a+)+$", "a" * 50_000 + "!"),
        ("(a|aa)*c", "a" * 50_000),
        ("^(\\w+\\s?)*$", "word " * 10_000 + "!"),
    ],
)
def test_backtracking_patterns_run_in_linear_time(pattern: str, subject: str) -> None:
    rx = compile_regex(pattern)
    started = time.perf_counter()
    assert rx.search(subject) is None
    # Python's re needs from seconds to longer than the universe for each of these.
    assert time.perf_counter() - started < 1.0


def test_search_semantics() -> None:
    assert compile_regex("gpt-(4|o1)").search("openai/gpt-4o") is not None
    assert compile_regex("^gpt").search("openai/gpt-4o") is None
    assert compile_regex("(?i)\\b(always|never)\\b").search("You must ALWAYS test") is not None
    assert compile_regex("é+").search("café") is not None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(a)\\1", "backreferences (\\1, (?P=name)) are not supported"),
        ("(?P<n>a)(?P=n)", "backreferences (\\1, (?P=name)) are not supported"),
        ("a(?=b)", "lookahead ((?=...), (?!...)) is not supported"),
        ("a(?!b)", "lookahead ((?=...), (?!...)) is not supported"),
        ("(?<=a)b", "lookbehind ((?<=...), (?<!...)) is not supported"),
        ("(?<!a)b", "lookbehind ((?<=...), (?<!...)) is not supported"),
        ("gpt-(4", "missing ): gpt-(4"),
        ("a{1001}", "invalid repetition size: {1001}"),
        ("a++", "bad repetition operator: ++"),
        ("\ud800", "the pattern is not valid text: surrogates not allowed"),
        ("x" * (MAX_PATTERN_LENGTH + 1), f"the limit is {MAX_PATTERN_LENGTH:,}"),
    ],
)
def test_patterns_re2_cannot_run_are_typed_located_errors(pattern: str, reason: str) -> None:
    assert reason in (regex_problem(pattern) or "")
    where = Location("p.yaml", 7, 26)
    with pytest.raises(RegexError) as caught:
        compile_regex(pattern, where, code="policy.regex")
    assert isinstance(caught.value, KiloRulesError)
    assert reason in caught.value.reason
    diag = caught.value.diagnostic
    assert (diag.code, diag.location) == ("policy.regex", where)
    assert reason in diag.message
    assert diag.hint is not None and "RE2" in diag.hint


def test_program_size_is_bounded() -> None:
    # Short, but a thousand copies of every Unicode letter class: refused at compile time.
    assert "pattern too large" in (regex_problem("\\pL{1000}") or "")
    assert "invalid repetition size" in (regex_problem("((a{100}){100}){100}") or "")


def test_compiled_patterns_are_cached_and_bounded() -> None:
    assert compile_regex("cache-me") is compile_regex("cache-me")
    for i in range(CACHE_SIZE + 10):
        compile_regex(f"p{i}")
    assert compile_regex("cache-me") is not None
    from kilo_rules.engine.base.regex import _compile

    assert _compile.cache_info().currsize <= CACHE_SIZE
