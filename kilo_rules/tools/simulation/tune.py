"""Tuning a policy's knobs on recorded sessions: the cheapest setting that stays safe.

A tune file (:mod:`kilo_rules.engine.formats.tune_format`, ``schemas/tune.v1.json``) names a base
policy, a model, recorded sessions and candidate values for some of the policy's settings.
:func:`load_tune_file` reads and checks it (every problem located in the file);
:func:`candidates` lists the combinations to try, the base itself first (the baseline);
:func:`run_tune` writes each combination as a small policy extending the base, compiles
it, and replays every session under all of them — one job per session, each replaying
every candidate, on the process pool or Dask cluster of
:func:`kilo_rules.tools.simulation.fleet.run_corpus`, exactly as ``kilo-rules simulate`` does. Each
candidate is then summed over the sessions (cost, compactions, provider overflows, replays that
stopped, the cost against the floor) and checked against the constraints; the cheapest feasible one
wins. :func:`write_outputs` writes the winner as a policy, the measures as JSON and an HTML page
with the table and the charts.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import stat
import tempfile
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location, PolicyError
from kilo_rules.engine.base.sandbox import allow_read, operator_roots
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog, model_from_data
from kilo_rules.engine.formats.load import Document, JsonPath, load_yaml_file, lookup, parse_yaml
from kilo_rules.engine.formats.tune_format import (
    KNOB_PATH_PATTERN,
    Constraints,
    KnobRange,
    KnobValue,
    Search,
    TuneFile,
)
from kilo_rules.engine.formats.validate import diagnose_all, dotted, load_schema, schema_diagnostics
from kilo_rules.engine.frontend.resolve import (
    bundled_policy_names,
    is_path_ref,
    resolve_policy,
    unknown_bundled,
)
from kilo_rules.tools.simulation.documents import (
    DiagnosticDocument,
    FailedSession,
    SessionDocument,
    TuneCandidate,
    TuneKnob,
    TuneReport,
    TuneSkipped,
    TuneWinner,
)
from kilo_rules.tools.simulation.fleet import (
    Executor,
    Outcome,
    Progress,
    expand_sessions,
    named_files,
    not_a_log,
    run_corpus,
)
from kilo_rules.tools.simulation.htmlreport import render_tune_html

__all__ = [
    "Candidate",
    "CandidateResult",
    "Knob",
    "Measures",
    "TuneResult",
    "TuneSpec",
    "candidate_policy",
    "candidates",
    "load_tune_file",
    "render_report_html",
    "run_tune",
    "with_winner_file",
    "write_outputs",
]

#: First keys a knob may not set: the tune writes them itself, or they are lists.
_RESERVED = ("version", "name", "description", "extends", "overrides")

_POLICY_SCHEMA = "policy.v1.json"

#: Sessions named in a winner's header at most (a corpus may hold thousands).
_HEADER_SESSIONS = 10

#: Costs that differ by less than this (USD) are a tie: sums of the same numbers in another
#: order differ in the last bits.
_COST_EPSILON = 1e-9


# --- the spec ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """One setting tuned: its dotted policy path and the values tried, in order."""

    path: str
    values: tuple[KnobValue, ...]
    at: Location
    """Where the knob's key is written in the tune file."""
    value_at: tuple[Location, ...]
    """Where each value is written (every value of a range: the range)."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The path's keys (``("compaction", "tail_turns")``)."""
        return tuple(self.path.split("."))


@dataclass(frozen=True)
class TuneSpec:
    """A loaded tune file: everything resolved, every knob checked against the base."""

    file: Path
    """The tune file, absolute."""
    base: str
    """The base: a bundled policy name, or the absolute path of a policy file."""
    base_name: str
    """The base's policy name (candidates are named ``<base_name>-tuned-<n>``)."""
    model: ModelInfo
    sessions: tuple[Path, ...]
    calibrate: bool
    constraints: Constraints
    knobs: tuple[Knob, ...]
    search: Search
    read_roots: tuple[Path, ...]
    """Directories the candidates may read besides the defaults (the base's, the operator's)."""
    baseline_values: Mapping[str, Any] = field(default_factory=dict)
    """Each knob's value under the base for this model (expressions evaluated when they
    depend only on the model)."""
    rejected: Mapping[tuple[int, int], tuple[Diagnostic, ...]] = field(default_factory=dict)
    """(knob, value) positions the policy schema refuses, with why, located at the value."""
    knobs_at: Location | None = None
    """Where the ``knobs`` key is written."""
    named_sessions: frozenset[Path] = frozenset()
    """The session files the tune file names one by one (resolved): one of them that is not
    a log fails, where a file a folder or a glob matched is skipped."""

    @property
    def combinations(self) -> int:
        """How many combinations the knobs' values make."""
        return math.prod(len(k.values) for k in self.knobs)

    @property
    def base_is_path(self) -> bool:
        """Whether the base is a policy file rather than a bundled name."""
        return Path(self.base).is_absolute()


@dataclass(frozen=True)
class Candidate:
    """One setting of the knobs: candidate 0 is the base itself (the baseline)."""

    index: int
    name: str
    values: Mapping[str, Any]
    """Knob path → value. The baseline's are the base's own values, for comparison."""
    choice: tuple[int, ...] = ()
    """The position of each knob's value in its list (empty for the baseline)."""

    @property
    def baseline(self) -> bool:
        """Whether this is the base itself."""
        return self.index == 0


@dataclass(frozen=True)
class Measures:
    """What one candidate did over every session replayed. Costs are USD."""

    cost: float
    compactions: int
    """Compactions summed over the sessions."""
    max_compactions: int
    """Compactions in the session that compacted most."""
    overflows: int
    """Provider overflows summed over the sessions."""
    stopped: int
    """Replays that stopped early (their compaction exhausted)."""
    floor_ratio: float | None
    """The cost against the sum of the sessions' floors (the cheapest candidate's requests
    under a perfect prompt cache); None when a session has no floor or a replay stopped."""
    session_costs: tuple[float, ...]
    errors: tuple[str, ...] = ()
    """Why replays stopped, one per stopped replay."""


@dataclass(frozen=True)
class CandidateResult:
    """A candidate with its measures, or the diagnostics for which it was not replayed."""

    candidate: Candidate
    measures: Measures | None
    diagnostics: tuple[Diagnostic, ...] = ()
    reasons: tuple[str, ...] = ()
    """Which constraints it breaks (empty when feasible)."""

    @property
    def skipped(self) -> bool:
        """Whether the candidate did not compile and was not replayed."""
        return self.measures is None

    @property
    def feasible(self) -> bool:
        """Whether it was replayed and meets every constraint."""
        return self.measures is not None and not self.reasons


@dataclass(frozen=True)
class TuneResult:
    """Every candidate measured on the sessions, and the winner."""

    spec: TuneSpec
    results: tuple[CandidateResult, ...]
    """In candidate order, the baseline first."""
    sessions: tuple[str, ...]
    """The sessions replayed (those that failed are in :attr:`failed`)."""
    failed: tuple[tuple[str, str], ...]
    """(session, error) of each session that could not be replayed."""
    floor_cost: float | None
    winner: int | None
    """The index of the cheapest feasible candidate, None when none is feasible."""
    skipped: tuple[tuple[str, str], ...] = ()
    """(file, reason) of each file a folder or glob matched that is not a recorded log
    (:func:`kilo_rules.tools.simulation.fleet.not_a_log`): left out, neither replayed nor failed."""
    failed_diagnostics: tuple[tuple[Diagnostic, ...], ...] = ()
    """The located diagnostics of each session in :attr:`failed`, in the same order."""
    uncalibrated: tuple[str, ...] = ()
    """With ``calibrate``, the sessions replayed uncalibrated because their logs record no
    usage to fit (they still count, at the simulator's own token counts)."""

    def calibration(self) -> str:
        """How the sessions' counts were calibrated, in words: ``"calibrated"``,
        ``"uncalibrated (no log records usage)"``, ``"calibrated (N without usage
        uncalibrated)"``, or ``"uncalibrated"`` when calibration was not asked for."""
        if not self.spec.calibrate:
            return "uncalibrated"
        n = len(self.uncalibrated)
        if n == 0:
            return "calibrated"
        if n == len(self.sessions):
            return "uncalibrated (no log records usage)"
        return f"calibrated ({n:,} without usage uncalibrated)"

    @property
    def baseline(self) -> CandidateResult:
        """The base's result (candidate 0)."""
        return self.results[0]

    def ranked(self) -> list[CandidateResult]:
        """Feasible candidates by cost, then infeasible ones by cost, then the skipped."""

        def key(r: CandidateResult) -> tuple[int, int, int, int]:
            group = 0 if r.feasible else (1 if r.measures is not None else 2)
            return (group, *_rank(r))

        return sorted(self.results, key=key)

    def vs_baseline(self, result: CandidateResult) -> float | None:
        """``result``'s cost divided by the baseline's; None when either is unknown or
        either stopped a replay early (its cost then covers fewer requests)."""
        m, base = result.measures, self.baseline.measures
        if m is None or base is None or not base.cost or m.stopped or base.stopped:
            return None
        return m.cost / base.cost

    def _failed_diagnostics(self) -> tuple[tuple[Diagnostic, ...], ...]:
        if len(self.failed_diagnostics) == len(self.failed):
            return self.failed_diagnostics
        return tuple(() for _ in self.failed)

    def to_json(self) -> dict[str, Any]:
        """The report (:meth:`document`) as JSON data."""
        return self.document().to_json()

    def document(self) -> TuneReport:
        """The report: every candidate, its knob values and measures, and the winner
        (``schemas/tune-report.v1.json``)."""
        spec = self.spec
        winner = None
        if self.winner is not None:
            w = self.results[self.winner]
            base = self.baseline.measures
            assert w.measures is not None  # a winner was measured
            winner = TuneWinner(
                index=w.candidate.index,
                name=w.candidate.name,
                values=dict(w.candidate.values),
                cost_usd=w.measures.cost,
                baseline_cost_usd=base.cost if base else None,
                vs_baseline=self.vs_baseline(w),
            )
        return TuneReport(
            version=1,
            tune_file=str(spec.file),
            base=spec.base,
            base_name=spec.base_name,
            model=spec.model.id,
            calibrate=spec.calibrate,
            constraints=spec.constraints,
            search=spec.search,
            knobs=[TuneKnob(path=k.path, values=list(k.values)) for k in spec.knobs],
            sessions=list(self.sessions),
            failed=[
                FailedSession(
                    session=s, error=e, diagnostics=[DiagnosticDocument.of(d) for d in diags]
                )
                for (s, e), diags in zip(self.failed, self._failed_diagnostics(), strict=True)
            ],
            skipped=[TuneSkipped(session=s, reason=r) for s, r in self.skipped],
            uncalibrated=list(self.uncalibrated),
            floor_cost_usd=self.floor_cost,
            candidates=[_candidate_document(self, r) for r in self.results],
            winner=winner,
        )


def _rank(r: CandidateResult) -> tuple[int, int, int]:
    """Cheaper first; on a tie fewer compactions, then the earlier candidate."""
    m = r.measures
    if m is None:
        return (0, 0, r.candidate.index)
    return (round(m.cost / _COST_EPSILON), m.compactions, r.candidate.index)


def _candidate_document(result: TuneResult, r: CandidateResult) -> TuneCandidate:
    c, m = r.candidate, r.measures
    return TuneCandidate(
        index=c.index,
        name=c.name,
        baseline=c.baseline,
        values=dict(c.values),
        status="skipped" if m is None else "measured",
        feasible=r.feasible,
        winner=result.winner == c.index,
        reasons=list(r.reasons),
        cost_usd=None if m is None else m.cost,
        vs_baseline=result.vs_baseline(r),
        floor_ratio=None if m is None else m.floor_ratio,
        compactions=None if m is None else m.compactions,
        max_compactions=None if m is None else m.max_compactions,
        provider_overflows=None if m is None else m.overflows,
        stopped=None if m is None else m.stopped,
        session_costs=None if m is None else list(m.session_costs),
        errors=[] if m is None else list(m.errors),
        diagnostics=[DiagnosticDocument.of(d) for d in r.diagnostics],
    )


# --- loading -------------------------------------------------------------------------------


def _relative_to(file: Path, ref: str) -> Path:
    p = Path(ref).expanduser()
    return Path(os.path.normpath(p if p.is_absolute() else file.parent / p))


@cache
def _knob_validator(branch: int) -> Draft202012Validator:
    """The tune schema's branch for a knob's values: 0 a list, 1 a range."""
    schema = load_schema("tune.v1.json")
    (values,) = schema["properties"]["knobs"]["patternProperties"].values()
    return Draft202012Validator({"$defs": schema["$defs"], **values["anyOf"][branch]})


def _knob_problems(doc: Document, key: str, value: Any) -> list[Diagnostic]:
    """What is wrong with one knob's values, said for the form it was written in: a list
    is not checked as a range, nor a range as a list."""
    where: JsonPath = ("knobs", key)
    if isinstance(value, list) and not value:
        return [
            Diagnostic(
                "tune.knob-no-values",
                f"knob {key!r} has no values",
                doc.locate(where),
                hint="list at least one value, or give a range {min, max, step}",
            )
        ]
    if not isinstance(value, list | dict):
        return [
            Diagnostic(
                "schema.type",
                f"knobs.{key}: expected a list of values or a range {{min, max, step}}",
                doc.locate(where),
            )
        ]
    check = _knob_validator(0 if isinstance(value, list) else 1)
    return [d for e in check.iter_errors(value) for d in diagnose_all(e, doc, where)]


def _schema_problems(doc: Document) -> list[Diagnostic]:
    """The tune schema's diagnostics; a knob's values checked in the form they are written
    in, and a knob key that is not a dotted path said so."""
    out = []
    knobs = doc.data.get("knobs")
    knobs = knobs if isinstance(knobs, dict) else {}
    for d in schema_diagnostics(doc, "tune.v1.json"):
        path = list(d.details.get("path", ()))
        if len(path) >= 2 and path[0] == "knobs" and path[1] in knobs:
            continue  # said again below, for the form the values are written in
        if d.code == "schema.unknown-key" and path == ["knobs"]:
            key = d.details.get("key")
            d = replace(
                d,
                code="tune.knob-path",
                message=f"knobs: {key!r} is not a dotted policy path",
                hint="keys of the policy joined by dots, e.g. compaction.tail_turns",
            )
        out.append(d)
    for key, value in knobs.items():
        if isinstance(key, str) and re.match(KNOB_PATH_PATTERN, key):
            out.extend(_knob_problems(doc, key, value))
    return sorted(out, key=Diagnostic.sort_key)


def _read_document(p: Path) -> Document:
    try:
        mode = p.stat().st_mode
    except OSError:
        mode = None  # reading it reports why (io.read)
    if mode is not None and not stat.S_ISREG(mode):
        raise PolicyError(
            Diagnostic(
                "tune.not-a-regular-file",
                f"{str(p)!r} is not a regular file; only regular files are read",
                Location(str(p), 1, 1),
            )
        )
    doc = load_yaml_file(p)
    if not isinstance(doc.data, dict):
        raise PolicyError(
            Diagnostic(
                "schema.type",
                "a tune file must be a mapping (version, base, model, sessions, knobs)",
                doc.locate(()),
            )
        )
    return doc


def _range_values(lo: float, hi: float, step: float) -> list[KnobValue]:
    if all(isinstance(v, int) for v in (lo, hi, step)):
        return list(range(int(lo), int(hi) + 1, int(step)))
    count = math.floor((hi - lo) / step + 1e-9) + 1
    # Rounded so that 0.1 + 2 × 0.1 is written 0.3 in the candidate policies.
    return [round(lo + i * step, 10) for i in range(count)]


def _knobs(doc: Document, spec: TuneFile) -> tuple[list[Knob], list[Diagnostic]]:
    """The knobs with their values, and what is wrong with their paths or values."""
    knobs: list[Knob] = []
    diags: list[Diagnostic] = []
    for path, raw in spec.knobs.items():
        where: JsonPath = ("knobs", path)
        at = doc.locate_key(where)
        keys = path.split(".")
        if keys[0] in _RESERVED:
            diags.append(
                Diagnostic(
                    "tune.knob-reserved",
                    f"knob {path!r}: {keys[0]} is not a setting a candidate may change",
                    at,
                    hint="tune the policy's settings (compaction.*, cache.*, overflow.*, ...)",
                )
            )
            continue
        if isinstance(raw, KnobRange):
            lo, hi, step = (doc.data["knobs"][path][k] for k in ("min", "max", "step"))
            if lo > hi:
                diags.append(
                    Diagnostic(
                        "tune.empty-range",
                        f"knob {path!r}: min {lo} is above max {hi}",
                        doc.locate(where),
                    )
                )
                continue
            if math.floor((hi - lo) / step + 1e-9) + 1 > spec.search.max_candidates:
                diags.append(_too_many(doc, spec, f"the range of {path!r} alone"))
                continue
            values = _range_values(lo, hi, step)
            value_at = tuple(doc.locate(where) for _ in values)
        else:
            # As the YAML wrote them: the candidates write them back the same way.
            values = list(doc.data["knobs"][path])
            value_at = tuple(doc.locate((*where, i)) for i in range(len(values)))
            seen: dict[str, int] = {}
            for i, v in enumerate(values):
                text = json.dumps(v)
                if text in seen:
                    diags.append(
                        Diagnostic(
                            "tune.duplicate-value",
                            f"knob {path!r}: the value {text} is listed twice",
                            value_at[i],
                            hint=f"it is already value {seen[text] + 1} of the list",
                        )
                    )
                seen.setdefault(text, i)
        knobs.append(Knob(path, tuple(values), at, value_at))
    ordered = sorted(knobs, key=lambda k: k.keys)
    for a, b in itertools.pairwise(ordered):
        if b.keys[: len(a.keys)] == a.keys:
            later = max(a, b, key=lambda k: (k.at.line, k.at.col))
            diags.append(
                Diagnostic(
                    "tune.knob-overlap",
                    f"knob {b.path!r} lies inside knob {a.path!r}: one value would replace "
                    "the other",
                    later.at,
                )
            )
    return knobs, diags


def _too_many(doc: Document, spec: TuneFile, what: str) -> Diagnostic:
    limit = spec.search.max_candidates
    return Diagnostic(
        "tune.too-many-candidates",
        f"{what} makes more than {limit:,} candidates (search.max_candidates)",
        doc.locate_key(("knobs",)),
        details={"max_candidates": limit},
        hint="fewer values, a coarser range step, search.method: random, or a larger "
        "search.max_candidates (each candidate replays every session)",
    )


def _count_problem(doc: Document, spec: TuneFile, knobs: Sequence[Knob]) -> Diagnostic | None:
    limit = spec.search.max_candidates
    total = math.prod(len(k.values) for k in knobs)
    if spec.search.method == "grid" and total > limit:
        return replace(
            _too_many(doc, spec, f"the grid of {len(knobs)} knob(s)"),
            message=f"the grid of {len(knobs)} knob(s) makes {total:,} candidates, more than "
            f"{limit:,} (search.max_candidates)",
            details={"candidates": total, "max_candidates": limit},
        )
    if spec.search.method == "random" and min(spec.search.samples, total) > limit:
        return Diagnostic(
            "tune.too-many-candidates",
            f"search.samples {spec.search.samples:,} is more than {limit:,} "
            "(search.max_candidates)",
            doc.locate(("search", "samples")),
            details={"samples": spec.search.samples, "max_candidates": limit},
        )
    return None


def _base(doc: Document, ref: str, file: Path) -> tuple[str, Diagnostic | None]:
    """The base as compile takes it (a bundled name, or an absolute path), or why not."""
    at = doc.locate(("base",))
    if not is_path_ref(ref):
        if ref in bundled_policy_names():
            return ref, None
        return ref, unknown_bundled(ref, "tune.unknown-base", at)
    path = _relative_to(file, ref)
    if not path.is_file():
        problem = "is not a regular file" if path.exists() else "does not exist"
        return ref, Diagnostic(
            "tune.missing-base",
            f"the base policy {ref!r} {problem} (looked at {path})",
            at,
            hint="a path is relative to the tune file",
        )
    return str(path), None


def _model(doc: Document, ref: str, file: Path) -> ModelInfo:
    at = doc.locate(("model",))
    try:
        # Catalog ids hold a "/" too: a model file is told apart by its suffix.
        if ref.endswith((".yaml", ".yml", ".json")):
            path = _relative_to(file, ref)
            if not path.is_file():
                raise PolicyError(
                    Diagnostic(
                        "tune.missing-model",
                        f"the model file {ref!r} does not exist (looked at {path})",
                        at,
                        hint="a path is relative to the tune file; a catalog id has no suffix",
                    )
                )
            model = model_from_data(load_yaml_file(path).data, file=str(path))
        else:
            model = bundled_catalog().get(ref)
    except KiloRulesError as exc:
        # A catalog error is located nowhere useful (``<model>``): the tune file names it.
        diags = [
            replace(d, location=at) if d.location.file.startswith("<") else d
            for d in exc.diagnostics
        ]
        raise PolicyError(diags) from None
    if model.prices is None:
        raise PolicyError(
            Diagnostic(
                "tune.no-prices",
                f"tune needs prices: the model {model.id!r} has none, so no candidate has a cost",
                at,
                hint="describe the model in a file with its prices (input, output, cache_read, "
                "cache_write per million tokens)",
            )
        )
    return model


def _sessions(
    doc: Document, specs: Sequence[str], file: Path
) -> tuple[tuple[Path, ...], frozenset[Path]]:
    """The session files, every spec relative to the tune file, and those named one by one
    (:func:`~kilo_rules.tools.simulation.fleet.named_files`); a spec that names nothing is located
    at its place in the file."""
    joined = [str(_relative_to(file, s)) for s in specs]
    try:
        return tuple(expand_sessions(joined)), named_files(joined)
    except KiloRulesError as exc:
        diags = []
        for d in exc.diagnostics:
            spec = d.details.get("spec")
            index = joined.index(spec) if spec in joined else None
            at = doc.locate(("sessions", index)) if index is not None else doc.locate(("sessions",))
            # A spec in a tune file is the file's problem, not the command line's.
            code = d.code.replace("simulate.", "tune.", 1)
            diags.append(replace(d, code=code, location=at))
        raise PolicyError(diags) from None


def _nested(pairs: Sequence[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for keys, value in pairs:
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return out


def _into_list(knob: Knob, data: Mapping[str, Any]) -> Diagnostic | None:
    """Why ``knob``'s path goes through a list of the base (or names an item by number),
    which a dotted path cannot set; None when it does not."""
    node: Any = data
    for n, key in enumerate(knob.keys):
        if isinstance(node, list) or key.isdigit():
            return _list_problem(knob, ".".join(knob.keys[:n]) or key)
        if not isinstance(node, dict):
            return None  # a setting under a scalar: the policy schema says what is wrong
        node = node.get(key)
    return None


def _list_problem(knob: Knob, through: str) -> Diagnostic:
    return Diagnostic(
        "tune.knob-into-list",
        f"knob {knob.path!r} goes into the list {through}: a path into a list is not supported",
        knob.at,
        details={"knob": knob.path, "list": through},
        hint="tune a setting outside lists, or make one base policy per list variant",
    )


def _policy_text(
    name: str,
    extends: str,
    settings: Sequence[tuple[tuple[str, ...], Any]],
    *,
    header: Sequence[str] = (),
    description: str | None = None,
) -> str:
    body: dict[str, Any] = {"version": 1, "name": name}
    if description:
        body["description"] = description
    body["extends"] = extends
    body.update(_nested(settings))
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=100)
    comments = "".join(f"# {_comment(line)}\n".replace("# \n", "#\n") for line in header)
    return comments + text


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _comment(text: str) -> str:
    """``text`` fit for a YAML comment: a line break in a file name must not end it."""
    return _CONTROL.sub("?", text)


def _schema_rejections(
    spec_base: str, knobs: Sequence[Knob]
) -> tuple[dict[tuple[int, int], tuple[Diagnostic, ...]], list[Diagnostic]]:
    """Each (knob, value) the policy schema refuses, with its diagnostics located at the
    value; and an error at each knob it refuses for every value (its path is wrong)."""
    rejected: dict[tuple[int, int], tuple[Diagnostic, ...]] = {}
    errors: list[Diagnostic] = []
    for i, knob in enumerate(knobs):
        first: Diagnostic | None = None
        for j, value in enumerate(knob.values):
            text = _policy_text("tune-probe", spec_base, [(knob.keys, value)])
            found = schema_diagnostics(parse_yaml(text, "<candidate>"), _POLICY_SCHEMA)
            if found:
                first = first or found[0]
                rejected[i, j] = tuple(
                    replace(
                        d,
                        message=f"knob {knob.path!r} = {json.dumps(value)}: {d.message}",
                        location=knob.value_at[j],
                    )
                    for d in found
                )
        if first is not None and all((i, j) in rejected for j in range(len(knob.values))):
            errors.append(
                Diagnostic(
                    "tune.knob-rejected",
                    f"knob {knob.path!r}: the policy schema refuses every value: {first.message}",
                    knob.at,
                    details={"knob": knob.path, **dict(first.details)},
                    hint=first.hint,
                )
            )
    return rejected, errors


def _setting(settings: Any, keys: Sequence[str]) -> tuple[bool, Any]:
    node = settings
    for k in keys:
        if isinstance(node, Mapping):
            if k not in node:
                return False, None
            node = node[k]
        elif hasattr(node, k):
            node = getattr(node, k)
        else:
            return False, None
    return True, node


def _baseline_values(base: str, model: ModelInfo, knobs: Sequence[Knob]) -> dict[str, Any]:
    """Each knob's value under the base for ``model``: the compiled setting when it is a
    plain value, else what the base writes (an expression that depends on the session)."""
    from kilo_rules.engine.compiler.compile import compile_policy

    plan = compile_policy(base, model)
    raw = resolve_policy(base).data
    out: dict[str, Any] = {}
    for k in knobs:
        found, value = _setting(plan.settings, k.keys)
        if not (found and (value is None or isinstance(value, int | float | str | bool))):
            value = lookup(raw, tuple(k.keys))
            value = value if value is None or isinstance(value, int | float | str | bool) else None
        out[k.path] = value
    return out


def load_tune_file(path: str | Path) -> TuneSpec:
    """Read a tune file and check it against the base, the model and the sessions.

    Raises :class:`~kilo_rules.engine.base.errors.PolicyError` with every located problem: YAML
    (``yaml.*``, ``io.read``), the schema (``schema.*``; a knob key that is not a dotted
    path is ``tune.knob-path``), and the tune's own (``tune.*``): a knob under a reserved
    key, two knobs one inside the other, a value listed twice, an empty range, a knob path
    into a list or one the policy schema refuses for every value, more candidates than
    ``search.max_candidates``, an unknown or missing base, a model unknown, missing or
    without prices, a session spec that names nothing. The base must compile for the
    model (its own diagnostics are raised as they are)."""
    file = Path(path).absolute()
    doc = _read_document(file)
    problems = _schema_problems(doc)
    if problems:
        raise PolicyError(problems)
    try:
        spec = TuneFile.model_validate(doc.data)
    except ValidationError as exc:  # a defence: the schema and the model agree
        raise PolicyError(
            [
                Diagnostic("tune.invalid", f"{dotted(loc)}: {e['msg']}", doc.locate(loc))
                for e in exc.errors()[:20]
                for loc in [tuple(p for p in e["loc"] if isinstance(p, str | int))]
            ]
        ) from None
    knobs, diags = _knobs(doc, spec)
    base, problem = _base(doc, spec.base, file)
    if problem is not None:
        diags.append(problem)
    if diags:
        raise PolicyError(diags)
    model = _model(doc, spec.model, file)
    roots = list(operator_roots())
    if Path(base).is_absolute():
        roots.append(Path(base).parent)
    read_roots = tuple(dict.fromkeys(r.resolve() for r in roots))
    with allow_read(read_roots):
        resolved = resolve_policy(base)
        into = [d for k in knobs if (d := _into_list(k, resolved.data)) is not None]
        if into:
            raise PolicyError(into)
        rejected, errors = _schema_rejections(base, knobs)
        count = _count_problem(doc, spec, knobs)
        if errors or count is not None:
            raise PolicyError([*errors, *([count] if count else [])])
        sessions, named = _sessions(doc, spec.sessions, file)
        baseline = _baseline_values(base, model, knobs)
    return TuneSpec(
        file=file,
        base=base,
        base_name=resolved.name,
        model=model,
        sessions=sessions,
        calibrate=spec.calibrate,
        constraints=spec.constraints,
        knobs=tuple(knobs),
        search=spec.search,
        read_roots=read_roots,
        baseline_values=baseline,
        rejected=rejected,
        knobs_at=doc.locate_key(("knobs",)),
        named_sessions=named,
    )


# --- candidates ----------------------------------------------------------------------------


def _choices(spec: TuneSpec) -> Iterator[tuple[int, ...]]:
    sizes = [len(k.values) for k in spec.knobs]
    if spec.search.method == "grid":
        yield from itertools.product(*(range(n) for n in sizes))
        return
    total = math.prod(sizes)
    wanted = min(spec.search.samples, total)
    rng = random.Random(spec.search.seed)
    if total <= 2 * wanted:
        picks = set(rng.sample(range(total), wanted))
    else:
        # The product may be beyond what range() can sample from; drawing with rejection
        # costs little while the draw is sparse.
        picks = set()
        while len(picks) < wanted:
            picks.add(rng.randrange(total))
    for number in sorted(picks):
        choice = []
        for n in reversed(sizes):
            number, digit = divmod(number, n)
            choice.append(digit)
        yield tuple(reversed(choice))


def candidates(spec: TuneSpec) -> list[Candidate]:
    """The candidates to replay: the base itself first (``baseline``, candidate 0), then
    every combination of the knobs' values (grid: the first knob varies slowest) or the
    ``search.samples`` combinations a random draw seeded with ``search.seed`` picks, in the
    grid's order. Candidate ``n`` is named ``<base_name>-tuned-<n>``."""
    out = [Candidate(0, spec.base_name, dict(spec.baseline_values))]
    for n, choice in enumerate(_choices(spec), 1):
        values = {k.path: k.values[c] for k, c in zip(spec.knobs, choice, strict=True)}
        out.append(Candidate(n, f"{spec.base_name}-tuned-{n}", values, choice))
    return out


def candidate_policy(
    spec: TuneSpec,
    candidate: Candidate,
    *,
    name: str | None = None,
    extends: str | None = None,
    header: Sequence[str] = (),
    description: str | None = None,
) -> str:
    """The YAML of a policy that extends the base and sets ``candidate``'s knob values (the
    baseline sets none). ``extends`` replaces the base reference (a path relative to where
    the file is written); ``header`` lines are written as comments on top."""
    settings = (
        [] if candidate.baseline else [(k.keys, candidate.values[k.path]) for k in spec.knobs]
    )
    return _policy_text(
        name or candidate.name,
        extends or spec.base,
        settings,
        header=header,
        description=description,
    )


# --- running -------------------------------------------------------------------------------


def _value_lines(text: str, spec: TuneSpec) -> dict[int, int]:
    """Line of each knob's value in a candidate's policy text → the knob's position."""
    doc = parse_yaml(text, "<candidate>")
    return {doc.locate(k.keys).line: i for i, k in enumerate(spec.knobs)}


def _relocated(
    spec: TuneSpec, candidate: Candidate, file: Path, text: str, diags: Sequence[Diagnostic]
) -> tuple[Diagnostic, ...]:
    """A compile failure's diagnostics, moved from the temporary candidate file to the
    knob value it comes from in the tune file (else to the ``knobs`` key)."""
    lines = _value_lines(text, spec)
    out = []
    for d in diags:
        where = d.location
        if where.file == str(file):
            i = lines.get(where.line)
            if i is not None:
                where = spec.knobs[i].value_at[candidate.choice[i]]
            else:
                where = spec.knobs_at or Location(str(spec.file), 1, 1)
        out.append(
            replace(
                d,
                message=f"candidate {candidate.index} ({candidate.name}): {d.message}",
                location=where,
                details={**dict(d.details), "candidate": candidate.index},
            )
        )
    return tuple(out)


def _prepare(
    spec: TuneSpec, cands: Sequence[Candidate], directory: Path
) -> tuple[list[tuple[Candidate, str]], dict[int, tuple[Diagnostic, ...]]]:
    """Each candidate written and compiled: (candidate, policy ref) of those that compile,
    and the diagnostics of those that do not, by candidate index."""
    from kilo_rules.engine.compiler.compile import compile_policy

    ready: list[tuple[Candidate, str]] = [(cands[0], spec.base)]
    skipped: dict[int, tuple[Diagnostic, ...]] = {}
    with allow_read(spec.read_roots):
        for c in cands[1:]:
            bad = [d for i, j in enumerate(c.choice) for d in spec.rejected.get((i, j), ())]
            if bad:
                skipped[c.index] = tuple(bad)
                continue
            text = candidate_policy(
                spec,
                c,
                header=[f"Candidate {c.index} of {spec.file}, written by kilo-rules tune."],
            )
            file = directory / f"{c.name}.yaml"
            safefs.write_atomic(file, text)
            try:
                compile_policy(file, spec.model)
            except KiloRulesError as exc:
                skipped[c.index] = _relocated(spec, c, file, text, exc.diagnostics)
                continue
            ready.append((c, str(file)))
    return ready, skipped


def _measure(
    docs: Sequence[SessionDocument], position: int, name: str
) -> tuple[Measures, float | None]:
    """One candidate's measures over the session documents (its report is the
    ``position``-th of each), and the sum of the sessions' floors."""
    costs: list[float] = []
    floors: list[float] = []
    floor_known = True
    compactions = overflows = stopped = peak = 0
    errors: list[str] = []
    for doc in docs:
        report = doc.reports[position]
        if report.policy != name:  # the order of the plans is the order of the reports
            raise RuntimeError(f"report {position} is {report.policy!r}, not {name!r}")
        cost = report.cost_usd
        if cost is None:
            raise KiloRulesError(
                Diagnostic(
                    "tune.no-prices",
                    f"tune needs prices: {doc.session} has no cost for {doc.model}",
                    Location(doc.session, 1, 1),
                )
            )
        costs.append(cost)
        compactions += report.compactions
        peak = max(peak, report.compactions)
        overflows += report.provider_overflows
        if report.stopped:
            stopped += 1
            errors.append(f"{doc.session}: {report.error or 'stopped early'}")
        if doc.floor is None:
            floor_known = False
        else:
            floors.append(doc.floor.cost_usd)
    total = math.fsum(costs)
    floor_sum = math.fsum(floors) if floor_known and floors else None
    measures = Measures(
        cost=total,
        compactions=compactions,
        max_compactions=peak,
        overflows=overflows,
        stopped=stopped,
        # A replay that stopped early is not a cheaper one: no ratio, as simulate shows it.
        floor_ratio=total / floor_sum if floor_sum and not stopped else None,
        session_costs=tuple(costs),
        errors=tuple(errors),
    )
    return measures, floor_sum


def _reasons(constraints: Constraints, m: Measures) -> tuple[str, ...]:
    out = []
    if m.overflows > constraints.max_overflows:
        out.append(
            f"{_plural(m.overflows, 'provider overflow')} > max_overflows "
            f"{constraints.max_overflows}"
        )
    limit = constraints.max_compactions
    if limit is not None and m.max_compactions > limit:
        out.append(
            f"{_plural(m.max_compactions, 'compaction')} in a session > max_compactions {limit}"
        )
    if m.stopped and not constraints.allow_stopped:
        out.append(f"{_plural(m.stopped, 'replay')} stopped early (allow_stopped: false)")
    return tuple(out)


def _no_sessions(spec: TuneSpec, failed: Sequence[Outcome[Any]], skipped: int) -> KiloRulesError:
    if not failed:
        return KiloRulesError(
            Diagnostic(
                "tune.no-session-replayed",
                f"no session to replay: the {skipped:,} files the sessions match are not "
                "recorded logs",
                Location(str(spec.file), 1, 1),
                hint="name the logs, or a folder or glob that holds some",
            )
        )
    first = failed[0]
    return KiloRulesError(
        Diagnostic(
            "tune.no-session-replayed",
            f"no session could be replayed ({len(failed):,} failed), e.g. {first.path}: "
            f"{first.error}",
            Location(str(spec.file), 1, 1),
        )
    )


def run_tune(
    spec: TuneSpec,
    *,
    executor: Executor = "process",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Progress | None = None,
) -> TuneResult:
    """Replay every session under every candidate and find the winner.

    The candidates are written into a temporary directory as policies extending the base
    and compiled here first: one that does not compile is skipped with its diagnostics.
    The others are replayed with :class:`~kilo_rules.tools.simulation.simulate.SessionJob` — one job
    per session, replaying every candidate — through
    :func:`~kilo_rules.tools.simulation.fleet.run_corpus` (``executor``, ``workers``, ``scheduler``
    and ``progress`` are its own; with a remote Dask cluster the temporary directory, ``TMPDIR``,
    must be one the workers read). With ``calibrate`` each session is replayed with the calibration
    fitted once on kilo-default's un-compacted replay of it
    (:func:`~kilo_rules.tools.simulation.simulate.fit_calibration`), the same for every candidate; a
    log without usage is replayed uncalibrated and listed in :attr:`TuneResult.uncalibrated`.

    A session that fails is listed in :attr:`TuneResult.failed` and the others count; a
    file a folder or glob matched that is not a recorded log is left out and listed in
    :attr:`TuneResult.skipped`; raises :class:`~kilo_rules.engine.base.errors.KiloRulesError` when
    no session could be replayed."""
    from kilo_rules.tools.simulation.simulate import SessionJob

    cands = candidates(spec)
    with tempfile.TemporaryDirectory(prefix="kilo-rules-tune-") as tmp:
        ready, skipped = _prepare(spec, cands, Path(tmp))
        job = SessionJob(
            policies=tuple(ref for _, ref in ready),
            model=spec.model,
            read_roots=tuple(str(r) for r in (*spec.read_roots, Path(tmp).resolve())),
            calibrate=spec.calibrate,
            steps=False,
        )
        outcomes = run_corpus(
            list(spec.sessions),
            job,
            executor=executor,
            workers=workers,
            scheduler=scheduler,
            progress=progress,
        )
    docs = [o.value for o in outcomes if o.value is not None]
    not_logs: list[tuple[str, str]] = []
    failed: list[Outcome[Any]] = []
    for o in outcomes:
        if o.value is None:
            reason = not_a_log(o, spec.named_sessions)
            if reason is None:
                failed.append(o)
            else:
                not_logs.append((str(o.path), reason))
    if not docs:
        raise _no_sessions(spec, failed, len(not_logs))
    measured: dict[int, Measures] = {}
    floor: float | None = None
    for position, (c, _) in enumerate(ready):
        measured[c.index], floor = _measure(docs, position, c.name)
    results = []
    for c in cands:
        m = measured.get(c.index)
        if m is None:
            results.append(CandidateResult(c, None, skipped.get(c.index, ())))
        else:
            results.append(CandidateResult(c, m, (), _reasons(spec.constraints, m)))
    best = min((r for r in results if r.feasible), key=_rank, default=None)
    return TuneResult(
        spec=spec,
        results=tuple(results),
        sessions=tuple(d.session for d in docs),
        failed=tuple((str(o.path), o.error or "failed") for o in failed),
        floor_cost=floor,
        winner=best.candidate.index if best is not None else None,
        skipped=tuple(not_logs),
        failed_diagnostics=tuple(o.diagnostics for o in failed),
        uncalibrated=tuple(
            d.session
            for d in docs
            if spec.calibrate and not (d.calibration is not None and d.calibration.applied)
        ),
    )


# --- outputs -------------------------------------------------------------------------------


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.4f}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _change(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{100 * (ratio - 1):+.1f} %"


def _shown(path: str | Path, out_dir: Path) -> str:
    """``path`` as the winner file should name it: relative to where the file is written,
    so that the file reads the same on every machine that checks it out."""
    try:
        return os.path.relpath(Path(path).resolve(), out_dir.resolve())
    except ValueError:  # another drive (Windows)
        return str(path)


def _winner_header(
    result: TuneResult, winner: CandidateResult, extends_note: str | None, out_dir: Path
) -> list[str]:
    spec = result.spec
    m, base = winner.measures, result.baseline.measures
    assert m is not None and base is not None  # a winner and the baseline were measured
    c = spec.constraints
    limits = [f"max_overflows {c.max_overflows}"]
    if c.max_compactions is not None:
        limits.append(f"max_compactions {c.max_compactions}")
    limits.append("stopped replays allowed" if c.allow_stopped else "no stopped replay")
    calibrated = f" ({result.calibration()})" if spec.calibrate else ""
    lines = [
        f"{spec.base_name}-tuned: {spec.base_name} with the cheapest knob setting kilo-rules "
        "tune found",
        f"that meets the constraints ({', '.join(limits)}).",
        f"Tune file: {_shown(spec.file, out_dir)}",
        f"Tuned on {_plural(len(result.sessions), 'session')} with {spec.model.id}{calibrated}:",
    ]
    lines += [f"  {_shown(s, out_dir)}" for s in result.sessions[:_HEADER_SESSIONS]]
    if len(result.sessions) > _HEADER_SESSIONS:
        lines.append(f"  and {len(result.sessions) - _HEADER_SESSIONS:,} more")
    measured = (
        f"Measured: {_usd(m.cost)} against {_usd(base.cost)} for {spec.base_name} "
        f"({_change(result.vs_baseline(winner))}); {_plural(m.compactions, 'compaction')} "
        f"(at most {m.max_compactions:,} in a session), "
        f"{_plural(m.overflows, 'provider overflow')}, {m.stopped:,} stopped; candidate "
        f"{winner.candidate.index} of {len(result.results) - 1:,}"
        + (
            " (the base itself was cheapest: nothing is changed)."
            if winner.candidate.baseline
            else "."
        )
    )
    lines += textwrap.wrap(measured, 92)
    if extends_note:
        lines.append(extends_note)
    return lines


def _winner_extends(spec: TuneSpec, out_dir: Path) -> tuple[str, str | None]:
    """The base as the winner's ``extends:`` names it from ``out_dir``, and a note when a
    check would need ``--allow-read`` to follow it."""
    if not spec.base_is_path:
        return spec.base, None
    base = Path(spec.base)
    here = out_dir.resolve()
    rel = os.path.relpath(base, here)
    if not rel.startswith(".."):
        return Path(rel).as_posix(), None
    return Path(rel).as_posix(), (
        f"The base lies outside this directory: check it with --allow-read {base.parent}"
    )


def write_outputs(result: TuneResult, out_dir: str | Path) -> dict[str, Path]:
    """Write the report and, when there is a winner, its policy into ``out_dir`` (created
    if needed): ``policy`` (``<base_name>-tuned.yaml``, the winner extending the base, with
    a comment header saying what it was tuned on and its cost against the baseline),
    ``json`` (``report.json``, :meth:`TuneResult.to_json`) and ``html`` (``report.html``,
    :func:`render_report_html`). Returns the paths written, by those names."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = result.spec
    written: dict[str, Path] = {}
    report = result.document()
    if result.winner is not None:
        winner = result.results[result.winner]
        extends, note = _winner_extends(spec, out)
        path = out / f"{spec.base_name}-tuned.yaml"
        calibrated = f", {result.calibration()}" if spec.calibrate else ""
        # Every output is written whole or not at all (a run killed mid-write leaves the old
        # file): safefs.write_atomic renames a fully written temporary file into place.
        safefs.write_atomic(
            path,
            candidate_policy(
                spec,
                winner.candidate,
                name=f"{spec.base_name}-tuned",
                extends=extends,
                header=_winner_header(result, winner, note, out),
                description=f"{spec.base_name} tuned by kilo-rules tune on "
                f"{_plural(len(result.sessions), 'session')} with {spec.model.id}{calibrated}.",
            ),
        )
        written["policy"] = path
        report = with_winner_file(report, path)
    json_path = out / "report.json"
    safefs.write_atomic(
        json_path, json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"
    )
    written["json"] = json_path
    html_path = out / "report.html"
    safefs.write_atomic(html_path, render_report_html(result))
    written["html"] = html_path
    return written


def with_winner_file(report: TuneReport, path: str | Path) -> TuneReport:
    """``report`` saying that its winner's policy was written to ``path``."""
    if report.winner is None:
        return report
    winner = report.winner.model_copy(update={"file": str(path)})
    return report.model_copy(update={"winner": winner})


def render_report_html(result: TuneResult) -> str:
    """The tune result as one self-contained HTML page:
    :func:`kilo_rules.tools.simulation.htmlreport.render_tune_html` of
    :meth:`TuneResult.document`."""
    return render_tune_html(result.document())
