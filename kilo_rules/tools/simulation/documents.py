"""The JSON documents ``simulate`` and ``tune`` write, as typed models.

One model per document, and the single source of truth for its shape: the producers build
them (:func:`~kilo_rules.tools.simulation.simulate.session_document`, the corpus run of the
command line, :meth:`~kilo_rules.tools.simulation.tune.TuneResult.to_json`), the readers
(:mod:`~kilo_rules.tools.simulation.fleet`, the tune, the HTML pages) read their attributes,
and ``schemas/`` holds their JSON Schemas, generated from them:

* :class:`SessionDocument` (``simulate.v1.json``): one session replayed under some policies,
  what ``kilo-rules simulate --format json`` prints for one session;
* :class:`CorpusDocument` (``corpus.v1.json``): many sessions with their aggregate, what it
  prints for several ``--session``, a folder or a glob;
* :class:`TuneReport` (``tune-report.v1.json``): the tune's ``report.json``.

Keys a later simulator added to a version 1 document are optional, with the default that
their absence meant (no floor, no calibration, no notes, no prunes...), so that a document
an older simulator wrote still reads; every key the simulator writes today it always
writes. Every model is frozen and closed (an unknown key is an error, not ignored), and
:func:`read_document` validates JSON read back from a file strictly: a string is never
taken for a number, nor a number for a flag.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from kilo_rules.engine.base.errors import Diagnostic
from kilo_rules.engine.formats.catalog import CacheFacts, Prices
from kilo_rules.engine.formats.tune_format import Constraints, KnobValue, Search

__all__ = [
    "CalibrationFit",
    "CorpusAggregate",
    "CorpusDocument",
    "CostFloor",
    "DiagnosticDocument",
    "FailedSession",
    "LocationDocument",
    "PolicyAggregate",
    "PolicyReport",
    "RecordedUsage",
    "SessionDocument",
    "SimulatedStep",
    "SkippedFile",
    "TuneCandidate",
    "TuneKnob",
    "TuneReport",
    "TuneSkipped",
    "TuneWinner",
    "WorstSession",
    "read_document",
]

M = TypeVar("M", bound=BaseModel)


def _none(value: object) -> bool:
    return value is None


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def to_json(self) -> dict[str, Any]:
        """The document as JSON data, keys in the order they are written."""
        return self.model_dump(mode="json")


def read_document(model: type[M], data: object) -> M:
    """``data`` (parsed JSON) validated as ``model``, strictly: JSON has no coercions, so
    neither does this (``"3"`` is no number, ``1`` no flag). Raises pydantic's
    ``ValidationError``."""
    return model.model_validate(data, strict=True)


# --- one session -----------------------------------------------------------------------------


class SimulatedStep(_Document):
    """One request a policy sent during the replay: its size, how the prompt cache split it,
    the output, what happened before it and its cost."""

    index: int = Field(ge=1, description="The request's number, from 1.")
    message_id: str = Field(description="The recorded assistant message this request answers.")
    input: int = Field(ge=0, description="Input tokens (read + written + uncached).")
    cache_read: int = Field(ge=0, description="Input tokens read from the prompt cache.")
    cache_write_5m: int = Field(ge=0, description="Input tokens written to the 5-minute cache.")
    cache_write_1h: int = Field(ge=0, description="Input tokens written to the 1-hour cache.")
    uncached: int = Field(ge=0, description="Input tokens billed at the plain input price.")
    output: int = Field(ge=0, description="Output tokens (recorded, reasoning included).")
    compactions: int = Field(
        ge=0, description="Compactions run before this request (retries included)."
    )
    provider_overflows: int = Field(
        ge=0, description="Requests the provider would have rejected before this one."
    )
    markers: int = Field(ge=0, description="Cache breakpoints in the request body.")
    cost_usd: float | None = Field(description="USD of the request; null without prices.")
    prunes: int = Field(0, ge=0, description="Tool outputs pruned before this request.")
    recorded_input: int | None = Field(
        None, description="The input the real agent's provider reported, when the log has it."
    )
    server_cleared: int = Field(
        0, ge=0, description="Tool uses the provider cleared from this request."
    )
    server_compacted: bool = Field(
        False, description="Whether the provider compacted the context at this request."
    )
    max_tokens: int | None = Field(
        None, description="The output cap the request asked for (null: none sent)."
    )

    @property
    def cache_write(self) -> int:
        """Input tokens written to the prompt cache (both buckets)."""
        return self.cache_write_5m + self.cache_write_1h


class PolicyReport(_Document):
    """What one policy did over the whole session. Costs are USD, null without prices."""

    policy: str = Field(description="The policy's name.")
    model: str = Field(description="The catalog id of the model replayed.")
    counter: str = Field(description="The token counter every request was measured with.")
    requests: int = Field(ge=0, description="Requests sent.")
    requests_total: int = Field(ge=0, description="Requests the recorded session made.")
    stopped: bool = Field(
        description="The replay stopped before the session's last request: its totals cover "
        "fewer requests, so they do not compare."
    )
    compactions: int = Field(ge=0, description="Compactions over the session.")
    provider_overflows: int = Field(
        ge=0, description="Requests the provider would have rejected as too long."
    )
    input: int = Field(ge=0, description="Input tokens over all requests.")
    cache_read: int = Field(ge=0, description="Input tokens read from the prompt cache.")
    cache_write: int = Field(ge=0, description="Input tokens written to the prompt cache.")
    cache_write_5m: int = Field(ge=0, description="... of which to the 5-minute cache.")
    cache_write_1h: int = Field(ge=0, description="... of which to the 1-hour cache.")
    uncached: int = Field(ge=0, description="Input tokens billed at the plain input price.")
    output: int = Field(ge=0, description="Output tokens (recorded, reasoning included).")
    summary_input: int = Field(ge=0, description="Tokens sent to the summarizer.")
    summary_output: int = Field(ge=0, description="Tokens of the summaries it wrote.")
    max_request: int = Field(ge=0, description="The largest request sent.")
    window: int = Field(ge=0, description="The model's context window in tokens.")
    cost_usd: float | None = Field(
        description="USD of every request plus the summary calls; null without prices."
    )
    error: str | None = Field(description="Why the replay stopped early, or null.")
    compaction_limit: int | None = Field(
        None,
        description="The context size at which the policy compacts (null: it never compacts "
        "on its own).",
    )
    server_compactions: int = Field(0, ge=0, description="Compactions the provider ran.")
    floor_cost_usd: float | None = Field(
        None,
        description="USD of the same requests under a perfect prompt cache; null without prices.",
    )
    floor_cache_read: int = Field(
        0, ge=0, description="Tokens read under that perfect cache (each written once)."
    )
    floor_cache_write: int = Field(0, ge=0, description="Tokens written under it.")
    steps: list[SimulatedStep] | None = Field(
        None,
        exclude_if=_none,
        description="Every request, in order; left out of a report without per-step detail.",
    )
    floor_ratio: float | None = Field(
        None,
        description="The cost against the session's floor; null when either is unknown or "
        "the replay stopped.",
    )


class CostFloor(_Document):
    """The session's cost floor: the cheapest of the replays under a perfect prompt cache."""

    cost_usd: float = Field(description="USD of that replay under a perfect prompt cache.")
    policy: str = Field(description="The policy whose replay it is.")
    input: int = Field(ge=0, description="Input tokens (read + written).")
    cache_write: int = Field(ge=0, description="Tokens written (each once).")
    cache_read: int = Field(ge=0, description="Tokens read.")
    output: int = Field(ge=0, description="Output tokens.")


class CalibrationFit(_Document):
    """How the simulator's count maps to the provider's: ``reported ≈ factor × simulated +
    offset``, fitted on the log's usage or declared by hand."""

    factor: float = Field(description="The provider's tokens per simulated token.")
    offset: int = Field(
        ge=0, description="Tokens the agent sent that the log does not hold (hidden prefix)."
    )
    r2: float | None = Field(description="R² of the fit (null when declared).")
    steps: int = Field(ge=0, description="Requests it was fitted on (0: declared by hand).")
    median_abs_error: float | None = Field(
        description="Median relative error of the fitted counts (null when declared)."
    )
    declared: bool = Field(description="Set by hand rather than fitted.")
    applied: bool = Field(description="Applied to every request's count.")


class RecordedUsage(_Document):
    """The session as its agent ran it, from the usage its log records, priced at the
    simulated model's prices."""

    requests: int = Field(ge=0, description="Assistant messages (compaction calls included).")
    with_usage: int = Field(ge=0, description="How many of them record usage.")
    input: int = Field(ge=0, description="Input tokens over those.")
    output: int = Field(ge=0, description="Output tokens over those.")
    cost_usd: float | None = Field(description="USD over those; null without usage or prices.")
    request_costs_usd: list[float | None] | None = Field(
        description="USD per replayed request (request i at i - 1; null where the log has no "
        "usage); null without usage or prices."
    )
    compactions: list[int] = Field(
        description="The replayed requests the agent's own compactions came before."
    )


class SessionDocument(_Document):
    """One recorded session replayed under one or more policies (``kilo-rules simulate
    --format json`` of one session)."""

    version: Literal[1] = Field(description="The document's version.")
    session: str = Field(description="The session, as named on the command line.")
    session_messages: int = Field(ge=0, description="Messages in the recorded session.")
    model: str = Field(description="The catalog id of the model replayed.")
    cache: CacheFacts = Field(description="The model's prompt-cache facts.")
    prices: Prices | None = Field(description="USD per million tokens; null without prices.")
    calibration: CalibrationFit | None = Field(
        None, description="The fitted or declared calibration, or null."
    )
    notes: list[str] = Field(
        default_factory=list, description="What the reader should know (one line each)."
    )
    recorded: RecordedUsage | None = Field(
        None, description="The session as its agent ran it, or null."
    )
    floor: CostFloor | None = Field(
        None, description="The session's cost floor; null without prices or a finished replay."
    )
    reports: list[PolicyReport] = Field(min_length=1, description="One report per policy.")


# --- many sessions ---------------------------------------------------------------------------


class LocationDocument(_Document):
    """Where a diagnostic points: 1-based line and column, and where it ends if known."""

    file: str = Field(description="The file (or pseudo-file, e.g. <command line>).")
    line: int = Field(description="Line, from 1.")
    col: int = Field(description="Column, from 1.")
    end_line: int | None = Field(None, exclude_if=_none, description="Last line, if known.")
    end_col: int | None = Field(None, exclude_if=_none, description="End column, if known.")


class DiagnosticDocument(_Document):
    """A located problem, as every ``--format json`` output writes it."""

    code: str = Field(description="Stable code, e.g. import.json.")
    severity: Literal["error", "warning"] = Field(description="error or warning.")
    message: str = Field(description="What went wrong.")
    location: LocationDocument = Field(description="Where.")
    details: dict[str, Any] | None = Field(
        None, exclude_if=_none, description="Facts for tools, by name."
    )
    hint: str | None = Field(None, exclude_if=_none, description="What to do about it.")

    @classmethod
    def of(cls, diagnostic: Diagnostic) -> DiagnosticDocument:
        """``diagnostic`` as the documents hold it."""
        return cls.model_validate(diagnostic.to_json())


class FailedSession(_Document):
    """A session that could not be replayed."""

    session: str = Field(description="The session file.")
    error: str = Field(description="The first diagnostic as text (or the error).")
    diagnostics: list[DiagnosticDocument] = Field(
        default_factory=list, description="Every diagnostic, located."
    )


class SkippedFile(_Document):
    """A file a folder or glob matched that is not a recorded log at all: left out."""

    session: str = Field(description="The file.")
    code: str = Field(description="The diagnostic code that says so.")
    reason: str = Field(description="Why it is no log.")


class PolicyAggregate(_Document):
    """One policy summed over the corpus (the sessions that did not stop, for the sums)."""

    policy: str = Field(description="The policy's name.")
    sessions: int = Field(ge=0, description="Sessions simulated.")
    stopped: int = Field(ge=0, description="How many of them stopped early.")
    cost_usd: float | None = Field(
        description="USD over the completed sessions; null when one has no prices."
    )
    compactions: int = Field(ge=0, description="Compactions over the completed sessions.")
    provider_overflows: int = Field(ge=0, description="Provider overflows over them.")
    input: int = Field(ge=0, description="Input tokens over them.")
    cache_read: int = Field(ge=0, description="Cache reads over them.")
    cache_write: int = Field(ge=0, description="Cache writes over them.")
    output: int = Field(ge=0, description="Output tokens over them.")
    floor_cost_usd: float | None = Field(
        description="The floors of the same sessions; null when one has none."
    )
    floor_ratio: float | None = Field(description="cost_usd / floor_cost_usd, or null.")
    cost_p50: float | None = Field(description="Per-session cost, median (nearest rank).")
    cost_p90: float | None = Field(description="Per-session cost, 90th percentile.")
    cost_max: float | None = Field(description="Per-session cost, highest.")


class WorstSession(_Document):
    """One (session, policy) pair of the worst list."""

    session: str = Field(description="The session.")
    policy: str = Field(description="The policy.")
    cost_usd: float | None = Field(description="Its cost, or null without prices.")
    floor_ratio: float | None = Field(description="Its cost against the floor, or null.")
    compactions: int = Field(ge=0, description="Its compactions.")
    stopped: bool = Field(description="Whether the replay stopped early.")


class CorpusAggregate(_Document):
    """Per-policy totals over the corpus and its worst sessions."""

    policies: list[PolicyAggregate] = Field(description="Each policy, in the order first seen.")
    worst: list[WorstSession] = Field(
        description="Stopped first, then by cost against the floor (else by cost), highest first."
    )
    sessions: int = Field(ge=0, description="Sessions, the failed included.")
    failed: int = Field(ge=0, description="Sessions that could not be replayed.")


class CorpusDocument(_Document):
    """Many recorded sessions replayed under the same policies (``kilo-rules simulate
    --format json`` of several sessions, a folder or a glob)."""

    version: Literal[1] = Field(description="The document's version.")
    model: str = Field(description="The catalog id of the model replayed.")
    sessions: list[SessionDocument] = Field(
        description="Each session replayed, in the order named (none when every one failed)."
    )
    aggregate: CorpusAggregate = Field(description="Per-policy totals and the worst sessions.")
    failed: list[FailedSession] = Field(description="The sessions that could not be replayed.")
    skipped: list[SkippedFile] = Field(
        default_factory=list, description="Files matched that are not recorded logs."
    )


# --- tune ------------------------------------------------------------------------------------


class TuneKnob(_Document):
    """A setting the tune varied and the values it tried."""

    path: str = Field(description="The setting's dotted path in the policy.")
    values: list[KnobValue] = Field(description="The values tried, in order.")


class TuneCandidate(_Document):
    """One combination of knob values and what it did over the sessions (null measures
    when it was skipped: it did not compile)."""

    index: int = Field(ge=0, description="The candidate's number; 0 is the base itself.")
    name: str = Field(description="Its name (that of the policy written for it).")
    baseline: bool = Field(description="Whether it is the base itself.")
    values: dict[str, KnobValue] = Field(description="Knob path → value.")
    status: Literal["measured", "skipped"] = Field(
        description="measured: replayed; skipped: it did not compile."
    )
    feasible: bool = Field(description="Replayed and within every constraint.")
    winner: bool = Field(description="Whether it won.")
    reasons: list[str] = Field(description="The constraints it breaks.")
    cost_usd: float | None = Field(description="USD over the sessions.")
    vs_baseline: float | None = Field(description="Its cost against the baseline's.")
    floor_ratio: float | None = Field(description="Its cost against the sum of the floors.")
    compactions: int | None = Field(description="Compactions summed over the sessions.")
    max_compactions: int | None = Field(description="Compactions in its worst session.")
    provider_overflows: int | None = Field(description="Provider overflows summed.")
    stopped: int | None = Field(description="Replays that stopped early.")
    session_costs: list[float] | None = Field(description="USD per session, in order.")
    errors: list[str] = Field(description="Why replays stopped, one per stopped replay.")
    diagnostics: list[DiagnosticDocument] = Field(
        description="Why it was skipped (its policy's diagnostics)."
    )


class TuneWinner(_Document):
    """The cheapest feasible candidate."""

    index: int = Field(ge=0, description="Its number among the candidates.")
    name: str = Field(description="Its name.")
    values: dict[str, KnobValue] = Field(description="Knob path → value.")
    cost_usd: float = Field(description="USD over the sessions.")
    baseline_cost_usd: float | None = Field(description="The baseline's, for comparison.")
    vs_baseline: float | None = Field(description="Its cost against the baseline's.")
    file: str | None = Field(
        None, exclude_if=_none, description="The policy written for it, once written."
    )


class TuneSkipped(_Document):
    """A file a folder or glob matched that is not a recorded log: left out."""

    session: str = Field(description="The file.")
    reason: str = Field(description="Why it is no log.")


class TuneReport(_Document):
    """The tune's ``report.json``: every candidate, its knob values and measures, and the
    winner (``kilo-rules tune --format json`` adds ``outputs``)."""

    version: Literal[1] = Field(description="The document's version.")
    tune_file: str = Field(description="The tune file.")
    base: str = Field(description="The base policy, as the tune file names it.")
    base_name: str = Field(description="The base policy's name.")
    model: str = Field(description="The catalog id of the model replayed.")
    calibrate: bool = Field(description="Whether the sessions' counts were calibrated.")
    constraints: Constraints = Field(description="What a candidate must do to be kept.")
    search: Search = Field(description="How the candidates were chosen.")
    knobs: list[TuneKnob] = Field(description="The settings varied.")
    sessions: list[str] = Field(description="The sessions replayed.")
    failed: list[FailedSession] = Field(description="The sessions that could not be replayed.")
    skipped: list[TuneSkipped] = Field(
        default_factory=list, description="Files matched that are not recorded logs."
    )
    uncalibrated: list[str] = Field(
        default_factory=list,
        description="With calibrate, the sessions replayed uncalibrated (no usage in the log).",
    )
    floor_cost_usd: float | None = Field(description="The sum of the sessions' floors.")
    candidates: list[TuneCandidate] = Field(
        min_length=1, description="Every candidate, the baseline first."
    )
    winner: TuneWinner | None = Field(description="The winner, or null when none is feasible.")
    outputs: dict[str, str] | None = Field(
        None, exclude_if=_none, description="The files written, by kind (the command line's)."
    )
