"""Whatever a policy file holds — random bytes, control characters, deep nesting, huge or
non-finite numbers, random keys and values from the schema — ``check`` (load, resolve,
schema, semantic checks, expressions) ends with located diagnostics or a clean report, and
the loader raises nothing but the package's typed errors."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError
from kilo_rules.engine.formats.load import parse_yaml
from kilo_rules.engine.formats.validate import load_schema
from kilo_rules.tools.checking.check import check_paths
from tests.fuzz.budget import FUZZ


def _check(content: bytes) -> list[Diagnostic]:
    """What ``kilo-rules check`` reports for a file holding ``content``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.yaml"
        path.write_bytes(content)
        report = check_paths([str(path)])
    assert not report.usage_errors
    for d in report.diagnostics:
        assert d.code and d.message
        assert d.location.line >= 1 and d.location.col >= 1
    return report.diagnostics


def _load(text: str) -> None:
    try:
        parse_yaml(text, "p.yaml")
    except KiloRulesError as exc:
        assert exc.diagnostics


# --- raw bytes and text -------------------------------------------------------------------

CONTROL = st.characters(min_codepoint=0, max_codepoint=0x9F)
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
YAML_BITS = st.sampled_from(
    [
        "version: 1\n",
        "name: p\n",
        "extends: kilo-default\n",
        "&a ",
        "*a",
        "!!python/name:os.system ",
        "!env ",
        "<<: ",
        "- ",
        "[",
        "]",
        "{",
        "}",
        ": ",
        "\n  ",
        "'",
        '"',
        '"\\x00"',
        '"\\e"',
        "|\n  ",
        ".inf",
        "-.nan",
        "1e400",
        "1.0e+400",
        "0x" + "f" * 40,
        "9" * 30,
        "---\n",
        "%YAML 1.1\n",
        "\t",
        "\ufeff",
    ]
)
TEXT = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=st.one_of(CONTROL, st.sampled_from("abc:-[]{}, \n'\"&*!#|>")), max_size=200),
    st.lists(st.one_of(YAML_BITS, st.text(max_size=5), CONTROL), max_size=40).map("".join),
)


@pytest.mark.slow
@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(content: bytes) -> None:
    _check(content)


@pytest.mark.slow
@FUZZ
@given(TEXT)
def test_yaml_shaped_text(text: str) -> None:
    _load(text)
    _check(("version: 1\nname: p\n" + text).encode("utf-8", "surrogatepass"))


@pytest.mark.slow
@FUZZ
@given(st.text(alphabet=st.one_of(CONTROL, SURROGATE, st.just("a")), min_size=1, max_size=20))
def test_control_characters_anywhere(noise: str) -> None:
    text = f"version: 1\nname: p\ndescription: {noise}\n"
    with_escapes = "version: 1\nname: p\ndescription: " + yaml.safe_dump(noise)
    for candidate in (text, with_escapes):
        _load(candidate)
        diags = _check(candidate.encode("utf-8", "surrogatepass"))
        bad = [
            c
            for c in noise
            if c not in "\t\n\r\x85"
            and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF)
        ]
        if bad:
            assert any(d.code in ("yaml.character", "yaml.encoding", "yaml.syntax") for d in diags)


NESTINGS = {
    "flow list": lambda d: "x: " + "[" * d + "1" + "]" * d + "\n",
    "flow mapping": lambda d: "x: " + "{a: " * d + "1" + "}" * d + "\n",
    "block list": lambda d: "x:\n  " + "- " * d + "1\n",
    "block mapping": lambda d: "".join(f"{'  ' * i}a:\n" for i in range(d)) + "  " * d + "1\n",
}


@pytest.mark.slow
@FUZZ
@given(st.integers(1, 200), st.sampled_from(sorted(NESTINGS)))
def test_deep_nesting(depth: int, kind: str) -> None:
    text = "version: 1\nname: p\n" + NESTINGS[kind](depth)
    _load(text)
    diags = _check(text.encode())
    assert diags  # x and a are not policy keys, whatever the depth
    if depth > 64:
        assert {d.code for d in diags} == {"yaml.depth"}


# --- documents built from the schema's own keys --------------------------------------------


@cache
def _schema_paths() -> list[tuple[str, ...]]:
    schema = load_schema("policy.v1.json")
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        while isinstance(node, dict) and "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        return node

    def branches(node: Any) -> Iterator[Any]:
        node = resolve(node)
        yield node
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, []) if isinstance(node, dict) else []:
                yield from branches(sub)

    out: list[tuple[str, ...]] = []
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        for branch in branches(node):
            if not isinstance(branch, dict):
                continue
            for key, sub in (branch.get("properties") or {}).items():
                out.append((*path, key))
                if len(path) < 4:
                    stack.append(((*path, key), sub))
    return sorted(set(out))


NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**53, 2**53 + 1, 1e308, math.inf, -math.inf, 0.5]),
)
EXPRESSIONS = st.sampled_from(
    [
        "model.limits.context - 1",
        "model.id matches '.*.*.*.*.*.*.*.*.*.*x'",
        "model.id matches '(a)\\1'",
        "regex_match(model.id, 'a(?=b)')",
        "budget.usable // 0",
        "session.turns +",
        "nope.name",
        "budget.usable",
        "tiktoken:cl100k",
        "tiktoken:cl100k_base",
        "(?<=x)y",
        "prompts/missing.txt",
        "../../etc/passwd",
        "estimate",
    ]
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, EXPRESSIONS, st.text(max_size=20))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["id", "when", "set", "messages_matching", "x"]), inner, max_size=3
        ),
    ),
    max_leaves=8,
)


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


@st.composite
def schema_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": 1, "name": "p"}
    if draw(st.integers(0, 3)) == 0:  # a bundled base costs ~0.1 s to resolve and check
        doc["extends"] = "kilo-default"
    for _ in range(draw(st.integers(0, 6))):
        path = draw(st.sampled_from(_schema_paths()))
        if path[0] in ("extends", "version"):
            continue
        _put(doc, path, draw(VALUES))
    if draw(st.booleans()):
        doc.setdefault("compaction", {})
        if isinstance(doc["compaction"], dict):
            doc["compaction"]["pin"] = [{"messages_matching": draw(EXPRESSIONS)}]
    if draw(st.booleans()):
        doc["overrides"] = [
            {"when": draw(EXPRESSIONS), "set": {"output": {"max_tokens": draw(NUMBERS)}}}
        ]
    return doc


@pytest.mark.slow
@FUZZ
@given(schema_documents())
def test_documents_from_schema_keys(doc: dict[str, Any]) -> None:
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    _load(text)
    _check(text.encode("utf-8", "surrogatepass"))


def test_schema_paths_cover_the_policy() -> None:
    paths = _schema_paths()
    assert ("tokens", "counter") in paths
    assert ("compaction", "pin") in paths
    assert len(paths) > 50
