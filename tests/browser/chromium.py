"""Debian's Chromium, headless, driven by Playwright: the one way the tests (and the
documentation's screenshots, docs/tools/screenshot.py) open a page."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

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


@dataclass
class Watched:
    """A page opened from a file, with what it did while loading and afterwards."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


def open_page(browser: Browser, html: str, path: Path) -> Watched:
    """Write ``html`` to ``path`` and open it at 1280 px, recording console errors, page
    errors and every request the page makes (a self-contained page makes one: itself)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium: apt-get install chromium",
            pytrace=False,
        )
    path.write_text(html, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    watched = Watched(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            watched.console_errors.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: watched.page_errors.append(str(error)))
    page.on("request", lambda request: watched.requests.append(request.url))
    page.goto(path.as_uri(), wait_until="load")
    return watched


def finish(watched: Watched, url: str, artifact: Path) -> None:
    """What every report page must show at the end: its table fits a 1280-pixel window
    without scrolling sideways; a full-page screenshot is kept as a test artifact (a real
    PNG); and loading it logged no error and requested nothing but the page itself."""
    widths = watched.page.evaluate(
        "() => { const w = document.querySelector('.table-wrap');"
        " return [w.clientWidth, w.scrollWidth]; }"
    )
    assert widths[1] <= widths[0], widths
    artifact.parent.mkdir(parents=True, exist_ok=True)
    watched.page.screenshot(path=str(artifact), full_page=True)
    assert watched.console_errors == []
    assert watched.page_errors == []
    assert watched.requests == [url]
    png = artifact.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000
