"""Replaying a recorded session under one or more plans, and what each would have cost.

:func:`simulate` grows the recorded session message by message under each plan, with the
:class:`~kilo_rules.engine.runtime.facade.Runtime` (compaction included). Before each recorded
assistant message it builds the request the agent would have sent; the message is then
appended with the usage a provider would have reported *for that request* — the input
split into uncached, cache-read and cache-written tokens by
:class:`~kilo_rules.engine.providers.cachesim.CacheSimulator`, plus the recorded output — because
the recorded usage belongs to the original context, not to the one the plan built. A request
the provider would refuse as too long — its input plus the output cap it asks for over the
window (:func:`~kilo_rules.engine.providers.serversim.refuses`, the rule of the runtime's window
stage and of the ``output-within-window`` acceptance rule) — is rejected the way the provider would
(:meth:`Runtime.overflowed`) and the step is retried after compaction.

Every plan is measured with the same counter (tiktoken ``cl100k_base``, offline) on the
rendered wire body, so reports compare even when the plans count differently. Compactions
that the original agent recorded (its own summary request and summary) are dropped first:
each plan decides for itself where to compact.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from kilo_rules.engine.base.errors import (
    ContextOverflowError,
    Diagnostic,
    KiloRulesError,
    MultipleRunsWarning,
)
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import ModelInfo, Prices
from kilo_rules.engine.formats.session import CacheTokens, Message, Session, TokenUsage
from kilo_rules.engine.providers.cachesim import Block, CacheSimulator, CacheStep, blocks
from kilo_rules.engine.providers.serversim import ServerEdits, ServerStep, refuses
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.facade import Runtime, StepResult
from kilo_rules.engine.runtime.guards import compaction_limit
from kilo_rules.engine.runtime.history import compaction_part, completed_compactions
from kilo_rules.engine.runtime.measure import messages_json
from kilo_rules.engine.summarizers.protocol import Summarizer, SummaryRequest
from kilo_rules.engine.text.tokens import CountCache, TokenCounter, counter_for
from kilo_rules.tools.simulation.documents import (
    CalibrationFit,
    CostFloor,
    PolicyReport,
    RecordedUsage,
    SessionDocument,
    SimulatedStep,
)

__all__ = [
    "REFERENCE_POLICY",
    "Calibration",
    "ReplayStep",
    "SessionJob",
    "SimulationReport",
    "SimulationStep",
    "build_session_document",
    "default_counter",
    "fit_calibration",
    "recorded_input",
    "recorded_summary",
    "recorded_usage",
    "reference_plan",
    "replay",
    "session_document",
    "simulate",
    "step_cost",
    "without_recorded_compactions",
]

#: The counter every plan is measured with unless the caller passes another.
COUNTER_SPEC = "tiktoken:cl100k_base"

#: The policy whose un-compacted replay the calibration is fitted on, whatever policies
#: are compared (so that their order and their set change nothing).
REFERENCE_POLICY = "kilo-default"

#: Retries of one step after a provider overflow before the plan is declared stuck
#: (a policy with no attempt cap could otherwise compact forever).
MAX_OVERFLOW_RETRIES = 8


@lru_cache(maxsize=1)
def default_counter() -> TokenCounter:
    """tiktoken ``cl100k_base`` (the estimate if it is unavailable), with a count cache
    shared by every simulation in the process: steps repeat most blocks verbatim."""
    counter, _ = counter_for(COUNTER_SPEC)
    return CountCache(counter, maxsize=65536)


@dataclass(frozen=True, slots=True)
class SimulationStep:
    """One request sent: its size, how the cache split it, the output and the cost.

    ``cost`` is USD, or None when the model has no prices in the catalog."""

    index: int  # 1-based request number
    message_id: str  # the recorded assistant message this request answers
    cache: CacheStep
    output: int
    compactions: int  # compactions run before this request (retries included)
    provider_overflows: int  # requests the provider would have rejected before this one
    markers: int  # cache breakpoints in the body
    cost: float | None
    prunes: int = 0  # tool outputs pruned before this request
    recorded_input: int | None = None  # what the real agent's provider reported, if logged
    server_cleared: int = 0  # tool uses the provider cleared from this request
    server_compacted: bool = False  # the provider compacted the context at this request
    max_tokens: int | None = None  # the output cap the request asked for (None: none sent)

    def document(self) -> SimulatedStep:
        """The step as the simulation document holds it."""
        c = self.cache
        return SimulatedStep(
            index=self.index,
            message_id=self.message_id,
            input=c.input,
            cache_read=c.read,
            cache_write_5m=c.write_5m,
            cache_write_1h=c.write_1h,
            uncached=c.uncached,
            output=self.output,
            compactions=self.compactions,
            provider_overflows=self.provider_overflows,
            markers=self.markers,
            cost_usd=self.cost,
            prunes=self.prunes,
            recorded_input=self.recorded_input,
            server_cleared=self.server_cleared,
            server_compacted=self.server_compacted,
            max_tokens=self.max_tokens,
        )

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the step (:meth:`document` as JSON)."""
        return self.document().to_json()


@dataclass
class SimulationReport:
    """What one plan did over the whole session. Costs are USD, None without prices."""

    policy: str
    model: str
    window: int
    counter: str
    steps: list[SimulationStep] = field(default_factory=list)
    compactions: int = 0
    provider_overflows: int = 0
    summary_input: int = 0  # tokens sent to the summarizer (as if it were the model)
    summary_output: int = 0  # tokens of the summaries it wrote
    error: str | None = None  # why the replay stopped early (compaction exhausted)
    prices: dict[str, float | None] | None = None
    cache_kind: str = "explicit"  # the model's prompt cache (explicit, automatic, none)
    requests_total: int = 0  # the requests the recorded session made
    compaction_limit: int | None = None  # the context size at which the plan compacts
    # (overflow.limit, as the runtime compares it; None: it never compacts on its own)
    server_compactions: int = 0  # compactions the provider ran (the server section)
    perfect_read: int = 0  # the same requests under a perfect cache: tokens read
    perfect_write: int = 0  # ... and written (each once)
    calibration: Calibration | None = None  # applied to every request's count

    @property
    def stopped(self) -> bool:
        """The replay stopped before the session's last request: its totals cover fewer
        requests than a complete replay's, so they are not comparable."""
        return self.error is not None or len(self.steps) < self.requests_total

    def _sum(self, name: str) -> int:
        return sum(int(getattr(s.cache, name)) for s in self.steps)

    @property
    def input(self) -> int:
        """Input tokens over all requests (read + written + uncached)."""
        return self._sum("input")

    @property
    def cache_read(self) -> int:
        """Input tokens read from the prompt cache."""
        return self._sum("read")

    @property
    def cache_write(self) -> int:
        """Input tokens written to the prompt cache (both buckets)."""
        return self._sum("write")

    @property
    def uncached(self) -> int:
        """Input tokens billed at the plain input price."""
        return self._sum("uncached")

    @property
    def output(self) -> int:
        """Output tokens (recorded, reasoning included)."""
        return sum(s.output for s in self.steps)

    @property
    def max_request(self) -> int:
        """The largest request sent."""
        return max((s.cache.input for s in self.steps), default=0)

    @property
    def cost(self) -> float | None:
        """Total USD: every request plus the summary calls; None without prices."""
        if self.prices is None:
            return None
        steps = sum(s.cost or 0.0 for s in self.steps)
        p_in, p_out = self.prices["input"] or 0.0, self.prices["output"] or 0.0
        return steps + (self.summary_input * p_in + self.summary_output * p_out) / 1e6

    @property
    def floor_cost(self) -> float | None:
        """USD of the same requests under a perfect prompt cache (each token written once,
        read by every later request that repeats it; summary calls as sent): what no
        placement of breakpoints can beat for this policy. None without prices."""
        p = self.prices
        if p is None:
            return None
        p_in, p_out = p["input"] or 0.0, p["output"] or 0.0
        # An explicit cache bills its writes; an automatic one bills them as plain input;
        # without a cache every token is plain input.
        write = (p["cache_write"] or p_in) if self.cache_kind == "explicit" else p_in
        read = p_in if self.cache_kind == "none" else (p["cache_read"] or 0.0)
        usd = self.perfect_write * write + self.perfect_read * read + self.output * p_out
        return (usd + self.summary_input * p_in + self.summary_output * p_out) / 1e6

    def document(self, *, steps: bool = True, floor_ratio: float | None = None) -> PolicyReport:
        """The report as the simulation document holds it; ``steps=False`` leaves out
        per-step detail, ``floor_ratio`` is its cost against the session's floor."""
        return PolicyReport(
            policy=self.policy,
            model=self.model,
            counter=self.counter,
            requests=len(self.steps),
            requests_total=self.requests_total,
            stopped=self.stopped,
            compactions=self.compactions,
            provider_overflows=self.provider_overflows,
            input=self.input,
            cache_read=self.cache_read,
            cache_write=self.cache_write,
            cache_write_5m=self._sum("write_5m"),
            cache_write_1h=self._sum("write_1h"),
            uncached=self.uncached,
            output=self.output,
            summary_input=self.summary_input,
            summary_output=self.summary_output,
            max_request=self.max_request,
            window=self.window,
            cost_usd=self.cost,
            error=self.error,
            compaction_limit=self.compaction_limit,
            server_compactions=self.server_compactions,
            floor_cost_usd=self.floor_cost,
            floor_cache_read=self.perfect_read,
            floor_cache_write=self.perfect_write,
            steps=[s.document() for s in self.steps] if steps else None,
            floor_ratio=floor_ratio,
        )

    def to_json(self, *, steps: bool = True) -> dict[str, Any]:
        """Stable JSON shape of the report; ``steps=False`` leaves out per-step detail.
        Without a session there is no floor to compare with: no ``floor_ratio``."""
        return self.document(steps=steps).model_dump(mode="json", exclude={"floor_ratio"})


def step_cost(prices: Prices | None, cache: CacheStep, output: int) -> float | None:
    """USD of one request at catalog ``prices`` (USD per Mtok); None without prices.

    A 1-hour write without its own price is charged at Anthropic's multiplier (2x input)."""
    p = prices
    if p is None:
        return None
    write_1h = p.cache_write_1h if p.cache_write_1h is not None else 2 * p.input
    usd = (
        cache.uncached * p.input
        + cache.read * p.cache_read
        + cache.write_5m * p.cache_write
        + cache.write_1h * write_1h
        + output * p.output
    )
    return usd / 1e6


@dataclass(frozen=True, slots=True)
class Calibration:
    """How the simulator's count of a request maps to what the provider reports:
    ``reported ≈ factor × simulated + offset``.

    ``offset`` stands for what the log does not hold (the agent's own system prompt and tool
    definitions) and is sent as a stable block in front of every request, so the cache
    model reads it like the prefix it is; ``factor`` for the provider's tokenizer against
    the simulator's. Fitted by :func:`fit_calibration` on the steps where the recorded and
    the replayed contexts are the same messages (``steps`` of them, with the fit's ``r2``
    and the median relative error of the fitted counts), or declared by hand
    (``steps == 0``)."""

    factor: float = 1.0
    offset: int = 0
    r2: float | None = None
    steps: int = 0
    median_abs_error: float | None = None

    def __post_init__(self) -> None:
        if not (0.1 <= self.factor <= 10.0):
            raise ValueError(f"token factor {self.factor} is outside 0.1..10")
        if not (0 <= self.offset <= 10_000_000):
            raise ValueError(f"hidden prefix {self.offset} is outside 0..10,000,000 tokens")

    def count(self, simulated: int) -> int:
        """The calibrated count of a request the simulator counted ``simulated``."""
        return round(self.factor * simulated) + self.offset

    def scale(self, simulated: int) -> int:
        """``simulated`` tokens of text as the provider would count them, without the hidden
        prefix: a summary call carries neither the agent's system prompt nor its tools."""
        return round(self.factor * simulated)

    def blocks(self, seq: list[Block]) -> list[Block]:
        """``seq`` as the provider would count it: each block scaled, the hidden prefix in
        front of the first."""
        scaled = [Block(b.key, round(b.tokens * self.factor), b.mark) for b in seq]
        return [Block("hidden-prefix", self.offset), *scaled] if self.offset else scaled

    def document(self, *, applied: bool) -> CalibrationFit:
        """The calibration as the simulation document holds it."""
        return CalibrationFit(
            factor=self.factor,
            offset=self.offset,
            r2=self.r2,
            steps=self.steps,
            median_abs_error=self.median_abs_error,
            declared=self.steps == 0,
            applied=applied,
        )

    def to_json(self, *, applied: bool) -> dict[str, Any]:
        """Stable JSON shape (:meth:`document` as JSON)."""
        return self.document(applied=applied).to_json()


def recorded_input(msg: Message) -> int | None:
    """The input the provider reported for ``msg`` (uncached, cache read and written),
    None when the log holds no usage for it."""
    t = msg.tokens
    if t is None:
        return None
    total = t.input + t.cache.read + t.cache.write
    return total or None


def _recorded_after_compaction(session: Session) -> set[str]:
    """Ids of the messages from the first compaction the agent recorded onwards: from
    there its context is a summary, not the history the replay grows."""
    kept = {m.id for m in without_recorded_compactions(session).messages}
    first = next((i for i, m in enumerate(session.messages) if m.id not in kept), None)
    return set() if first is None else {m.id for m in session.messages[first:]}


def fit_calibration(
    plan: Plan, session: Session, *, counter: TokenCounter | None = None
) -> Calibration | None:
    """Fit ``reported = factor × simulated + offset`` (a robust line) on the un-compacted
    replay of ``session`` under ``plan``: before each recorded assistant message up to the
    agent's first recorded compaction, the request ``plan`` builds from the recorded
    messages as they are — nothing pruned, nothing compacted, whatever the policy's own
    triggers say — against the input the log records for that message. Both describe the
    same messages, so every request with usage counts. None when fewer than three do (a
    log without usage). :func:`session_document` fits on :func:`reference_plan`'s."""
    count = counter or default_counter()
    after = _recorded_after_compaction(session)
    live = session.model_copy(update={"messages": []})
    pairs: list[tuple[int, int]] = []
    for msg in session.messages:
        if msg.id in after:
            break
        rec = recorded_input(msg) if msg.role == "assistant" else None
        if rec is not None:
            built = apply_plan(plan, live)
            pairs.append((sum(b.tokens for b in blocks(built.request, count.count)), rec))
        live = live.model_copy(update={"messages": [*live.messages, msg]})
    return _robust_fit(pairs)


def reference_plan(model: ModelInfo, plans: Sequence[Plan] = ()) -> Plan:
    """The plan a session's calibration is fitted on: :data:`REFERENCE_POLICY` compiled for
    ``model``; should it not compile there, the plan of ``plans`` whose policy name sorts
    first. Either way the same whatever the order of ``plans``."""
    from kilo_rules.engine.compiler.compile import compile_policy

    try:
        return compile_policy(REFERENCE_POLICY, model)
    except KiloRulesError:
        if not plans:
            raise
        return min(plans, key=lambda p: (p.policy, p.policy_file))


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


#: Steps a fit looks at at most (evenly spaced): the slope is a median over their pairs.
_FIT_POINTS = 400


def _robust_fit(pairs: Sequence[tuple[int, int]]) -> Calibration | None:
    """Theil-Sen: the slope is the median of the slopes between every two steps, the
    offset the median of what remains. A least-squares line would bend to a single jump
    that the log cannot show (a summarised reasoning block billed in full, an attachment),
    and then miss every step after it; the median follows the steps that agree."""
    n = len(pairs)
    if n < 3:
        return None
    if n > _FIT_POINTS:
        pairs = [pairs[i * (n - 1) // (_FIT_POINTS - 1)] for i in range(_FIT_POINTS)]
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(pairs)
        for x2, y2 in pairs[i + 1 :]
        if x2 != x1
    ]
    if not slopes:
        return None
    factor = min(max(_median(slopes), 0.1), 10.0)
    offset = max(_median([y - factor * x for x, y in pairs]), 0.0)
    my = sum(y for _, y in pairs) / len(pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    residual = sum((y - (factor * x + offset)) ** 2 for x, y in pairs)
    r2 = 1.0 - residual / syy if syy else 1.0
    error = _median([abs(factor * x + offset - y) / y for x, y in pairs])
    return Calibration(round(factor, 4), round(offset), round(r2, 5), n, round(error, 5))


class _PerfectCache:
    """A prompt cache without limits: every prefix of every request is kept, for ever.
    The cheapest any cache could make a sequence of requests: each token written once,
    when a request first carries it, and read by every later request that repeats it."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def step(self, seq: list[Block]) -> tuple[int, int]:
        """(read, written) tokens of one request."""
        read = written = 0
        prefix = 0
        hit = True
        for b in seq:
            prefix = hash((prefix, b.key))
            if hit and prefix in self._seen:
                read += b.tokens
                continue
            hit = False
            written += b.tokens
            self._seen.add(prefix)
        return read, written


class _Metered:
    """A summarizer that counts what a model would be sent and would write, calibrated
    like every request when a calibration is applied (its factor only: a summary call
    carries no hidden prefix)."""

    def __init__(
        self, inner: Summarizer, count: TokenCounter, calibration: Calibration | None = None
    ) -> None:
        self.inner = inner
        self.count = count
        self.calibration = calibration
        self.input = 0
        self.output = 0

    def _tokens(self, text: str) -> int:
        n = self.count.count(text)
        return self.calibration.scale(n) if self.calibration else n

    def summarize(self, request: SummaryRequest) -> str:
        text = self.inner.summarize(request)
        self.input += self._tokens(request.instruction)
        self.input += self._tokens(messages_json(request.messages))
        self.output += self._tokens(text)
        return text


def without_recorded_compactions(session: Session) -> Session:
    """``session`` minus the compactions its agent made (request and summary messages)."""
    drop = {
        session.messages[i].id for pair in completed_compactions(session.messages) for i in pair
    }
    drop |= {m.id for m in session.messages if compaction_part(m) is not None}
    return session.model_copy(
        update={"messages": [m for m in session.messages if m.id not in drop]}
    )


def _output(msg: Message) -> int:
    return (msg.tokens.output + msg.tokens.reasoning) if msg.tokens else 0


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One recorded assistant message, replayed under a plan.

    ``live`` is the session the step started from; ``result`` the step that was sent (its
    decisions and mutations include those of every retry after a provider overflow);
    ``blocks`` that request in cache order with its tokens; ``split`` what the cache model
    says the provider would have read, written and charged uncached."""

    message: Message
    live: Session
    result: StepResult
    blocks: list[Block]
    split: CacheStep
    compactions: int
    overflows: int
    markers: int
    prunes: int
    server: ServerStep = field(default_factory=ServerStep)


class _Replay:
    """One plan over one session (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        summarizer: Summarizer,
        counter: TokenCounter,
        cache: CacheSimulator,
        calibration: Calibration | None = None,
    ) -> None:
        m = plan.model
        self.plan = plan
        self.calibration = calibration
        self.counter = counter
        self.metered = _Metered(summarizer, counter, calibration)
        self.runtime = Runtime(plan, self.metered)
        self.cache = cache
        self.window = m.limits.input or m.limits.context
        self.context, self.input_limit = m.limits.context, m.limits.input
        from kilo_rules.engine.runtime.server import gated

        runs = [e for e, supported in gated(plan) if supported]
        self.server = ServerEdits(runs, m.api, counter.count)

    def _refused(self, seq: list[Block], result: StepResult) -> bool:
        """The provider refuses the request as too long (as it counts it: ``seq``)."""
        size = sum(b.tokens for b in seq)
        return refuses(size, result.model_request.max_tokens, self.context, self.input_limit)

    def _build(self, live: Session) -> tuple[StepResult, list[Block], int, ServerStep]:
        """The request for the next step, retried while the provider would refuse it.

        The runtime caps the output against its own count of the request (Kilo's
        capOutputTokens); the provider counts its own way, and refuses the request when
        input and cap exceed its window. Kilo takes that refusal for an overflow: it
        compacts in overflow mode and sends the step again."""
        result = self.runtime.step(live)
        overflows = 0
        seq = self._blocks(result.request)
        while self._refused(seq, result):
            if overflows >= MAX_OVERFLOW_RETRIES:
                cap = result.model_request.max_tokens or 0
                raise ContextOverflowError(
                    Diagnostic(
                        "simulate.overflow-retries",
                        f"the provider still refuses the request ({sum(b.tokens for b in seq):,}"
                        f" input + {cap:,} output tokens, {self.context:,}-token window) after "
                        f"{overflows} provider overflows and compactions",
                    )
                )
            overflows += 1
            self.runtime.overflowed(result.session)
            again = self.runtime.step(result.session)
            result = replace(
                again,
                decisions=[*result.decisions, *again.decisions],
                mutations=[*result.mutations, *again.mutations],
                compactions=result.compactions + again.compactions,
            )
            seq = self._blocks(result.request)
        if self.server.active:
            # The provider edits the request before the model reads it: what it bills and
            # caches is what is left.
            edited, done = self.server.apply(result.request)
            return result, self._blocks(edited), overflows, done
        return result, seq, overflows, ServerStep()

    def _blocks(self, request: dict[str, Any]) -> list[Block]:
        seq = blocks(request, self.counter.count)
        return self.calibration.blocks(seq) if self.calibration else seq

    def steps(self, original: Session) -> Iterator[ReplayStep]:
        """Every recorded assistant message of ``original``, replayed in order. Raises
        :class:`ContextOverflowError` when a step cannot be brought under the window."""
        from kilo_rules.engine.providers import count_markers

        live = original.model_copy(update={"messages": []})
        for msg in original.messages:
            if msg.role != "assistant":
                live = live.model_copy(update={"messages": [*live.messages, msg]})
                continue
            result, seq, overflows, server = self._build(live)
            self.metered.input += server.summary_input
            self.metered.output += server.summary_output
            split = self.cache.step(seq)
            markers = count_markers(result.request, result.provider)
            prunes = sum(1 for m in result.mutations if m.get("op") == "mark_compacted")
            yield ReplayStep(
                msg,
                live,
                result,
                seq,
                split,
                result.compactions,
                overflows,
                markers,
                prunes,
                server,
            )
            # The provider's usage for the request this plan built, not the recorded one.
            usage = TokenUsage(
                input=split.uncached,
                output=msg.tokens.output if msg.tokens else 0,
                reasoning=msg.tokens.reasoning if msg.tokens else 0,
                cache=CacheTokens(read=split.read, write=split.write),
            )
            answered = msg.model_copy(update={"tokens": usage})
            grown = result.session
            live = grown.model_copy(update={"messages": [*grown.messages, answered]})

    def run(self, original: Session) -> SimulationReport:
        m = self.plan.model
        out = SimulationReport(self.plan.policy, m.id, self.window, self.counter.name)
        out.prices = m.prices.model_dump() if m.prices is not None else None
        out.cache_kind = m.cache.kind
        perfect = _PerfectCache()
        out.requests_total = sum(1 for m in original.messages if m.role == "assistant")
        out.calibration = self.calibration
        out.compaction_limit = _static_limit(self.plan)
        try:
            for step in self.steps(original):
                read, written = perfect.step(step.blocks)
                out.perfect_read += read
                out.perfect_write += written
                output = _output(step.message)
                out.compactions += step.compactions
                out.provider_overflows += step.overflows
                out.server_compactions += int(step.server.compacted)
                if out.compaction_limit is None:  # a limit that depends on the session
                    out.compaction_limit = _decided_limit(step.result)
                out.steps.append(
                    SimulationStep(
                        index=len(out.steps) + 1,
                        message_id=step.message.id,
                        cache=step.split,
                        output=output,
                        compactions=step.compactions,
                        provider_overflows=step.overflows,
                        markers=step.markers,
                        cost=step_cost(m.prices, step.split, output),
                        prunes=step.prunes,
                        recorded_input=recorded_input(step.message),
                        server_cleared=step.server.cleared_tool_uses,
                        server_compacted=step.server.compacted,
                        max_tokens=step.result.model_request.max_tokens,
                    )
                )
        except ContextOverflowError as exc:
            out.error = exc.diagnostics[0].message if exc.diagnostics else str(exc)
        out.summary_input = self.metered.input
        out.summary_output = self.metered.output
        return out


def _static_limit(plan: Plan) -> int | None:
    """The compaction limit when the policy fixes it for the model (None when it depends
    on the session, or the plan never compacts on its own)."""
    try:
        return compaction_limit(plan, plan.context())
    except (KiloRulesError, KeyError, TypeError, ValueError):
        return None


def _decided_limit(result: StepResult) -> int | None:
    """The limit the runtime compared the usage with in this step, if it did."""
    for d in result.decisions:
        if d.stage == "guards" and d.rule == "overflow" and "limit" in d.inputs:
            return int(d.inputs["limit"])
    return None


def replay(
    plan: Plan,
    session: Session,
    *,
    summarizer: Summarizer | None = None,
    counter: TokenCounter | None = None,
    lookback: int | None = 20,
    seconds_per_step: float | None = None,
    calibration: Calibration | None = None,
) -> Iterator[ReplayStep]:
    """The steps :func:`simulate` takes for one plan, one at a time (its recorded
    compactions dropped first), for tools that look at each request: the same requests,
    the same compactions, the same cache model."""
    run = _replay_for(plan, summarizer, counter, lookback, seconds_per_step, calibration)
    return run.steps(without_recorded_compactions(session))


def _replay_for(
    plan: Plan,
    summarizer: Summarizer | None,
    counter: TokenCounter | None,
    lookback: int | None,
    seconds_per_step: float | None,
    calibration: Calibration | None = None,
) -> _Replay:
    if summarizer is None:
        from kilo_rules.engine.summarizers import ExtractiveSummarizer

        summarizer = ExtractiveSummarizer()
    cache = CacheSimulator(
        plan.model.cache.kind,
        plan.model.cache.min_cacheable_tokens,
        lookback=lookback,
        seconds_per_step=seconds_per_step,
    )
    return _Replay(plan, summarizer, counter or default_counter(), cache, calibration)


def simulate(
    session: Session,
    plans: Sequence[Plan],
    *,
    summarizer: Summarizer | None = None,
    counter: TokenCounter | None = None,
    lookback: int | None = 20,
    seconds_per_step: float | None = None,
    calibration: Calibration | None = None,
) -> list[SimulationReport]:
    """Replay ``session`` under each plan; one report per plan, in order.

    ``summarizer`` writes the summaries of compactions (default: the offline extractive
    one, so a simulation is deterministic). ``counter`` measures every request (default:
    :func:`default_counter`). ``lookback`` and ``seconds_per_step`` tune the cache model
    (see :mod:`kilo_rules.engine.providers.cachesim`). ``calibration`` maps every count to what the
    provider would report (:func:`fit_calibration`), so that the usage fed back, the
    compaction points and the bill follow the real counts. A plan whose compaction is
    exhausted stops early and says why in :attr:`SimulationReport.error`.
    """
    original = without_recorded_compactions(session)
    return [
        _replay_for(plan, summarizer, counter, lookback, seconds_per_step, calibration).run(
            original
        )
        for plan in plans
    ]


def session_document(
    session: Session,
    plans: Sequence[Plan],
    *,
    name: str,
    calibrate: bool = False,
    declared: Calibration | None = None,
    lookback: int | None = 20,
    seconds_per_step: float | None = None,
    steps: bool = True,
) -> dict[str, Any]:
    """:func:`build_session_document` as JSON data (``schemas/simulate.v1.json``)."""
    return build_session_document(
        session,
        plans,
        name=name,
        calibrate=calibrate,
        declared=declared,
        lookback=lookback,
        seconds_per_step=seconds_per_step,
        steps=steps,
    ).to_json()


def build_session_document(
    session: Session,
    plans: Sequence[Plan],
    *,
    name: str,
    calibrate: bool = False,
    declared: Calibration | None = None,
    lookback: int | None = 20,
    seconds_per_step: float | None = None,
    steps: bool = True,
) -> SessionDocument:
    """Everything ``kilo-rules simulate`` reports for one session, as its JSON document:
    the model, its cache facts and prices, the fitted calibration (when the log records
    usage), the session as recorded (:func:`recorded_summary`), the cost floor (the
    cheapest of the replays under a perfect prompt cache), and one report per plan with its
    own perfect-cache cost and its ratio to the floor.

    The calibration is fitted once, on :func:`reference_plan`'s un-compacted replay
    (:func:`fit_calibration`), so each plan's report is the same whatever the other plans
    and their order. ``calibrate`` applies it; a log without usage is then replayed
    uncalibrated and ``notes`` says so. ``declared`` is one set by hand, applied whatever
    the log holds. All plans must be for the same model."""
    if not plans:
        raise ValueError("no plans to simulate")
    model = plans[0].model
    if any(p.model.id != model.id for p in plans):
        raise ValueError("every plan of one simulation must be for the same model")
    # A declared calibration is applied whatever the log holds: no fit to make.
    fitted = (
        None if declared is not None else fit_calibration(reference_plan(model, plans), session)
    )
    notes: list[str] = []
    if calibrate and fitted is None and declared is None:
        notes.append(
            "not calibrated: the log records no usage to calibrate with (fewer than three "
            "requests with token counts before its first compaction); declare the hidden "
            "prefix and token factor by hand to calibrate it (--hidden-prefix, --token-factor)"
        )
    applied = declared or (fitted if calibrate else None)
    reports = simulate(
        session,
        plans,
        lookback=lookback,
        seconds_per_step=seconds_per_step,
        calibration=applied,
    )
    calibration = None
    if applied is not None:
        calibration = applied.document(applied=True)
    elif fitted is not None:
        calibration = fitted.document(applied=False)
    # The session's floor: the cheapest of these replays under a perfect cache.
    finished = [r for r in reports if not r.stopped and r.floor_cost is not None]
    best = min(finished, key=lambda r: r.floor_cost or 0.0, default=None)
    floor: CostFloor | None = None
    if best is not None and best.floor_cost is not None:
        floor = CostFloor(
            cost_usd=best.floor_cost,
            policy=best.policy,
            input=best.perfect_read + best.perfect_write,
            cache_write=best.perfect_write,
            cache_read=best.perfect_read,
            output=best.output,
        )
    out_reports = []
    for r in reports:
        cost = r.cost
        ratio = (
            cost / floor.cost_usd
            if floor and cost is not None and floor.cost_usd and not r.stopped
            else None
        )
        out_reports.append(r.document(steps=steps, floor_ratio=ratio))
    return SessionDocument(
        version=1,
        session=name,
        session_messages=len(session.messages),
        model=model.id,
        cache=model.cache,
        prices=model.prices,
        calibration=calibration,
        notes=notes,
        recorded=recorded_usage(session, model.prices),
        floor=floor,
        reports=out_reports,
    )


def recorded_summary(session: Session, prices: Prices | None) -> dict[str, Any]:
    """:func:`recorded_usage` as JSON data."""
    return recorded_usage(session, prices).to_json()


def recorded_usage(session: Session, prices: Prices | None) -> RecordedUsage:
    """The session as its agent ran it, from the usage its log records, priced at
    ``prices`` (the simulated model's, so that it compares with the replays): ``requests``
    (every assistant message, the agent's own compaction calls included) and how many
    record usage, the input, output and ``cost_usd`` over them (None without usage or
    prices), ``request_costs_usd`` per replayed request (request ``i`` at ``i - 1``; a
    compaction call of the agent is billed with the request that followed it; None where
    the log has no usage), and ``compactions``: the replayed requests the agent's own
    compactions came before. Cache writes are priced at the 5-minute rate (logs do not
    say the bucket)."""
    kept = {m.id for m in without_recorded_compactions(session).messages}
    costs: list[float | None] = []
    compactions: list[int] = []
    pending: float | None = None  # a dropped compaction call, billed with the next request
    pending_mark = False
    requests = with_usage = total_in = total_out = 0
    for msg in session.messages:
        if msg.id not in kept:
            pending_mark = pending_mark or compaction_part(msg) is not None or msg.summary
        if msg.role != "assistant":
            continue
        requests += 1
        usd = _recorded_cost(msg, prices)
        rec = recorded_input(msg)
        if rec is not None:
            with_usage += 1
            total_in += rec
            total_out += _output(msg)
        if msg.id not in kept:
            pending = None if usd is None and pending is None else (pending or 0.0) + (usd or 0.0)
            continue
        if pending_mark:
            compactions.append(len(costs) + 1)
            pending_mark = False
        if pending is not None:
            usd, pending = (usd or 0.0) + pending, None
        costs.append(usd)
    known = [c for c in costs if c is not None]
    if pending is not None:  # the log ends on a compaction call
        known.append(pending)
    return RecordedUsage(
        requests=requests,
        with_usage=with_usage,
        input=total_in,
        output=total_out,
        cost_usd=sum(known) if known and prices is not None else None,
        request_costs_usd=costs if known and prices is not None else None,
        compactions=compactions,
    )


def _recorded_cost(msg: Message, prices: Prices | None) -> float | None:
    t = msg.tokens
    if t is None or prices is None or recorded_input(msg) is None:
        return None
    split = CacheStep(t.input + t.cache.read + t.cache.write, t.cache.read, t.cache.write)
    return step_cost(prices, split, t.output + t.reasoning)


@dataclass(frozen=True)
class SessionJob:
    """One session file simulated under the same policies, as a picklable callable: a
    corpus run sends it to worker processes (or a Dask cluster), which compile the
    policies themselves (a compiled plan holds closures and does not travel) under the
    read roots given here (a worker does not inherit the caller's)."""

    policies: tuple[str, ...]
    model: ModelInfo
    config: Mapping[str, Any] = field(default_factory=dict)
    read_roots: tuple[str, ...] = ()
    calibrate: bool = False
    declared: Calibration | None = None
    lookback: int | None = 20
    seconds_per_step: float | None = None
    steps: bool = True
    run: int | None = None

    def __call__(self, path: Path) -> SessionDocument:
        from kilo_rules.engine.base.sandbox import allow_read
        from kilo_rules.engine.compiler.compile import compile_policy
        from kilo_rules.engine.importers import read_session

        with allow_read(self.read_roots):
            plans = [compile_policy(p, self.model, config=dict(self.config)) for p in self.policies]
            # In a worker nobody sees a warning: which run of a multi-run log was read
            # travels back as one of the document's notes.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", MultipleRunsWarning)
                session = read_session(path, run=self.run)
            for w in caught:
                if not isinstance(w.message, MultipleRunsWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            doc = build_session_document(
                session,
                plans,
                name=str(path),
                calibrate=self.calibrate,
                declared=self.declared,
                lookback=self.lookback,
                seconds_per_step=self.seconds_per_step,
                steps=self.steps,
            )
            runs = [w.message for w in caught if isinstance(w.message, MultipleRunsWarning)]
            notes = [*(_run_note(w) for w in runs), *doc.notes]
            return doc.model_copy(update={"notes": notes}) if runs else doc


def _run_note(w: MultipleRunsWarning) -> str:
    what = f" ({w.instance})" if w.instance else ""
    return (
        f"{w.file} holds {w.runs} runs (one per line); run {w.run}{what} was replayed; "
        f"replay another alone with --session {w.file} --run N (0–{w.runs - 1})"
    )
