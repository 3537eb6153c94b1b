"""Mutations of JSON documents for the session and importer fuzzers: replace a value with
random JSON of any type, drop a key, wrap a value in arrays or objects (deeply, too), copy a
member beside itself (repeated ids), or put a lone surrogate in a string."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from hypothesis import strategies as st

from kilo_rules.engine.base.source import JsonPath, lookup
from kilo_rules.engine.formats.load import iter_paths

# Strings the formats give meaning to, so that a replacement often lands on another branch.
WORDS = [
    "user",
    "assistant",
    "system",
    "tool",
    "function",
    "developer",
    "exit",
    "text",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "image",
    "image_url",
    "input_audio",
    "file",
    "document",
    "url",
    "text",
    "reasoning",
    "step-start",
    "compaction",
    "message",
    "run",
    "recall",
    "error",
    "summary",
    "progress",
    "compact_boundary",
    "mini-swe-agent-1",
    "mini-swe-agent-1.1",
    "toolu_1",
    "toolu_01",
    "call_1",
    "call_00",
    "m1",
    "data:image/png;base64,AA==",
    "\ud800",
    "a\udfffb",
    "",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.sampled_from(WORDS)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(WORDS), inner, max_size=3)
    ),
    max_leaves=6,
)


DEEP = "\x00deep:"
_DEEP = re.compile(r'"\\u0000deep:(\d+)"')


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps``, with each ``DEEP`` string written as that many nested arrays."""
    return _DEEP.sub(
        lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), json.dumps(value, **kwargs)
    )


def _set(doc: Any, path: JsonPath, value: Any) -> Any:
    if not path:
        return value
    parent = lookup(doc, path[:-1])
    parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw: st.DrawFn, doc: Any, max_mutations: int = 3, min_path: int = 0) -> Any:
    """A copy of ``doc`` with one to ``max_mutations`` mutations of values at least
    ``min_path`` steps below the root (1 keeps the records of a JSON Lines file a list)."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(min_value=1, max_value=max_mutations))):
        paths = [p for p, _ in iter_paths(doc) if len(p) >= min_path]
        path = draw(st.sampled_from(paths))
        value = lookup(doc, path)
        parent = lookup(doc, path[:-1]) if path else None
        op = draw(st.sampled_from(["replace", "replace", "drop", "nest", "deep", "copy", "lone"]))
        if op == "replace":
            doc = _set(doc, path, draw(json_values))
        elif op == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "nest":
            doc = _set(doc, path, draw(st.sampled_from([[value], {"type": value}])))
        elif op == "deep":
            # json.dumps cannot write what is too deep to parse: see :func:`dumps`.
            doc = _set(doc, path, f"{DEEP}{draw(st.sampled_from([80, 101, 200, 1500]))}")
        elif op == "copy" and isinstance(parent, list):
            parent.insert(int(path[-1]), copy.deepcopy(value))
        elif op == "lone" and isinstance(value, str):
            cut = draw(st.integers(min_value=0, max_value=len(value)))
            lone = draw(st.sampled_from(["\ud800", "\udc00", "\udbff"]))
            doc = _set(doc, path, value[:cut] + lone + value[cut:])
    return doc
