"""A compiler owns its caches: bounded, keyed by content, cleared whole, shared by nobody
else unless asked (docs/architecture.md, "Caches")."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from kilo_rules import PolicyStore
from kilo_rules.engine.base.lru import CacheStats
from kilo_rules.engine.compiler.compile import (
    Compiler,
    clear_cache,
    compile_policy,
    default_compiler,
)
from kilo_rules.engine.formats.load import resource_root
from kilo_rules.engine.frontend.resolve import DEFAULT_RESOLVE_CACHES, resolve_policy

SONNET = "anthropic/claude-sonnet-4-5"
MODELS = (SONNET, "openai/gpt-5", "google/gemini-2.5-pro")


@pytest.fixture
def compiler() -> Compiler:
    """A compiler of the test's own."""
    return Compiler()


def _own_copy(tmp_path: Path) -> Path:
    root = Path(str(resource_root()))
    shutil.copytree(root / "prompts", tmp_path / "prompts")
    target = tmp_path / "kilo-default.yaml"
    shutil.copy(root / "kilo-default.yaml", target)
    return target


def _counts(stats: dict[str, CacheStats]) -> dict[str, tuple[int, int, int]]:
    return {name: (s.hits, s.misses, s.size) for name, s in stats.items()}


def test_a_compiler_of_its_own_leaves_the_default_one_alone(
    tmp_path: Path, compiler: Compiler
) -> None:
    policy = _own_copy(tmp_path)
    before = _counts(default_compiler().stats())
    plan = compiler.compile(policy, SONNET)
    assert _counts(default_compiler().stats()) == before
    own = compiler.stats()
    for name in ("plans", "resolved", "checked", "expressions", "documents", "trees", "parsed"):
        assert own[name].size > 0, name
    assert compiler.compile(policy, SONNET) is plan
    assert compiler.stats()["plans"].hits == own["plans"].hits + 1


def test_two_compilers_compile_the_same_plan_without_sharing_it(
    tmp_path: Path, compiler: Compiler
) -> None:
    policy = _own_copy(tmp_path)
    other = Compiler()
    a, b = compiler.compile(policy, SONNET), other.compile(policy, SONNET)
    assert a is not b
    assert a.revision == b.revision and a.data == b.data and a.values == b.values
    assert a.prompt == b.prompt
    # A layer's condition is a compiled expression, equal only to itself.
    assert [(x.id, x.text, x.location) for x in a.layers] == [
        (x.id, x.text, x.location) for x in b.layers
    ]


def test_the_default_compiler_serves_compile_policy() -> None:
    plan = compile_policy("kilo-default", SONNET)
    assert default_compiler().compile("kilo-default", SONNET) is plan
    # The module-level functions share the default compiler's lower caches.
    assert default_compiler().resolve_caches is DEFAULT_RESOLVE_CACHES
    assert resolve_policy("kilo-default").caches is DEFAULT_RESOLVE_CACHES


def test_clear_forgets_every_cache_and_the_next_compile_is_the_same(
    tmp_path: Path, compiler: Compiler
) -> None:
    policy = _own_copy(tmp_path)
    first = compiler.compile(policy, SONNET)
    compiler.clear()
    assert all(s.size == 0 for s in compiler.stats().values())
    again = compiler.compile(policy, SONNET)
    assert again is not first
    assert again.data == first.data and again.values == first.values
    assert compiler.stats()["documents"].misses > 0  # the files were parsed again


def test_clear_cache_clears_the_default_compiler() -> None:
    compile_policy("kilo-default", SONNET)
    clear_cache()
    assert default_compiler().stats()["plans"].size == 0


def test_every_cache_is_bounded() -> None:
    compiler = Compiler(3)
    for name in ("plans", "expressions", "checked", "resolved"):
        assert compiler.stats()[name].maxsize == 3
    assert all(s.maxsize >= 1 for s in compiler.stats().values())


def test_plans_are_keyed_by_content_not_by_the_resolved_object(
    tmp_path: Path, compiler: Compiler
) -> None:
    policy = _own_copy(tmp_path)
    one, two = resolve_policy(policy), resolve_policy(policy)
    assert one is not two
    assert compiler.compile(one, SONNET) is compiler.compile(two, SONNET)


def test_one_compiler_serves_many_threads(tmp_path: Path, compiler: Compiler) -> None:
    policy = _own_copy(tmp_path)
    serial = {m: Compiler().compile(policy, m) for m in MODELS}
    results: dict[tuple[int, str], object] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for m in MODELS:
                results[i, m] = compiler.compile(policy, m)
        except BaseException as exc:  # reported below, in the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (_, m), plan in results.items():
        assert plan.data == serial[m].data  # type: ignore[attr-defined]
    assert compiler.stats()["plans"].size == len(MODELS)


def test_a_store_compiles_with_a_compiler_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "routes.yaml").write_text(
        "version: 1\nroutes: []\ndefault: kilo-default\n", encoding="utf-8"
    )
    before = default_compiler().stats()["plans"]
    with PolicyStore.from_directory(tmp_path) as store:
        store.plan_for(SONNET)
        assert store.compiler is not default_compiler()
        assert store.compiler.stats()["plans"].size >= 1
        assert default_compiler().stats()["plans"] == before
