"""The browser tests need Debian's Chromium at ``/usr/bin/chromium`` (``chromium.CHROMIUM``).

Without it every browser test fails at setup with one message naming the package, and the
run's header says so first, rather than each failing deep inside Playwright's launch. They
fail, never skip: a CI image without Chromium must not pass as if the report rendered.
``KILO_RULES_TEST_CHROMIUM`` points the tests at another binary (the test of this check
uses it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import chromium

if os.environ.get("KILO_RULES_TEST_CHROMIUM"):
    chromium.CHROMIUM = Path(os.environ["KILO_RULES_TEST_CHROMIUM"])


def missing_message() -> str | None:
    """Why the browser tests cannot run, or None when Chromium is there."""
    path = chromium.CHROMIUM
    if path.is_file() and os.access(path, os.X_OK):
        return None
    return (
        f"headless Chromium is missing: the browser tests (tests/browser) run {path}; "
        "install Debian's package: apt-get install chromium"
    )


def pytest_report_header() -> str | None:
    message = missing_message()
    return f"browser tests: {message}" if message else None


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    message = missing_message()
    if message:
        pytest.fail(message, pytrace=False)
