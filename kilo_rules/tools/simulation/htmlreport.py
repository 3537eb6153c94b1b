"""A ``kilo-rules simulate`` or ``kilo-rules tune`` result as one self-contained HTML page.

:func:`render_html` (the ``simulate --format json`` document) and :func:`render_tune_html`
(the tune's ``report.json``) validate their document against its model, strictly, raising
:class:`DocumentError` at the first bad value, and render it through the Jinja2 templates of
``templates/`` (autoescape on), with the inline-SVG charts of
:mod:`~kilo_rules.tools.simulation.charts`. The page has inline CSS and no script or
external resource (a Content-Security-Policy forbids both), and the same document always
gives the same bytes.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import jinja2
from markupsafe import Markup
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kilo_rules.tools.simulation.charts import (
    COST_EPSILON,
    MAX_POINTS,
    SVG_NS,
    cache_chart,
    context_chart,
    cost_chart,
    fmt_change,
    fmt_usd4,
    has_steps,
    knob_value,
    measured,
    plural,
    style,
    tune_charts,
    unique,
)
from kilo_rules.tools.simulation.charts import esc as _e
from kilo_rules.tools.simulation.charts import fmt_int as _int
from kilo_rules.tools.simulation.charts import fmt_num as _num
from kilo_rules.tools.simulation.charts import fmt_ratio as _ratio
from kilo_rules.tools.simulation.charts import fmt_usd as _usd
from kilo_rules.tools.simulation.documents import (
    CorpusDocument,
    DiagnosticDocument,
    PolicyAggregate,
    PolicyReport,
    SessionDocument,
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

MAX_CHARTED_SESSIONS = 20

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


def _counters(s: SessionDocument) -> list[str]:
    return unique(r.counter for r in s.reports if r.counter)


def _counted(s: SessionDocument) -> Markup:
    """What the token counts shown are, in words (markup built from escaped pieces)."""
    counters = ", ".join(f"<code>{_e(c)}</code>" for c in _counters(s)) or (
        "the simulator's counter"
    )
    c = s.calibration
    if c is None or not c.applied:
        return Markup(counters)
    return Markup(
        f"{counters}, calibrated to the provider's count ({c.factor:g} × counted + "
        f"{_num(c.offset)} hidden tokens)"
    )


def _given(model: BaseModel) -> list[tuple[str, Any]]:
    """The fields the document gave (in the model's order, which is the reading order), so
    that an older document's page shows what it holds and no more."""
    given = model.model_fields_set
    return [(k, getattr(model, k)) for k in type(model).model_fields if k in given]


# --- templates -----------------------------------------------------------------------------


def _as_html(value: object) -> object:
    """Every ``{{ value }}`` of the templates as ``html.escape`` writes it (``&quot;`` and
    ``&#x27;``): autoescape would escape plain text anyway, this keeps the pages' bytes as
    they were when they were built from strings. Markup passes unchanged."""
    if hasattr(value, "__html__"):
        return value
    return Markup(html.escape(str(value), quote=True))


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("kilo_rules.tools.simulation", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    finalize=_as_html,
)


def _block(name: str, **values: Any) -> Markup:
    """The macro ``name`` of ``sections.html.j2`` called with ``values``."""
    macro = getattr(_TEMPLATES.get_template("sections.html.j2").module, name)
    return Markup(macro(**values))


@dataclass(frozen=True, slots=True)
class _Row:
    """A table row: ``(content, numeric)`` cells (text, or Markup built from escaped
    pieces), ``data-*`` attributes and classes."""

    cells: Sequence[tuple[str, bool]]
    data: Sequence[tuple[str, str]] = ()
    classes: Sequence[str] = ()


# --- tables and sections -------------------------------------------------------------------


def _policy_cell(i: int, policy: str) -> Markup:
    color, _ = style(i)
    # Built from escaped pieces: a palette colour and the escaped policy name.
    return Markup(
        f'<span class="dot" aria-hidden="true"><svg xmlns="{SVG_NS}" viewBox="0 0 10 10">'
        f'<rect width="10" height="10" rx="2" fill="{color}"/></svg></span>{_e(policy)}'
    )


def _totals_row(
    i: int, r: PolicyReport, base: float | None, floor_cost: float | None, cheapest: float | None
) -> _Row:
    """One policy's row of the totals table, its "vs floor" cell last."""
    requests: str = _int(r.requests)
    if r.stopped:
        requests = Markup(f'{requests} of {r.requests_total:,}, <span class="stop">stopped</span>')
    window: str = f"{r.max_request:,}"
    if r.window:
        window = Markup(f'{window} <span class="unit">/ {r.window:,}</span>')
    vs_first = r.cost_usd / base if r.cost_usd is not None and base else None
    vs_floor = r.floor_ratio
    if vs_floor is None and r.cost_usd is not None and floor_cost:
        vs_floor = r.cost_usd / floor_cost
    policy = _policy_cell(i, r.policy)
    classes = []
    if r.stopped:
        classes.append("stopped")
    if cheapest is not None and r.cost_usd == cheapest and not r.stopped:
        classes.append("best")
        policy += Markup(' <span class="tag">cheapest</span>')
    cells = [
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
        (_ratio(vs_floor), True),
    ]
    return _Row(cells, [("policy", r.policy)], classes)


_TOTALS_COLUMNS = [
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
    ("vs floor", True),
]


def _totals_table(s: SessionDocument, sid: str) -> Markup:
    floor_cost = s.floor.cost_usd if s.floor is not None else None
    base = s.reports[0].cost_usd
    costs = [r.cost_usd for r in s.reports if r.cost_usd is not None and not r.stopped]
    cheapest = min(costs) if len(s.reports) > 1 and costs else None
    rows = [_totals_row(i, r, base, floor_cost, cheapest) for i, r in enumerate(s.reports)]
    # Without a floor the column would be dashes only.
    show_floor = bool(floor_cost) or any(r.floor_ratio is not None for r in s.reports)
    if not show_floor:
        rows = [_Row(r.cells[:-1], r.data, r.classes) for r in rows]
    errors = [
        {
            "policy": r.policy,
            "requests": plural(r.requests, "request"),
            "total": f"{r.requests_total:,}",
            "error": r.error,
        }
        for r in s.reports
        if r.error
    ]
    return _block(
        "totals",
        sid=sid,
        counted=_counted(s),
        first=s.reports[0].policy,
        show_floor=show_floor,
        columns=_TOTALS_COLUMNS if show_floor else _TOTALS_COLUMNS[:-1],
        items=rows,
        errors=errors,
    )


def _cache_fact(s: SessionDocument) -> Markup:
    cache = []
    for key, value in _given(s.cache):
        shown = _scalar(value)
        cache.append(shown if key == "kind" else f"{_e(key.replace('_', ' '))} {shown}")
    return Markup(" · ".join(cache))


def _calibration_fact(s: SessionDocument) -> Markup:
    c = s.calibration
    assert c is not None
    # The simulator's model: reported ≈ factor × simulated + offset (the hidden prefix).
    bits = [
        f"reported ≈ {c.factor if c.factor is not None else 1.0:g} × simulated + "
        f"{_num(c.offset or 0)} tokens"
    ]
    if c.declared or c.steps == 0:
        bits.append("declared by hand")
    elif c.steps is not None:
        bits.append(f"fitted on {plural(c.steps, 'step')}")
    if c.r2 is not None:
        bits.append(f"R² {c.r2:.4f}")
    if c.median_abs_error is not None:
        bits.append(f"median error {100 * c.median_abs_error:.2f}%")
    if c.applied is not None:
        bits.append("<strong>applied</strong>" if c.applied else "not applied")
    return Markup(" · ".join(bits) or "—")


def _outcome_facts(s: SessionDocument) -> list[tuple[str, Markup]]:
    """The recorded cost and the floor, as facts."""
    items = []
    if s.recorded is not None and s.recorded.cost_usd is not None:
        agent = len(set(s.recorded.compactions))
        compacted = f"compacted {plural(agent, 'time')}" if agent else "never compacted"
        items.append(
            (
                "As recorded",
                Markup(
                    f"<strong>{_usd(s.recorded.cost_usd)}</strong> at these prices, from the "
                    f"usage the log reports; the agent {compacted}"
                ),
            )
        )
    if s.floor is not None:
        f = s.floor
        items.append(
            (
                "Floor",
                Markup(
                    f"<strong>{_usd(f.cost_usd)}</strong>"
                    + (f" ({_e(f.policy)}'s requests under a perfect cache)" if f.policy else "")
                    + f" — {f.input:,} input tokens: "
                    f"{f.cache_write:,} written to the cache, {f.cache_read:,} read from it; "
                    f"{f.output:,} output"
                ),
            )
        )
    return items


def _facts(s: SessionDocument, *, with_session: bool) -> Markup:
    # The values are Markup built from escaped pieces; the labels are text.
    items: list[tuple[str, str]] = []
    if with_session:
        messages = (
            f" ({plural(s.session_messages, 'message')})" if s.session_messages is not None else ""
        )
        items.append(("Session", Markup(f"<code>{_e(s.session)}</code>{messages}")))
    if s.model:
        items.append(("Model", Markup(f"<code>{_e(s.model)}</code>")))
    if _counters(s):
        items.append(("Counter", _counted(s)))
    if _given(s.cache):
        items.append(("Cache", _cache_fact(s)))
    if s.prices is None:
        items.append(("Prices", "none in the catalog: no costs"))
    else:
        prices = " · ".join(
            f"{_e(key.replace('_', ' '))} {_e(_usd2(value))}" for key, value in _given(s.prices)
        )
        items.append(("Prices", Markup(f'{prices} <span class="unit">per million tokens</span>')))
    if s.calibration is not None:
        items.append(("Calibration", _calibration_fact(s)))
    items += [("Note", note) for note in s.notes]
    items += _outcome_facts(s)
    return _facts_list(items)


def _facts_list(items: Sequence[tuple[str, str]]) -> Markup:
    """Label and value pairs as a definition list (a value is text or Markup)."""
    return _block("facts", items=items)


def _usd2(x: float | None) -> str:
    return "—" if x is None else f"${x:,.2f}"


def _scalar(value: Any) -> str:
    """A cache setting as markup (escaped)."""
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


def _lede(s: SessionDocument) -> Markup:
    """One sentence with the answer most readers came for: which policy is cheapest, and
    by how much (markup built from escaped pieces)."""
    priced = [r for r in s.reports if r.cost_usd is not None and not r.stopped]
    if len(priced) < 2:
        return Markup("")
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
    return Markup(f'<p class="lede">{text}</p>')


def _session_section(s: SessionDocument, sid: str, *, heading: Markup | None) -> Markup:
    charted = any(has_steps(r) for r in s.reports)
    return _block(
        "session",
        sid=sid,
        heading=heading,
        facts_block=_facts(s, with_session=True) if heading is not None else "",
        lede=_lede(s),
        totals_block=_totals_table(s, sid),
        charts=[context_chart(s, sid), cost_chart(s, sid), cache_chart(s, sid)] if charted else [],
        no_charts=s.session,
    )


def _aggregate_table(policies: Sequence[PolicyAggregate]) -> Markup:
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
        _Row(
            [
                (p.policy, False),
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
            [("policy", p.policy)],
        )
        for p in policies
    ]
    return _block("aggregate", columns=columns, items=rows)


def _worst_table(worst: Sequence[WorstSession], anchors: Mapping[str, str]) -> Markup:
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
        session = Markup(f"<code>{_e(w.session)}</code>")
        if w.session in anchors:
            session = Markup(f'<a href="#{anchors[w.session]}">{session}</a>')
        rows.append(
            _Row(
                [
                    (str(n), True),
                    (session, False),
                    (w.policy, False),
                    (_usd(w.cost_usd), True),
                    (_ratio(w.floor_ratio), True),
                    (_int(w.compactions), True),
                    ("stopped" if w.stopped else "", False),
                ]
            )
        )
    return _block("worst", columns=columns, items=rows)


def _failed_list(failed: Sequence[tuple[str, str]]) -> Markup:
    return _block(
        "failed", heading=f"{plural(len(failed), 'session')} could not be replayed", items=failed
    )


def _rest_table(rest: Sequence[tuple[int, SessionDocument]]) -> Markup:
    policies = unique(r.policy for _, s in rest for r in s.reports)
    columns = [("#", True), ("Session", False), ("Model", False), ("Requests", True)]
    columns += [(p, True) for p in policies]
    rows = []
    for n, s in rest:
        by_policy = {r.policy: r for r in reversed(s.reports)}
        cells = [
            (str(n), True),
            (Markup(f"<code>{_e(s.session)}</code>"), False),
            (Markup(f"<code>{_e(s.model)}</code>"), False),
            (_int(max(r.requests_total for r in s.reports)), True),
        ]
        for p in policies:
            r = by_policy.get(p)
            if r is None:
                cells.append(("", True))
            else:
                cells.append((_usd(r.cost_usd) + (" (stopped)" if r.stopped else ""), True))
        rows.append(_Row(cells))
    return _block(
        "rest",
        heading=plural(len(rest), "more session"),
        charted=MAX_CHARTED_SESSIONS,
        columns=columns,
        items=rows,
    )


# Nothing may load or run: the page is a document, and it is read from untrusted places.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _page(
    title: str,
    header: Sequence[Markup],
    main: Sequence[Markup],
    footer: Markup,
    *,
    generator: str,
    extra_css: str | None = None,
) -> str:
    """A whole report page (``page.html.j2``): the head (the Content-Security-Policy, the
    shared styles and the template ``extra_css`` after them), ``title`` as the heading atop
    ``header``, then ``main`` and ``footer``."""
    return _TEMPLATES.get_template("page.html.j2").render(
        title=title,
        header=header,
        main=main,
        footer=footer,
        generator=generator,
        csp=_CSP,
        extra_css=extra_css,
    )


def _corpus_facts(sessions: Sequence[SessionDocument]) -> Markup:
    models = unique(s.model for s in sessions)
    counters = unique(c for s in sessions for c in _counters(s))
    facts: list[tuple[str, str]] = [
        ("Sessions", f"{len(sessions):,}"),
        ("Models", Markup(", ".join(f"<code>{_e(m)}</code>" for m in models))),
    ]
    if counters:
        facts.append(("Counter", Markup(", ".join(f"<code>{_e(c)}</code>" for c in counters))))
    facts.append(("Policies", ", ".join(unique(r.policy for s in sessions for r in s.reports))))
    return _facts_list(facts)


def _corpus_body(sessions: Sequence[SessionDocument], corpus: CorpusDocument) -> list[Markup]:
    body: list[Markup] = []
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
        heading = Markup(f"{n}. <code>{_e(s.session)}</code>")
        body.append(_session_section(s, f"s{n}", heading=heading))
    rest = list(enumerate(sessions, 1))[MAX_CHARTED_SESSIONS:]
    if rest:
        body.append(_rest_table(rest))
    return body


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
            title = f"kilo-rules simulate: {plural(len(sessions), 'session')}"
        else:
            one = sessions[0]
            title = f"kilo-rules simulate: {one.session}" + (
                f" on {one.model}" if one.model else ""
            )
    if corpus is not None:
        header = _corpus_facts(sessions)
        body = _corpus_body(sessions, corpus)
    else:
        header = _facts(sessions[0], with_session=True)
        body = [_session_section(sessions[0], "s1", heading=None)]
    return _page(
        title,
        [header],
        body,
        Markup(
            "Written by <code>kilo-rules simulate</code>. This page is self-contained: no "
            "scripts, no fonts or images from elsewhere; hover a marker or a line end for its "
            "numbers."
        ),
        generator="kilo-rules simulate",
    )


# --- the tune report -----------------------------------------------------------------------


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


def _parse_tune(doc: TuneReport | Mapping[str, Any]) -> TuneReport:
    t = doc if isinstance(doc, TuneReport) else _validated(TuneReport, doc, "tune report")
    seen: set[int] = set()
    for i, c in enumerate(t.candidates):
        if c.index in seen:
            raise DocumentError(
                f"candidates[{i}].index", f"candidate {c.index} is listed twice", what="tune report"
            )
        seen.add(c.index)
        if measured(c) and c.cost_usd is None:
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


def _path_breaks(path: str) -> Markup:
    """A dotted knob path as markup that may wrap after each dot: a long one would
    otherwise widen its column past the page."""
    return Markup(_e(path).replace(".", ".<wbr/>"))


def _tune_order(c: TuneCandidate) -> tuple[int, int, int, int]:
    """The tune's ranking: feasible candidates by cost, then infeasible ones by cost, then
    the skipped; equal costs go to fewer compactions, then to the earlier candidate."""
    group = 0 if c.feasible else (1 if measured(c) else 2)
    if c.cost_usd is None:
        return (group, 0, 0, c.index)
    return (group, round(c.cost_usd / COST_EPSILON), c.compactions or 0, c.index)


def _tune_verdict_cell(c: TuneCandidate) -> str:
    """Whether the candidate meets the constraints, and why not."""
    if not measured(c):
        why = [_diagnostic(d) for d in c.diagnostics]
        return "skipped: " + "; ".join(why) if why else "skipped"
    if not c.feasible:
        return "no: " + "; ".join(c.reasons) if c.reasons else "no"
    return "yes"


def _tune_row(t: TuneReport, c: TuneCandidate) -> _Row:
    classes = []
    tags = ""
    if t.winner is not None and c.index == t.winner.index:
        classes.append("winner")
        tags += ' <span class="tag winner">winner</span>'
    if c.baseline:
        classes.append("baseline")
        tags += ' <span class="tag baseline">baseline</span>'
    if not measured(c):
        classes.append("skipped")
    elif not c.feasible:
        classes.append("infeasible")
    # Why replays stopped names the session: long, so it is the cell's tooltip.
    why = f' title="{_e("; ".join(c.errors))}"' if c.errors else ""
    # The Markup cells are built from escaped pieces.
    cells: list[tuple[str, bool]] = [
        (Markup(f'<span title="{_e(c.name)}">{c.index}</span>{tags}'), False),
        *(
            (
                Markup(f"<code>{_e(knob_value(c.values[k.path]))}</code>")
                if k.path in c.values
                else "—",
                False,
            )
            for k in t.knobs
        ),
        (fmt_usd4(c.cost_usd), True),
        (fmt_change(c.vs_baseline), True),
        (_ratio(c.floor_ratio), True),
        (_int(c.compactions), True),
        (_int(c.max_compactions), True),
        (_int(c.provider_overflows), True),
        (_int(c.stopped), True),
        (Markup(f"<span{why}>{_e(_tune_verdict_cell(c))}</span>"), False),
    ]
    return _Row(cells, [("candidate", str(c.index))], classes)


def _tune_table(t: TuneReport) -> Markup:
    columns = [
        ("#", False),
        *((_path_breaks(k.path), False) for k in t.knobs),
        ("Cost", True),
        ("vs baseline", True),
        ("vs floor", True),
        ("Compactions", True),
        ("Max / session", True),
        ("Overflows", True),
        ("Stopped", True),
        ("Feasible", False),
    ]
    rows = [_tune_row(t, c) for c in sorted(t.candidates, key=_tune_order)]
    return _block("candidates", columns=columns, items=rows)


def _tune_facts(t: TuneReport) -> Markup:
    constraints = []
    if t.constraints.max_overflows is not None:
        constraints.append(f"provider overflows ≤ {t.constraints.max_overflows:,}")
    if t.constraints.max_compactions is not None:
        constraints.append(f"compactions per session ≤ {t.constraints.max_compactions:,}")
    if t.constraints.allow_stopped is not None:
        constraints.append(
            "stopped replays allowed" if t.constraints.allow_stopped else "no stopped replay"
        )
    skipped = sum(1 for c in t.candidates if not measured(c))
    tried = len(t.candidates) - (1 if _tune_baseline(t) is not None else 0)
    method = f" ({t.search.method})" if t.search.method else ""
    sessions = Markup("<br/>".join(f"<code>{_e(s)}</code>" for s in t.sessions) or "—")
    return _facts_list(
        [
            ("Tune file", Markup(f"<code>{_e(t.tune_file)}</code>")),
            ("Base", Markup(f"<code>{_e(t.base)}</code>")),
            (
                "Model",
                Markup(f"<code>{_e(t.model)}</code>" + (" (calibrated)" if t.calibrate else "")),
            ),
            ("Sessions", sessions),
            ("Constraints", ", ".join(constraints) or "—"),
            (
                "Candidates",
                f"{tried:,}{method}"
                + (" and the baseline" if _tune_baseline(t) is not None else "")
                + (f"; {skipped:,} skipped" if skipped else ""),
            ),
            ("Floor", fmt_usd4(t.floor_cost_usd)),
        ]
    )


def _verdict(t: TuneReport) -> Markup:
    """The winner against the baseline, in one sentence (built from escaped pieces)."""
    w = _tune_winner(t)
    if w is None:
        return Markup('<p class="lede">No candidate meets the constraints.</p>')
    base = _tune_baseline(t)
    text = f"Winner: candidate {w.index} <code>{_e(w.name)}</code>, {_e(fmt_usd4(w.cost_usd))}"
    if base is not None and base is not w:
        text += (
            f" against {_e(fmt_usd4(base.cost_usd))} for the baseline "
            f"({_e(fmt_change(w.vs_baseline))})"
        )
    elif base is w:
        text += ": the baseline itself, nothing cheaper meets the constraints"
    return Markup(f'<p class="lede">{text}.</p>')


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
    main.append(_block("charts_section", charts=tune_charts(t)))
    return _page(
        title,
        [_tune_facts(t), _verdict(t)],
        main,
        Markup(
            "Written by <code>kilo-rules tune</code>. This page is self-contained: no scripts, "
            "no fonts or images from elsewhere; hover a point for its candidate."
        ),
        generator="kilo-rules tune",
        extra_css="tune.css",
    )
