"""Without Chromium the browser tests fail (never skip) with one message naming the
package to install, before Playwright tries to launch it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_missing_chromium_fails_the_browser_tests_naming_the_package(tmp_path: Path) -> None:
    # A wide terminal keeps pytest's short summary line whole on every machine.
    env = {
        **os.environ,
        "KILO_RULES_TEST_CHROMIUM": str(tmp_path / "no-chromium"),
        "COLUMNS": "1000",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "tests/browser/test_report_chromium.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1, out.stdout  # failed: not passed, not skipped
    assert "skipped" not in out.stdout and " passed" not in out.stdout
    message = (
        f"headless Chromium is missing: the browser tests (tests/browser) run "
        f"{tmp_path / 'no-chromium'}; install Debian's package: apt-get install chromium"
    )
    assert f"browser tests: {message}" in out.stdout  # the header, before any test
    # the header, the one test's setup, and its line in the short summary
    assert out.stdout.count(message) == 3
    assert "ERROR tests/browser/test_report_chromium.py::" in out.stdout
    assert "playwright" not in out.stdout.lower()  # no launch was tried
