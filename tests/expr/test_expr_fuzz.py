"""Property-based fuzzing: whatever the input, the result is a value or a typed error.

Three properties, 10,500 generated inputs in all:
* random text (4,000) and grammar-shaped expressions with random names (4,000) are parsed,
  checked, compiled and evaluated, and every stage either succeeds or raises
  ``ExprError``/``EvalError``;
* on well-typed generated expressions (2,500) the compiled closures and the tree-walking
  interpreter agree, value for value and failure for failure.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import EvalError, ExprError
from kilo_rules.engine.frontend.expr import (
    BOOL,
    FLOAT,
    INT,
    STR,
    Type,
    check,
    compile_expr,
    compile_source,
    default_vocabulary,
    infer,
    interpret,
    list_of,
    nullable,
    parse,
)

RANDOM_TEXT_EXAMPLES = 4_000
SHAPED_EXAMPLES = 4_000
DIFFERENTIAL_EXAMPLES = 2_500

# Fixed seeds keep CI reproducible; raise the counts locally to search harder.
_FUZZ = settings(
    deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


def fuzz(examples: int) -> settings:
    return settings(_FUZZ, max_examples=examples)


VOCAB = default_vocabulary()


def _sample_value(t: Type) -> Any:
    base = t.non_null()
    return {"int": 1000, "float": 2.5, "str": "claude-x", "bool": True}.get(
        next(iter(base.kinds)) if len(base.kinds) == 1 else "float",
        ["text", "image"],
    )


CONTEXT = {name: _sample_value(t) for name, t in VOCAB.items()}
NULLS = {**CONTEXT, **{name: None for name, t in VOCAB.items() if t.nullable}}
ZEROS = {**CONTEXT, **{name: 0 for name, t in VOCAB.items() if t == INT}}


def _run_everything(text: str) -> None:
    """Parse, check, compile and evaluate ``text`` every way there is."""
    try:
        expr = parse(text)
    except ExprError:
        return
    # Unchecked first: the runtime must stay typed even when the checker was skipped.
    evaluators: list[Any] = []
    with contextlib.suppress(ExprError):
        evaluators.append(compile_expr(expr))
    result, diagnostics = infer(expr, VOCAB)
    check(expr, VOCAB, expected=BOOL)
    if not diagnostics:
        try:
            evaluators.append(compile_source(text, expected=result, vocab=VOCAB))
        except ExprError as exc:
            assert {d.code for d in exc.diagnostics} == {"expr.eval"}
    for evaluate in evaluators:
        for context in (CONTEXT, NULLS, ZEROS):
            with contextlib.suppress(EvalError):
                evaluate(context)


TOKENS = st.sampled_from(
    [
        "(",
        ")",
        "[",
        "]",
        ",",
        "+",
        "-",
        "*",
        "/",
        "//",
        "%",
        "==",
        "!=",
        "<",
        "<=",
        ">",
        ">=",
        "and",
        "or",
        "not",
        "in",
        "not in",
        "if",
        "else",
        "??",
        "contains",
        "startswith",
        "endswith",
        "matches",
        "true",
        "false",
        "null",
        "0",
        "1",
        "2.5",
        "1_000",
        "50KB",
        "5m",
        "'a'",
        '"b\\n"',
        "'(a+)+'",
        "model.limits.input",
        "model.id",
        "session.turns",
        "min",
        "clamp",
        "len",
        "lower",
        "round",
        "x",
        "model.limit.context",
        "=",
        "!",
        "&&",
        '"',
        ".",
        "\n",
        " ",
    ]
)


@pytest.mark.slow
def test_random_text() -> None:
    seen = 0

    @fuzz(RANDOM_TEXT_EXAMPLES // 2)
    @given(st.text(max_size=60))
    def any_text(text: str) -> None:
        nonlocal seen
        seen += 1
        _run_everything(text)

    @fuzz(RANDOM_TEXT_EXAMPLES // 2)
    @given(st.lists(TOKENS, max_size=25).map(" ".join))
    def token_soup(text: str) -> None:
        nonlocal seen
        seen += 1
        _run_everything(text)

    any_text()
    token_soup()
    assert seen >= RANDOM_TEXT_EXAMPLES


# --- grammar-shaped, untyped ------------------------------------------------------------

NAMES = st.one_of(
    st.sampled_from(sorted(VOCAB)),
    st.lists(
        st.sampled_from(["a", "model", "limits", "x_1", "budget", "if", "in"]),
        min_size=1,
        max_size=3,
    ).map(".".join),
)
ATOMS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        [
            "true",
            "false",
            "null",
            "50KB",
            "2GiB",
            "30s",
            "7d",
            "''",
            "'x'",
            "'(a|a)*'",
            "'[a-z]+'",
            "'claude'",
        ]
    ),
    NAMES,
)
FUNCTIONS = st.sampled_from(
    [
        "min",
        "max",
        "clamp",
        "floor",
        "ceil",
        "round",
        "abs",
        "len",
        "lower",
        "upper",
        "int",
        "float",
        "str",
        "any",
        "all",
        "coalesce",
        "sum",
        "regex_match",
        "nope",
        "model.id",
    ]
)
BINARY = st.sampled_from(
    [
        "+",
        "-",
        "*",
        "/",
        "//",
        "%",
        "==",
        "!=",
        "<",
        "<=",
        ">",
        ">=",
        "and",
        "or",
        "in",
        "not in",
        "contains",
        "startswith",
        "endswith",
        "matches",
        "??",
    ]
)


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, BINARY, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"-{e}"),
        inner.map(lambda e: f"not {e}"),
        st.tuples(FUNCTIONS, st.lists(inner, max_size=4)).map(
            lambda t: f"{t[0]}({', '.join(t[1])})"
        ),
        st.lists(inner, max_size=4).map(lambda items: f"[{', '.join(items)}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
    )


SHAPED = st.recursive(ATOMS, _extend, max_leaves=25)


@pytest.mark.slow
def test_grammar_shaped_expressions() -> None:
    seen = 0

    @fuzz(SHAPED_EXAMPLES)
    @given(SHAPED)
    def shaped(text: str) -> None:
        nonlocal seen
        seen += 1
        _run_everything(text)

    shaped()
    assert seen >= SHAPED_EXAMPLES


# --- well-typed: compiled == interpreted ------------------------------------------------

TYPED_VOCAB = default_vocabulary().extended(
    {
        "n.a": INT,
        "n.b": INT,
        "n.c": nullable(INT),
        "f.x": FLOAT,
        "s.a": STR,
        "s.b": STR,
        "b.a": BOOL,
        "l.i": list_of(INT),
        "l.s": list_of(STR),
    }
)
WORDS = st.text(alphabet="abcxyz-.", max_size=6)


def _p(template: str, *parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(*parts).map(lambda values: template.format(*values))


@cache
def typed(kind: str, depth: int) -> st.SearchStrategy[str]:
    """Expression text of type ``kind`` (int, float, str, bool), nested up to ``depth``."""
    leaves = {
        "int": st.one_of(
            st.integers(-50, 10**6).map(str),
            st.sampled_from(
                [
                    "n.a",
                    "n.b",
                    "50KB",
                    "1KiB",
                    "5m",
                    "1_000",
                    "model.limits.context",
                    "session.turns",
                    "(n.c ?? 3)",
                ]
            ),
        ),
        "float": st.one_of(
            st.floats(-1e3, 1e6, allow_nan=False).map(lambda f: f"{f:.4f}"),
            st.just("f.x"),
            st.just("(model.prices.input ?? 0.5)"),
        ),
        "str": st.one_of(WORDS.map(repr), st.sampled_from(["s.a", "s.b", "model.api_id"])),
        "bool": st.sampled_from(["true", "false", "b.a", "model.reasoning", "(n.c == null)"]),
    }
    if depth == 0:
        return leaves[kind]
    i, f, s, b = (typed(k, depth - 1) for k in ("int", "float", "str", "bool"))
    number = st.one_of(i, f)
    options: dict[str, list[st.SearchStrategy[str]]] = {
        "int": [
            _p("({} {} {})", i, st.sampled_from(["+", "-", "*", "//", "%"]), i),
            _p("-{}", i),
            _p("min({}, {})", i, i),
            _p("max({}, {}, {})", i, i, i),
            _p("clamp({}, {}, {})", i, i, i),
            _p("floor({})", number),
            _p("ceil({})", number),
            _p("round({})", number),
            _p("abs({})", i),
            _p("len({})", s),
            _p("int({})", number),
            _p("({} if {} else {})", i, b, i),
            _p("(n.c - {} if n.c != null else {})", i, i),
            _p("sum([{}, {}])", i, i),
            _p("max(l.i)", st.just("")),
            _p("coalesce(n.c, {})", i),
        ],
        "float": [
            _p("({} {} {})", number, st.sampled_from(["+", "-", "*"]), f),
            _p("({} / {})", number, number),
            _p("float({})", i),
            _p("({} if {} else {})", f, b, f),
        ],
        "str": [
            _p("({} + {})", s, s),
            _p("lower({})", s),
            _p("upper({})", s),
            _p("str({})", st.one_of(i, b, s)),
            _p("({} if {} else {})", s, b, s),
            _p("(model.prompt ?? {})", s),
        ],
        "bool": [
            _p("({} {} {})", number, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), number),
            _p(
                "({} {} {})",
                s,
                st.sampled_from(["==", "<", "in", "not in", "contains", "startswith", "endswith"]),
                s,
            ),
            _p("({} {} {})", b, st.sampled_from(["and", "or", "=="]), b),
            _p("(not {})", b),  # bare, `a == not b` would not parse
            _p("({} in l.i)", i),
            _p("(l.s contains {})", s),
            _p("({} matches {})", s, st.sampled_from(["'a.c'", "'^x'", "'(ab|c)$'", "'-'"])),
            _p("any([{}, {}])", b, b),
            _p("all([{}])", b),
            _p("({} if {} else {})", b, b, b),
            _p("(n.c != null and n.c > {})", i),
        ],
    }
    return st.one_of(leaves[kind], *options[kind])


CONTEXTS = st.fixed_dictionaries(
    {
        "n.a": st.integers(-5, 10**6),
        "n.b": st.integers(-5, 5),
        "n.c": st.one_of(st.none(), st.integers(-5, 100)),
        "f.x": st.floats(-100, 100, allow_nan=False),
        "s.a": WORDS,
        "s.b": WORDS,
        "b.a": st.booleans(),
        "l.i": st.lists(st.integers(-3, 3), max_size=3),
        "l.s": st.lists(WORDS, max_size=3),
        "model.limits.context": st.integers(0, 10**6),
        "session.turns": st.integers(0, 50),
        "model.prices.input": st.one_of(st.none(), st.floats(0, 100)),
        "model.api_id": WORDS,
        "model.reasoning": st.booleans(),
        "model.prompt": st.one_of(st.none(), WORDS),
    }
)
KINDS = {"int": INT, "float": FLOAT, "str": STR, "bool": BOOL}


def _outcome(evaluate: Any, context: dict[str, Any]) -> tuple[str, Any]:
    try:
        value = evaluate(context)
    except EvalError:
        return ("error", None)
    return ("value", (type(value), value))


@pytest.mark.slow
def test_compiled_matches_interpreter() -> None:
    seen = 0
    compiled_ok = 0

    @fuzz(DIFFERENTIAL_EXAMPLES)
    @given(
        st.sampled_from(sorted(KINDS)).flatmap(lambda k: st.tuples(st.just(k), typed(k, 3))),
        CONTEXTS,
    )
    def differential(case: tuple[str, str], context: dict[str, Any]) -> None:
        nonlocal seen, compiled_ok
        seen += 1
        kind, text = case
        try:
            compiled = compile_source(text, expected=KINDS[kind], vocab=TYPED_VOCAB)
        except ExprError as exc:
            # Well-typed by construction: only a constant that always fails may stop it.
            assert {d.code for d in exc.diagnostics} == {"expr.eval"}, exc.diagnostics
            return
        compiled_ok += 1
        assert _outcome(compiled, context) == _outcome(
            lambda ctx: interpret(compiled.expr, ctx), context
        ), text

    differential()
    assert seen >= DIFFERENTIAL_EXAMPLES
    assert compiled_ok >= DIFFERENTIAL_EXAMPLES * 0.8
