"""Runs ``bad_expressions.yaml``: each bad expression and the first diagnostic it gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kilo_rules.engine.base.errors import ExprError
from kilo_rules.engine.frontend.expr import (
    BOOL,
    FLOAT,
    INT,
    NUMBER,
    STR,
    Type,
    compile_source,
    default_vocabulary,
    text_locate,
)
from kilo_rules.engine.frontend.expr.types import ANY

CORPUS = yaml.safe_load((Path(__file__).parent / "bad_expressions.yaml").read_text("utf-8"))
TYPES = {"int": INT, "float": FLOAT, "number": NUMBER, "str": STR, "bool": BOOL}
VOCAB = default_vocabulary().extended(
    {name: TYPES[kind] for name, kind in CORPUS["vocabulary_extra"].items()}
)


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS["cases"]) >= 40
    assert sum(1 for case in CORPUS["cases"] if "\n" in case["expr"]) >= 3


@pytest.mark.parametrize("case", CORPUS["cases"], ids=lambda case: case["expr"][:40])
def test_bad_expression(case: dict[str, Any]) -> None:
    at = case.get("at", {})
    locate = text_locate(
        case["expr"], "policy.yaml", at.get("line", 1), at.get("col", 1), at.get("indent", 0)
    )
    expected: Type = TYPES[case["expected"]] if "expected" in case else ANY
    with pytest.raises(ExprError) as info:
        compile_source(case["expr"], expected=expected, vocab=VOCAB, locate=locate)
    first = info.value.diagnostic
    want = case["want"]
    got = {"code": first.code, "line": first.location.line, "col": first.location.col}
    assert got == {k: want[k] for k in ("code", "line", "col")}, first
    text = first.message + (f" ({first.hint})" if first.hint else "")
    assert want["message"] in text, first
    assert first.location.file == "policy.yaml"
