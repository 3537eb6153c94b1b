"""The tune HTML report, opened in a real browser (Debian's Chromium, headless).

The fixture is the ``report.json`` of a real tune (``kilo-rules tune``) of kilo-default on
Sonnet 4.5 over the two Claude Code sessions, its paths made relative: three values of
``overflow.threshold_percent`` by two of ``compaction.preserve_recent_tokens``, at most one
compaction per session. Two candidates compact three times (infeasible, and the cheapest);
the winner is not the baseline. The page must load nothing but itself, raise no error, and
lay out every chart, axis label, winner and baseline label and table row with a real size.
The full-page screenshot is kept as a test artifact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.tools.simulation.htmlreport import render_tune_html

from .chromium import chromium, finish, open_page
from .test_report_chromium import box

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "tune" / "report.json"
ARTIFACT = ROOT / "build" / "test-artifacts" / "tune-report.png"


@pytest.mark.slow
def test_tune_report_renders_in_chromium(tmp_path: Path) -> None:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    candidates = doc["candidates"]
    knobs = [k["path"] for k in doc["knobs"]]
    winner = doc["winner"]["index"]
    infeasible = [c["index"] for c in candidates if not c["feasible"]]
    assert infeasible and winner != 0  # what the fixture is for
    # Feasible first, each group by cost.
    order = [
        c["index"]
        for c in sorted(candidates, key=lambda c: (not c["feasible"], c["cost_usd"], c["index"]))
    ]
    page_file = tmp_path / "tune-report.html"
    url = page_file.as_uri()
    with chromium() as browser:
        watched = open_page(browser, render_tune_html(doc), page_file)
        page = watched.page

        charts = ["cost-compactions", *(f"knob-{i}" for i in range(len(knobs)))]
        chart_boxes = {}
        for chart in charts:
            svg = page.locator(f'figure[data-chart="{chart}"] svg.chart')
            assert svg.count() == 1, chart
            assert svg.is_visible(), chart
            chart_boxes[chart] = box(svg, f"{chart} chart")
            # Scaled to the column width (viewBox), not collapsed or overflowing.
            assert 900 <= chart_boxes[chart]["width"] <= 1200, (chart, chart_boxes[chart])

        labels = page.locator("svg text.axis-label")
        texts = [labels.nth(i).text_content() for i in range(labels.count())]
        assert texts == [t for x in ("compactions", *knobs) for t in (x, "cost (USD)")]
        for i, text in enumerate(texts):
            box(labels.nth(i), f"axis label {text!r}")

        # Every candidate is a point of the compactions chart, the infeasible ones hollow.
        first = page.locator('figure[data-chart="cost-compactions"]')
        assert first.locator("[data-point]").count() == len(candidates)
        hollow = first.locator('[data-point="infeasible"]')
        assert sorted(
            int(hollow.nth(i).get_attribute("data-candidate") or -1) for i in range(hollow.count())
        ) == sorted(infeasible)

        # The winner is labelled in every chart, the baseline where it is drawn (not in the
        # knob charts: its own value may be none of those tried), each inside its chart.
        for chart, kinds in zip(
            charts, [("winner", "baseline"), *([("winner",)] * len(knobs))], strict=True
        ):
            frame = chart_boxes[chart]
            for kind in ("winner", "baseline"):
                label = page.locator(f'figure[data-chart="{chart}"] text[data-label="{kind}"]')
                assert label.count() == (1 if kind in kinds else 0), (chart, kind)
                if kind not in kinds:
                    continue
                assert label.text_content() == kind
                found = box(label, f"{kind} label in {chart}")
                assert frame["x"] <= found["x"] <= frame["x"] + frame["width"] - found["width"]
                assert frame["y"] <= found["y"] <= frame["y"] + frame["height"] - found["height"]
                entry = page.locator(
                    f'figure[data-chart="{chart}"] li[data-legend="point"][data-kind="{kind}"]'
                )
                box(entry, f"{kind} legend entry in {chart}")

        rows = page.locator("table.candidates-table tbody tr")
        assert rows.count() == len(candidates)
        assert [rows.nth(i).get_attribute("data-candidate") for i in range(rows.count())] == [
            str(i) for i in order
        ]
        for i in range(rows.count()):
            row = rows.nth(i)
            assert row.is_visible(), i
            box(row, f"table row {i}")
        box(page.locator(f'tr[data-candidate="{winner}"].winner .tag.winner'), "winner tag")
        box(page.locator('tr[data-candidate="0"].baseline .tag.baseline'), "baseline tag")
        finish(watched, url, ARTIFACT)
