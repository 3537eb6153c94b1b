"""The public API: one sorted ``__all__``, every name importable and documented."""

from __future__ import annotations

import kilo_rules


def test_all_is_sorted_and_unique() -> None:
    names = list(kilo_rules.__all__)
    assert names == sorted(names)
    assert len(names) == len(set(names))


def test_every_public_name_exists_and_has_a_docstring() -> None:
    for name in kilo_rules.__all__:
        obj = getattr(kilo_rules, name)
        if name.startswith("__"):
            continue
        assert (getattr(obj, "__doc__", None) or "").strip(), name


def test_routes_are_public() -> None:
    assert {"Routes", "load_routes"} <= set(kilo_rules.__all__)
    assert kilo_rules.load_routes.__module__ == "kilo_rules.engine.frontend.routes"


def test_the_policy_store_is_public() -> None:
    import kilo_rules.tools.serving.store

    for name in ("PolicyStore", "ReloadResult", "StoreError", "StoreSettings"):
        assert name in kilo_rules.__all__
        assert getattr(kilo_rules, name) is getattr(kilo_rules.tools.serving.store, name)


def test_the_compiler_is_public() -> None:
    import kilo_rules.engine.compiler.compile

    assert "Compiler" in kilo_rules.__all__
    assert kilo_rules.Compiler is kilo_rules.engine.compiler.compile.Compiler
    for method in ("compile", "resolve", "clear", "stats"):
        assert (getattr(kilo_rules.Compiler, method).__doc__ or "").strip(), method


def test_the_lazy_table_and_the_type_checking_imports_agree() -> None:
    """Type checkers read the TYPE_CHECKING imports, the package resolves names through
    ``_EXPORTS``: a name added to one only would be wrong for the other."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(kilo_rules.__file__).read_text(encoding="utf-8"))
    guard = next(n for n in tree.body if isinstance(n, ast.If))
    imported = {
        "." * node.level + (node.module or ""): tuple(a.name for a in node.names)
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
    }
    assert imported == kilo_rules._EXPORTS
    assert set(kilo_rules.__all__) == {*kilo_rules._MODULE_OF, "__version__"}


def test_importing_the_package_loads_no_heavy_module() -> None:
    """``import kilo_rules`` (and so every ``kilo-rules`` command) starts without the
    runtime, the simulator or the HTTP client."""
    import subprocess
    import sys

    code = (
        "import sys, kilo_rules; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kilo_rules', 'httpx', 'pydantic', 'lark', 'jsonschema', 'yaml')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # The version module (and the two empty packages above it) only.
    version = ["kilo_rules.engine", "kilo_rules.engine.base", "kilo_rules.engine.base.version"]
    assert out.stdout.strip() == str(["kilo_rules", *version])


def test_a_public_name_unknown_to_the_package_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no_such_name"):
        kilo_rules.no_such_name  # noqa: B018
    assert "compile_policy" in dir(kilo_rules)


def test_the_cli_offers_every_wire_format_the_providers_render() -> None:
    import argparse

    from kilo_rules.engine.providers import APIS as RENDERED
    from kilo_rules.tools.cli import build_parser

    parser = build_parser("build")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    build = sub.choices["build"]
    provider = next(a for a in build._actions if "--provider" in a.option_strings)
    assert tuple(provider.choices or ()) == RENDERED


def test_one_result_type_for_apply_plan_and_runtime_step() -> None:
    """``apply_plan`` and ``Runtime.step`` return the same :class:`StepResult`, whose
    ``session`` is the session handed in with the step's mutations applied."""
    import pytest

    from kilo_rules import Runtime, StepResult, apply_mutations, apply_plan, compile_policy
    from kilo_rules.engine.formats.session import Session

    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    session = Session.model_validate(
        {
            "version": 1,
            "id": "s",
            "messages": [
                {
                    "id": "u1",
                    "role": "user",
                    "parts": [{"id": "p1", "type": "text", "text": "hi"}],
                }
            ],
        }
    )
    direct = apply_plan(plan, session)
    stepped = Runtime(plan).step(session)
    assert type(direct) is StepResult and type(stepped) is StepResult
    assert direct.request == stepped.request
    assert direct.mutations  # the environment block, persisted with the user message
    assert direct.session == apply_mutations(session, direct.mutations) != session
    assert stepped.session == direct.session and stepped.compactions == 0
    assert "TurnResult" not in kilo_rules.__all__ and "StepResult" in kilo_rules.__all__
    with pytest.warns(DeprecationWarning, match=r"use kilo_rules\.StepResult"):
        assert kilo_rules.TurnResult is StepResult  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"use StepResult"):
        from kilo_rules.engine.runtime.apply import TurnResult  # type: ignore[attr-defined]
    assert TurnResult is StepResult
    with pytest.warns(DeprecationWarning, match=r"StepResult\.turn is deprecated"):
        assert stepped.turn is stepped
