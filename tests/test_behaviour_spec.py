"""Every citation of the behaviour spec resolves, and every cited doc exists.

Code, policy comments, schemas and pages cite ``docs/kilo-behaviour.md`` by section
("\u00a73", "\u00a77.5", "\u00a78 step 6", "\u00a714 conflict 1"). A citation of a section,
step or conflict the spec does not have is a dangling reference, and so is a ``docs/*.md``
path (or a relative Markdown link) to a page that is not in the repository. Citations
of other documents ("DESIGN.md \u00a72", "seed \u00a711") are not the spec's and are skipped.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "kilo-behaviour.md"
SCANNED = ("policies", "kilo_rules", "docs", "tests", "schemas", "README.md")
TEXT_SUFFIXES = frozenset({".py", ".yaml", ".yml", ".md", ".json", ".txt", ".toml"})

SECTION = "\u00a7"
#: A section number, then optionally the steps or conflict it points into:
#: "8 step 6", "8 steps 3-4, 8", "14 conflict 1".
_CITATION = re.compile(
    SECTION + r"(?P<num>\d+(?:\.\d+)*)"
    r"(?:\s+(?P<kind>steps?|conflicts?)\s+"
    r"(?P<items>\d+(?:\s*[-\u2013]\s*\d+)?(?:\s*,\s*\d+(?:\s*[-\u2013]\s*\d+)?)*))?"
)
#: Text right before a section sign that makes it another document's section.
_FOREIGN = re.compile(r"(?:DESIGN(?:\.md)?|STYLE(?:\.md)?|seed)[`'\"]*\s*$")
_HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s+\S", re.M)
_ITEM = re.compile(r"^(\d+)\.\s", re.M)
#: A repository doc path, not part of a URL or a longer path.
_DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]+?\.md\b")
_MD_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+\.md)(?:#[^)]*)?\)")
_SPEC_PATH = re.compile(r"([\w./-]*)kilo-behaviour\.md")

#: ``docs/...md`` strings that are examples, not citations: (file, path, why).
NOT_CITATIONS = {
    ("docs/security.md", "docs/AGENTS.md"): "the symlink attack the threat model describes",
}


@dataclass(frozen=True)
class Citation:
    """One section citation: where it is, what it names, and the steps it points into."""

    where: str
    number: str
    kind: str | None
    items: tuple[int, ...]

    def __str__(self) -> str:
        tail = f" {self.kind} {', '.join(map(str, self.items))}" if self.kind else ""
        return f"{self.where}: {SECTION}{self.number}{tail}"


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        p = ROOT / name
        paths = [p] if p.is_file() else sorted(p.rglob("*"))
        out += [f for f in paths if f.is_file() and f.suffix in TEXT_SUFFIXES]
    return [f for f in out if f.resolve() != Path(__file__).resolve()]


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _items(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for piece in re.split(r"\s*,\s*", spec.strip()):
        ends = [int(n) for n in re.split(r"\s*[-\u2013]\s*", piece)]
        out += range(ends[0], ends[-1] + 1)
    return tuple(out)


def citations_in(text: str, where: str) -> list[Citation]:
    """The behaviour-spec citations in ``text``; other documents' sections are skipped."""
    found: list[Citation] = []
    for m in _CITATION.finditer(text):
        if _FOREIGN.search(text[max(0, m.start() - 40) : m.start()]):
            continue
        kind = m["kind"]
        found.append(
            Citation(
                f"{where}:{_line(text, m.start())}",
                m["num"],
                ("conflict" if kind.startswith("conflict") else "step") if kind else None,
                _items(m["items"]) if m["items"] else (),
            )
        )
    return found


def spec_sections(text: str) -> dict[str, set[int]]:
    """Each numbered heading of the spec, with the numbered list items of its own body
    (up to the next heading of any level)."""
    heads = list(_HEADING.finditer(text))
    sections: dict[str, set[int]] = {}
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[h.end() : end]
        sections[h[1]] = {int(n) for n in _ITEM.findall(body)}
    return sections


def dangling(cites: list[Citation], sections: dict[str, set[int]]) -> list[str]:
    """Citations naming a section, step or conflict the spec does not have."""
    bad: list[str] = []
    for c in cites:
        if c.number not in sections:
            bad.append(f"{c}: no section {c.number}")
        elif missing := [n for n in c.items if n not in sections[c.number]]:
            bad.append(f"{c}: section {c.number} has no {c.kind} {missing}")
    return bad


def _python_prose(text: str) -> str:
    """The comments and docstrings of a Python file: where a test's prose is, apart from
    the paths it uses as data."""
    pieces = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            pieces.append(ast.get_docstring(node) or "")
    return "\n".join(pieces)


@cache
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_behaviour_spec_exists() -> None:
    assert SPEC.is_file(), "docs/kilo-behaviour.md is cited throughout and must exist"


def test_every_section_citation_resolves_to_a_heading_of_the_spec() -> None:
    cites = [c for f in _files() for c in citations_in(_read(f), _rel(f))]
    by_file = {c.where.rsplit(":", 1)[0] for c in cites}
    # the scan really reads the files that cite the spec most
    assert {"policies/kilo-default.yaml", "policies/tests/kilo-default.test.yaml"} <= by_file
    assert sum(c.where.startswith("policies/kilo-default.yaml:") for c in cites) >= 50
    sections = spec_sections(_read(SPEC))
    assert dangling(cites, sections) == []


def test_the_policy_cites_the_spec_by_its_path() -> None:
    head = _read(ROOT / "policies" / "kilo-default.yaml").split("\nversion:", 1)[0]
    assert "docs/kilo-behaviour.md" in head


def test_every_path_to_the_spec_is_docs_kilo_behaviour_md() -> None:
    wrong = [
        f"{_rel(f)}:{_line(_read(f), m.start())}: {m[0]}"
        for f in _files()
        for m in _SPEC_PATH.finditer(_read(f))
        if m[1] not in ("", "docs/") and not m[1].endswith("/docs/")
    ]
    assert wrong == []


@pytest.mark.slow
def test_every_cited_doc_exists() -> None:
    missing: list[str] = []
    for f in _files():
        rel, text = _rel(f), _read(f)
        if rel.startswith("tests/") and f.suffix != ".py":
            continue  # fixtures: their paths are data
        # The prose is a part of the text: a file that names no doc anywhere is not parsed.
        in_prose = rel.startswith("tests/") and f.suffix == ".py" and _DOC_PATH.search(text)
        prose = _python_prose(text) if in_prose else text
        for m in _DOC_PATH.finditer(prose):
            if (rel, m[0]) not in NOT_CITATIONS and not (ROOT / m[0]).is_file():
                missing.append(f"{rel}: {m[0]}")
        if f.suffix == ".md":
            for link in _MD_LINK.findall(text):
                if not (f.parent / link).resolve().is_file():
                    missing.append(f"{rel}: link {link}")
    assert missing == []


# --- the checker itself ---------------------------------------------------------------


SAMPLE_SPEC = """\
## 3. Window
### 3.1 Reserve
## 8. Loop
1. first
2. second
### 8.1 Detail
3. not a step of 8
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"see {SECTION}4", "no section 4"),
        (f"see {SECTION}3.2", "no section 3.2"),
        (f"({SECTION}8 step 3)", "section 8 has no step [3]"),
        (f"{SECTION}8 steps 1\u20133", "section 8 has no step [3]"),
        (f"{SECTION}3 conflict 1", "section 3 has no conflict [1]"),
    ],
)
def test_the_checker_reports_what_the_spec_lacks(text: str, problem: str) -> None:
    (bad,) = dangling(citations_in(text, "x.py"), spec_sections(SAMPLE_SPEC))
    assert bad.endswith(problem)


def test_the_checker_accepts_what_the_spec_has_and_skips_other_documents() -> None:
    text = (
        f"{SECTION}3, {SECTION}3.1/{SECTION}8, {SECTION}8 steps 1-2, "
        f"DESIGN.md {SECTION}9, (the test of DESIGN\n{SECTION}7), seed {SECTION}11"
    )
    cites = citations_in(text, "x.py")
    assert [c.number for c in cites] == ["3", "3.1", "8", "8"]
    assert cites[-1].items == (1, 2)
    assert dangling(cites, spec_sections(SAMPLE_SPEC)) == []


def test_doc_paths_in_urls_and_test_data_are_not_citations() -> None:
    text = "source: https://example.com/docs/models/x.md, see docs/cli.md"
    assert _DOC_PATH.findall(text) == ["docs/cli.md"]
    code = '"""Uses docs/cli.md."""\nPATH = "docs/x.md"  # and docs/serve.md\n'
    assert _DOC_PATH.findall(_python_prose(code)) == ["docs/serve.md", "docs/cli.md"]
