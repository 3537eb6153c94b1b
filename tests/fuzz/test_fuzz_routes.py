"""Whatever a routes file holds — random bytes, YAML-shaped noise, documents built from the
routes keys with hostile values — ``load_routes`` raises nothing but a located
:class:`PolicyError`, and a file that loads routes every model and checks cleanly."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import PolicyError
from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.engine.frontend.routes import ROUTES_FILE, check_routes, load_routes
from tests.fuzz.budget import FUZZ


def _load(content: bytes) -> None:
    """Load ``content`` as a routes file beside a policy file it may name."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "team.yaml").write_text("version: 1\nname: team\n", encoding="utf-8")
        (root / "sub").mkdir()
        path = root / ROUTES_FILE
        path.write_bytes(content)
        try:
            routes = load_routes(path)
        except PolicyError as exc:
            assert exc.diagnostics
            for d in exc.diagnostics:
                assert d.code and d.message
                assert d.location.line >= 1 and d.location.col >= 1
            return
        catalog = bundled_catalog()
        for model in catalog.models:
            choice = routes.policy_for(model)
            assert choice.policy in routes.policies()
        for d in check_routes(routes, catalog):
            assert d.code.startswith("routes.") and d.location.line >= 1


CONTROL = st.characters(min_codepoint=0, max_codepoint=0x9F)
YAML_BITS = st.sampled_from(
    [
        "version: 1\n",
        "default: kilo-default\n",
        "routes:\n",
        "  - match: {family: claude}\n",
        "    policy: long-run\n",
        "    name: a\n",
        "match: ",
        "glob: '*'",
        "&a ",
        "*a",
        "!!python/name:os.system ",
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
        "|\n  ",
        "1e400",
        "---\n",
        "\t",
        "\ufeff",
    ]
)
TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(YAML_BITS, st.text(max_size=5), CONTROL), max_size=40).map("".join),
)


@pytest.mark.slow
@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(content: bytes) -> None:
    _load(content)


@pytest.mark.slow
@FUZZ
@given(TEXT)
def test_yaml_shaped_text(text: str) -> None:
    _load(("version: 1\n" + text).encode("utf-8", "surrogatepass"))


# Generated uniformly, unlike st.integers, whose draws lean to the bounds: most documents
# stay valid, so that matching and check_routes see many loaded files.
RARELY = st.sampled_from([False] * 9 + [True])

GOOD_REFS = st.sampled_from(["kilo-default", "long-run", "cache-max", "team.yaml", "./team.yaml"])
BAD_REFS = st.sampled_from(
    [
        "kilo-defualt",
        "teem.yaml",
        "sub/",
        "sub",
        "../escape.yaml",
        "/etc/passwd",
        "~/x.yaml",
        "\\\\server\\x.yaml",
        "/dev/zero",
        "",
        "a" * 2000,
    ]
)
REFS = st.one_of(GOOD_REFS, GOOD_REFS, GOOD_REFS, BAD_REFS)
PATTERNS = st.one_of(
    st.sampled_from(
        [
            "*",
            "**",
            "openai/gpt-5*",
            "openai/gpt-5-mini*",
            "[",
            "[!a-z]*",
            "*" * 100 + "x",
            "?" * 300,
            "anthropic/claude-sonnet-4-6",
        ]
    ),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), REFS, PATTERNS)
MATCH_VALUES = {
    "id": st.sampled_from(["anthropic/claude-sonnet-4-6", "openai/gpt-5", "nope"]),
    "provider": st.sampled_from(["anthropic", "openrouter", "nobody"]),
    "family": st.sampled_from(["claude", "gpt", "qwen"]),
    "glob": PATTERNS,
    "x": SCALARS,
}


@st.composite
def matches(draw: st.DrawFn) -> Any:
    if draw(RARELY):
        return draw(SCALARS)
    keys = draw(
        st.lists(
            st.sampled_from(["id", "provider", "family", "glob"]),
            min_size=0 if draw(RARELY) else 1,
            max_size=3,
            unique=True,
        )
    )
    if draw(RARELY):
        keys.append("x")
    return {k: draw(SCALARS if draw(RARELY) else MATCH_VALUES[k]) for k in keys}


@st.composite
def routes_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if not draw(RARELY):
        doc["version"] = draw(SCALARS) if draw(RARELY) else 1
    routes = []
    for _ in range(draw(st.integers(0, 6))):
        route: dict[str, Any] = {"match": draw(matches()), "policy": draw(REFS)}
        if draw(st.booleans()):
            route["name"] = draw(st.sampled_from(["a", "b", "c", "default", "a b", "", None]))
        if draw(RARELY):
            del route[draw(st.sampled_from(["match", "policy"]))]
        routes.append(route)
    if not draw(RARELY):
        doc["routes"] = routes
    if not draw(RARELY):
        doc["default"] = draw(REFS)
    return doc


@pytest.mark.slow
@FUZZ
@given(routes_documents())
def test_documents_from_routes_keys(doc: dict[str, Any]) -> None:
    _load(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode("utf-8"))


VALID_MATCH_VALUES = {
    **MATCH_VALUES,
    "glob": st.one_of(
        st.sampled_from(
            ["*", "openai/gpt-5*", "openai/gpt-5-mini*", "anthropic/*", "*/claude-*", "[!a-n]*"]
        ),
        st.text(alphabet="abo/*?-[]", min_size=1, max_size=8),
    ),
    "id": st.sampled_from(
        ["anthropic/claude-sonnet-4-6", "openai/gpt-5", "openai/gpt-5-mini", "google/x"]
    ),
}


@st.composite
def valid_routes_files(draw: st.DrawFn) -> str:
    routes = []
    for i in range(draw(st.integers(0, 8))):
        keys = draw(
            st.lists(
                st.sampled_from(["id", "provider", "family", "glob"]),
                min_size=1,
                max_size=3,
                unique=True,
            )
        )
        route: dict[str, Any] = {
            "match": {k: draw(VALID_MATCH_VALUES[k]) for k in keys},
            "policy": draw(GOOD_REFS),
        }
        if draw(st.booleans()):
            route["name"] = f"r{i}"
        routes.append(route)
    doc = {"version": 1, "routes": routes, "default": draw(GOOD_REFS)}
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.slow
@FUZZ
@given(valid_routes_files())
def test_check_routes_agrees_with_routing(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "team.yaml").write_text("version: 1\nname: team\n", encoding="utf-8")
        path = root / ROUTES_FILE
        path.write_text(text, encoding="utf-8")
        routes = load_routes(path)
    catalog = bundled_catalog()
    chosen = {m.id: routes.policy_for(m).route for m in catalog.models}
    for d in check_routes(routes, catalog):
        if d.code in ("routes.unreachable", "routes.no-model"):
            # Never chosen for any catalog model: the check is sound on the catalog.
            assert d.details["route"] not in chosen.values(), d
        elif d.code == "routes.default-models":
            assert d.details["models"] == [i for i, r in chosen.items() if r == "default"]
        elif d.code == "routes.default-unreachable":
            assert "default" not in chosen.values()
