"""The README is the way in to the documentation: it links every page under docs/, and it
and the package docstring lead with the same entry point."""

from __future__ import annotations

import re
from pathlib import Path

import kilo_rules

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]*)?\)", README))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages, "no docs/*.md found"
    assert sorted(pages - linked) == []
    assert sorted(linked - pages) == []  # and no link to a page that is not there


def test_the_readme_and_the_package_lead_with_the_same_entry_point() -> None:
    doc = kilo_rules.__doc__ or ""
    for text in (README, doc):
        first_code = text[text.index("Runtime(") - 400 : text.index("Runtime(")]
        assert "compile_policy" in text and "read_session" in text
        assert "apply_plan" not in first_code  # the loop comes first, the one-shot after
    assert doc.index("Runtime") < doc.index("apply_plan")
    assert README.index("runtime.step(") < README.index("apply_plan(")
