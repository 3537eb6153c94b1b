"""The HTML report of ``simulate`` (``kilo_rules.tools.simulation.htmlreport``), read back as a
document.

The page is well-formed XML (void elements are self-closed, every string is escaped), so
these tests parse it with ElementTree and assert on elements and attributes rather than on
substrings. The fixtures are real ``simulate --format json`` outputs: a 12-request subagent
session (no compaction) and a 143-request session in which every policy compacts once.
``enriched`` adds the document keys newer simulators write (floor, calibration, compaction
limits, prunes, recorded input), an overflow and a stopped policy.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.tools.simulation.htmlreport import (
    MAX_CHARTED_SESSIONS,
    MAX_POINTS,
    DocumentError,
    render_html,
    render_tune_html,
)

FIXTURES = Path(__file__).parent / "fixtures" / "simulate"
SVG_NS = "http://www.w3.org/2000/svg"
OPUS_POLICIES = ["kilo-default", "cache-max", "long-run", "local-small"]
HOSTILE = "<script>alert(1)</script>"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return doc


def small() -> dict[str, Any]:
    return load("sonnet45-subagent.json")


def opus() -> dict[str, Any]:
    return load("opus46-spotter.json")


def parse(text: str) -> ET.Element:
    """The page as an element tree, SVG namespace dropped so one path syntax finds all."""
    root = ET.fromstring(text)
    for el in root.iter():
        if el.tag.startswith("{"):
            el.tag = el.tag.split("}", 1)[1]
    return root


def text_of(el: ET.Element) -> str:
    return "".join(el.itertext())


def one(root: ET.Element, path: str) -> ET.Element:
    found = root.findall(path)
    assert len(found) == 1, f"{path}: {len(found)} elements"
    return found[0]


def path_points(d: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"(-?[\d.]+),(-?[\d.]+)", d)]


def enriched() -> dict[str, Any]:
    """The opus fixture with every optional key, one provider overflow and a stopped policy."""
    doc = opus()
    doc["floor"] = {
        "cost_usd": 2.5,
        "policy": "kilo-default",
        "input": 11_000_000,
        "cache_write": 180_000,
        "cache_read": 10_820_000,
        "output": 40_320,
    }
    doc["calibration"] = {
        "factor": 1.0331,
        "offset": 12_118,
        "r2": 0.99956,
        "steps": 120,
        "median_abs_error": 0.00356,
        "declared": False,
        "applied": True,
    }
    recorded = {st["index"]: st["input"] * 104 // 100 + 900 for st in doc["reports"][0]["steps"]}
    for i, r in enumerate(doc["reports"]):
        r["compaction_limit"] = 160_000 if i < 3 else 140_000
        r["floor_ratio"] = round(r["cost_usd"] / 2.5, 4)
        for st in r["steps"]:
            st["prunes"] = 1 if st["index"] % 40 == 0 else 0
            st["recorded_input"] = recorded[st["index"]]
    local = doc["reports"][3]
    local["provider_overflows"] = 1
    local["steps"][90]["provider_overflows"] = 1  # request 91, the one it compacted before
    stopped = copy.deepcopy(doc["reports"][1])
    stopped.update(
        policy="tight-window",
        requests=100,
        stopped=True,
        error="compaction exhausted: the tail alone exceeds the window",
        steps=stopped["steps"][:100],
        cost_usd=sum(st["cost_usd"] for st in stopped["steps"][:100]),
    )
    doc["reports"].append(stopped)
    return doc


def _report(policy: str, rows: list[dict[str, Any]], **given: Any) -> dict[str, Any]:
    """A whole report of ``rows`` (its steps): the totals are the steps' sums."""

    def total(key: str) -> int:
        return sum(int(r[key]) for r in rows)

    out: dict[str, Any] = {
        "policy": policy,
        "model": "anthropic/claude-sonnet-4-5",
        "counter": "tiktoken:cl100k_base",
        "requests": len(rows),
        "requests_total": len(rows),
        "stopped": False,
        "compactions": total("compactions"),
        "provider_overflows": total("provider_overflows"),
        "input": total("input"),
        "cache_read": total("cache_read"),
        "cache_write": total("cache_write_5m") + total("cache_write_1h"),
        "cache_write_5m": total("cache_write_5m"),
        "cache_write_1h": total("cache_write_1h"),
        "uncached": total("uncached"),
        "output": total("output"),
        "summary_input": 0,
        "summary_output": 0,
        "max_request": max((r["input"] for r in rows), default=0),
        "window": 200_000,
        "cost_usd": None,
        "error": None,
        "steps": rows,
    }
    out.update(given)
    return out


def long_doc(steps: int = 10_000) -> dict[str, Any]:
    """A synthetic session of ``steps`` requests and two policies, with one marker of each
    kind in the middle of a bucket (where no min/max selection would keep it)."""
    reports = []
    for p, policy in enumerate(("steady", "bursty")):
        rows = []
        for i in range(1, steps + 1):
            size = 20_000 + (i * 7919 + p * 104_729) % 60_000
            rows.append(
                {
                    "index": i,
                    "message_id": f"msg_{i:06d}",
                    "input": size,
                    "cache_read": size - 500,
                    "cache_write_5m": 400,
                    "cache_write_1h": 0,
                    "uncached": 100,
                    "output": 50,
                    "compactions": 1 if i == 2_500 else 0,
                    "provider_overflows": 1 if i == 7_777 else 0,
                    "prunes": 1 if i == 5_000 else 0,
                    "markers": 2,
                    "cost_usd": 0.01,
                }
            )
        # The marked requests sit mid-range: only the keep-the-markers rule draws them.
        for i in (2_500, 5_000, 7_777):
            if i <= steps:
                rows[i - 1]["input"] = 50_000
        reports.append(_report(policy, rows, cost_usd=0.01 * steps))
    return {
        "version": 1,
        "session": "synthetic.jsonl",
        "session_messages": 2 * steps + 1,
        "model": "anthropic/claude-sonnet-4-5",
        "cache": {"kind": "explicit", "max_breakpoints": 4, "min_cacheable_tokens": 1024},
        "prices": {"input": 3.0, "output": 15.0},
        "reports": reports,
    }


def corpus(n: int, *, aggregate: bool = True) -> dict[str, Any]:
    sessions = []
    for i in range(n):
        doc = opus() if i == 1 else small()
        doc["session"] = f"corpus/session-{i + 1:02d}.jsonl"
        sessions.append(doc)
    out: dict[str, Any] = {
        "version": 1,
        "model": "anthropic/claude-sonnet-4-5",
        "sessions": sessions,
        "aggregate": {"policies": [], "worst": [], "sessions": n, "failed": 1},
        "failed": [{"session": f"broken/{HOSTILE}.jsonl", "error": "not a session log"}],
    }
    if aggregate:
        out["aggregate"] = {
            "policies": [
                {
                    "policy": "kilo-default",
                    "sessions": n,
                    "stopped": 0,
                    "cost_usd": 12.5,
                    "compactions": 1,
                    "provider_overflows": 0,
                    "input": 123_456_789,
                    "cache_read": 120_000_000,
                    "cache_write": 3_000_000,
                    "output": 400_000,
                    "floor_cost_usd": 10.0,
                    "floor_ratio": 1.25,
                    "cost_p50": 0.35,
                    "cost_p90": 5.1,
                    "cost_max": 5.1,
                },
                {
                    "policy": "local-small",
                    "sessions": n,
                    "stopped": 0,
                    "cost_usd": None,
                    "compactions": 0,
                    "provider_overflows": 0,
                    "input": 0,
                    "cache_read": 0,
                    "cache_write": 0,
                    "output": 0,
                    "floor_cost_usd": None,
                    "floor_ratio": None,
                    "cost_p50": None,
                    "cost_p90": None,
                    "cost_max": None,
                },
            ],
            "worst": [
                {
                    "session": "corpus/session-02.jsonl",
                    "policy": "local-small",
                    "cost_usd": 28.8654,
                    "floor_ratio": 9.5,
                    "compactions": 1,
                    "stopped": False,
                },
                {
                    "session": "elsewhere.jsonl",
                    "policy": "cache-max",
                    "cost_usd": None,
                    "floor_ratio": None,
                    "compactions": 0,
                    "stopped": True,
                },
            ],
            "sessions": n + 1,
            "failed": 1,
        }
    return out


# --- structure of the fixtures ---------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["sonnet45-subagent.json", "opus46-spotter.json"])
def test_each_session_has_three_accessible_charts(fixture: str) -> None:
    root = parse(render_html(load(fixture)))
    charts = [f.get("data-chart") for f in root.iter("figure")]
    assert charts == ["context", "cost", "cache"]
    for figure in root.iter("figure"):
        assert figure[0].tag == "figcaption" and text_of(figure[0]).strip()
        svg = one(figure, "svg")
        assert svg.get("role") == "img"
        assert svg.get("viewBox") == f"0 0 960 {svg.get('viewBox', '').split()[-1]}"
        title_id = svg.get("aria-labelledby")
        title = one(svg, "title")
        assert title.get("id") == title_id == f"s1-{figure.get('data-chart')}-title"
        assert text_of(title).strip()


def test_small_fixture_table_and_header() -> None:
    doc = small()
    text = render_html(doc)
    root = parse(text)
    title = "kilo-rules simulate: examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
    assert text_of(one(root, "head/title")) == f"{title} on anthropic/claude-sonnet-4-5"
    assert text_of(one(root, ".//h1")) == f"{title} on anthropic/claude-sonnet-4-5"
    facts = {
        text_of(dt): text_of(dd)
        for dt, dd in zip(
            root.findall(".//header/dl/dt"), root.findall(".//header/dl/dd"), strict=True
        )
    }
    assert facts["Model"] == "anthropic/claude-sonnet-4-5"
    assert facts["Counter"] == "tiktoken:cl100k_base"
    assert facts["Cache"] == "explicit · max breakpoints 4 · min cacheable tokens 1,024"
    assert facts["Prices"].startswith("input $3.00 · output $15.00 · cache write $3.75")
    assert "Calibration" not in facts and "Floor" not in facts
    assert text_of(one(root, ".//p[@class='lede']")) == (
        "kilo-default and long-run are the cheapest complete replays at $0.3547; "
        "local-small costs $1.54 (4.34× as much)."
    )
    ticks = [
        text_of(t) for t in root.findall(".//figure[@data-chart='cost']//g[@class='tick']/text")
    ]
    assert ticks[:5] == ["$0.00", "$0.50", "$1.00", "$1.50", "$2.00"]
    rows = root.findall(".//table[@class='totals']/tbody/tr")
    assert [r.get("data-policy") for r in rows] == [
        "kilo-default",
        "cache-max",
        "long-run",
        "local-small",
    ]
    cells = [text_of(td) for td in rows[3]]
    # policy, requests, compactions, overflows, input, read, write, uncached, output,
    # max request / window, cost, vs first (no floor: no "vs floor" column)
    assert cells == [
        "local-small",
        "12",
        "0",
        "0",
        "512,271",
        "0",
        "0",
        "512,271",
        "136",
        "57,199 / 200,000",
        "$1.54",
        "4.34×",
    ]
    assert all(td.get("class") == "num" for td in rows[3][1:])
    # kilo-default and long-run tie for the cheapest complete replay
    assert [r.get("class") for r in rows] == ["best", None, "best", None]
    assert not root.findall(".//*[@class='marker']")


def test_opus_fixture_legends_axes_and_compaction_markers() -> None:
    root = parse(render_html(opus()))
    context = one(root, ".//figure[@data-chart='context']")
    legend = {
        (li.get("data-legend"), text_of(li)) for li in context.findall(".//ul[@class='legend']/li")
    }
    assert legend == {
        ("policy", "kilo-default"),
        ("policy", "cache-max"),
        ("policy", "long-run"),
        ("policy", "local-small"),
        ("reference", "window 200,000"),
        ("marker", "compaction"),
        ("marker", "provider overflow"),
    }
    labels = [text_of(t) for t in root.findall(".//text[@class='axis-label']")]
    assert labels == ["request", "tokens", "request", "US dollars", "request", "share of input"]
    markers = {
        (m.get("data-policy"), m.get("data-kind"), m.get("data-step"))
        for m in context.findall(".//*[@class='marker']")
    }
    assert markers == {
        ("kilo-default", "compaction", "111"),
        ("cache-max", "compaction", "111"),
        ("long-run", "compaction", "111"),
        ("local-small", "compaction", "91"),
    }
    tip = one(context, ".//*[@data-policy='local-small'][@data-kind='compaction']/title")
    assert text_of(tip) == "local-small: 1 compaction before request 91 (context 4,731 tokens)"
    lines = context.findall(".//path[@data-series='policy']")
    assert [p.get("data-policy") for p in lines] == OPUS_POLICIES
    assert all(len(path_points(p.get("d", ""))) == 143 for p in lines)
    cache = one(root, ".//figure[@data-chart='cache']")
    assert [li.get("data-kind") for li in cache.findall(".//li")] == ["read", "write", "uncached"]
    panels = cache.findall(".//g[@class='panel']")
    assert [g.get("data-policy") for g in panels] == OPUS_POLICIES
    assert "0% read · 0% written · 100% uncached" in text_of(panels[3])


def test_opus_cost_lines_end_at_the_table_totals() -> None:
    """Summary calls are in a report's cost but not in its steps: the line adds them at the
    compaction, so it ends where the table's cost is."""
    root = parse(render_html(opus()))
    cost = one(root, ".//figure[@data-chart='cost']")
    assert [text_of(li) for li in cost.findall(".//li[@data-legend='policy']")] == [
        "kilo-default ($5.10)",
        "cache-max ($5.66)",
        "long-run ($5.10)",
        "local-small ($28.87)",
    ]
    rows = root.findall(".//table[@class='totals']/tbody/tr")
    assert [text_of(r[10]) for r in rows] == ["$5.10", "$5.66", "$5.10", "$28.87"]
    assert text_of(one(root, ".//p[@class='lede']")) == (
        "kilo-default is the cheapest complete replay at $5.10; "
        "local-small costs $28.87 (5.66× as much)."
    )
    assert [text_of(r[11]) for r in rows] == ["1.00×", "1.11×", "1.00×", "5.66×"]
    assert "added at the requests that followed them" in text_of(one(cost, "figcaption"))


def test_optional_keys_floor_calibration_limits_prunes_recorded() -> None:
    root = parse(render_html(enriched()))
    facts = dict(
        zip(
            [text_of(dt) for dt in root.findall(".//header/dl/dt")],
            [text_of(dd) for dd in root.findall(".//header/dl/dd")],
            strict=True,
        )
    )
    assert facts["Calibration"] == (
        "reported ≈ 1.0331 × simulated + 12,118 tokens · fitted on 120 steps · R² 0.9996 · "
        "median error 0.36% · applied"
    )
    assert facts["Floor"].startswith(
        "$2.50 (kilo-default's requests under a perfect cache) — 11,000,000 input tokens: "
        "180,000 written"
    )
    rows = root.findall(".//table[@class='totals']/tbody/tr")
    assert len(rows) == 5
    stopped = rows[4]
    assert stopped.get("class") == "stopped"
    assert text_of(stopped[1]) == "100 of 143, stopped"
    # floor_ratio from the document, not recomputed
    assert [text_of(r[12]) for r in rows[:4]] == ["2.04×", "2.27×", "2.04×", "11.55×"]
    assert text_of(one(root, ".//p[@class='lede']")).endswith(
        "The floor is $2.50: the cheapest costs 2.04× that. "
        "1 policy stopped early: fewer requests, so not compared."
    )
    errors = one(root, ".//ul[@class='errors']")
    assert text_of(errors).strip() == (
        "tight-window stopped after 100 requests of 143: "
        "compaction exhausted: the tail alone exceeds the window"
    )
    context = one(root, ".//figure[@data-chart='context']")
    limits = context.findall(".//line[@class='compaction-limit']")
    assert [(x.get("data-policy"), x.get("stroke-dasharray")) for x in limits][:4] == [
        ("kilo-default", "6 4"),
        ("cache-max", "6 4"),
        ("long-run", "6 4"),
        ("local-small", "6 4"),
    ]
    assert text_of(one(limits[3], "title")) == "local-small compacts at 140,000 tokens"
    recorded = one(context, ".//path[@data-series='recorded']")
    assert (recorded.get("stroke"), recorded.get("stroke-width")) == ("#C9CED6", "7")
    assert len(path_points(recorded.get("d", ""))) == 143
    kinds = [li.get("data-kind") for li in context.findall(".//li") if li.get("data-kind")]
    assert kinds == [
        "window",
        "compaction-limit",
        "recorded",
        "compaction",
        "prune",
        "overflow",
    ]
    overflow = context.findall(".//*[@data-kind='overflow'][@class='marker']")
    assert [(m.get("data-policy"), m.get("data-step")) for m in overflow] == [("local-small", "91")]
    prunes = {
        (m.get("data-policy"), m.get("data-step"))
        for m in context.findall(".//rect[@data-kind='prune']")
    }
    assert ("kilo-default", "120") in prunes and ("tight-window", "80") in prunes
    assert ("tight-window", "120") not in prunes  # it stopped at request 100
    cost = one(root, ".//figure[@data-chart='cost']")
    assert text_of(one(cost, ".//li[@data-kind='floor']")) == "floor $2.50"


def _facts(root: ET.Element) -> dict[str, str]:
    return dict(
        zip(
            [text_of(dt) for dt in root.findall(".//header/dl/dt")],
            [text_of(dd) for dd in root.findall(".//header/dl/dd")],
            strict=True,
        )
    )


def test_calibrated_counts_are_named_as_such() -> None:
    root = parse(render_html(enriched()))  # its calibration is applied
    calibrated = (
        "tiktoken:cl100k_base, calibrated to the provider's count (1.0331 × counted + "
        "12,118 hidden tokens)"
    )
    assert _facts(root)["Counter"] == calibrated
    caption = text_of(one(root, ".//table[@class='totals']/caption"))
    assert caption.startswith(f"Totals per policy. Tokens as counted by {calibrated}; costs")
    context = text_of(one(root, ".//figure[@data-chart='context']/figcaption"))
    assert "The counts are calibrated to the provider's" in context
    doc = enriched()
    doc["calibration"]["applied"] = False
    root = parse(render_html(doc))
    assert _facts(root)["Counter"] == "tiktoken:cl100k_base"
    caption = text_of(one(root, ".//table[@class='totals']/caption"))
    assert caption.startswith("Totals per policy. Tokens as counted by tiktoken:cl100k_base; costs")


def _with_recorded() -> dict[str, Any]:
    doc = opus()
    costs = [round(st["cost_usd"] * 0.9, 6) for st in doc["reports"][0]["steps"]]
    costs[10] = None  # a request the log holds no usage for
    doc["recorded"] = {
        "requests": 144,
        "with_usage": 142,
        "input": 9_000_000,
        "output": 40_000,
        "cost_usd": sum(c for c in costs if c is not None),
        "request_costs_usd": costs,
        "compactions": [72],
    }
    doc["notes"] = ["not calibrated: the log records no usage to calibrate with"]
    return doc


def test_the_recorded_agents_compactions_and_cost_are_drawn() -> None:
    doc = _with_recorded()
    total = doc["recorded"]["cost_usd"]
    root = parse(render_html(doc))
    facts = _facts(root)
    assert facts["As recorded"] == (
        f"${total:,.2f} at these prices, from the usage the log reports; the agent compacted 1 time"
    )
    assert facts["Note"] == "not calibrated: the log records no usage to calibrate with"
    context = one(root, ".//figure[@data-chart='context']")
    (line,) = context.findall(".//line[@class='recorded-compaction']")
    assert line.get("data-step") == "72"
    assert line.get("x1") == line.get("x2")
    # at request 72 of the policies' lines (one point per request)
    kilo = one(context, ".//path[@data-series='policy'][@data-policy='kilo-default']")
    assert float(line.get("x1", "")) == path_points(kilo.get("d", ""))[71][0]
    assert text_of(one(line, "title")) == "the recorded agent compacted before request 72"
    legend = one(context, ".//li[@data-kind='recorded-compaction']")
    assert text_of(legend) == "the recorded agent compacted"
    cost = one(root, ".//figure[@data-chart='cost']")
    series = one(cost, ".//path[@data-series='recorded']")
    points = path_points(series.get("d", ""))
    assert len(points) == 143
    assert all(b[1] <= a[1] for a, b in pairwise(points))  # climbs (SVG y)
    assert text_of(one(cost, ".//li[@data-kind='recorded']")) == f"recorded (${total:,.2f})"
    assert "the session as recorded" in text_of(one(cost, "figcaption"))


def test_no_recorded_section_draws_no_recorded_marks() -> None:
    root = parse(render_html(opus()))
    assert not root.findall(".//*[@class='recorded-compaction']")
    assert not root.findall(".//figure[@data-chart='cost']//path[@data-series='recorded']")
    assert "As recorded" not in _facts(root)


def test_declared_calibration_not_applied() -> None:
    doc = small()
    doc["calibration"] = {
        "factor": 1.2,
        "offset": 0,
        "r2": None,
        "steps": 0,
        "median_abs_error": None,
        "declared": True,
    }
    doc["calibration"]["applied"] = False
    root = parse(render_html(doc))
    dd = root.findall(".//header/dl/dd")[-1]
    assert text_of(dd) == "reported ≈ 1.2 × simulated + 0 tokens · declared by hand · not applied"


def test_steps_in_any_order_draw_the_same_page() -> None:
    """The lines run in request order whatever order the steps arrive in."""
    doc = opus()
    shuffled = copy.deepcopy(doc)
    for r in shuffled["reports"]:
        r["steps"] = r["steps"][1::2] + r["steps"][::2]
    assert render_html(shuffled) == render_html(doc)
    lines = parse(render_html(shuffled)).findall(".//path[@data-series='policy']")
    assert lines
    for line in lines:
        xs = [x for x, _ in path_points(line.get("d", ""))]
        assert xs == sorted(xs)


def test_a_hand_trimmed_document_is_refused_at_the_first_missing_key() -> None:
    steps = [{"index": i, "input": 1000 * i, "uncached": 1000 * i} for i in (3, 1, 2)]
    with pytest.raises(DocumentError) as info:
        render_html({"version": 1, "reports": [{"policy": "p", "steps": steps}]})
    assert (info.value.path, info.value.problem) == ("session", "missing (a required key)")


def test_no_prices_skips_the_cost_chart_with_a_note() -> None:
    doc = small()
    doc["prices"] = None
    for r in doc["reports"]:
        r["cost_usd"] = None
        for st in r["steps"]:
            st["cost_usd"] = None
    root = parse(render_html(doc))
    assert [f.get("data-chart") for f in root.iter("figure")] == ["context", "cache"]
    note = one(root, ".//p[@data-skipped='cost']")
    assert text_of(note) == (
        "No cost chart: the model anthropic/claude-sonnet-4-5 has no prices in the catalog."
    )
    rows = root.findall(".//table[@class='totals']/tbody/tr")
    assert {text_of(r[10]) for r in rows} == {"—"}


def test_reports_without_steps_render_the_table_only() -> None:
    doc = small()
    for r in doc["reports"]:
        del r["steps"]
    root = parse(render_html(doc))
    assert not list(root.iter("figure"))
    assert len(root.findall(".//table[@class='totals']/tbody/tr")) == 4
    assert one(root, ".//p[@data-skipped='charts']") is not None


# --- safety ----------------------------------------------------------------------------------


def test_strings_from_the_document_are_escaped() -> None:
    doc = small()
    doc["session"] = f"sessions/{HOSTILE}.jsonl"
    doc["model"] = f'"><img src=x onerror=alert(2)>{HOSTILE}'
    doc["reports"][1]["policy"] = HOSTILE
    doc["reports"][1]["error"] = f"boom {HOSTILE}"
    doc["reports"][1]["stopped"] = True
    doc["notes"] = [HOSTILE]
    text = render_html(doc)
    assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    root = parse(text)  # still well-formed: no markup escaped its attribute or element
    rows = root.findall(".//table[@class='totals']/tbody/tr")
    assert rows[1].get("data-policy") == HOSTILE
    assert text_of(rows[1][0]) == HOSTILE
    legend = one(root, ".//figure[@data-chart='context']//li[@data-policy='" + HOSTILE + "']")
    assert text_of(legend) == HOSTILE
    assert text_of(one(root, ".//ul[@class='errors']")).strip().endswith(f"boom {HOSTILE}")
    assert text_of(one(root, ".//h1")) == (
        f"kilo-rules simulate: sessions/{HOSTILE}.jsonl on {doc['model']}"
    )


@pytest.mark.parametrize(
    "doc",
    [pytest.param(enriched(), id="enriched"), pytest.param(corpus(3), id="corpus")],
)
def test_page_is_self_contained(doc: dict[str, Any]) -> None:
    text = render_html(doc)
    lowered = text.lower()
    assert "<script" not in lowered
    assert set(re.findall(r"https?://[^\s\"'<>)]*", text)) == {SVG_NS}
    for needle in ("<link", "<img", "<iframe", "<object", "<embed", "url(", "@import", " src="):
        assert needle not in lowered, needle
    root = parse(text)
    csp = one(root, ".//meta[@http-equiv='Content-Security-Policy']")
    assert (csp.get("content") or "").startswith("default-src 'none'")
    ids = [el.get("id") for el in root.iter() if el.get("id")]
    assert len(ids) == len(set(ids))
    # In-page links only (the worst list points at session sections).
    for a in root.iter("a"):
        href = a.get("href") or ""
        assert href.startswith("#") and href[1:] in ids


def test_output_is_deterministic() -> None:
    first = render_html(enriched())
    assert render_html(enriched()) == first
    # Independent of the order keys happen to arrive in.
    reordered = json.loads(json.dumps(enriched(), sort_keys=True))
    assert render_html(reordered) == first


def test_title_replaces_the_default() -> None:
    root = parse(render_html(small(), title="Nightly <cost> report"))
    assert text_of(one(root, ".//h1")) == "Nightly <cost> report"
    assert text_of(one(root, "head/title")) == "Nightly <cost> report"


# --- long sessions ---------------------------------------------------------------------------


def test_long_series_are_reduced_keeping_every_marker() -> None:
    text = render_html(long_doc())
    assert len(text.encode()) < 300_000  # 10,000 requests x 2 policies
    root = parse(text)
    context = one(root, ".//figure[@data-chart='context']")
    caption = text_of(one(context, "figcaption"))
    assert f"more than {MAX_POINTS:,} points" in caption
    assert "bursty 10,000 → " in caption and "steady 10,000 → " in caption
    for line in context.findall(".//path[@data-series='policy']"):
        points = path_points(line.get("d", ""))
        assert MAX_POINTS - 10 <= len(points) <= MAX_POINTS + 5
        xs = [x for x, _ in points]
        assert xs == sorted(xs)
        for kind, step in (("compaction", "2500"), ("prune", "5000"), ("overflow", "7777")):
            marker = one(
                context,
                f".//*[@class='marker'][@data-policy='{line.get('data-policy')}']"
                f"[@data-kind='{kind}']",
            )
            assert marker.get("data-step") == step
            # The marker sits on a point of the reduced line.
            if kind == "prune":
                cx = float(marker.get("x", "0")) + 3.5
                cy = float(marker.get("y", "0")) + 3.5
            else:
                shape = path_points(marker.get("d", ""))
                cx = sum(x for x, _ in shape) / len(shape)
                cy = max(y for _, y in shape) - (5 if kind == "compaction" else 4)
            assert any(abs(x - cx) < 0.15 and abs(y - cy) < 0.15 for x, y in points), kind
    cost = one(root, ".//figure[@data-chart='cost']")
    for line in cost.findall(".//path[@data-series='policy']"):
        assert len(path_points(line.get("d", ""))) <= MAX_POINTS + 2
    cache = one(root, ".//figure[@data-chart='cache']")
    assert "summed into one column" in text_of(one(cache, "figcaption"))
    for area in cache.findall(".//path[@class='area']"):
        assert (area.get("d") or "").count("H") == 300


def test_short_series_are_drawn_whole() -> None:
    text = render_html(long_doc(MAX_POINTS))
    context = one(parse(text), ".//figure[@data-chart='context']")
    assert "reduced" not in text_of(one(context, "figcaption"))
    for line in context.findall(".//path[@data-series='policy']"):
        assert len(path_points(line.get("d", ""))) == MAX_POINTS


# --- corpora ---------------------------------------------------------------------------------


def test_corpus_aggregate_worst_and_sections() -> None:
    root = parse(render_html(corpus(2)))
    assert text_of(one(root, ".//h1")) == "kilo-rules simulate: 2 sessions"
    agg = root.findall(".//table[@class='aggregate-table']/tbody/tr")
    assert [r.get("data-policy") for r in agg] == ["kilo-default", "local-small"]
    assert [text_of(td) for td in agg[0]] == [
        "kilo-default",
        "2",
        "0",
        "$12.50",
        "$0.3500",
        "$5.10",
        "$5.10",
        "1",
        "0",
        "123,456,789",
        "120,000,000",
        "3,000,000",
        "400,000",
        "$10.00",
        "1.25×",
    ]
    assert text_of(agg[1][3]) == "—"
    worst = root.findall(".//table[@class='worst-table']/tbody/tr")
    assert [text_of(td) for td in worst[0]] == [
        "1",
        "corpus/session-02.jsonl",
        "local-small",
        "$28.87",
        "9.50×",
        "1",
        "",
    ]
    assert one(worst[0], ".//a").get("href") == "#s2"
    assert not worst[1].findall(".//a")  # not a session of this page
    assert text_of(worst[1][6]) == "stopped"
    failed = one(root, ".//section[@class='failed']")
    assert text_of(one(failed, "h2")) == "1 session could not be replayed"
    assert text_of(one(failed, "ul")) == f"broken/{HOSTILE}.jsonl: not a session log"
    sections = root.findall(".//section[@class='session']")
    assert [s.get("id") for s in sections] == ["s1", "s2"]
    assert [len(s.findall(".//figure")) for s in sections] == [3, 3]
    markers = sections[1].findall(".//*[@class='marker'][@data-step='111']")
    assert len(markers) == 3
    assert not root.findall(".//section[@class='rest']")


def test_corpus_draws_at_most_the_cap_and_lists_the_rest() -> None:
    n = MAX_CHARTED_SESSIONS + 3
    root = parse(render_html(corpus(n, aggregate=False)))
    assert len(root.findall(".//figure[@data-chart='context']")) == MAX_CHARTED_SESSIONS
    assert len(root.findall(".//section[@class='session']")) == MAX_CHARTED_SESSIONS
    assert not root.findall(".//section[@class='aggregate']")
    rest = one(root, ".//section[@class='rest']")
    assert text_of(one(rest, "h2")) == "3 more sessions"
    head = [text_of(th) for th in rest.findall(".//thead/tr/th")]
    assert head == ["#", "Session", "Model", "Requests", *OPUS_POLICIES]
    rows = rest.findall(".//tbody/tr")
    assert [text_of(r[1]) for r in rows] == [
        "corpus/session-21.jsonl",
        "corpus/session-22.jsonl",
        "corpus/session-23.jsonl",
    ]
    assert [text_of(td) for td in rows[0]][3:] == ["12", "$0.3547", "$0.4834", "$0.3547", "$1.54"]


# --- invalid documents -----------------------------------------------------------------------


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node: Any = doc
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return doc


def _without(doc: dict[str, Any], path: str) -> dict[str, Any]:
    node: Any = doc
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    return doc


CALIBRATION = {
    "factor": 1.0,
    "offset": 0,
    "r2": None,
    "steps": 0,
    "median_abs_error": None,
    "declared": True,
    "applied": True,
}
RECORDED = {
    "requests": 12,
    "with_usage": 12,
    "input": 1000,
    "output": 10,
    "cost_usd": 0.1,
    "request_costs_usd": [0.1],
    "compactions": [],
}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "simulation document: expected an object, got a list"),
        (
            {"version": 1},
            "simulation document: expected a 'reports' list (one session) or a 'sessions' "
            "list (a corpus), found neither",
        ),
        (
            _with(small(), "reports", []),
            "reports: expected at least one report, got an empty list",
        ),
        (_with(small(), "reports", "all"), "reports: expected a list, got a string"),
        (_with(small(), "reports", [7]), "reports[0]: expected an object, got a number"),
        (_without(small(), "reports.0.policy"), "reports[0].policy: missing (a required key)"),
        (
            _with(small(), "reports.0.policy", 3),
            "reports[0].policy: expected a string, got a number",
        ),
        (
            _with(small(), "reports.0.bogus", 1),
            "reports[0].bogus: unknown key (not part of a version 1 document)",
        ),
        (
            {"version": 2, "reports": []},
            "version: this page reads version 1 documents, got version 2",
        ),
        (
            _with(small(), "reports.0.steps.5.input", "51838"),
            "reports[0].steps[5].input: expected an integer, got a string",
        ),
        (
            _with(small(), "reports.2.steps.0.cache_read", True),
            "reports[2].steps[0].cache_read: expected an integer, got a boolean",
        ),
        (
            _with(small(), "reports.1.steps.3.input", None),
            "reports[1].steps[3].input: expected an integer, got null",
        ),
        (
            _without(small(), "reports.1.steps.3.input"),
            "reports[1].steps[3].input: missing (a required key)",
        ),
        (
            _with(small(), "reports.0.cost_usd", "0.35"),
            "reports[0].cost_usd: expected a number, got a string",
        ),
        (
            _with(small(), "reports.0.cost_usd", float("nan")),
            "reports[0].cost_usd: expected a finite number, got nan",
        ),
        (
            _with(small(), "reports.0.stopped", "no"),
            "reports[0].stopped: expected true or false, got a string",
        ),
        (_with(small(), "prices", [3.0]), "prices: expected an object, got a list"),
        (
            _with(small(), "prices.input", "3"),
            "prices.input: expected a number, got a string",
        ),
        (
            _with(
                small(),
                "floor",
                {
                    "cost_usd": "cheap",
                    "policy": "kilo-default",
                    "input": 0,
                    "cache_write": 0,
                    "cache_read": 0,
                    "output": 0,
                },
            ),
            "floor.cost_usd: expected a number, got a string",
        ),
        (
            _with(small(), "calibration", {**CALIBRATION, "applied": 1}),
            "calibration.applied: expected true or false, got a number",
        ),
        (
            _with(small(), "reports.0.compaction_limit", 1.5),
            "reports[0].compaction_limit: expected an integer, got a number",
        ),
        (
            _with(small(), "reports.0.steps.0.recorded_input", "600"),
            "reports[0].steps[0].recorded_input: expected an integer, got a string",
        ),
        (
            _with(small(), "recorded", {**RECORDED, "compactions": ["72"]}),
            "recorded.compactions[0]: expected an integer, got a string",
        ),
        (
            _with(small(), "recorded", {**RECORDED, "request_costs_usd": [0.1, "x"]}),
            "recorded.request_costs_usd[1]: expected a number, got a string",
        ),
        (_with(small(), "notes", [1]), "notes[0]: expected a string, got a number"),
        (
            _with(corpus(1), "sessions", []),
            "sessions: expected at least one session, got an empty list",
        ),
        (_with(corpus(1), "sessions", {"a": 1}), "sessions: expected a list, got an object"),
        (
            _with(corpus(2), "sessions.1", {"session": "x"}),
            "sessions[1].version: missing (a required key)",
        ),
        (
            _with(corpus(2), "failed.0.diagnostics", [{"code": "x"}]),
            "failed[0].diagnostics[0].severity: missing (a required key)",
        ),
        (
            _with(corpus(3), "sessions.2.reports.0.steps.5.input", "many"),
            "sessions[2].reports[0].steps[5].input: expected an integer, got a string",
        ),
        (
            _with(corpus(2), "aggregate.policies.1.cost_p90", "high"),
            "aggregate.policies[1].cost_p90: expected a number, got a string",
        ),
        (
            _with(corpus(2), "aggregate.worst", {"session": "x"}),
            "aggregate.worst: expected a list, got an object",
        ),
    ],
)
def test_invalid_documents_name_the_bad_value(doc: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        render_html(doc)
    assert str(info.value) == message
    assert isinstance(info.value, DocumentError)


TUNE_REPORT = Path(__file__).parent / "fixtures" / "tune" / "report.json"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("candidates.1.session_costs.0", "0.3", "expected a number, got a string"),
        ("candidates.2.status", "done", "expected 'measured' or 'skipped', got 'done'"),
        ("constraints.max_overflows", True, "expected an integer, got a boolean"),
        ("winner.index", 99, "no candidate 99 in candidates"),
        ("candidates.1.index", 0, "candidate 0 is listed twice"),
        (
            "knobs.0.values.0",
            {"a": 1},
            "expected an integer, a number, true or false, a string or null, got an object",
        ),
    ],
)
def test_invalid_tune_reports_name_the_bad_value(path: str, value: Any, message: str) -> None:
    doc = _with(json.loads(TUNE_REPORT.read_text(encoding="utf-8")), path, value)
    with pytest.raises(DocumentError) as info:
        render_tune_html(doc)
    where = re.sub(r"\.(\d+)", r"[\1]", path)
    assert str(info.value) == f"{where}: {message}"


def test_a_dotted_key_is_quoted_in_the_path() -> None:
    doc = json.loads(TUNE_REPORT.read_text(encoding="utf-8"))
    doc["candidates"][1]["values"]["overflow.threshold_percent"] = [60]
    with pytest.raises(DocumentError) as info:
        render_tune_html(doc)
    assert info.value.path == 'candidates[1].values["overflow.threshold_percent"]'


# --- the templates -----------------------------------------------------------------------------

# Markup and every character that escaping changes, quotes included.
NASTY = HOSTILE + "\"&'"
# NASTY as html.escape writes it, the escaping the pages have always had.
NASTY_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&amp;&#x27;"


def _assert_inert(text: str) -> ET.Element:
    assert "<script" not in text.lower()
    assert NASTY_ESCAPED in text
    return parse(text)  # still well-formed: nothing escaped its attribute or element


def test_markup_and_quotes_in_names_are_escaped_in_every_block_of_a_corpus_page() -> None:
    doc = corpus(MAX_CHARTED_SESSIONS + 1)
    first = doc["sessions"][0]
    first["session"] = f"corpus/{NASTY}.jsonl"
    first["reports"][0]["policy"] = NASTY
    first["notes"] = [NASTY]
    doc["sessions"][-1]["session"] = f"rest/{NASTY}.jsonl"
    doc["aggregate"]["policies"][0]["policy"] = NASTY
    doc["aggregate"]["worst"][0]["session"] = first["session"]
    doc["aggregate"]["worst"][1]["policy"] = NASTY
    doc["failed"][0]["error"] = NASTY
    root = _assert_inert(render_html(doc))
    assert one(root, ".//table[@class='aggregate-table']/tbody/tr[1]").get("data-policy") == NASTY
    worst = root.findall(".//table[@class='worst-table']/tbody/tr")
    assert text_of(worst[0][1]) == first["session"]
    assert one(root, ".//table[@class='worst-table']//a").get("href") == "#s1"
    assert text_of(worst[1][2]) == NASTY
    assert text_of(one(root, ".//section[@id='failed']//li")).endswith(f": {NASTY}")
    assert text_of(one(root, ".//section[@id='s1']/h2")) == f"1. {first['session']}"
    totals = one(root, ".//table[@id='s1-totals']")
    assert f"divides each cost by {NASTY}'s" in text_of(one(totals, "caption"))
    assert totals.findall("tbody/tr")[0].get("data-policy") == NASTY
    legend = root.findall(".//figure[@id='s1-context']//li[@data-policy]")[0]
    assert legend.get("data-policy") == text_of(legend) == NASTY
    rest = root.findall(".//table[@class='rest-table']/tbody/tr")
    assert text_of(rest[-1][1]) == f"rest/{NASTY}.jsonl"
    facts = one(root, ".//section[@id='s1']/dl[@class='facts']")
    assert NASTY in [text_of(dd) for dd in facts.findall("dd")]


def test_markup_and_quotes_in_names_are_escaped_in_the_tune_page() -> None:
    doc = json.loads(TUNE_REPORT.read_text(encoding="utf-8"))
    old = doc["knobs"][0]["path"]
    doc["knobs"][0]["path"] = f"{NASTY}.knob"
    for c in doc["candidates"]:
        if old in c["values"]:
            c["values"][f"{NASTY}.knob"] = c["values"].pop(old)
    doc["base_name"] = NASTY
    doc["candidates"][1]["name"] = NASTY
    doc["failed"] = [{"session": NASTY, "error": NASTY}]
    root = _assert_inert(render_tune_html(doc))
    assert text_of(one(root, ".//h1")).startswith(f"kilo-rules tune: {NASTY}")
    assert text_of(one(root, ".//head/title")).startswith(f"kilo-rules tune: {NASTY}")
    head = root.findall(".//table[@class='candidates-table']/thead/tr/th")
    assert text_of(head[1]) == f"{NASTY}.knob"
    names = {s.get("title") for s in root.findall(".//table[@class='candidates-table']//span")}
    assert NASTY in names
    assert text_of(one(root, ".//section[@id='failed']//li")) == f"{NASTY}: {NASTY}"
    assert one(root, ".//figure[@id='tune-knob-0']").find("figcaption") is not None


def test_the_templates_ship_as_package_data() -> None:
    import tomllib
    from fnmatch import fnmatch
    from importlib.resources import files

    folder = files("kilo_rules.tools.simulation") / "templates"
    shipped = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert {"page.html.j2", "sections.html.j2", "report.css", "tune.css"} <= set(shipped)
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text("utf-8"))
    setuptools = pyproject["tool"]["setuptools"]
    assert "kilo_rules.tools.simulation.templates" in setuptools["packages"]
    globs = setuptools["package-data"]["kilo_rules.tools.simulation.templates"]
    for name in shipped:
        assert any(fnmatch(name, g) for g in globs), name
