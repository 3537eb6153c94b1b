"""Screenshot a page written by ``kilo-rules simulate --html`` for the documentation.

    .venv/bin/python docs/tools/screenshot.py REPORT.html OUT.png [HEIGHT]

Opens the page in headless Chromium the way the browser tests do (tests/browser/chromium.py),
at the width the report is laid out for, and saves the page (or its first HEIGHT pixels).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.browser.chromium import chromium  # the repository root is on the path now


def main(page_path: str, out: str, height: int | None = None) -> None:
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": height or 900})
        page.goto(Path(page_path).resolve().as_uri())
        if height:
            page.screenshot(path=out, clip={"x": 0, "y": 0, "width": 1280, "height": height})
        else:
            page.screenshot(path=out, full_page=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
