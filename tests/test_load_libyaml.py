"""libyaml's parser under our composer gives the very documents PyYAML's does.

``parse_yaml`` composes with libyaml when PyYAML has it (eight times faster on the
catalog) and falls back to the pure-Python parser on any failure, whose diagnostics are
the ones reported. These tests hold the fast path to the Python one: same data, same
value, key and scalar locations, same errors, on every YAML file of the repository, on
texts chosen to differ between the two parsers, and on generated texts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.formats import load

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not getattr(yaml, "__with_libyaml__", False), reason="PyYAML built without libyaml"
)


def _outcome(text: str) -> Any:
    try:
        doc = load.parse_yaml(text, "f.yaml")
    except PolicyError as exc:
        return ("error", [(d.code, d.message, d.location) for d in exc.diagnostics])
    return (doc.data, doc.values, doc.keys, doc.scalars)


def _both(text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    fast = _outcome(text)
    with monkeypatch.context() as m:
        m.setattr(load, "_CParser", None)
        slow = _outcome(text)
    return fast, slow


def test_the_fast_path_is_taken() -> None:
    root, _ = load._fast_compose("a: [1, 2]\n", load.DEFAULT_LIMITS) or (None, None)
    assert root is not None
    assert load._fast_compose("a: b: c\n", load.DEFAULT_LIMITS) is None


def _repo_yaml() -> list[Path]:
    skip = {".venv", ".git", "node_modules"}
    return sorted(
        p
        for pattern in ("*.yaml", "*.yml")
        for p in ROOT.rglob(pattern)
        if not skip & set(p.relative_to(ROOT).parts)
    )


@pytest.mark.slow
def test_every_yaml_file_of_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    files = _repo_yaml()
    assert len(files) > 20
    for path in files:
        fast, slow = _both(path.read_text(encoding="utf-8"), monkeypatch)
        assert fast == slow, path


TRICKY = [
    "\ufeffa: 1\nb: x\n",  # a byte-order mark: libyaml's marks would not count it
    "a: 1\r\nb: 'x y'\r\nc: |\r\n  l1\r\n  l2\r\n",
    "a: x\x85b: y\n",
    "a: x\u2028b: y\n",
    "a: \"\\u2028 é 😀\"\nb: 😀 plain\nc: '😀'\n",
    "a:\n\t- x\n",
    "k: >-\n  folded\n  text\n\nz: 'it''s'\n",
    "a: &x [1, 2]\nb: *x\nc: *x\n",
    "? complex\n: v\n",
    "a: 1\n...\n",
    "%YAML 1.1\n---\na: 1\n",
    "a: b: c\n",
    "- 'x\n  y'\n- \"a\\\n  b\"\n",
    "a: 1\n---\nb: 2\n",
    "a: !!python/object x\n",
    "a: !custom x\n",
    "a: 1\na: 2\n",
    "t: 2001-12-14t21:59:43.10-05:00\nn: ~\nb: yes\nf: .inf\nh: 0x1F\n",
    "x: " + "[" * 70 + "]" * 70 + "\n",
    "a: *nope\n",
    "",
    "# only a comment\n",
    "- " + "\n- ".join(str(i) for i in range(200)) + "\n",
    "a: |#\n  x\n",  # libyaml takes a comment glued to the indicator
    "a: >-2#c\n   x\n",
    "?\n",  # an empty value: the two parsers place it differently
    "a:\nb: ~\n",
    "&a.b x\n",
    "%TAG ! tag:x,2000:\n---\na: !b c\n",
]


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_texts_the_parsers_could_disagree_on(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = _both(text, monkeypatch)
    assert fast == slow


_PIECES = st.sampled_from(
    [
        "a", "b", "key", "é", "😀", " ", "  ", "\n", "\r\n", "\t", ":", ": ", "- ", "-",
        "'", '"', "\\", "#", "&x ", "*x", "!!str ", "|", ">", "[", "]", "{", "}", ",",
        "?", "---", "...", "1", "0x1", "true", "~", "%", "@", "\u2028", "\x85",
        "&a.b ", "*a.b", "!x ", "!x!y ", "%TAG ! tag:x,2000:\n", "|#", "|2", ">-", "|+",
        "<<: ", "`", "!<tag:a> ", "\\x41", "{a: 1}", "[a, b]", "\n  ", "\n    ",
    ]
)  # fmt: skip


@pytest.mark.slow
@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.lists(_PIECES, max_size=40).map("".join))
def test_generated_texts(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = _both(text, monkeypatch)
    assert fast == slow
