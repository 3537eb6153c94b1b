"""The suite's two tiers: ``make test`` runs every test on every core, slow ones first;
``make test-fast`` runs the tests not marked slow."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from .conftest import ROOT


def _collected(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_slow_tests_are_collected_first_in_their_own_order() -> None:
    # test_tune.py has slow tests at its end and quick ones before them.
    every = _collected("tests/test_tune.py")
    slow = _collected("tests/test_tune.py", "-m", "slow")
    assert slow and len(slow) < len(every)
    assert every[: len(slow)] == slow
    quick = _collected("tests/test_tune.py", "-m", "not slow")
    assert every[len(slow) :] == quick


def test_make_test_is_parallel_and_test_fast_leaves_out_the_slow_tier() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    parallel = re.search(r"^PYTEST_PARALLEL = (.*)$", makefile, re.M)
    assert parallel is not None and "-n auto" in parallel.group(1)
    targets = {
        m.group(1): m.group(2) for m in re.finditer(r"^([\w-]+): .*\n((?:\t.*\n)+)", makefile, re.M)
    }
    assert targets["test"].rstrip().endswith("$(PYTEST_PARALLEL)")
    assert '$(PYTEST_PARALLEL) -m "not slow"' in targets["test-fast"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dev = project["project"]["optional-dependencies"]["dev"]
    assert any(req.startswith("pytest-xdist") for req in dev)
    markers = project["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)
