"""The vocabulary, free names, definition order and the public surface."""

from __future__ import annotations

import pytest

import kilo_rules.engine.frontend.expr as expr_api
from kilo_rules.engine.base.errors import ExprError, Location
from kilo_rules.engine.formats.catalog import Limits, ModelInfo, Prices
from kilo_rules.engine.frontend.expr import (
    INT,
    STR,
    Vocabulary,
    default_vocabulary,
    free_names,
    model_values,
    nullable,
    order_definitions,
    parse,
    text_locate,
)


def test_public_names_are_sorted_and_importable() -> None:
    assert expr_api.__all__ == sorted(
        expr_api.__all__, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n)
    )
    for name in expr_api.__all__:
        assert getattr(expr_api, name) is not None


def test_default_vocabulary_has_the_documented_names() -> None:
    vocab = default_vocabulary()
    assert vocab["model.limits.input"] == nullable(INT)
    assert vocab["model.prompt"] == nullable(STR)
    assert vocab["session.last.count"] == INT
    assert vocab["request.max_steps"] == nullable(INT)
    assert vocab["agent.name"] == STR
    assert vocab["env.platform"] == STR
    assert vocab["config.output_token_max"] == nullable(INT)
    assert all(vocab.doc(name) for name in vocab)
    assert vocab.is_group("model.limits") and not vocab.is_group("model.limits.input")
    assert "model.limits.context" in vocab.members("model")


def test_every_model_field_is_a_name() -> None:
    model = ModelInfo(
        id="anthropic/claude-x",
        provider="anthropic",
        family="claude",
        api_id="claude-x",
        api="anthropic",
        limits=Limits(context=200_000, output=64_000),
        prices=Prices(input=3, output=15),
    )
    values = model_values(model)
    vocab = default_vocabulary()
    model_names = {name for name in vocab if name.startswith("model.")}
    assert set(values) == model_names
    rest = {name: None for name in vocab if name not in values}
    problems = vocab.check_context({**values, **rest})
    assert all(not p.startswith("model.") for p in problems), problems
    no_prices = model.model_copy(update={"prices": None})
    assert model_values(no_prices)["model.prices.input"] is None


def test_check_context_reports_missing_and_wrong_types() -> None:
    vocab = Vocabulary({"a.b": INT, "c": (STR, "a string")})
    assert vocab.check_context({"a.b": "x"}) == ["a.b: expected int, got str", "c: missing"]
    assert vocab.check_context({"a.b": 1, "c": "x"}) == []


def test_extended() -> None:
    vocab = default_vocabulary().extended({"budget.usable": INT})
    assert vocab["budget.usable"] == INT
    assert "budget.usable" not in default_vocabulary()
    with pytest.raises(ValueError, match="already defined"):
        vocab.extended({"model.id": STR})
    with pytest.raises(ValueError, match="not a valid"):
        vocab.extended({"not.a": INT})
    with pytest.raises(ValueError, match="not a valid"):
        vocab.extended({"a..b": INT})


def test_free_names_in_source_order_once() -> None:
    text = "b + a.x * min(b, c) if d else a.x"
    names = free_names(parse(text, locate=text_locate(text, "f.yaml", 3, 10)))
    assert [n for n, _ in names] == ["b", "a.x", "c", "d"]
    assert names[1][1] == Location("f.yaml", 3, 14, 3, 17)


def _defs(**sources: str) -> dict[str, expr_api.Expr]:
    return {name.replace("_", "."): parse(text) for name, text in sources.items()}


def test_order_definitions() -> None:
    defs = _defs(
        output_max="min(model.limits.output, 32000)",
        budget_usable="model.limits.context - output.max",
        threshold="budget.usable * 0.9",
        unrelated="1",
    )
    assert order_definitions(defs) == ["output.max", "budget.usable", "threshold", "unrelated"]
    reversed_defs = dict(reversed(list(defs.items())))
    order = order_definitions(reversed_defs)
    assert order.index("output.max") < order.index("budget.usable") < order.index("threshold")


def test_cycle_is_located_at_the_reference() -> None:
    defs = {
        "a": parse("b + 1"),
        "b": parse("1 + c", locate=text_locate("1 + c", "p.yaml", 9, 8)),
        "c": parse("a * 2"),
    }
    with pytest.raises(ExprError) as info:
        order_definitions(defs)
    diagnostic = info.value.diagnostic
    assert diagnostic.code == "expr.cycle"
    assert "a -> b -> c -> a" in diagnostic.message
    assert diagnostic.details["cycle"] == ["a", "b", "c", "a"]
    defs = {"x": parse("1"), "a": parse("b"), "b": parse("x + b")}
    with pytest.raises(ExprError) as info:
        order_definitions(defs)
    assert info.value.diagnostic.message == "b refers to itself"
    assert info.value.diagnostic.location.col == 5


def test_docs_list_every_name_and_function() -> None:
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "expressions.md").read_text("utf-8")
    for name in default_vocabulary():
        assert f"| `{name}` |" in docs, name
    for name in expr_api.FUNCTIONS:
        assert f"| `{name}(" in docs, name
