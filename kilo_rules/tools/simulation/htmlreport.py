"""A ``kilo-rules simulate`` or ``kilo-rules tune`` result as one self-contained HTML page.

:func:`render_html` reads the JSON document ``simulate --format json`` prints (one session,
or a corpus of sessions with its aggregate); :func:`render_tune_html` reads the tune's
``report.json``. Each returns a single HTML file, both pages drawn alike: inline CSS,
charts drawn here as inline SVG, no script and no external resource of any kind, so the
page can be attached to a CI run, mailed or archived and still open years later. A
Content-Security-Policy meta tag forbids scripts and remote loads as a second line of
defence: every string from the document is escaped, but the page should stay inert even if
a future change forgets one.

The output is deterministic (the same document gives the same bytes), so two reports can
be diffed. Series longer than :data:`MAX_POINTS` are reduced to each bucket's minimum and
maximum, keeping every step that carries a marker, so a long session stays a small file.

It reads the documents as their models (:mod:`~kilo_rules.tools.simulation.documents`),
and validates JSON data against them strictly (the JSON may come from another version of
the simulator or from a hand-edited file), raising :class:`DocumentError` (a
:class:`ValueError`) with the path of the first bad value and what is wrong with it.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kilo_rules.tools.simulation.documents import (
    CorpusDocument,
    DiagnosticDocument,
    PolicyAggregate,
    PolicyReport,
    SessionDocument,
    SimulatedStep,
    TuneCandidate,
    TuneReport,
    WorstSession,
    read_document,
)

__all__ = [
    "MAX_CHARTED_SESSIONS",
    "MAX_POINTS",
    "DocumentError",
    "render_html",
    "render_tune_html",
]

_D = TypeVar("_D", bound=BaseModel)

#: A chart series longer than this is reduced (per-bucket min and max, markers kept).
MAX_POINTS = 1500

#: A corpus draws charts for this many sessions; the rest are listed in one table.
MAX_CHARTED_SESSIONS = 20

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
_SVG_NS = "http://www.w3.org/2000/svg"


# --- the document, validated ---------------------------------------------------------------


class DocumentError(ValueError):
    """A document the page cannot be drawn from: ``path`` names the first bad value (``""``
    for the document itself), ``problem`` what is wrong with it."""

    def __init__(self, path: str, problem: str, *, what: str = "simulation document") -> None:
        super().__init__(f"{path or what}: {problem}")
        self.path = path
        self.problem = problem


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the document's path: ``reports[0].steps[5].input``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.isidentifier():  # a key of a mapping, such as a knob's dotted path
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
        else:
            out += f".{part}" if out else part
    return out


# The names pydantic gives the members of a union of plain types in an error's location.
_UNION_MEMBERS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
}


def _first_problem(errors: Sequence[ErrorDetails]) -> tuple[str, str]:
    """The path and the problem of the first error. A value that fits no member of a union
    (a knob value) fails once per member: those failures are one problem, at the value."""
    first = errors[0]
    loc = first["loc"]
    if loc and loc[-1] in _UNION_MEMBERS:
        members = [
            str(e["loc"][-1])
            for e in errors
            if e["loc"][:-1] == loc[:-1] and len(e["loc"]) == len(loc)
        ]
        if len(members) > 1:
            wanted = ", ".join(_UNION_MEMBERS.get(m, m) for m in members)
            return _path(loc[:-1]), f"expected {wanted} or null, got {_kind(first.get('input'))}"
    return _path(loc), _problem(first)


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _problem(error: ErrorDetails) -> str:
    """What is wrong with the value, in the page's words."""
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_kind(value)}"
    if kind == "missing":
        return "missing (a required key)"
    if kind == "finite_number":
        return f"expected a finite number, got {value}"
    if kind == "too_short":
        last = next((p for p in reversed(error["loc"]) if isinstance(p, str)), "item")
        return f"expected at least one {last.removesuffix('s')}, got an empty list"
    if kind == "extra_forbidden":
        return "unknown key (not part of a version 1 document)"
    if kind == "literal_error":
        return f"expected {ctx.get('expected', 'another value')}, got {value!r}"
    if kind == "greater_than_equal":
        return f"expected at least {ctx.get('ge')}, got {value!r}"
    message = str(error["msg"])
    return message[:1].lower() + message[1:]


def _validated(model: type[_D], doc: object, what: str) -> _D:
    """``doc`` read as ``model``, or the :class:`DocumentError` of its first bad value."""
    if not isinstance(doc, Mapping):
        raise DocumentError("", f"expected an object, got {_kind(doc)}", what=what)
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version != 1:
        raise DocumentError(
            "version", f"this page reads version 1 documents, got version {version}", what=what
        )
    try:
        return read_document(model, doc)
    except ValidationError as exc:
        path, problem = _first_problem(exc.errors())
        raise DocumentError(path, problem, what=what) from None


def _in_order(doc: SessionDocument) -> SessionDocument:
    """The document with each report's steps in request order, whatever order they arrive
    in (or the lines would double back)."""
    reports = [
        r.model_copy(update={"steps": sorted(r.steps, key=lambda st: st.index)}) if r.steps else r
        for r in doc.reports
    ]
    return doc.model_copy(update={"reports": reports})


def _parse(
    doc: SessionDocument | CorpusDocument | Mapping[str, Any],
) -> tuple[list[SessionDocument], CorpusDocument | None]:
    """The sessions to draw and, for a corpus, its document."""
    if isinstance(doc, SessionDocument):
        return [_in_order(doc)], None
    if isinstance(doc, CorpusDocument):
        corpus = doc
    elif isinstance(doc, Mapping) and doc.get("sessions") is not None:
        corpus = _validated(CorpusDocument, doc, "simulation document")
    elif isinstance(doc, Mapping) and doc.get("reports") is None:
        raise DocumentError(
            "",
            "expected a 'reports' list (one session) or a 'sessions' list (a corpus), "
            "found neither",
        )
    else:
        return [_in_order(_validated(SessionDocument, doc, "simulation document"))], None
    if not corpus.sessions:
        raise DocumentError("sessions", "expected at least one session, got an empty list")
    return [_in_order(s) for s in corpus.sessions], corpus


def _steps(r: PolicyReport) -> list[SimulatedStep]:
    return r.steps or []


def _has_steps(r: PolicyReport) -> bool:
    return bool(r.steps)


def _has_prunes(r: PolicyReport) -> bool:
    """Whether the steps say how many tool outputs were pruned (older simulators did not)."""
    return any("prunes" in st.model_fields_set for st in _steps(r))


def _counters(s: SessionDocument) -> list[str]:
    return _unique(r.counter for r in s.reports if r.counter)


def _calibrated(s: SessionDocument) -> bool:
    """The counts shown are calibrated to the provider's, not the counter's own."""
    return s.calibration is not None and s.calibration.applied


def _counted(s: SessionDocument) -> str:
    """What the token counts shown are, in words (HTML)."""
    counters = ", ".join(f"<code>{_e(c)}</code>" for c in _counters(s)) or (
        "the simulator's counter"
    )
    c = s.calibration
    if c is None or not c.applied:
        return counters
    return (
        f"{counters}, calibrated to the provider's count ({c.factor:g} × counted + "
        f"{_num(c.offset)} hidden tokens)"
    )


def _given(model: BaseModel) -> list[tuple[str, Any]]:
    """The fields the document gave (in the model's order, which is the reading order), so
    that an older document's page shows what it holds and no more."""
    given = model.model_fields_set
    return [(k, getattr(model, k)) for k in type(model).model_fields if k in given]


# --- formatting ----------------------------------------------------------------------------


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _int(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def _usd(x: float | None) -> str:
    if x is None:
        return "—"
    # Cents hide the differences between cheap single requests; large sums need no more.
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:,.4f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}×"


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def _share(part: int, whole: int) -> str:
    return "—" if whole <= 0 else f"{100 * part / whole:.0f}%"


def _plural(n: int, word: str) -> str:
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


def _style(i: int) -> tuple[str, str | None]:
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
            f'text-anchor="end">{_e(yfmt(t))}</text>'
        )
    for t in xticks:
        x = plot.x(t)
        out.append(
            f'<line x1="{_c(x)}" x2="{_c(x)}" y1="{_c(plot.bottom)}" '
            f'y2="{_c(plot.bottom + 4)}" stroke="{_MUTED}"/>'
        )
        out.append(
            f'<text x="{_c(x)}" y="{_c(plot.bottom + 6 + tick_size)}" '
            f'text-anchor="middle">{_e(_int(int(t)) if xfmt is None else xfmt(t))}</text>'
        )
    out.append("</g>")
    out.append(
        f'<path class="axis" d="M{_c(plot.left)},{_c(plot.top)}V{_c(plot.bottom)}'
        f'H{_c(plot.right)}" fill="none" stroke="{_MUTED}" stroke-width="1"/>'
    )
    if xlabel:
        out.append(
            f'<text class="axis-label" x="{_c(plot.left + plot.width / 2)}" '
            f'y="{_c(plot.bottom + 36)}" text-anchor="middle" font-size="13">{_e(xlabel)}</text>'
        )
    if ylabel:
        ly = plot.top + plot.height / 2
        out.append(
            f'<text class="axis-label" x="14" y="{_c(ly)}" text-anchor="middle" '
            f'font-size="13" transform="rotate(-90 14 {_c(ly)})">{_e(ylabel)}</text>'
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
        f'<svg class="chart" xmlns="{_SVG_NS}" viewBox="0 0 {_c(_WIDTH)} {_c(height)}" '
        f'role="img" aria-labelledby="{chart_id}-title" aria-describedby="{chart_id}-desc" '
        f'font-size="12">',
        f'<title id="{chart_id}-title">{_e(title)}</title>',
        f'<desc id="{chart_id}-desc">{_e(desc)}</desc>',
    ]


def _swatch(shape: str) -> str:
    """A legend symbol: ``shape`` drawn in a 28 by 12 box, centred on (14, 6)."""
    return (
        f'<svg class="swatch" xmlns="{_SVG_NS}" viewBox="0 0 28 12" aria-hidden="true">'
        f"{shape}</svg>"
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
    return f'<li data-legend="{kind}"{extra}>{swatch}<span>{_e(label)}</span></li>'


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
    parts = ", ".join(f"{_e(name)} {total:,} → {kept:,}" for name, total, kept in reduced)
    return (
        f" Series of more than {MAX_POINTS:,} points are drawn reduced to each bucket's "
        f"minimum and maximum, every marked request kept ({parts} points)."
    )


def _figure(
    chart: str, chart_id: str, caption: str, legend: Sequence[str], svg: Sequence[str]
) -> str:
    return "\n".join(
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


def _context_chart(s: SessionDocument, sid: str) -> str:
    chart_id = f"{sid}-context"
    reports = [r for r in s.reports if _has_steps(r)]
    recorded: dict[int, int] = {}
    for r in reports:
        for st in _steps(r):
            if st.recorded_input is not None:
                recorded.setdefault(st.index, st.recorded_input)
    rec_points = sorted(recorded.items())
    last = max(
        [r.requests_total for r in reports] + [st.index for r in reports for st in _steps(r)[-1:]]
    )
    first = min(st.index for r in reports for st in _steps(r)[:1])
    data_top = max(
        [st.input for r in reports for st in _steps(r)]
        + [v for _, v in rec_points]
        + [r.compaction_limit or 0 for r in reports]
    )
    windows = _unique(str(r.window) for r in reports if r.window)
    # A window far above the data would flatten every line against the axis; it is named
    # in the legend instead.
    drawn_windows = [int(w) for w in windows if data_top == 0 or int(w) <= 2 * data_top]
    top, yticks = _value_ticks(max([data_top, *drawn_windows, 1]))
    height = 400.0
    plot = _Plot(72, 18, _WIDTH - 72 - 20, height - 18 - 52, first, max(last, first + 1), 0, top)
    svg = _svg_open(
        chart_id,
        height,
        f"Context size per request: {s.session}",
        "Tokens in each request, one line per policy: "
        + ", ".join(r.policy for r in reports)
        + (f"; window {', '.join(f'{int(w):,}' for w in windows)} tokens" if windows else "")
        + ".",
    )
    svg += _axes(
        plot, _request_ticks(first, last), yticks, _short, xlabel="request", ylabel="tokens"
    )
    legend: list[str] = []
    for i, r in enumerate(s.reports):
        if not _has_steps(r):
            continue
        color, dash = _style(i)
        legend.append(
            _legend_item(
                _swatch_line(color, dash), r.policy, "policy", f' data-policy="{_e(r.policy)}"'
            )
        )
    for w in windows:
        label = f"window {int(w):,}"
        if int(w) in drawn_windows:
            y = plot.y(int(w))
            svg.append(
                f'<g class="window"><line x1="{_c(plot.left)}" x2="{_c(plot.right)}" '
                f'y1="{_c(y)}" y2="{_c(y)}" stroke="{_INK}" stroke-width="1.5"/>'
                f'<text x="{_c(plot.right - 4)}" y="{_c(y - 5)}" text-anchor="end" '
                f'font-size="11" fill="{_INK}">{_e(label)}</text></g>'
            )
        else:
            label += " (above the chart)"
        legend.append(
            _legend_item(_swatch_line(_INK, None, 1.5), label, "reference", ' data-kind="window"')
        )
    limits = [(i, r) for i, r in enumerate(s.reports) if _has_steps(r) and r.compaction_limit]
    for i, r in limits:
        color, _ = _style(i)
        y = plot.y(r.compaction_limit or 0)
        svg.append(
            f'<line class="compaction-limit" data-policy="{_e(r.policy)}" x1="{_c(plot.left)}" '
            f'x2="{_c(plot.right)}" y1="{_c(y)}" y2="{_c(y)}" stroke="{color}" '
            f'stroke-width="1.2" stroke-dasharray="6 4"><title>'
            f"{_e(r.policy)} compacts at {r.compaction_limit:,} tokens</title></line>"
        )
    if limits:
        legend.append(
            _legend_item(
                _swatch_line(_MUTED, "6 4", 1.5),
                "compaction limit (in the policy's colour)",
                "reference",
                ' data-kind="compaction-limit"',
            )
        )
    reduced: list[tuple[str, int, int]] = []
    if rec_points:
        keep = _reduce([v for _, v in rec_points])
        if len(keep) < len(rec_points):
            reduced.append(("recorded", len(rec_points), len(keep)))
        path = _polyline((plot.x(rec_points[k][0]), plot.y(rec_points[k][1])) for k in keep)
        svg.append(
            f'<path class="series" data-series="recorded" d="{path}" fill="none" '
            f'stroke="{_RECORDED}" stroke-width="{_RECORDED_WIDTH}" stroke-linejoin="round" '
            'stroke-linecap="round"/>'
        )
        legend.append(
            _legend_item(
                _swatch_line(_RECORDED, None, _RECORDED_WIDTH),
                "recorded",
                "series",
                ' data-kind="recorded"',
            )
        )
    recorded_marks = sorted(set(s.recorded.compactions)) if s.recorded else []
    agent = [k for k in recorded_marks if first <= k <= last]
    if agent:
        for k in agent:
            x = plot.x(k)
            svg.append(
                f'<line class="recorded-compaction" data-step="{k}" x1="{_c(x)}" x2="{_c(x)}" '
                f'y1="{_c(plot.top)}" y2="{_c(plot.bottom)}" stroke="{_INK}" stroke-width="1.2" '
                f'stroke-dasharray="1 3"><title>the recorded agent compacted before request '
                f"{k:,}</title></line>"
            )
        legend.append(
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
    marks: list[str] = []
    kinds_seen = {"compaction", "overflow"}
    for i, r in enumerate(s.reports):
        if not _has_steps(r):
            continue
        if _has_prunes(r):
            kinds_seen.add("prune")
        color, dash = _style(i)
        steps = _steps(r)
        marked = [
            k for k, st in enumerate(steps) if st.compactions or st.prunes or st.provider_overflows
        ]
        keep = _reduce([st.input for st in steps], marked)
        if len(keep) < len(steps):
            reduced.append((r.policy, len(steps), len(keep)))
        path = _polyline((plot.x(steps[k].index), plot.y(steps[k].input)) for k in keep)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        svg.append(
            f'<path class="series" data-series="policy" data-policy="{_e(r.policy)}" d="{path}" '
            f'fill="none" stroke="{color}" stroke-width="{_line_width(i)}" '
            f'stroke-linejoin="round"{dash_attr}/>'
        )
        for k in marked:
            st = steps[k]
            x, y = plot.x(st.index), plot.y(st.input)
            for kind, count in (
                ("compaction", st.compactions),
                ("prune", st.prunes),
                ("overflow", st.provider_overflows),
            ):
                if not count:
                    continue
                what = _plural(count, _MARKER_LABELS[kind])
                tip = (
                    f"{r.policy}: {what} before request {st.index:,} (context {st.input:,} tokens)"
                )
                marks.append(
                    _marker_shape(
                        kind,
                        x,
                        y,
                        color,
                        f"<title>{_e(tip)}</title>",
                        f' class="marker" data-kind="{kind}" data-step="{st.index}" '
                        f'data-policy="{_e(r.policy)}"',
                    )
                )
    svg += marks
    for kind in ("compaction", "prune", "overflow"):
        if kind in kinds_seen:
            legend.append(
                _legend_item(
                    _swatch_marker(kind), _MARKER_LABELS[kind], "marker", f' data-kind="{kind}"'
                )
            )
    caption = (
        "<strong>Context size per request.</strong> Tokens in each request the policy sends "
        "(the wire body, counted the same way for every policy). A marker sits on the request "
        "that followed a compaction, a prune, or a request the provider would have refused "
        "as too long — its input plus the output cap it asked for over the window (sent "
        "again after compacting)."
    )
    if _calibrated(s):
        caption += " The counts are calibrated to the provider's (see Calibration above)."
    if rec_points:
        caption += (
            " The wide grey band is the input the recorded agent's provider reported for "
            "the same request."
        )
    if agent:
        caption += (
            " A dotted vertical line marks a request the recorded agent sent after compacting "
            "its own context."
        )
    caption += _reduction_note(reduced)
    return _figure("context", chart_id, caption, legend, svg)


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


def _cost_chart(s: SessionDocument, sid: str) -> str:
    chart_id = f"{sid}-cost"
    reports = [
        (i, r)
        for i, r in enumerate(s.reports)
        if _has_steps(r) and any(st.cost_usd is not None for st in _steps(r))
    ]
    if s.prices is None or not reports:
        model = f"the model {_e(s.model)}" if s.model else "the model"
        return (
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
        + ", ".join(f"{r.policy} {_usd(c[-1])}" for _, r, c in series)
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
        color, dash = _style(i)
        legend.append(
            _legend_item(
                _swatch_line(color, dash),
                f"{r.policy} ({_usd(cumulative[-1])})",
                "policy",
                f' data-policy="{_e(r.policy)}"',
            )
        )
        keep = _reduce(cumulative)
        if len(keep) < len(cumulative):
            reduced.append((r.policy, len(cumulative), len(keep)))
        path = _polyline((plot.x(_steps(r)[k].index), plot.y(cumulative[k])) for k in keep)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        end_x, end_y = plot.x(_steps(r)[-1].index), plot.y(cumulative[-1])
        lines.append(
            f'<path class="series" data-series="policy" data-policy="{_e(r.policy)}" d="{path}" '
            f'fill="none" stroke="{color}" stroke-width="{_line_width(i)}" '
            f'stroke-linejoin="round"{dash_attr}/>'
            f'<circle cx="{_c(end_x)}" cy="{_c(end_y)}" r="3" fill="{color}"><title>'
            f"{_e(r.policy)}: {_usd(cumulative[-1])} over {_plural(len(_steps(r)), 'request')}"
            "</title></circle>"
        )
    if floor_cost is not None:
        y = plot.y(floor_cost)
        label = f"floor {_usd(floor_cost)}"
        svg.append(
            f'<g class="floor"><line x1="{_c(plot.left)}" x2="{_c(plot.right)}" y1="{_c(y)}" '
            f'y2="{_c(y)}" stroke="{_INK}" stroke-width="1.5" stroke-dasharray="2 3"/>'
            f'<text x="{_c(plot.right - 4)}" y="{_c(y - 5)}" text-anchor="end" font-size="11" '
            f'fill="{_INK}">{_e(label)}</text></g>'
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
            f'stroke-linecap="round"><title>as recorded: {_e(_usd(total))}</title></path>'
        )
        legend.append(
            _legend_item(
                _swatch_line(_RECORDED, None, _RECORDED_WIDTH),
                f"recorded ({_usd(total)})",
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


def _cache_chart(s: SessionDocument, sid: str) -> str:
    chart_id = f"{sid}-cache"
    reports = [(i, r) for i, r in enumerate(s.reports) if _has_steps(r)]
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
        color, _ = _style(i)
        svg.append(
            f'<g class="panel" data-policy="{_e(r.policy)}">'
            f'<rect x="{_c(px)}" y="{_c(py - 16)}" width="10" height="10" fill="{color}"/>'
            f'<text x="{_c(px + 15)}" y="{_c(py - 7)}" font-size="12.5" font-weight="600" '
            f'fill="{_INK}">{_e(name)}<title>{_e(r.policy)}</title></text>'
            f'<text x="{_c(px + panel_w)}" y="{_c(py - 7)}" font-size="11" text-anchor="end" '
            f'fill="{_MUTED}">{_e(summary)}</text>'
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


# --- tables and sections -------------------------------------------------------------------


def _row(cells: Sequence[tuple[str, bool]], attrs: str = "") -> str:
    tds = "".join(
        f'<td class="num">{c}</td>' if num else f'<td class="text">{c}</td>' for c, num in cells
    )
    return f"<tr{attrs}>{tds}</tr>"


def _head(columns: Sequence[tuple[str, bool]], escape: Callable[[str], str] = _e) -> str:
    """The header row of ``(name, numeric)`` columns; ``escape`` turns a name into markup."""
    ths = "".join(
        f'<th scope="col" class="num">{escape(c)}</th>'
        if num
        else f'<th scope="col">{escape(c)}</th>'
        for c, num in columns
    )
    return f"<thead><tr>{ths}</tr></thead>"


def _totals_table(s: SessionDocument, sid: str) -> str:
    floor_cost = s.floor.cost_usd if s.floor is not None else None
    base = s.reports[0].cost_usd
    costs = [r.cost_usd for r in s.reports if r.cost_usd is not None and not r.stopped]
    cheapest = min(costs) if len(s.reports) > 1 and costs else None
    # Without a floor the column would be dashes only.
    show_floor = bool(floor_cost) or any(r.floor_ratio is not None for r in s.reports)
    rows = []
    for i, r in enumerate(s.reports):
        color, _ = _style(i)
        requests = _int(r.requests)
        if r.stopped:
            requests = f'{requests} of {r.requests_total:,}, <span class="stop">stopped</span>'
        window = f"{r.max_request:,}"
        if r.window:
            window += f' <span class="unit">/ {r.window:,}</span>'
        vs_first = r.cost_usd / base if r.cost_usd is not None and base else None
        vs_floor = r.floor_ratio
        if vs_floor is None and r.cost_usd is not None and floor_cost:
            vs_floor = r.cost_usd / floor_cost
        policy = (
            f'<span class="dot" aria-hidden="true"><svg xmlns="{_SVG_NS}" viewBox="0 0 10 10">'
            f'<rect width="10" height="10" rx="2" fill="{color}"/></svg></span>{_e(r.policy)}'
        )
        cls = []
        if r.stopped:
            cls.append("stopped")
        if cheapest is not None and r.cost_usd == cheapest and not r.stopped:
            cls.append("best")
            policy += ' <span class="tag">cheapest</span>'
        attrs = f' data-policy="{_e(r.policy)}"' + (f' class="{" ".join(cls)}"' if cls else "")
        rows.append(
            _row(
                [
                    (policy, False),
                    (requests, True),
                    (_int(r.compactions), True),
                    (_int(r.provider_overflows), True),
                    (_int(r.input), True),
                    (_int(r.cache_read), True),
                    (_int(r.cache_write), True),
                    (_int(r.uncached), True),
                    (_int(r.output), True),
                    (window, True),
                    (_usd(r.cost_usd), True),
                    (_ratio(vs_first), True),
                    *([(_ratio(vs_floor), True)] if show_floor else []),
                ],
                attrs,
            )
        )
    columns = [
        ("Policy", False),
        ("Requests", True),
        ("Compactions", True),
        ("Provider overflows", True),
        ("Input", True),
        ("Cache read", True),
        ("Cache write", True),
        ("Uncached", True),
        ("Output", True),
        ("Max request / window", True),
        ("Cost", True),
        ("vs first", True),
    ]
    if show_floor:
        columns.append(("vs floor", True))
    errors = [
        f"<li><strong>{_e(r.policy)}</strong> stopped after {_plural(r.requests, 'request')} "
        f"of {r.requests_total:,}: {_e(r.error)}</li>"
        for r in s.reports
        if r.error
    ]
    parts = [
        '<div class="table-wrap">',
        f'<table class="totals" id="{sid}-totals">',
        f"<caption>Totals per policy. Tokens as counted by {_counted(s)}; costs in US "
        "dollars, summary calls included. “vs first” divides each cost by "
        f"{_e(s.reports[0].policy)}'s"
        + (", “vs floor” by the session's floor" if show_floor else "")
        + ".</caption>",
        _head(columns),
        "<tbody>",
        *rows,
        "</tbody></table></div>",
    ]
    if errors:
        parts += ['<ul class="errors">', *errors, "</ul>"]
    return "\n".join(parts)


def _facts(s: SessionDocument, *, with_session: bool) -> str:
    items: list[tuple[str, str]] = []
    if with_session:
        messages = (
            f" ({_plural(s.session_messages, 'message')})" if s.session_messages is not None else ""
        )
        items.append(("Session", f"<code>{_e(s.session)}</code>{messages}"))
    if s.model:
        items.append(("Model", f"<code>{_e(s.model)}</code>"))
    if _counters(s):
        items.append(("Counter", _counted(s)))
    if _given(s.cache):
        cache = []
        for key, value in _given(s.cache):
            shown = _scalar(value)
            cache.append(shown if key == "kind" else f"{_e(key.replace('_', ' '))} {shown}")
        items.append(("Cache", " · ".join(cache)))
    if s.prices is None:
        items.append(("Prices", "none in the catalog: no costs"))
    else:
        prices = " · ".join(
            f"{_e(key.replace('_', ' '))} {_e(_usd2(value))}" for key, value in _given(s.prices)
        )
        items.append(("Prices", f'{prices} <span class="unit">per million tokens</span>'))
    if s.calibration is not None:
        c = s.calibration
        # The simulator's model: reported ≈ factor × simulated + offset (the hidden prefix).
        bits = [
            f"reported ≈ {c.factor if c.factor is not None else 1.0:g} × simulated + "
            f"{_num(c.offset or 0)} tokens"
        ]
        if c.declared or c.steps == 0:
            bits.append("declared by hand")
        elif c.steps is not None:
            bits.append(f"fitted on {_plural(c.steps, 'step')}")
        if c.r2 is not None:
            bits.append(f"R² {c.r2:.4f}")
        if c.median_abs_error is not None:
            bits.append(f"median error {100 * c.median_abs_error:.2f}%")
        if c.applied is not None:
            bits.append("<strong>applied</strong>" if c.applied else "not applied")
        items.append(("Calibration", " · ".join(bits) or "—"))
    for note in s.notes:
        items.append(("Note", _e(note)))
    if s.recorded is not None and s.recorded.cost_usd is not None:
        agent = len(set(s.recorded.compactions))
        compacted = f"compacted {_plural(agent, 'time')}" if agent else "never compacted"
        items.append(
            (
                "As recorded",
                f"<strong>{_usd(s.recorded.cost_usd)}</strong> at these prices, from the usage the "
                f"log reports; the agent {compacted}",
            )
        )
    if s.floor is not None:
        f = s.floor
        items.append(
            (
                "Floor",
                f"<strong>{_usd(f.cost_usd)}</strong>"
                + (f" ({_e(f.policy)}'s requests under a perfect cache)" if f.policy else "")
                + f" — {f.input:,} input tokens: "
                f"{f.cache_write:,} written to the cache, {f.cache_read:,} read from it; "
                f"{f.output:,} output",
            )
        )
    return _facts_list(items)


def _facts_list(items: Iterable[tuple[str, str]]) -> str:
    """Label and value pairs as a definition list; the values are markup already."""
    body = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<dl class="facts">{body}</dl>'


def _usd2(x: float | None) -> str:
    return "—" if x is None else f"${x:,.2f}"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _num(value)
    if value is None:
        return "—"
    if isinstance(value, str):
        return _e(value)
    return f"<code>{_e(json.dumps(value, sort_keys=True, default=str))}</code>"


def _lede(s: SessionDocument) -> str:
    """One sentence with the answer most readers came for: which policy is cheapest, and
    by how much."""
    priced = [r for r in s.reports if r.cost_usd is not None and not r.stopped]
    if len(priced) < 2:
        return ""
    dear = max(priced, key=lambda r: r.cost_usd or 0.0)
    low, high = min(r.cost_usd or 0.0 for r in priced), dear.cost_usd or 0.0
    if high == low:
        text = f"All {len(priced)} complete replays cost the same: {_usd(low)}."
    else:
        tied = [f"<strong>{_e(r.policy)}</strong>" for r in priced if r.cost_usd == low]
        who = (
            f"{tied[0]} is the cheapest complete replay"
            if len(tied) == 1
            else f"{', '.join(tied[:-1])} and {tied[-1]} are the cheapest complete replays"
        )
        text = f"{who} at {_usd(low)}; <strong>{_e(dear.policy)}</strong> costs {_usd(high)}" + (
            f" ({_ratio(high / low)} as much)." if low > 0 else "."
        )
    floor = s.floor.cost_usd if s.floor is not None else None
    if floor:
        text += f" The floor is {_usd(floor)}: the cheapest costs {_ratio(low / floor)} that."
    stopped = sum(r.stopped for r in s.reports)
    if stopped:
        who = "1 policy" if stopped == 1 else f"{stopped} policies"
        text += f" {who} stopped early: fewer requests, so not compared."
    return f'<p class="lede">{text}</p>'


def _session_section(s: SessionDocument, sid: str, *, heading: str | None) -> str:
    parts = [f'<section class="session" id="{sid}">']
    if heading is not None:
        parts.append(f'<h2 id="{sid}-h">{heading}</h2>')
        parts.append(_facts(s, with_session=True))
        parts.append('<h3 class="sub">Totals by policy</h3>')
    else:
        parts.append(f'<h2 id="{sid}-h">Totals by policy</h2>')
    parts.append(_lede(s))
    parts.append(_totals_table(s, sid))
    if any(_has_steps(r) for r in s.reports):
        parts.append(_context_chart(s, sid))
        parts.append(_cost_chart(s, sid))
        parts.append(_cache_chart(s, sid))
    else:
        parts.append(
            f'<p class="note" data-skipped="charts">No charts: the document carries no '
            f"per-request steps for {_e(s.session)}.</p>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _aggregate_table(policies: Sequence[PolicyAggregate]) -> str:
    columns = [
        ("Policy", False),
        ("Sessions", True),
        ("Stopped", True),
        ("Cost", True),
        ("p50", True),
        ("p90", True),
        ("Max", True),
        ("Compactions", True),
        ("Provider overflows", True),
        ("Input", True),
        ("Cache read", True),
        ("Cache write", True),
        ("Output", True),
        ("Floor", True),
        ("vs floor", True),
    ]
    rows = [
        _row(
            [
                (_e(p.policy), False),
                (_int(p.sessions), True),
                (_int(p.stopped), True),
                (_usd(p.cost_usd), True),
                (_usd(p.cost_p50), True),
                (_usd(p.cost_p90), True),
                (_usd(p.cost_max), True),
                (_int(p.compactions), True),
                (_int(p.provider_overflows), True),
                (_int(p.input), True),
                (_int(p.cache_read), True),
                (_int(p.cache_write), True),
                (_int(p.output), True),
                (_usd(p.floor_cost_usd), True),
                (_ratio(p.floor_ratio), True),
            ],
            f' data-policy="{_e(p.policy)}"',
        )
        for p in policies
    ]
    return "\n".join(
        [
            '<section class="aggregate" id="aggregate">',
            "<h2>All sessions, per policy</h2>",
            '<div class="table-wrap"><table class="aggregate-table">',
            "<caption>Sums over every session; p50, p90 and max are the cost of one "
            "session.</caption>",
            _head(columns),
            "<tbody>",
            *rows,
            "</tbody></table></div>",
            "</section>",
        ]
    )


def _worst_table(worst: Sequence[WorstSession], anchors: Mapping[str, str]) -> str:
    columns = [
        ("#", True),
        ("Session", False),
        ("Policy", False),
        ("Cost", True),
        ("vs floor", True),
        ("Compactions", True),
        ("Stopped", False),
    ]
    rows = []
    for n, w in enumerate(worst, 1):
        session = f"<code>{_e(w.session)}</code>"
        if w.session in anchors:
            session = f'<a href="#{anchors[w.session]}">{session}</a>'
        rows.append(
            _row(
                [
                    (str(n), True),
                    (session, False),
                    (_e(w.policy), False),
                    (_usd(w.cost_usd), True),
                    (_ratio(w.floor_ratio), True),
                    (_int(w.compactions), True),
                    ("stopped" if w.stopped else "", False),
                ]
            )
        )
    return "\n".join(
        [
            '<section class="worst" id="worst">',
            "<h2>Worst sessions</h2>",
            '<div class="table-wrap"><table class="worst-table">',
            "<caption>The session and policy pairs furthest above their floor, worst "
            "first.</caption>",
            _head(columns),
            "<tbody>",
            *rows,
            "</tbody></table></div>",
            "</section>",
        ]
    )


def _failed_list(failed: Sequence[tuple[str, str]]) -> str:
    items = "".join(
        f"<li><code>{_e(session)}</code>: {_e(error)}</li>" for session, error in failed
    )
    return (
        '<section class="failed" id="failed">'
        f"<h2>{_plural(len(failed), 'session')} could not be replayed</h2>"
        f'<ul class="errors">{items}</ul></section>'
    )


def _rest_table(rest: Sequence[tuple[int, SessionDocument]]) -> str:
    policies = _unique(r.policy for _, s in rest for r in s.reports)
    columns = [("#", True), ("Session", False), ("Model", False), ("Requests", True)]
    columns += [(p, True) for p in policies]
    rows = []
    for n, s in rest:
        by_policy = {r.policy: r for r in reversed(s.reports)}
        cells = [
            (str(n), True),
            (f"<code>{_e(s.session)}</code>", False),
            (f"<code>{_e(s.model)}</code>", False),
            (_int(max(r.requests_total for r in s.reports)), True),
        ]
        for p in policies:
            r = by_policy.get(p)
            if r is None:
                cells.append(("", True))
            else:
                cells.append((_usd(r.cost_usd) + (" (stopped)" if r.stopped else ""), True))
        rows.append(_row(cells))
    return "\n".join(
        [
            '<section class="rest" id="more-sessions">',
            f"<h2>{_plural(len(rest), 'more session')}</h2>",
            f'<p class="note">Charts are drawn for the first {MAX_CHARTED_SESSIONS} '
            "sessions only; these are listed with each policy's cost.</p>",
            '<div class="table-wrap"><table class="rest-table">',
            _head(columns),
            "<tbody>",
            *rows,
            "</tbody></table></div>",
            "</section>",
        ]
    )


_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body {
  margin: 0; background: #FFFFFF; color: #1F2328;
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
    sans-serif;
  -webkit-print-color-adjust: exact; print-color-adjust: exact;
}
header, main, footer { max-width: 1240px; margin: 0 auto; padding: 0 28px; }
header { padding-top: 28px; padding-bottom: 12px; border-bottom: 1px solid #D1D9E0; }
h1 { font-size: 22px; line-height: 1.3; margin: 0 0 14px; overflow-wrap: anywhere; }
h2 { font-size: 18px; margin: 34px 0 10px; overflow-wrap: anywhere; }
h3.sub { font-size: 15px; margin: 18px 0 8px; }
section.session + section.session { border-top: 1px solid #D1D9E0; margin-top: 36px; }
code { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  overflow-wrap: anywhere; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 18px;
  margin: 0 0 12px; }
dl.facts dt { color: #59636E; }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.unit { color: #59636E; }
.table-wrap { overflow-x: auto; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums;
  font-size: 12.5px; }
caption { caption-side: top; text-align: left; color: #59636E; padding: 0 0 8px; }
th, td { padding: 6px 6px; border-bottom: 1px solid #E3E8EE; white-space: nowrap;
  vertical-align: baseline; }
thead th { background: #F6F8FA; border-bottom: 1px solid #D1D9E0; font-weight: 600;
  text-align: left; white-space: normal; vertical-align: bottom; }
.num { text-align: right; }
thead th.num { text-align: right; }
tbody tr:nth-child(even) td { background: #FBFCFD; }
td.text { white-space: normal; overflow-wrap: anywhere; }
td.text:first-child { min-width: 11em; }
tr.best td { font-weight: 600; }
tr.stopped td { color: #59636E; }
tr.stopped .stop { color: #8C2F39; font-weight: 600; }
.tag { display: inline-block; font-size: 11px; font-weight: 600; padding: 0 6px;
  border: 1px solid #1B9E77; color: #11684F; border-radius: 9px; margin-left: 4px; }
.dot svg { width: 10px; height: 10px; margin-right: 7px; vertical-align: -1px; }
ul.errors { margin: 4px 0 0; padding-left: 20px; color: #8C2F39; }
figure { margin: 22px 0; padding: 16px 18px 12px; border: 1px solid #D1D9E0;
  border-radius: 8px; break-inside: avoid; page-break-inside: avoid; }
figcaption { margin: 0 0 10px; color: #59636E; }
figcaption strong { color: #1F2328; font-size: 15px; }
ul.legend { list-style: none; display: flex; flex-wrap: wrap; gap: 4px 20px;
  margin: 0 0 8px; padding: 0; font-size: 13px; }
ul.legend li { display: inline-flex; align-items: center; gap: 6px; }
ul.legend li span { overflow-wrap: anywhere; }
svg.swatch { width: 28px; height: 12px; flex: none; }
svg.chart { display: block; width: 100%; height: auto; }
svg.chart text { font-family: inherit; }
.note { color: #59636E; font-style: italic; }
p.lede { font-size: 15px; margin: 0 0 12px; }
a { color: #0B5CAD; }
footer { color: #59636E; font-size: 12px; padding-top: 18px; padding-bottom: 28px;
  border-top: 1px solid #D1D9E0; margin-top: 36px; }
@media print {
  header, main, footer { max-width: none; padding: 0; }
  figure { border-color: #999999; }
  .table-wrap { overflow: visible; }
}
"""

# Nothing may load or run: the page is a document, and it is read from untrusted places.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _page(
    title: str,
    header: Sequence[str],
    main: Sequence[str],
    footer: str,
    *,
    generator: str,
    css: str = "",
) -> str:
    """A whole report page: the head (the Content-Security-Policy, the shared styles and
    ``css`` after them), ``title`` as the heading atop ``header``, then ``main`` and
    ``footer``. ``header``, ``main`` and ``footer`` are markup already; ``title`` is text."""
    return (
        "\n".join(
            [
                "<!DOCTYPE html>",
                '<html lang="en">',
                "<head>",
                '<meta charset="utf-8"/>',
                '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
                f'<meta http-equiv="Content-Security-Policy" content="{_e(_CSP)}"/>',
                f'<meta name="generator" content="{_e(generator)}"/>',
                f"<title>{_e(title)}</title>",
                f"<style>{_CSS}{css}</style>",
                "</head>",
                "<body>",
                "<header>",
                f"<h1>{_e(title)}</h1>",
                *header,
                "</header>",
                "<main>",
                *main,
                "</main>",
                f"<footer>{footer}</footer>",
                "</body>",
                "</html>",
            ]
        )
        + "\n"
    )


def render_html(
    doc: SessionDocument | CorpusDocument | Mapping[str, Any], *, title: str | None = None
) -> str:
    """The simulation document ``doc`` as one self-contained HTML page.

    ``doc`` is what ``kilo-rules simulate --format json`` prints, as its model or as JSON
    data: a single session (:class:`~kilo_rules.tools.simulation.documents.SessionDocument`,
    ``schemas/simulate.v1.json``) or a corpus
    (:class:`~kilo_rules.tools.simulation.documents.CorpusDocument`,
    ``schemas/corpus.v1.json``). The page shows
    the session's facts (model, cache, prices, calibration, floor), a totals table per
    session and three inline-SVG charts per session: context size per request, cumulative
    cost and the cache split. A corpus leads with the aggregate and the worst sessions and
    draws charts for its first :data:`MAX_CHARTED_SESSIONS` sessions.

    ``title`` replaces the default heading. The page has no script and loads nothing;
    every string from ``doc`` is escaped. The same document always gives the same text.

    JSON data is validated against the model, strictly; raises :class:`DocumentError` (a
    :class:`ValueError`) naming the path of the first invalid value (for example
    ``sessions[2].reports[0].steps[5].input: expected an integer, got a string``).
    """
    sessions, corpus = _parse(doc)
    if title is None:
        if corpus is not None:
            title = f"kilo-rules simulate: {_plural(len(sessions), 'session')}"
        else:
            one = sessions[0]
            title = f"kilo-rules simulate: {one.session}" + (
                f" on {one.model}" if one.model else ""
            )
    header: list[str] = []
    if corpus is not None:
        models = _unique(s.model for s in sessions)
        counters = _unique(c for s in sessions for c in _counters(s))
        facts = [
            ("Sessions", f"{len(sessions):,}"),
            ("Models", ", ".join(f"<code>{_e(m)}</code>" for m in models)),
        ]
        if counters:
            facts.append(("Counter", ", ".join(f"<code>{_e(c)}</code>" for c in counters)))
        facts.append(
            (
                "Policies",
                ", ".join(_e(p) for p in _unique(r.policy for s in sessions for r in s.reports)),
            )
        )
        header.append(_facts_list(facts))
    else:
        header.append(_facts(sessions[0], with_session=True))
    body: list[str] = []
    if corpus is not None:
        charted = list(enumerate(sessions[:MAX_CHARTED_SESSIONS], 1))
        anchors: dict[str, str] = {}
        for n, s in charted:
            anchors.setdefault(s.session, f"s{n}")
        if corpus.aggregate.policies:
            body.append(_aggregate_table(corpus.aggregate.policies))
        if corpus.aggregate.worst:
            body.append(_worst_table(corpus.aggregate.worst, anchors))
        if corpus.failed:
            body.append(_failed_list([(f.session, f.error) for f in corpus.failed]))
        for n, s in charted:
            heading = f"{n}. <code>{_e(s.session)}</code>"
            body.append(_session_section(s, f"s{n}", heading=heading))
        rest = list(enumerate(sessions, 1))[MAX_CHARTED_SESSIONS:]
        if rest:
            body.append(_rest_table(rest))
    else:
        body.append(_session_section(sessions[0], "s1", heading=None))
    return _page(
        title,
        header,
        body,
        "Written by <code>kilo-rules simulate</code>. This page is self-contained: no "
        "scripts, no fonts or images from elsewhere; hover a marker or a line end for its "
        "numbers.",
        generator="kilo-rules simulate",
    )


# --- the tune report -----------------------------------------------------------------------

# The first colours of the palette, as the first policies of the simulate charts have them.
_FEASIBLE, _INFEASIBLE, _WINNER = _PALETTE[:3]

# Costs that differ by less than this (USD) rank as a tie, as the tune ranks them: sums of
# the same numbers in another order differ in the last bits.
_COST_EPSILON = 1e-9

# A knob value longer than this is cut short under its column of points.
_MAX_TICK_LABEL = 24

_TUNE_CSS = """
tbody tr.winner td { background: #E8F5EF; font-weight: 600; }
tr.infeasible td, tr.skipped td { color: #59636E; }
.tag.baseline { border-color: #59636E; color: #59636E; }
.candidates-table td.text:first-child { min-width: 0; white-space: nowrap; }
.candidates-table td:last-child { min-width: 16em; }
"""


def _diagnostic(d: DiagnosticDocument) -> str:
    """A diagnostic of the report as the command line prints it."""
    where = d.location
    return f"{where.file}:{where.line}:{where.col}: {d.severity}[{d.code}]: {d.message}"


def _tune_winner(t: TuneReport) -> TuneCandidate | None:
    if t.winner is None:
        return None
    return next(c for c in t.candidates if c.index == t.winner.index)


def _tune_baseline(t: TuneReport) -> TuneCandidate | None:
    return next((c for c in t.candidates if c.baseline), None)


def _measured(c: TuneCandidate) -> bool:
    return c.status == "measured"


def _parse_tune(doc: TuneReport | Mapping[str, Any]) -> TuneReport:
    t = doc if isinstance(doc, TuneReport) else _validated(TuneReport, doc, "tune report")
    seen: set[int] = set()
    for i, c in enumerate(t.candidates):
        if c.index in seen:
            raise DocumentError(
                f"candidates[{i}].index", f"candidate {c.index} is listed twice", what="tune report"
            )
        seen.add(c.index)
        if _measured(c) and c.cost_usd is None:
            raise DocumentError(
                f"candidates[{i}].cost_usd",
                "missing (a measured candidate has a cost)",
                what="tune report",
            )
    if t.winner is not None and t.winner.index not in seen:
        raise DocumentError(
            "winner.index", f"no candidate {t.winner.index} in candidates", what="tune report"
        )
    return t


def _usd4(x: float | None) -> str:
    # Candidates of one tune often differ by fractions of a cent.
    return "—" if x is None else f"${x:,.4f}"


def _change(ratio: float | None) -> str:
    return "—" if ratio is None else f"{100 * (ratio - 1):+.1f} %"


def _knob_value(value: Any) -> str:
    """A knob value as the tune file spells it (a string bare, anything else as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _path_breaks(path: str) -> str:
    """A dotted knob path as markup that may wrap after each dot: a long one would
    otherwise widen its column past the page."""
    return _e(path).replace(".", ".<wbr/>")


def _tune_order(c: TuneCandidate) -> tuple[int, int, int, int]:
    """The tune's ranking: feasible candidates by cost, then infeasible ones by cost, then
    the skipped; equal costs go to fewer compactions, then to the earlier candidate."""
    group = 0 if c.feasible else (1 if _measured(c) else 2)
    if c.cost_usd is None:
        return (group, 0, 0, c.index)
    return (group, round(c.cost_usd / _COST_EPSILON), c.compactions or 0, c.index)


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
) -> str:
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
        desc += f" The winner, candidate {t.winner.index}, costs {_usd4(t.winner.cost_usd)}."
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
        tip = f"#{c.index} {c.name}: {_usd4(c.cost_usd)}" + (
            "" if c.feasible else " — infeasible: " + "; ".join(c.reasons)
        )
        svg.append(
            _tune_mark(
                kind,
                x,
                y,
                inner=f"<title>{_e(tip)}</title>",
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


def _tune_charts(t: TuneReport) -> list[str]:
    measured = [c for c in t.candidates if _measured(c)]
    if not measured:
        return []
    figures = [
        _tune_chart(
            t,
            "cost-compactions",
            "<strong>Cost against compactions.</strong> Each candidate's cost over every "
            "session against its compactions (summed over the sessions).",
            "compactions",
            [(float(c.compactions or 0), c) for c in measured],
            None,
        )
    ]
    for i, knob in enumerate(t.knobs):
        # Values compared as JSON: 1, 1.0 and true are different settings of a knob.
        where: dict[str, int] = {}
        for n, value in enumerate(knob.values):
            where.setdefault(json.dumps(value, sort_keys=True, default=str), n)
        points = []
        for c in measured:
            # The baseline's value may be none of those tried: it has no column.
            if c.baseline or knob.path not in c.values:
                continue
            column = where.get(json.dumps(c.values[knob.path], sort_keys=True, default=str))
            if column is not None:
                points.append((float(column), c))
        if not points:
            continue
        path = _e(knob.path)
        figures.append(
            _tune_chart(
                t,
                f"knob-{i}",
                f"<strong>Cost against {path}.</strong> Each candidate's cost against its "
                f"value of {path} (the other knobs vary within a column; the baseline is not "
                "drawn).",
                knob.path,
                points,
                [_knob_value(v) for v in knob.values],
            )
        )
    return figures


def _tune_table(t: TuneReport) -> str:
    columns = [
        ("#", False),
        *((k.path, False) for k in t.knobs),
        ("Cost", True),
        ("vs baseline", True),
        ("vs floor", True),
        ("Compactions", True),
        ("Max / session", True),
        ("Overflows", True),
        ("Stopped", True),
        ("Feasible", False),
    ]
    rows = []
    for c in sorted(t.candidates, key=_tune_order):
        classes = []
        tags = ""
        if t.winner is not None and c.index == t.winner.index:
            classes.append("winner")
            tags += ' <span class="tag winner">winner</span>'
        if c.baseline:
            classes.append("baseline")
            tags += ' <span class="tag baseline">baseline</span>'
        if not _measured(c):
            classes.append("skipped")
            verdict = (
                "skipped: " + "; ".join([_diagnostic(d) for d in c.diagnostics])
                if [_diagnostic(d) for d in c.diagnostics]
                else "skipped"
            )
        elif not c.feasible:
            classes.append("infeasible")
            verdict = "no: " + "; ".join(c.reasons) if c.reasons else "no"
        else:
            verdict = "yes"
        # Why replays stopped names the session: long, so it is the cell's tooltip.
        why = f' title="{_e("; ".join(c.errors))}"' if c.errors else ""
        cells = [
            (f'<span title="{_e(c.name)}">{c.index}</span>{tags}', False),
            *(
                (
                    f"<code>{_e(_knob_value(c.values[k.path]))}</code>"
                    if k.path in c.values
                    else "—",
                    False,
                )
                for k in t.knobs
            ),
            (_usd4(c.cost_usd), True),
            (_change(c.vs_baseline), True),
            (_ratio(c.floor_ratio), True),
            (_int(c.compactions), True),
            (_int(c.max_compactions), True),
            (_int(c.provider_overflows), True),
            (_int(c.stopped), True),
            (f"<span{why}>{_e(verdict)}</span>", False),
        ]
        attrs = f' data-candidate="{c.index}"' + (
            f' class="{" ".join(classes)}"' if classes else ""
        )
        rows.append(_row(cells, attrs))
    return "\n".join(
        [
            '<section class="candidates" id="candidates">',
            "<h2>Candidates</h2>",
            '<div class="table-wrap"><table class="candidates-table">',
            "<caption>Every candidate, those that meet the constraints first, by cost over "
            "every session; “vs baseline” divides each cost by the baseline's.</caption>",
            _head(columns, _path_breaks),
            "<tbody>",
            *rows,
            "</tbody></table></div>",
            "</section>",
        ]
    )


def _tune_facts(t: TuneReport) -> str:
    constraints = []
    if t.constraints.max_overflows is not None:
        constraints.append(f"provider overflows ≤ {t.constraints.max_overflows:,}")
    if t.constraints.max_compactions is not None:
        constraints.append(f"compactions per session ≤ {t.constraints.max_compactions:,}")
    if t.constraints.allow_stopped is not None:
        constraints.append(
            "stopped replays allowed" if t.constraints.allow_stopped else "no stopped replay"
        )
    skipped = sum(1 for c in t.candidates if not _measured(c))
    tried = len(t.candidates) - (1 if _tune_baseline(t) is not None else 0)
    method = f" ({t.search.method})" if t.search.method else ""
    return _facts_list(
        [
            ("Tune file", f"<code>{_e(t.tune_file)}</code>"),
            ("Base", f"<code>{_e(t.base)}</code>"),
            ("Model", f"<code>{_e(t.model)}</code>" + (" (calibrated)" if t.calibrate else "")),
            ("Sessions", "<br/>".join(f"<code>{_e(s)}</code>" for s in t.sessions) or "—"),
            ("Constraints", _e(", ".join(constraints)) or "—"),
            (
                "Candidates",
                _e(
                    f"{tried:,}{method}"
                    + (" and the baseline" if _tune_baseline(t) is not None else "")
                    + (f"; {skipped:,} skipped" if skipped else "")
                ),
            ),
            ("Floor", _e(_usd4(t.floor_cost_usd))),
        ]
    )


def _verdict(t: TuneReport) -> str:
    w = _tune_winner(t)
    if w is None:
        return '<p class="lede">No candidate meets the constraints.</p>'
    base = _tune_baseline(t)
    text = f"Winner: candidate {w.index} <code>{_e(w.name)}</code>, {_e(_usd4(w.cost_usd))}"
    if base is not None and base is not w:
        text += (
            f" against {_e(_usd4(base.cost_usd))} for the baseline ({_e(_change(w.vs_baseline))})"
        )
    elif base is w:
        text += ": the baseline itself, nothing cheaper meets the constraints"
    return f'<p class="lede">{text}.</p>'


def render_tune_html(doc: TuneReport | Mapping[str, Any]) -> str:
    """The ``kilo-rules tune`` report ``doc`` as one self-contained HTML page.

    ``doc`` is the tune's ``report.json``
    (:meth:`kilo_rules.tools.simulation.tune.TuneResult.document`, or its JSON;
    ``schemas/tune-report.v1.json``): the tune file's facts, the knobs
    and their values, and every candidate with its measures. The page shows the facts and the
    verdict, the table of candidates (those that meet the constraints first, by cost; the winner and
    the baseline marked) and inline-SVG scatter charts of cost against compactions and against each
    knob (infeasible points hollow, the winner and the baseline labelled), with the styles, axes and
    legends of :func:`render_html`'s charts.

    Like :func:`render_html`'s page it has no script and loads nothing, every string from
    ``doc`` is escaped, and the same document always gives the same text.

    JSON data is validated against the model, strictly; raises :class:`DocumentError` (a
    :class:`ValueError`) naming the path of the first invalid value (for example
    ``candidates[3].cost_usd: expected a number, got a string``).
    """
    t = _parse_tune(doc)
    title = f"kilo-rules tune: {t.base_name}" + (f" on {t.model}" if t.model else "")
    main = [_tune_table(t)]
    if t.failed:
        main.append(_failed_list([(f.session, f.error) for f in t.failed]))
    charts = _tune_charts(t)
    main.append('<section class="charts" id="charts">')
    main.append("<h2>Charts</h2>")
    if charts:
        main += charts
    else:
        main.append(
            '<p class="note" data-skipped="charts">No charts: no candidate was replayed.</p>'
        )
    main.append("</section>")
    return _page(
        title,
        [_tune_facts(t), _verdict(t)],
        main,
        "Written by <code>kilo-rules tune</code>. This page is self-contained: no scripts, "
        "no fonts or images from elsewhere; hover a point for its candidate.",
        generator="kilo-rules tune",
        css=_TUNE_CSS,
    )
