"""Debian's Chromium, headless, driven by Playwright: the one way the tests (and the
documentation's screenshots, docs/tools/screenshot.py) open a page."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# No sandbox: test containers run as root without user namespaces. The rest keeps the
# browser from reaching out on its own (updates, sync, QUIC probes), so any request a test
# sees comes from the page.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium, closed after the block."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
