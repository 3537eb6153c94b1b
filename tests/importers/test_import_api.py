"""The public surface of kilo_rules.engine.importers."""

from __future__ import annotations

from importer_helpers import SUBAGENT, SWE_AGENT

import kilo_rules.engine.importers as importers


def test_all_is_sorted_and_documented() -> None:
    assert importers.__all__ == sorted(importers.__all__)
    for name in importers.__all__:
        if callable(getattr(importers, name)):
            assert getattr(importers, name).__doc__


def test_formats_are_described_and_sorted() -> None:
    assert list(importers.FORMATS) == sorted(importers.FORMATS)
    assert all(importers.FORMATS.values())


def test_import_text_equals_import_file() -> None:
    for path in (SUBAGENT, SWE_AGENT):
        text = path.read_text(encoding="utf-8")
        assert importers.import_text(text, name=str(path)) == importers.import_file(path)
