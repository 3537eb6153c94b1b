"""The inline-SVG charts of the ``simulate`` and ``tune`` HTML pages, and the number formats
they share with the page's tables.

Every chart is drawn here as text: each string that comes from a document passes through
:func:`esc` (``html.escape``) on its way into the SVG, so a chart is markup built from
escaped pieces and the page's templates may insert it as it is. The drawing is
deterministic (the same document gives the same bytes). Series longer than
:data:`MAX_POINTS` are reduced to each bucket's minimum and maximum, keeping every step
that carries a marker, so a long session stays a small file.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from kilo_rules.tools.simulation.documents import (
    PolicyReport,
    SessionDocument,
    SimulatedStep,
    TuneCandidate,
    TuneReport,
)

__all__ = [
    "COST_EPSILON",
    "MAX_POINTS",
    "SVG_NS",
    "cache_chart",
    "context_chart",
    "cost_chart",
    "esc",
    "fmt_change",
    "fmt_int",
    "fmt_num",
    "fmt_ratio",
    "fmt_usd",
    "fmt_usd4",
    "has_steps",
    "knob_value",
    "measured",
    "plural",
    "style",
    "tune_charts",
    "unique",
]

#: A chart series longer than this is reduced (per-bucket min and max, markers kept).
MAX_POINTS = 1500

#: A corpus draws charts for this many sessions; the rest are listed in one table.

# The cache panels draw one column per slot; beyond this many requests, neighbouring
# requests are summed into one slot (a sub-pixel column would only add bytes).
_MAX_SLOTS = 300

# Okabe-Ito, without its yellow (unreadable on white paper): distinguishable with the
# common colour-vision deficiencies.
_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C6D31")
# Each policy also has its own dash pattern: where policies send the same requests their
# lines coincide, and the gaps of the later one let the earlier one show through; in
# greyscale print the patterns tell the lines apart.
_DASHES = (None, "10 4", "3 3", "12 3 3 3", "6 3", "2 5", "14 4 4 4", "8 2")

_CACHE_KINDS = (
    ("read", "cache read", "#1B9E77"),
    ("write", "cache write", "#E6AB02"),
    ("uncached", "uncached", "#7570B3"),
)

_INK = "#1F2328"
_MUTED = "#59636E"
_GRID = "#E3E8EE"
# The recorded input is drawn as a wide pale band under the policy lines: a calibrated
# replay follows it closely, and a thin grey line would vanish beneath them.
_RECORDED = "#C9CED6"
_RECORDED_WIDTH = 7

_WIDTH = 960.0
SVG_NS = "http://www.w3.org/2000/svg"


def _steps(r: PolicyReport) -> list[SimulatedStep]:
    return r.steps or []


def has_steps(r: PolicyReport) -> bool:
    return bool(r.steps)


def _has_prunes(r: PolicyReport) -> bool:
    """Whether the steps say how many tool outputs were pruned (older simulators did not)."""
    return any("prunes" in st.model_fields_set for st in _steps(r))


def _calibrated(s: SessionDocument) -> bool:
    """The counts shown are calibrated to the provider's, not the counter's own."""
    return s.calibration is not None and s.calibration.applied


# --- formatting ----------------------------------------------------------------------------


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def fmt_int(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def fmt_usd(x: float | None) -> str:
    if x is None:
        return "—"
    # Cents hide the differences between cheap single requests; large sums need no more.
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:,.4f}"


def fmt_ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}×"


def fmt_num(x: float | None) -> str:
    if x is None:
        return "—"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def _share(part: int, whole: int) -> str:
    return "—" if whole <= 0 else f"{100 * part / whole:.0f}%"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _c(v: float) -> str:
    """An SVG coordinate: one decimal is below a pixel at any sane zoom, and keeps files small."""
    s = f"{v:.1f}"
    s = s[:-2] if s.endswith(".0") else s
    return "0" if s == "-0" else s


def _short(v: float) -> str:
    """A token tick label: 0, 500, 25k, 1.5M."""
    if v >= 1_000_000:
        return f"{round(v / 1_000_000, 3):g}M"
    if v >= 1000:
        return f"{round(v / 1000, 3):g}k"
    return f"{round(v, 3):g}"


def _money_tick(step: float) -> Callable[[float], str]:
    """Dollar tick labels with as many decimals as the tick step needs ($0.25, $5)."""
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    # Fractions of a dollar read as cents: $0.50, not $0.5.
    decimals = max(decimals, 2) if decimals else 0
    return lambda v: f"${v:,.{decimals}f}"


def style(i: int) -> tuple[str, str | None]:
    # Past eight policies the colours repeat, each with a different pattern than before.
    return _PALETTE[i % len(_PALETTE)], _DASHES[(i + i // len(_PALETTE)) % len(_DASHES)]


# --- scales, axes and series reduction -----------------------------------------------------


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    if raw <= 0:
        return 1.0
    magnitude = float(10 ** math.floor(math.log10(raw)))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= m * magnitude * (1 + 1e-9):
            return m * magnitude
    return 10 * magnitude


def _value_ticks(top: float, count: int = 5) -> tuple[float, list[float]]:
    """Ticks from 0 up to a round value at or above ``top``, and that value."""
    step = _nice_step(top if top > 0 else 1.0, count)
    n = max(1, math.ceil(top / step - 1e-9))
    return n * step, [round(i * step, 10) for i in range(n + 1)]


def _span_ticks(lo: float, hi: float, count: int = 5) -> tuple[float, float, list[float]]:
    """Round ticks from at or below ``lo`` to at or above ``hi``, and the first and last;
    a single value gets room around it."""
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        # No negative amounts invented under values that are all zero or more.
        lo, hi = (lo - pad if lo < 0 else max(0.0, lo - pad)), hi + pad
    step = _nice_step(hi - lo, count)
    first = math.floor(lo / step + 1e-9) * step
    n = max(1, math.ceil((hi - first) / step - 1e-9))
    ticks = [round(first + i * step, 10) for i in range(n + 1)]
    return ticks[0], ticks[-1], ticks


def _request_ticks(first: int, last: int, count: int = 8) -> list[int]:
    """Integer ticks for request numbers: the first request, then round numbers."""
    if last <= first:
        return [first]
    step = max(1, round(_nice_step(last - first, count)))
    ticks = [first]
    start = (first // step + 1) * step
    for v in range(start, last + 1, step):
        # A round tick right next to the first would print over it.
        if v - first >= step * 0.75:
            ticks.append(v)
    return ticks


@dataclass(frozen=True, slots=True)
class _Plot:
    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, v: float) -> float:
        span = self.x1 - self.x0
        return self.left + (0.5 if span == 0 else (v - self.x0) / span) * self.width

    def y(self, v: float) -> float:
        span = self.y1 - self.y0
        return self.top + self.height - (0.0 if span == 0 else (v - self.y0) / span) * self.height

    @property
    def bottom(self) -> float:
        return self.top + self.height

    @property
    def right(self) -> float:
        return self.left + self.width


def _axes(
    plot: _Plot,
    xticks: Sequence[float],
    yticks: Sequence[float],
    yfmt: Callable[[float], str],
    *,
    xlabel: str | None,
    ylabel: str | None,
    tick_size: int = 11,
    xfmt: Callable[[float], str] | None = None,
) -> list[str]:
    """Grid lines at ``yticks``, tick labels on both axes, the axis lines and their labels.
    The x ticks are request numbers unless ``xfmt`` names them."""
    out = ['<g class="grid" stroke="' + _GRID + '" stroke-width="1">']
    out += [
        f'<line x1="{_c(plot.left)}" x2="{_c(plot.right)}" y1="{_c(plot.y(t))}" '
        f'y2="{_c(plot.y(t))}"/>'
        for t in yticks
    ]
    out.append("</g>")
    out.append(f'<g class="tick" font-size="{tick_size}" fill="{_MUTED}">')
    for t in yticks:
        out.append(
            f'<text x="{_c(plot.left - 6)}" y="{_c(plot.y(t) + 4)}" '
            f'text-anchor="end">{esc(yfmt(t))}</text>'
        )
    for t in xticks:
        x = plot.x(t)
        out.append(
            f'<line x1="{_c(x)}" x2="{_c(x)}" y1="{_c(plot.bottom)}" '
            f'y2="{_c(plot.bottom + 4)}" stroke="{_MUTED}"/>'
        )
        out.append(
            f'<text x="{_c(x)}" y="{_c(plot.bottom + 6 + tick_size)}" '
            f'text-anchor="middle">{esc(fmt_int(int(t)) if xfmt is None else xfmt(t))}</text>'
        )
    out.append("</g>")
    out.append(
        f'<path class="axis" d="M{_c(plot.left)},{_c(plot.top)}V{_c(plot.bottom)}'
        f'H{_c(plot.right)}" fill="none" stroke="{_MUTED}" stroke-width="1"/>'
    )
    if xlabel:
        out.append(
            f'<text class="axis-label" x="{_c(plot.left + plot.width / 2)}" '
            f'y="{_c(plot.bottom + 36)}" text-anchor="middle" font-size="13">{esc(xlabel)}</text>'
        )
    if ylabel:
        ly = plot.top + plot.height / 2
        out.append(
            f'<text class="axis-label" x="14" y="{_c(ly)}" text-anchor="middle" '
            f'font-size="13" transform="rotate(-90 14 {_c(ly)})">{esc(ylabel)}</text>'
        )
    return out


def _reduce(
    values: Sequence[float], keep: Iterable[int] = (), limit: int = MAX_POINTS
) -> list[int]:
    """The positions of ``values`` to draw: all of them up to ``limit``; beyond, the first,
    the last, each bucket's minimum and maximum (so peaks and drops survive) and ``keep``."""
    n = len(values)
    if n <= limit:
        return list(range(n))
    buckets = limit // 2
    chosen = {0, n - 1, *keep}
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo < hi:
            segment = range(lo, hi)
            chosen.add(min(segment, key=values.__getitem__))
            chosen.add(max(segment, key=values.__getitem__))
    return sorted(chosen)


def _polyline(points: Iterable[tuple[float, float]]) -> str:
    parts = [f"{_c(x)},{_c(y)}" for x, y in points]
    return "M" + "L".join(parts) if parts else ""


def _svg_open(chart_id: str, height: float, title: str, desc: str) -> list[str]:
    return [
        f'<svg class="chart" xmlns="{SVG_NS}" viewBox="0 0 {_c(_WIDTH)} {_c(height)}" '
        f'role="img" aria-labelledby="{chart_id}-title" aria-describedby="{chart_id}-desc" '
        f'font-size="12">',
        f'<title id="{chart_id}-title">{esc(title)}</title>',
        f'<desc id="{chart_id}-desc">{esc(desc)}</desc>',
    ]


def _swatch(shape: str) -> str:
    """A legend symbol: ``shape`` drawn in a 28 by 12 box, centred on (14, 6)."""
    return (
        f'<svg class="swatch" xmlns="{SVG_NS}" viewBox="0 0 28 12" aria-hidden="true">{shape}</svg>'
    )


def _swatch_line(color: str, dash: str | None = None, width: float = 2.5) -> str:
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return _swatch(
        f'<line x1="1" y1="6" x2="27" y2="6" stroke="{color}" stroke-width="{width}"{dash_attr}/>'
    )


def _swatch_marker(kind: str, color: str = _INK) -> str:
    return _swatch(_marker_shape(kind, 14, 6, color))


def _swatch_box(color: str) -> str:
    return _swatch(f'<rect x="6" y="1" width="16" height="10" fill="{color}"/>')


def _legend_item(swatch: str, label: str, kind: str, extra: str = "") -> str:
    return f'<li data-legend="{kind}"{extra}>{swatch}<span>{esc(label)}</span></li>'


def _marker_shape(
    kind: str, x: float, y: float, color: str, inner: str = "", attrs: str = ""
) -> str:
    if kind == "compaction":
        d = f"M{_c(x)},{_c(y - 7)}L{_c(x + 6.5)},{_c(y + 5)}L{_c(x - 6.5)},{_c(y + 5)}Z"
        return (
            f'<path{attrs} d="{d}" fill="{color}" stroke="{_INK}" stroke-width="0.9">{inner}</path>'
        )
    if kind == "prune":
        return (
            f'<rect{attrs} x="{_c(x - 3.5)}" y="{_c(y - 3.5)}" width="7" height="7" fill="{color}" '
            f'stroke="{_INK}" stroke-width="0.8">{inner}</rect>'
        )
    a, b, t, u = _c(x - 4), _c(x + 4), _c(y - 4), _c(y + 4)
    d = f"M{a},{t}L{b},{u}M{a},{u}L{b},{t}"
    return f'<path{attrs} d="{d}" fill="none" stroke="{color}" stroke-width="2.2">{inner}</path>'


_MARKER_LABELS = {
    "compaction": "compaction",
    "prune": "prune",
    "overflow": "provider overflow",
}


# --- charts --------------------------------------------------------------------------------


def _reduction_note(reduced: Sequence[tuple[str, int, int]]) -> str:
    if not reduced:
        return ""
    parts = ", ".join(f"{esc(name)} {total:,} → {kept:,}" for name, total, kept in reduced)
    return (
        f" Series of more than {MAX_POINTS:,} points are drawn reduced to each bucket's "
        f"minimum and maximum, every marked request kept ({parts} points)."
    )


def _figure(
    chart: str, chart_id: str, caption: str, legend: Sequence[str], svg: Sequence[str]
) -> Markup:
    """A chart as a figure: ``caption`` (markup), the ``legend`` items and the ``svg``
    elements (the opening tag first; the closing tag is added here).

    This is where chart markup is marked safe for the page's templates: every piece was
    built here from constants, numbers and strings passed through :func:`esc`."""
    return Markup(
        "\n".join(
            [
                f'<figure class="chart-figure" data-chart="{chart}" id="{chart_id}">',
                f"<figcaption>{caption}</figcaption>",
                '<ul class="legend">',
                *legend,
                "</ul>",
                *svg,
                "</svg>",
                "</figure>",
            ]
        )
    )


@dataclass(slots=True)
class _Drawing:
    """A chart being drawn: its SVG elements, its legend items and the series it reduced."""

    svg: list[str]
    legend: list[str]
    reduced: list[tuple[str, int, int]]


@dataclass(frozen=True, slots=True)
class _ContextFrame:
    """The context chart's plot and ticks, the windows of the policies and those drawn."""

    plot: _Plot
    xticks: list[int]
    yticks: list[float]
    windows: list[str]
    drawn: list[int]


def _context_frame(s: SessionDocument, rec_points: Sequence[tuple[int, int]]) -> _ContextFrame:
    reports = [r for r in s.reports if has_steps(r)]
    last = max(
        [r.requests_total for r in reports] + [st.index for r in reports for st in _steps(r)[-1:]]
    )
    first = min(st.index for r in reports for st in _steps(r)[:1])
    data_top = max(
        [st.input for r in reports for st in _steps(r)]
        + [v for _, v in rec_points]
        + [r.compaction_limit or 0 for r in reports]
    )
    windows = unique(str(r.window) for r in reports if r.window)
    # A window far above the data would flatten every line against the axis; it is named
    # in the legend instead.
    drawn = [int(w) for w in windows if data_top == 0 or int(w) <= 2 * data_top]
    top, yticks = _value_ticks(max([data_top, *drawn, 1]))
    height = _CONTEXT_HEIGHT
    plot = _Plot(72, 18, _WIDTH - 72 - 20, height - 18 - 52, first, max(last, first + 1), 0, top)
    return _ContextFrame(plot, _request_ticks(first, last), yticks, windows, drawn)


_CONTEXT_HEIGHT = 400.0


def _recorded_inputs(s: SessionDocument) -> list[tuple[int, int]]:
    """``(request, input)`` as the recorded agent's provider reported it, in request order."""
    recorded: dict[int, int] = {}
    for r in s.reports:
        for st in _steps(r):
            if st.recorded_input is not None:
                recorded.setdefault(st.index, st.recorded_input)
    return sorted(recorded.items())


def _window_lines(d: _Drawing, frame: _ContextFrame) -> None:
    """A line at each window low enough to draw; every window is named in the legend."""
    plot = frame.plot
    for w in frame.windows:
        label = f"window {int(w):,}"
        if int(w) in frame.drawn:
            y = plot.y(int(w))
            d.svg.append(
                f'<g class="window"><line x1="{_c(plot.left)}" x2="{_c(plot.right)}" '
                f'y1="{_c(y)}" y2="{_c(y)}" stroke="{_INK}" stroke-width="1.5"/>'
                f'<text x="{_c(plot.right - 4)}" y="{_c(y - 5)}" text-anchor="end" '
                f'font-size="11" fill="{_INK}">{esc(label)}</text></g>'
            )
        else:
            label += " (above the chart)"
        d.legend.append(
            _legend_item(_swatch_line(_INK, None, 1.5), label, "reference", ' data-kind="window"')
        )


def _limit_lines(d: _Drawing, s: SessionDocument, plot: _Plot) -> None:
    """A dashed line, in the policy's colour, where each policy compacts."""
    limits = [(i, r) for i, r in enumerate(s.reports) if has_steps(r) and r.compaction_limit]
    for i, r in limits:
        color, _ = style(i)
        y = plot.y(r.compaction_limit or 0)
        d.svg.append(
            f'<line class="compaction-limit" data-policy="{esc(r.policy)}" x1="{_c(plot.left)}" '
            f'x2="{_c(plot.right)}" y1="{_c(y)}" y2="{_c(y)}" stroke="{color}" '
            f'stroke-width="1.2" stroke-dasharray="6 4"><title>'
            f"{esc(r.policy)} compacts at {r.compaction_limit:,} tokens</title></line>"
        )
    if limits:
        d.legend.append(
            _legend_item(
                _swatch_line(_MUTED, "6 4", 1.5),
                "compaction limit (in the policy's colour)",
                "reference",
                ' data-kind="compaction-limit"',
            )
        )


def _recorded_band(d: _Drawing, plot: _Plot, rec_points: Sequence[tuple[int, int]]) -> None:
    """The recorded input as a wide pale band under the policy lines."""
    if not rec_points:
        return
    keep = _reduce([v for _, v in rec_points])
    if len(keep) < len(rec_points):
        d.reduced.append(("recorded", len(rec_points), len(keep)))
    path = _polyline((plot.x(rec_points[k][0]), plot.y(rec_points[k][1])) for k in keep)
    d.svg.append(
        f'<path class="series" data-series="recorded" d="{path}" fill="none" '
        f'stroke="{_RECORDED}" stroke-width="{_RECORDED_WIDTH}" stroke-linejoin="round" '
        'stroke-linecap="round"/>'
    )
    d.legend.append(
        _legend_item(
            _swatch_line(_RECORDED, None, _RECORDED_WIDTH),
            "recorded",
            "series",
            ' data-kind="recorded"',
        )
    )


def _agent_compactions(d: _Drawing, s: SessionDocument, plot: _Plot) -> bool:
    """A dotted vertical line at each request the recorded agent sent after compacting its
    own context (within the chart); whether there was one."""
    recorded_marks = sorted(set(s.recorded.compactions)) if s.recorded else []
    agent = [k for k in recorded_marks if plot.x0 <= k <= _last_request(s)]
    for k in agent:
        x = plot.x(k)
        d.svg.append(
            f'<line class="recorded-compaction" data-step="{k}" x1="{_c(x)}" x2="{_c(x)}" '
            f'y1="{_c(plot.top)}" y2="{_c(plot.bottom)}" stroke="{_INK}" stroke-width="1.2" '
            f'stroke-dasharray="1 3"><title>the recorded agent compacted before request '
            f"{k:,}</title></line>"
        )
    if agent:
        d.legend.append(
            _legend_item(
                _swatch(
                    f'<line x1="14" y1="0" x2="14" y2="12" stroke="{_INK}" stroke-width="1.5" '
                    'stroke-dasharray="1 2"/>'
                ),
                "the recorded agent compacted",
                "reference",
                ' data-kind="recorded-compaction"',
            )
        )
    return bool(agent)


def _last_request(s: SessionDocument) -> int:
    """The last request number the context chart spans."""
    reports = [r for r in s.reports if has_steps(r)]
    return max(
        [r.requests_total for r in reports] + [st.index for r in reports for st in _steps(r)[-1:]]
    )


def _step_markers(r: PolicyReport, st: SimulatedStep, x: float, y: float, color: str) -> list[str]:
    """The markers of one step: a compaction, a prune and an overflow each have their own."""
    out = []
    for kind, count in (
        ("compaction", st.compactions),
        ("prune", st.prunes),
        ("overflow", st.provider_overflows),
    ):
        if not count:
            continue
        what = plural(count, _MARKER_LABELS[kind])
        tip = f"{r.policy}: {what} before request {st.index:,} (context {st.input:,} tokens)"
        out.append(
            _marker_shape(
                kind,
                x,
                y,
                color,
                f"<title>{esc(tip)}</title>",
                f' class="marker" data-kind="{kind}" data-step="{st.index}" '
                f'data-policy="{esc(r.policy)}"',
            )
        )
    return out


def _context_lines(d: _Drawing, s: SessionDocument, plot: _Plot) -> None:
    """One line per policy, then the markers on them (drawn last, so no line hides one),
    then the legend of the markers."""
    marks: list[str] = []
    kinds_seen = {"compaction", "overflow"}
    for i, r in enumerate(s.reports):
        if not has_steps(r):
            continue
        if _has_prunes(r):
            kinds_seen.add("prune")
        color, dash = style(i)
        steps = _steps(r)
        marked = [
            k for k, st in enumerate(steps) if st.compactions or st.prunes or st.provider_overflows
        ]
        keep = _reduce([st.input for st in steps], marked)
        if len(keep) < len(steps):
            d.reduced.append((r.policy, len(steps), len(keep)))
        path = _polyline((plot.x(steps[k].index), plot.y(steps[k].input)) for k in keep)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        d.svg.append(
            f'<path class="series" data-series="policy" data-policy="{esc(r.policy)}" d="{path}" '
            f'fill="none" stroke="{color}" stroke-width="{_line_width(i)}" '
            f'stroke-linejoin="round"{dash_attr}/>'
        )
        for k in marked:
            st = steps[k]
            marks += _step_markers(r, st, plot.x(st.index), plot.y(st.input), color)
    d.svg += marks
    for kind in ("compaction", "prune", "overflow"):
        if kind in kinds_seen:
            d.legend.append(
                _legend_item(
                    _swatch_marker(kind), _MARKER_LABELS[kind], "marker", f' data-kind="{kind}"'
                )
            )


def _policy_legend(s: SessionDocument) -> list[str]:
    legend = []
    for i, r in enumerate(s.reports):
        if not has_steps(r):
            continue
        color, dash = style(i)
        legend.append(
            _legend_item(
                _swatch_line(color, dash), r.policy, "policy", f' data-policy="{esc(r.policy)}"'
            )
        )
    return legend


def _context_caption(s: SessionDocument, *, recorded: bool, agent: bool) -> str:
    caption = (
        "<strong>Context size per request.</strong> Tokens in each request the policy sends "
        "(the wire body, counted the same way for every policy). A marker sits on the request "
        "that followed a compaction, a prune, or a request the provider would have refused "
        "as too long — its input plus the output cap it asked for over the window (sent "
        "again after compacting)."
    )
    if _calibrated(s):
        caption += " The counts are calibrated to the provider's (see Calibration above)."
    if recorded:
        caption += (
            " The wide grey band is the input the recorded agent's provider reported for "
            "the same request."
        )
    if agent:
        caption += (
            " A dotted vertical line marks a request the recorded agent sent after compacting "
            "its own context."
        )
    return caption


def context_chart(s: SessionDocument, sid: str) -> Markup:
    """The context size of each request, one line per policy, with the windows, the
    compaction limits, the recorded input and a marker at each compaction, prune and
    provider overflow."""
    chart_id = f"{sid}-context"
    rec_points = _recorded_inputs(s)
    frame = _context_frame(s, rec_points)
    plot = frame.plot
    svg = _svg_open(
        chart_id,
        _CONTEXT_HEIGHT,
        f"Context size per request: {s.session}",
        "Tokens in each request, one line per policy: "
        + ", ".join(r.policy for r in s.reports if has_steps(r))
        + (
            f"; window {', '.join(f'{int(w):,}' for w in frame.windows)} tokens"
            if frame.windows
            else ""
        )
        + ".",
    )
    svg += _axes(plot, frame.xticks, frame.yticks, _short, xlabel="request", ylabel="tokens")
    d = _Drawing(svg, _policy_legend(s), [])
    _window_lines(d, frame)
    _limit_lines(d, s, plot)
    _recorded_band(d, plot, rec_points)
    agent = _agent_compactions(d, s, plot)
    _context_lines(d, s, plot)
    caption = _context_caption(s, recorded=bool(rec_points), agent=agent)
    caption += _reduction_note(d.reduced)
    return _figure("context", chart_id, caption, d.legend, d.svg)


def _summary_costs(r: PolicyReport) -> dict[int, float]:
    """The cost of the summary calls (in the report's total, not in its steps), spread over
    the requests that followed a compaction in proportion to their compactions.

    The document has no cost per summary call, only their sum; spreading it puts each share
    where the calls happened, so the line climbs where compaction costs money and ends at
    the table's total."""
    if r.cost_usd is None:
        return {}
    rest = r.cost_usd - sum(st.cost_usd or 0.0 for st in _steps(r))
    # Below a millionth of a cent the difference is float rounding, not a summary call.
    if rest <= 1e-8:
        return {}
    weights = {k: st.compactions for k, st in enumerate(_steps(r)) if st.compactions > 0}
    if not weights:
        return {len(_steps(r)) - 1: rest}
    whole = sum(weights.values())
    return {k: rest * w / whole for k, w in weights.items()}


def _line_width(i: int) -> float:
    """Earlier policies draw slightly wider lines, under later ones: where policies send the
    same requests, the earlier colours stay visible along the edges and in the gaps."""
    return max(1.6, 3.0 - 0.4 * i)


def cost_chart(s: SessionDocument, sid: str) -> Markup:
    """The cost spent up to each request, one line per policy, with the floor and the
    session as recorded; a note instead when the model has no prices."""
    chart_id = f"{sid}-cost"
    reports = [
        (i, r)
        for i, r in enumerate(s.reports)
        if has_steps(r) and any(st.cost_usd is not None for st in _steps(r))
    ]
    if s.prices is None or not reports:
        model = f"the model {esc(s.model)}" if s.model else "the model"
        # Built from escaped pieces, like the charts.
        return Markup(
            f'<p class="note" data-skipped="cost" id="{chart_id}">No cost chart: {model} '
            "has no prices in the catalog.</p>"
        )
    series: list[tuple[int, PolicyReport, list[float]]] = []
    spread = False
    for i, r in reports:
        extra = _summary_costs(r)
        spread = spread or bool(extra)
        total = 0.0
        cumulative = []
        for k, st in enumerate(_steps(r)):
            total += (st.cost_usd or 0.0) + extra.get(k, 0.0)
            cumulative.append(total)
        series.append((i, r, cumulative))
    first = min(_steps(r)[0].index for _, r in reports)
    last = max([r.requests_total for _, r in reports] + [_steps(r)[-1].index for _, r in reports])
    floor_cost = s.floor.cost_usd if s.floor is not None else None
    recorded = _recorded_cumulative(s, last)
    data_top = max(
        [c[-1] for _, _, c in series] + [floor_cost or 0.0] + [v for _, v in recorded[-1:]]
    )
    top, yticks = _value_ticks(data_top if data_top > 0 else 1.0)
    step = yticks[1] - yticks[0] if len(yticks) > 1 else top
    height = 330.0
    plot = _Plot(72, 18, _WIDTH - 72 - 20, height - 18 - 52, first, max(last, first + 1), 0, top)
    svg = _svg_open(
        chart_id,
        height,
        f"Cumulative cost: {s.session}",
        "US dollars spent up to each request, one line per policy: "
        + ", ".join(f"{r.policy} {fmt_usd(c[-1])}" for _, r, c in series)
        + ".",
    )
    svg += _axes(
        plot,
        _request_ticks(first, last),
        yticks,
        _money_tick(step),
        xlabel="request",
        ylabel="US dollars",
    )
    legend: list[str] = []
    lines: list[str] = []
    reduced: list[tuple[str, int, int]] = []
    for i, r, cumulative in series:
        color, dash = style(i)
        legend.append(
            _legend_item(
                _swatch_line(color, dash),
                f"{r.policy} ({fmt_usd(cumulative[-1])})",
                "policy",
                f' data-policy="{esc(r.policy)}"',
            )
        )
        keep = _reduce(cumulative)
        if len(keep) < len(cumulative):
            reduced.append((r.policy, len(cumulative), len(keep)))
        path = _polyline((plot.x(_steps(r)[k].index), plot.y(cumulative[k])) for k in keep)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        end_x, end_y = plot.x(_steps(r)[-1].index), plot.y(cumulative[-1])
        lines.append(
            f'<path class="series" data-series="policy" data-policy="{esc(r.policy)}" d="{path}" '
            f'fill="none" stroke="{color}" stroke-width="{_line_width(i)}" '
            f'stroke-linejoin="round"{dash_attr}/>'
            f'<circle cx="{_c(end_x)}" cy="{_c(end_y)}" r="3" fill="{color}"><title>'
            f"{esc(r.policy)}: {fmt_usd(cumulative[-1])} over {plural(len(_steps(r)), 'request')}"
            "</title></circle>"
        )
    if floor_cost is not None:
        y = plot.y(floor_cost)
        label = f"floor {fmt_usd(floor_cost)}"
        svg.append(
            f'<g class="floor"><line x1="{_c(plot.left)}" x2="{_c(plot.right)}" y1="{_c(y)}" '
            f'y2="{_c(y)}" stroke="{_INK}" stroke-width="1.5" stroke-dasharray="2 3"/>'
            f'<text x="{_c(plot.right - 4)}" y="{_c(y - 5)}" text-anchor="end" font-size="11" '
            f'fill="{_INK}">{esc(label)}</text></g>'
        )
        legend.append(
            _legend_item(_swatch_line(_INK, "2 3", 1.5), label, "reference", ' data-kind="floor"')
        )
    if recorded:
        keep = _reduce([v for _, v in recorded])
        if len(keep) < len(recorded):
            reduced.append(("recorded", len(recorded), len(keep)))
        path = _polyline((plot.x(recorded[k][0]), plot.y(recorded[k][1])) for k in keep)
        total = recorded[-1][1]
        svg.append(
            f'<path class="series" data-series="recorded" d="{path}" fill="none" '
            f'stroke="{_RECORDED}" stroke-width="{_RECORDED_WIDTH}" stroke-linejoin="round" '
            f'stroke-linecap="round"><title>as recorded: {esc(fmt_usd(total))}</title></path>'
        )
        legend.append(
            _legend_item(
                _swatch_line(_RECORDED, None, _RECORDED_WIDTH),
                f"recorded ({fmt_usd(total)})",
                "series",
                ' data-kind="recorded"',
            )
        )
    svg += lines
    caption = (
        "<strong>Cumulative cost.</strong> US dollars spent up to each request at the "
        "model's list prices."
    )
    if spread:
        caption += (
            " The summary calls of compactions are added at the requests that followed "
            "them (their total split evenly), so each line ends at the table's cost."
        )
    if floor_cost is not None:
        caption += (
            " The dotted line is the floor: the cheapest of these replays under a perfect "
            "prompt cache (each token written once, read by every later request that "
            "repeats it)."
        )
    if recorded:
        caption += (
            " The wide grey band is the session as recorded: the usage its log reports, "
            "priced the same way (the agent's own compaction calls included)."
        )
    caption += _reduction_note(reduced)
    return _figure("cost", chart_id, caption, legend, svg)


def _recorded_cumulative(s: SessionDocument, last: int) -> list[tuple[int, float]]:
    """``(request, dollars so far)`` of the session as recorded, up to request ``last``;
    empty when the document has no recorded costs."""
    if s.recorded is None or not any(c is not None for c in (s.recorded.request_costs_usd or [])):
        return []
    total = 0.0
    out = []
    for i, c in enumerate((s.recorded.request_costs_usd or [])[:last], start=1):
        total += c or 0.0
        out.append((i, total))
    return out


def _slots(steps: Sequence[SimulatedStep]) -> list[tuple[int, int, int, int, int]]:
    """``(first index, last index, read, write, uncached)`` per column of a cache panel."""
    n = len(steps)
    count = min(n, _MAX_SLOTS)
    out = []
    for b in range(count):
        chunk = steps[b * n // count : (b + 1) * n // count]
        out.append(
            (
                chunk[0].index,
                chunk[-1].index,
                sum(st.cache_read for st in chunk),
                sum(st.cache_write for st in chunk),
                sum(st.uncached for st in chunk),
            )
        )
    return out


def cache_chart(s: SessionDocument, sid: str) -> Markup:
    """The share of each request's input read from the cache, written to it or uncached:
    one panel per policy."""
    chart_id = f"{sid}-cache"
    reports = [(i, r) for i, r in enumerate(s.reports) if has_steps(r)]
    cols = 1 if len(reports) == 1 else 2
    left, right, gap_x = 64.0, 28.0, 52.0
    panel_w = (_WIDTH - left - right - gap_x * (cols - 1)) / cols
    panel_h, head, foot = 110.0, 24.0, 26.0
    rows = math.ceil(len(reports) / cols)
    row_h = head + panel_h + foot
    height = 8 + rows * row_h + 30
    first = min(_steps(r)[0].index for _, r in reports)
    last = max(_steps(r)[-1].index for _, r in reports)
    svg = _svg_open(
        chart_id,
        height,
        f"Cache split of each request: {s.session}",
        "Share of each request's input read from the cache, written to it, or uncached; "
        "one panel per policy: "
        + "; ".join(
            f"{r.policy} {_share(r.cache_read, r.input)} read, "
            f"{_share(r.cache_write, r.input)} written, "
            f"{_share(r.uncached, r.input)} uncached"
            for _, r in reports
        )
        + ".",
    )
    summed = False
    for n, (i, r) in enumerate(reports):
        px = left + (n % cols) * (panel_w + gap_x)
        py = 8 + (n // cols) * row_h + head
        plot = _Plot(px, py, panel_w, panel_h, first - 0.5, last + 0.5, 0, 1)
        name = r.policy if len(r.policy) <= 48 else r.policy[:47] + "…"
        summary = (
            f"{_share(r.cache_read, r.input)} read · {_share(r.cache_write, r.input)} written · "
            f"{_share(r.uncached, r.input)} uncached"
        )
        color, _ = style(i)
        svg.append(
            f'<g class="panel" data-policy="{esc(r.policy)}">'
            f'<rect x="{_c(px)}" y="{_c(py - 16)}" width="10" height="10" fill="{color}"/>'
            f'<text x="{_c(px + 15)}" y="{_c(py - 7)}" font-size="12.5" font-weight="600" '
            f'fill="{_INK}">{esc(name)}<title>{esc(r.policy)}</title></text>'
            f'<text x="{_c(px + panel_w)}" y="{_c(py - 7)}" font-size="11" text-anchor="end" '
            f'fill="{_MUTED}">{esc(summary)}</text>'
        )
        slots = _slots(_steps(r))
        summed = summed or len(slots) < len(_steps(r))
        # Cumulative areas drawn back to front (everything, then read+write, then read):
        # each is one path over the slots instead of three rectangles per request.
        fills = {k: c for k, _, c in _CACHE_KINDS}
        for layer, kind in enumerate(("uncached", "write", "read")):
            d = [f"M{_c(plot.x(slots[0][0] - 0.5))},{_c(plot.bottom)}"]
            for _, hi, rd, wr, un in slots:
                whole = rd + wr + un
                part = (whole, rd + wr, rd)[layer]
                d.append(f"V{_c(plot.y(part / whole if whole else 0.0))}H{_c(plot.x(hi + 0.5))}")
            d.append(f"V{_c(plot.bottom)}Z")
            svg.append(
                f'<path class="area" data-kind="{kind}" d="{"".join(d)}" fill="{fills[kind]}"/>'
            )
        svg += _axes(
            plot,
            _request_ticks(first, last, 5 if cols == 2 else 8),
            [0, 0.5, 1],
            lambda v: f"{v * 100:.0f}%",
            xlabel=None,
            ylabel=None,
            tick_size=10,
        )
        svg.append("</g>")
    svg.append(
        f'<text class="axis-label" x="{_c(left + (_WIDTH - left - right) / 2)}" '
        f'y="{_c(height - 8)}" text-anchor="middle" font-size="13">request</text>'
    )
    mid = 8 + rows * row_h / 2
    svg.append(
        f'<text class="axis-label" x="14" y="{_c(mid)}" text-anchor="middle" font-size="13" '
        f'transform="rotate(-90 14 {_c(mid)})">share of input</text>'
    )
    legend = [
        _legend_item(_swatch_box(color), label, "cache", f' data-kind="{kind}"')
        for kind, label, color in _CACHE_KINDS
    ]
    caption = (
        "<strong>Cache split of each request.</strong> The share of each request's input "
        "tokens read from the prompt cache, written to it, or billed uncached; one panel "
        "per policy."
    )
    if summed:
        caption += (
            f" Sessions longer than {_MAX_SLOTS:,} requests are drawn with neighbouring "
            "requests summed into one column."
        )
    return _figure("cache", chart_id, caption, legend, svg)


# --- the tune report -----------------------------------------------------------------------

# The first colours of the palette, as the first policies of the simulate charts have them.
_FEASIBLE, _INFEASIBLE, _WINNER = _PALETTE[:3]

# Costs that differ by less than this (USD) rank as a tie, as the tune ranks them: sums of
# the same numbers in another order differ in the last bits.
COST_EPSILON = 1e-9

# A knob value longer than this is cut short under its column of points.
_MAX_TICK_LABEL = 24


def measured(c: TuneCandidate) -> bool:
    return c.status == "measured"


def fmt_usd4(x: float | None) -> str:
    # Candidates of one tune often differ by fractions of a cent.
    return "—" if x is None else f"${x:,.4f}"


def fmt_change(ratio: float | None) -> str:
    return "—" if ratio is None else f"{100 * (ratio - 1):+.1f} %"


def knob_value(value: Any) -> str:
    """A knob value as the tune file spells it (a string bare, anything else as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _tune_mark(
    kind: str, x: float, y: float, *, size: float = 1.0, inner: str = "", attrs: str = ""
) -> str:
    """One candidate's point (``feasible`` filled, ``infeasible`` hollow), or the ring of
    the ``winner`` or the box of the ``baseline`` drawn around a point; ``size`` scales it."""
    if kind == "feasible" or kind == "infeasible":
        fill, stroke = (_FEASIBLE, _FEASIBLE) if kind == "feasible" else ("#FFFFFF", _INFEASIBLE)
        shape = (
            f'<circle{attrs} cx="{_c(x)}" cy="{_c(y)}" r="{_c(5 * size)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.8"'
        )
        return f"{shape}>{inner}</circle>" if inner else f"{shape}/>"
    if kind == "winner":
        return (
            f'<circle{attrs} cx="{_c(x)}" cy="{_c(y)}" r="{_c(10 * size)}" fill="none" '
            f'stroke="{_WINNER}" stroke-width="2.2"/>'
        )
    half = 9 * size
    return (
        f'<rect{attrs} x="{_c(x - half)}" y="{_c(y - half)}" width="{_c(2 * half)}" '
        f'height="{_c(2 * half)}" fill="none" stroke="{_INK}" stroke-width="1.2"/>'
    )


def _tune_swatch(kind: str) -> str:
    point = _tune_mark("infeasible" if kind == "infeasible" else "feasible", 14, 6, size=0.5)
    if kind == "winner" or kind == "baseline":
        point += _tune_mark(kind, 14, 6, size=0.5)
    return _swatch(point)


_TUNE_LEGEND = {
    "feasible": "meets the constraints",
    "infeasible": "does not",
    "winner": "winner",
    "baseline": "baseline",
}


def _tune_chart(
    t: TuneReport,
    chart: str,
    caption: str,
    xlabel: str,
    points: Sequence[tuple[float, TuneCandidate]],
    categories: Sequence[str] | None,
) -> Markup:
    """Cost against ``x`` for each ``(x, candidate)`` of ``points``: feasible candidates
    filled, infeasible ones hollow, the winner ringed and the baseline boxed, both labelled.
    ``categories`` names the x positions 0, 1, ... (a knob's values); without them x is a
    count (compactions)."""
    chart_id = f"tune-{chart}"
    costs = [c.cost_usd or 0.0 for _, c in points]
    y0, y1, yticks = _span_ticks(min(costs), max(costs))
    step = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    xfmt: Callable[[float], str] | None = None
    if categories is not None:
        names = [
            v if len(v) <= _MAX_TICK_LABEL else v[: _MAX_TICK_LABEL - 1] + "…" for v in categories
        ]
        x0, x1 = -0.5, len(categories) - 0.5
        xticks: list[float] = [float(i) for i in range(len(categories))]

        def xfmt(v: float) -> str:
            return names[round(v)]

    else:
        lo, hi = int(min(x for x, _ in points)), int(max(x for x, _ in points))
        # Room either side, so that no point sits on the axis.
        pad = max(0.5, (hi - lo) * 0.06)
        x0, x1 = lo - pad, hi + pad
        xticks = [float(v) for v in _request_ticks(lo, hi)]
    height = 360.0
    plot = _Plot(72, 18, _WIDTH - 72 - 20, height - 18 - 52, x0, x1, y0, y1)
    feasible = sum(1 for _, c in points if c.feasible)
    desc = (
        f"One point per candidate: {feasible:,} meet the constraints, "
        f"{len(points) - feasible:,} do not."
    )
    drawn = {c.index for _, c in points}
    if t.winner is not None and t.winner.index in drawn:
        desc += f" The winner, candidate {t.winner.index}, costs {fmt_usd4(t.winner.cost_usd)}."
    svg = _svg_open(chart_id, height, f"Cost against {xlabel}", desc)
    svg += _axes(
        plot,
        xticks,
        yticks,
        _money_tick(step),
        xlabel=xlabel,
        ylabel="cost (USD)",
        xfmt=xfmt,
    )
    marks: list[str] = []
    labels: list[str] = []
    kinds: set[str] = set()
    for xv, c in points:
        x, y = plot.x(xv), plot.y(c.cost_usd or 0.0)
        kind = "feasible" if c.feasible else "infeasible"
        kinds.add(kind)
        tip = f"#{c.index} {c.name}: {fmt_usd4(c.cost_usd)}" + (
            "" if c.feasible else " — infeasible: " + "; ".join(c.reasons)
        )
        svg.append(
            _tune_mark(
                kind,
                x,
                y,
                inner=f"<title>{esc(tip)}</title>",
                attrs=f' data-point="{kind}" data-candidate="{c.index}"',
            )
        )
        # Near the right edge a label goes to the left of its point, or it would be cut.
        right = x > plot.left + 0.85 * plot.width
        lx, anchor = (x - 13, ' text-anchor="end"') if right else (x + 13, "")
        if c.baseline:
            kinds.add("baseline")
            marks.append(_tune_mark("baseline", x, y, attrs=' data-mark="baseline"'))
            labels.append(
                f'<text data-label="baseline" x="{_c(lx)}" y="{_c(y + 17)}"{anchor} '
                f'fill="{_INK}">baseline</text>'
            )
        if t.winner is not None and c.index == t.winner.index:
            kinds.add("winner")
            marks.append(_tune_mark("winner", x, y, attrs=' data-mark="winner"'))
            labels.append(
                f'<text data-label="winner" x="{_c(lx)}" y="{_c(y - 9)}"{anchor} '
                f'fill="{_WINNER}" font-weight="600">winner</text>'
            )
    # The rings and labels last: no later point may hide them.
    svg += marks + labels
    legend = [
        _legend_item(_tune_swatch(kind), label, "point", f' data-kind="{kind}"')
        for kind, label in _TUNE_LEGEND.items()
        if kind in kinds
    ]
    return _figure(chart, chart_id, caption, legend, svg)


def tune_charts(t: TuneReport) -> list[Markup]:
    """The tune's scatter charts: cost against compactions, then against each knob."""
    replayed = [c for c in t.candidates if measured(c)]
    if not replayed:
        return []
    figures = [
        _tune_chart(
            t,
            "cost-compactions",
            "<strong>Cost against compactions.</strong> Each candidate's cost over every "
            "session against its compactions (summed over the sessions).",
            "compactions",
            [(float(c.compactions or 0), c) for c in replayed],
            None,
        )
    ]
    for i, knob in enumerate(t.knobs):
        # Values compared as JSON: 1, 1.0 and true are different settings of a knob.
        where: dict[str, int] = {}
        for n, value in enumerate(knob.values):
            where.setdefault(json.dumps(value, sort_keys=True, default=str), n)
        points = []
        for c in replayed:
            # The baseline's value may be none of those tried: it has no column.
            if c.baseline or knob.path not in c.values:
                continue
            column = where.get(json.dumps(c.values[knob.path], sort_keys=True, default=str))
            if column is not None:
                points.append((float(column), c))
        if not points:
            continue
        path = esc(knob.path)
        figures.append(
            _tune_chart(
                t,
                f"knob-{i}",
                f"<strong>Cost against {path}.</strong> Each candidate's cost against its "
                f"value of {path} (the other knobs vary within a column; the baseline is not "
                "drawn).",
                knob.path,
                points,
                [knob_value(v) for v in knob.values],
            )
        )
    return figures
