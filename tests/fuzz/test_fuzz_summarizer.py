"""Fuzz the summarizer's reply parser: whatever body a server sends, only a summary string
or a SummarizerError comes out (never a KeyError, TypeError or RecursionError)."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.summarizers.http import reply_text
from kilo_rules.engine.summarizers.protocol import SummarizerError
from tests.fuzz.budget import FUZZ

Kind = Literal["openai", "anthropic"]
KINDS = st.sampled_from(["openai", "anthropic"])
MAX_CHARS = 50

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["text", "type", "content", "x"]), inner, max_size=4)
    ),
    max_leaves=20,
)
# Text parts of either API, with values of any type where the strings should be.
parts = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "thinking", "image"]) | values},
        optional={"text": values | st.text(max_size=80)},
    )
    | values,
    max_size=4,
)
content = st.text(max_size=80) | parts | values
shaped = st.one_of(
    st.builds(lambda c: {"choices": [{"message": {"content": c}}]}, content),
    st.builds(lambda c: {"choices": c}, values),
    st.builds(lambda c: {"content": c}, parts | values),
    values,
)


def check(body: bytes, kind: Kind) -> None:
    try:
        text = reply_text(body, kind, max_chars=MAX_CHARS)
    except SummarizerError as err:
        assert err.diagnostic.code in ("summarizer.response", "summarizer.too-long")
        return
    assert isinstance(text, str) and text == text.strip() and 0 < len(text) <= MAX_CHARS


@pytest.mark.slow
@FUZZ
@given(shaped, KINDS)
def test_json_shapes(data: Any, kind: Kind) -> None:
    check(json.dumps(data).encode(), kind)


@FUZZ
@given(st.binary(max_size=200), KINDS)
def test_arbitrary_bytes(body: bytes, kind: Kind) -> None:
    check(body, kind)


@FUZZ
@given(
    st.integers(min_value=1, max_value=60_000),
    st.sampled_from(['{"choices": ', '{"content": ', ""]),
    st.sampled_from(["[", '{"a": ', '[{"text": ']),
    KINDS,
)
def test_deep_nesting(depth: int, prefix: str, opener: str, kind: Kind) -> None:
    closer = {"[": "]", '{"a": ': "}", '[{"text": ': "}]"}[opener]
    body = prefix + opener * depth + "1" + closer * depth + ("}" if prefix else "")
    check(body.encode(), kind)
