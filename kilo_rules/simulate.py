"""Replaying a recorded session under one or more plans, and what each would have cost.

:func:`simulate` grows the recorded session message by message under each plan, with the
:class:`~kilo_rules.runtime.facade.Runtime` (compaction included). Before each recorded
assistant message it builds the request the agent would have sent; the message is then
appended with the usage a provider would have reported *for that request* — the input
split into uncached, cache-read and cache-written tokens by
:class:`~kilo_rules.cachesim.CacheSimulator`, plus the recorded output — because the
recorded usage belongs to the original context, not to the one the plan built. A request
larger than the model's window is rejected the way a provider would
(:meth:`Runtime.overflowed`) and the step is retried after compaction.

Every plan is measured with the same counter (tiktoken ``cl100k_base``, offline) on the
rendered wire body, so reports compare even when the plans count differently. Compactions
that the original agent recorded (its own summary request and summary) are dropped first:
each plan decides for itself where to compact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .cachesim import Block, CacheSimulator, CacheStep, blocks
from .catalog import Prices
from .errors import ContextOverflowError, Diagnostic
from .plan import Plan
from .runtime.facade import Runtime, StepResult
from .runtime.history import compaction_part, completed_compactions
from .runtime.measure import messages_json
from .session import CacheTokens, Message, Session, TokenUsage
from .summarize import Summarizer, SummaryRequest
from .tokens import CountCache, TokenCounter, counter_for

__all__ = [
    "ReplayStep",
    "SimulationReport",
    "SimulationStep",
    "default_counter",
    "replay",
    "simulate",
    "step_cost",
    "without_recorded_compactions",
]

#: The counter every plan is measured with unless the caller passes another.
COUNTER_SPEC = "tiktoken:cl100k_base"

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

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the step."""
        c = self.cache
        return {
            "index": self.index,
            "message_id": self.message_id,
            "input": c.input,
            "cache_read": c.read,
            "cache_write_5m": c.write_5m,
            "cache_write_1h": c.write_1h,
            "uncached": c.uncached,
            "output": self.output,
            "compactions": self.compactions,
            "provider_overflows": self.provider_overflows,
            "markers": self.markers,
            "cost_usd": self.cost,
        }


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
    requests_total: int = 0  # the requests the recorded session made

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

    def to_json(self, *, steps: bool = True) -> dict[str, Any]:
        """Stable JSON shape of the report; ``steps=False`` leaves out per-step detail."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "model": self.model,
            "counter": self.counter,
            "requests": len(self.steps),
            "requests_total": self.requests_total,
            "stopped": self.stopped,
            "compactions": self.compactions,
            "provider_overflows": self.provider_overflows,
            "input": self.input,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "cache_write_5m": self._sum("write_5m"),
            "cache_write_1h": self._sum("write_1h"),
            "uncached": self.uncached,
            "output": self.output,
            "summary_input": self.summary_input,
            "summary_output": self.summary_output,
            "max_request": self.max_request,
            "window": self.window,
            "cost_usd": self.cost,
            "error": self.error,
        }
        if steps:
            out["steps"] = [s.to_json() for s in self.steps]
        return out


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


class _Metered:
    """A summarizer that counts what a model would be sent and would write."""

    def __init__(self, inner: Summarizer, count: TokenCounter) -> None:
        self.inner = inner
        self.count = count
        self.input = 0
        self.output = 0

    def summarize(self, request: SummaryRequest) -> str:
        text = self.inner.summarize(request)
        self.input += self.count.count(request.instruction)
        self.input += self.count.count(messages_json(request.messages))
        self.output += self.count.count(text)
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


class _Replay:
    """One plan over one session (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        summarizer: Summarizer,
        counter: TokenCounter,
        cache: CacheSimulator,
    ) -> None:
        m = plan.model
        self.plan = plan
        self.counter = counter
        self.metered = _Metered(summarizer, counter)
        self.runtime = Runtime(plan, self.metered)
        self.cache = cache
        self.window = m.limits.input or m.limits.context

    def _build(self, live: Session) -> tuple[StepResult, list[Block], int]:
        """The request for the next step, retried while the provider would reject it."""
        result = self.runtime.step(live)
        overflows = 0
        seq = blocks(result.request, self.counter.count)
        while sum(b.tokens for b in seq) > self.window:
            if overflows >= MAX_OVERFLOW_RETRIES:
                raise ContextOverflowError(
                    Diagnostic(
                        "simulate.overflow-retries",
                        f"the request still exceeds the {self.window:,}-token window after "
                        f"{overflows} provider overflows and compactions",
                    )
                )
            overflows += 1
            self.runtime.overflowed(result.session)
            again = self.runtime.step(result.session)
            result = StepResult(
                again.request,
                [*result.decisions, *again.decisions],
                [*result.mutations, *again.mutations],
                again.session,
                again.turn,
                result.compactions + again.compactions,
            )
            seq = blocks(result.request, self.counter.count)
        return result, seq, overflows

    def steps(self, original: Session) -> Iterator[ReplayStep]:
        """Every recorded assistant message of ``original``, replayed in order. Raises
        :class:`ContextOverflowError` when a step cannot be brought under the window."""
        from .providers import count_markers

        live = original.model_copy(update={"messages": []})
        for msg in original.messages:
            if msg.role != "assistant":
                live = live.model_copy(update={"messages": [*live.messages, msg]})
                continue
            result, seq, overflows = self._build(live)
            split = self.cache.step(seq)
            markers = count_markers(result.request, result.turn.provider)
            yield ReplayStep(msg, live, result, seq, split, result.compactions, overflows, markers)
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
        out.requests_total = sum(1 for m in original.messages if m.role == "assistant")
        try:
            for step in self.steps(original):
                output = _output(step.message)
                out.compactions += step.compactions
                out.provider_overflows += step.overflows
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
                    )
                )
        except ContextOverflowError as exc:
            out.error = exc.diagnostics[0].message if exc.diagnostics else str(exc)
        out.summary_input = self.metered.input
        out.summary_output = self.metered.output
        return out


def replay(
    plan: Plan,
    session: Session,
    *,
    summarizer: Summarizer | None = None,
    counter: TokenCounter | None = None,
    lookback: int | None = 20,
    seconds_per_step: float | None = None,
) -> Iterator[ReplayStep]:
    """The steps :func:`simulate` takes for one plan, one at a time (its recorded
    compactions dropped first), for tools that look at each request: the same requests,
    the same compactions, the same cache model."""
    return _replay_for(plan, summarizer, counter, lookback, seconds_per_step).steps(
        without_recorded_compactions(session)
    )


def _replay_for(
    plan: Plan,
    summarizer: Summarizer | None,
    counter: TokenCounter | None,
    lookback: int | None,
    seconds_per_step: float | None,
) -> _Replay:
    if summarizer is None:
        from .summarizers import ExtractiveSummarizer

        summarizer = ExtractiveSummarizer()
    cache = CacheSimulator(
        plan.model.cache.kind,
        plan.model.cache.min_cacheable_tokens,
        lookback=lookback,
        seconds_per_step=seconds_per_step,
    )
    return _Replay(plan, summarizer, counter or default_counter(), cache)


def simulate(
    session: Session,
    plans: Sequence[Plan],
    *,
    summarizer: Summarizer | None = None,
    counter: TokenCounter | None = None,
    lookback: int | None = 20,
    seconds_per_step: float | None = None,
) -> list[SimulationReport]:
    """Replay ``session`` under each plan; one report per plan, in order.

    ``summarizer`` writes the summaries of compactions (default: the offline extractive
    one, so a simulation is deterministic). ``counter`` measures every request (default:
    :func:`default_counter`). ``lookback`` and ``seconds_per_step`` tune the cache model
    (see :mod:`kilo_rules.cachesim`). A plan whose compaction is exhausted stops early and
    says why in :attr:`SimulationReport.error`.
    """
    original = without_recorded_compactions(session)
    return [
        _replay_for(plan, summarizer, counter, lookback, seconds_per_step).run(original)
        for plan in plans
    ]
