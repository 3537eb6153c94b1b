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
