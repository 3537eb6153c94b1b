"""The simulate HTML report, opened in a real browser (Debian's Chromium, headless).

Structure tests read the markup; this one checks what a reader gets: the page loads
nothing but itself, raises no error, and lays out every chart, axis label, legend entry
and table row with a real size. The full-page screenshot is kept as a test artifact so a
reviewer can look at the rendering of the commit under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator

from kilo_rules.tools.simulation.htmlreport import render_html

from .chromium import chromium, finish, open_page

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "simulate" / "opus46-spotter.json"
ARTIFACT = ROOT / "build" / "test-artifacts" / "simulate-report.png"
CHARTS = ("context", "cost", "cache")
AXIS_LABELS = ("request", "tokens", "request", "US dollars", "request", "share of input")


def box(locator: Locator, what: str) -> dict[str, float]:
    """The element's laid-out box, failing unless it has a real width and height."""
    found = locator.bounding_box()
    assert found is not None, f"{what}: not rendered"
    assert found["width"] > 0 and found["height"] > 0, f"{what}: empty box {found}"
    return {key: found[key] for key in ("x", "y", "width", "height")}


@pytest.mark.slow
def test_opus_report_renders_in_chromium(tmp_path: Path) -> None:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    # The session as recorded (what simulate adds from the log's usage): the agent
    # compacted before request 72; its cost per request.
    costs = [st["cost_usd"] * 0.9 for st in doc["reports"][0]["steps"]]
    doc["recorded"] = {
        **{"requests": 144, "with_usage": 143, "input": 0, "output": 0},
        **{"cost_usd": sum(costs), "request_costs_usd": costs, "compactions": [72]},
    }
    policies = [r["policy"] for r in doc["reports"]]
    page_file = tmp_path / "simulate-report.html"
    url = page_file.as_uri()
    with chromium() as browser:
        watched = open_page(browser, render_html(doc), page_file)
        page = watched.page

        for chart in CHARTS:
            svg = page.locator(f'figure[data-chart="{chart}"] svg.chart')
            assert svg.count() == 1, chart
            assert svg.is_visible(), chart
            chart_box = box(svg, f"{chart} chart")
            # Scaled to the column width (viewBox), not collapsed or overflowing.
            assert 900 <= chart_box["width"] <= 1200, (chart, chart_box)

        labels = page.locator("svg text.axis-label")
        texts = [labels.nth(i).text_content() for i in range(labels.count())]
        assert texts == [*AXIS_LABELS]
        for i, text in enumerate(texts):
            box(labels.nth(i), f"axis label {text!r}")

        for chart in ("context", "cost"):
            for policy in policies:
                entry = page.locator(
                    f'figure[data-chart="{chart}"] li[data-legend="policy"][data-policy="{policy}"]'
                )
                assert entry.count() == 1, (chart, policy)
                box(entry, f"{chart} legend entry {policy}")
        for kind, label in (("compaction", "compaction"), ("overflow", "provider overflow")):
            entry = page.locator(f'li[data-legend="marker"][data-kind="{kind}"]')
            assert entry.text_content() == label
            box(entry, f"marker legend entry {label}")
        for kind in ("read", "write", "uncached"):
            box(page.locator(f'li[data-legend="cache"][data-kind="{kind}"]'), kind)

        # The compaction markers are drawn inside the context chart.
        context = box(page.locator('figure[data-chart="context"] svg.chart'), "context")
        markers = page.locator('.marker[data-kind="compaction"]')
        assert markers.count() == len(policies)
        for i in range(markers.count()):
            m = box(markers.nth(i), f"compaction marker {i}")
            assert context["x"] <= m["x"] <= context["x"] + context["width"]
            assert context["y"] <= m["y"] <= context["y"] + context["height"]

        # The recorded agent's compaction spans the context chart; the recorded cost is a
        # line of the cost chart, each with its legend entry.
        agent = page.locator('figure[data-chart="context"] line.recorded-compaction')
        assert agent.count() == 1
        mark = box(agent, "recorded compaction")
        assert mark["height"] > context["height"] / 2
        assert context["x"] <= mark["x"] <= context["x"] + context["width"]
        box(page.locator('li[data-legend="reference"][data-kind="recorded-compaction"]'), "legend")
        recorded = page.locator('figure[data-chart="cost"] path[data-series="recorded"]')
        assert recorded.count() == 1
        box(recorded, "recorded cost line")
        entry = page.locator('figure[data-chart="cost"] li[data-kind="recorded"]')
        assert (entry.text_content() or "").startswith("recorded ($")
        box(entry, "recorded cost legend entry")

        rows = page.locator("table.totals tbody tr")
        assert rows.count() == len(policies)
        for i, policy in enumerate(policies):
            row = rows.nth(i)
            assert row.is_visible(), policy
            assert row.get_attribute("data-policy") == policy
            box(row, f"table row {policy}")
        finish(watched, url, ARTIFACT)
