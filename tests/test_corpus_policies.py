"""The broken-policy corpus: every case pins code, file, line, column and message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kilo_rules.engine.base.errors import Diagnostic
from kilo_rules.tools.checking.check import check_paths

CORPUS = Path(__file__).parent / "corpus" / "broken_policies.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))["cases"]


def _generate(kind: str, base: str) -> bytes:
    if kind == "many_aliases":
        return (base + ", ".join(["*x"] * 150) + "]\n").encode()
    if kind == "deep_nesting":
        return (base + "x: " + "[" * 100 + "]" * 100 + "\n").encode()
    if kind == "huge_file":
        line = "# " + "x" * 97 + "\n"
        return (base + line * 52_000).encode()  # about 5 MB
    if kind == "huge_integer":
        return (base + "9" * 5_000 + "\n").encode()
    if kind == "many_values":
        return (base + ", ".join(["1"] * 240_000) + "]\n").encode()  # about 720 KB
    if kind == "latin1":
        return (base + "description: caf\xe9\n").encode("latin-1")
    raise AssertionError(f"unknown generator {kind}")


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["note"] for c in CASES])
def test_broken_policy(case: dict[str, Any], in_tmp: Path) -> None:
    for name, content in case["files"].items():
        target = in_tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name == "policy.yaml" and case.get("generate"):
            target.write_bytes(_generate(case["generate"], content))
        else:
            target.write_text(content, encoding="utf-8")
    report = check_paths([case.get("check", "policy.yaml")])
    errors = [d for d in report.diagnostics if d.severity == "error"]
    _expect(errors, case["want_errors"], exhaustive=case.get("exhaustive", True))
    if "want_warnings" in case:
        # Given, the warnings are pinned as the errors are: every one, exactly.
        warnings = [d for d in report.diagnostics if d.severity != "error"]
        _expect(warnings, case["want_warnings"], exhaustive=True)
    assert report.exit_code == (1 if case["want_errors"] else 0)


def _expect(got: list[Diagnostic], want: list[dict[str, Any]], *, exhaustive: bool) -> None:
    described = "\n".join(f"  {d}" for d in got)
    if exhaustive:
        assert len(got) == len(want), f"expected {len(want)} diagnostic(s), got:\n{described}"
    for w in want:
        matches = [
            d
            for d in got
            if d.code == w["code"]
            and w["message"] in d.message
            and ("line" not in w or d.location.line == w["line"])
            and ("col" not in w or d.location.col == w["col"])
            and Path(d.location.file).name == w.get("file", Path(d.location.file).name)
        ]
        assert matches, f"no diagnostic matches {w}; got:\n{described}"
