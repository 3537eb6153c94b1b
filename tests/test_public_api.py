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
    assert kilo_rules.load_routes.__module__ == "kilo_rules.routes"


def test_the_policy_store_is_public() -> None:
    import kilo_rules.store

    for name in ("PolicyStore", "ReloadResult", "StoreError", "StoreSettings"):
        assert name in kilo_rules.__all__
        assert getattr(kilo_rules, name) is getattr(kilo_rules.store, name)
