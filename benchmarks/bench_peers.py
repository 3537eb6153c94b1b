"""Per-step cost and correctness against LiteLLM's and LangChain's ``trim_messages``.

Run with ``python benchmarks/bench_peers.py [--windows 16000,32000,64000,100000]
[--sessions 3] [--steps 6] [--counter tiktoken|estimate] [--policy long-run] [session ...]``
after ``pip install -e '.[bench]'``. The sessions default to the largest recorded
trajectories in ``../shared/data/trajectories`` (their recorded compactions dropped, as
bench_runtime does). For each window every session is replayed step by step (a step is the
history up to an assistant message) three ways:

* kilo-rules: one :class:`Runtime` across the steps, the way an agent uses it, on
  ``long-run`` (see :data:`DEFAULT_POLICY`) compiled for a catalog model whose
  ``limits.context`` is the window (and ``tokens.counter: tiktoken:cl100k_base`` unless
  ``--counter estimate``). The session it sees is the one its own previous steps left
  (pruned and compacted), plus the recorded message; its step includes any prune or
  compaction it runs;
* LiteLLM ``litellm.utils.trim_messages(model="gpt-4")`` (tiktoken ``cl100k_base``);
* LangChain ``langchain_core.messages.trim_messages`` (strategy ``last``, the system
  message kept, starting on a human or an assistant message: see
  :data:`LANGCHAIN_START_ON`) with a tiktoken counter.

The peers get the full history in OpenAI chat form (LangChain's messages built from it),
with kilo's system prompt first, and a budget of window - output cap - the tool definitions
they do not see. Their conversion is not timed: an agent keeps its history in that form.
Kilo runs every step (its state carries over); the peers run on ``--steps`` steps spread
evenly over each session, and all medians are over those same steps.

Per window the report gives the median ms per step of each, the ratio peer / kilo-rules
(target >= 10x; on the steps both ran, should kilo-rules stop early), how many requests are
over budget (each request counted with tiktoken the same way for all three — system,
messages, tool calls and results, tool definitions — against window - output cap),
orphans (a tool result without its call or a call without its result) and the median
request size (what each kept of the history). Timings of one run on a shared machine:
compare runs with ``farm-bench``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

# LiteLLM fetches its model map from the network at import unless told otherwise.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from kilo_rules.engine.base.errors import KiloRulesError, MultipleRunsWarning
from kilo_rules.engine.compiler import compile as compile_module
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import model_from_data
from kilo_rules.engine.formats.request import Text
from kilo_rules.engine.formats.session import (
    Session,
    TextPart,
    TokenUsage,
    ToolPart,
)
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import run
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.facade import Runtime
from kilo_rules.engine.text.tokens import TiktokenCounter
from kilo_rules.tools.simulation.simulate import without_recorded_compactions

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"
WINDOWS = (16_000, 32_000, 64_000, 100_000)
TARGET = 10.0
#: LiteLLM's tokenizer for this model is tiktoken cl100k_base, the encoding counted here.
LITELLM_MODEL = "gpt-4"
#: The recorded sessions are single-prompt autonomous runs: one user turn, where
#: kilo-default's three compactions per turn end them early. long-run is the bundled
#: policy for them (``--policy kilo-default`` measures the other).
DEFAULT_POLICY = "long-run"
#: LangChain's documentation has trimmed histories start on a human message; an agent
#: session has one human message and then only assistant and tool messages, so that alone
#: keeps nothing but the system prompt once trimming starts. A history may also start on
#: an assistant message (its tool results follow it), which keeps every pair whole.
LANGCHAIN_START_ON = ("human", "ai")
DEFAULT_STEPS = 6


def output_cap(window: int) -> int:
    """The output tokens reserved in a window: a quarter of it, at most 8,192."""
    return min(8_192, window // 4)


def model_for(window: int) -> dict[str, Any]:
    """bench_runtime's catalog model with ``window`` as its context."""
    return {
        "id": "bench/claude",
        "provider": "anthropic",
        "family": "claude",
        "api_id": "claude-bench",
        "api": "anthropic",
        "limits": {"context": window, "output": output_cap(window)},
        "cache": {"kind": "explicit", "max_breakpoints": 4, "min_cacheable_tokens": 1024},
    }


def plan_for(window: int, counter: str, policy_dir: Path, base: str = DEFAULT_POLICY) -> Plan:
    """``base`` (a policy name or file) for a ``window``-token model, counting with
    ``counter``."""
    policy = policy_dir / "bench.yaml"
    spec = "tiktoken:cl100k_base" if counter == "tiktoken" else "estimate"
    if _is_file(base):
        # A policy reads files only from its own folder: a copy beside the bench policy.
        copy = policy_dir / "base.yaml"
        copy.write_text(Path(base).read_text(encoding="utf-8"), encoding="utf-8")
        base = "./base.yaml"
    policy.write_text(
        f"version: 1\nname: bench\nextends: {json.dumps(base)}\ntokens: {{counter: '{spec}'}}\n",
        encoding="utf-8",
    )
    compile_module.clear_cache()
    return compile_policy(policy, model_from_data(model_for(window)))


def _is_file(policy: str) -> bool:
    """Whether ``policy`` names a file rather than a bundled policy."""
    return "/" in policy or policy.endswith((".yaml", ".yml"))


# --- one tiktoken measure for every request -------------------------------------------


class Measure:
    """Tokens of a request as OpenAI's chat format counts them (3 per message and 3 to
    prime the reply, plus the role and every text, tool call and tool result), with the
    tool definitions (name, description, JSON schema) added. One measure for all three
    results, so that "over budget" means the same for each."""

    def __init__(self) -> None:
        self._counter = TiktokenCounter("cl100k_base")

    def text(self, text: str) -> int:
        """Tokens of one text."""
        return self._counter.count(text) if text else 0

    def tools(self, tools: Sequence[dict[str, Any]]) -> int:
        """Tokens of the tool definitions."""
        return sum(
            self.text(str(t.get("name", "")))
            + self.text(str(t.get("description", "")))
            + self.text(json.dumps(t.get("input_schema", {}), ensure_ascii=False))
            for t in tools
        )

    def openai(self, messages: Sequence[dict[str, Any]]) -> int:
        """Tokens of OpenAI chat messages."""
        n = 3
        for m in messages:
            n += 3 + self.text(m["role"]) + self.text(_content_text(m.get("content")))
            for call in m.get("tool_calls") or ():
                fn = call["function"]
                n += self.text(fn["name"]) + self.text(fn["arguments"])
        return n

    def langchain(self, messages: Sequence[Any]) -> int:
        """Tokens of LangChain messages (the counter handed to its ``trim_messages``)."""
        n = 3
        for m in messages:
            n += 3 + self.text(m.type) + self.text(_content_text(m.content))
            for call in getattr(m, "tool_calls", None) or ():
                n += self.text(call["name"]) + self.text(json.dumps(call["args"]))
        return n

    def anthropic(self, request: dict[str, Any]) -> int:
        """Tokens of an Anthropic Messages body: system, messages, tools."""
        n = 3
        system = request.get("system")
        if system:
            n += 3 + self.text("system") + self.text(_content_text(system))
        for m in request.get("messages", ()):
            n += 3 + self.text(m["role"])
            content = m["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for b in blocks:
                kind = b.get("type")
                if kind == "text":
                    n += self.text(b["text"])
                elif kind == "thinking":
                    n += self.text(b.get("thinking", ""))
                elif kind == "tool_use":
                    n += self.text(b["name"]) + self.text(json.dumps(b.get("input", {})))
                elif kind == "tool_result":
                    n += self.text(_content_text(b.get("content")))
        return n + self.tools(request.get("tools", ()))


def _content_text(content: Any) -> str:
    """The text of a message content: a string, or the texts of its blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        b if isinstance(b, str) else str(b.get("text", ""))
        for b in content
        if isinstance(b, str) or b.get("type") == "text"
    )


# --- orphans ---------------------------------------------------------------------------


def _unpaired(calls: list[str], results: list[str]) -> int:
    have_calls, have_results = set(calls), set(results)
    return sum(1 for c in calls if c not in have_results) + sum(
        1 for r in results if r not in have_calls
    )


def orphans_openai(messages: Sequence[dict[str, Any]]) -> int:
    """Tool calls without their result and results without their call."""
    calls = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    return _unpaired(calls, results)


def orphans_langchain(messages: Sequence[Any]) -> int:
    """:func:`orphans_openai` for LangChain messages."""
    calls = [c["id"] for m in messages for c in getattr(m, "tool_calls", None) or ()]
    results = [m.tool_call_id for m in messages if m.type == "tool"]
    return _unpaired(calls, results)


def orphans_anthropic(request: dict[str, Any]) -> int:
    """:func:`orphans_openai` for an Anthropic Messages body."""
    calls: list[str] = []
    results: list[str] = []
    for m in request.get("messages", ()):
        if isinstance(m["content"], str):
            continue
        for b in m["content"]:
            if b.get("type") == "tool_use":
                calls.append(b["id"])
            elif b.get("type") == "tool_result":
                results.append(b["tool_use_id"])
    return _unpaired(calls, results)


# --- the sessions in the peers' chat form -------------------------------------------------


def to_openai(session: Session) -> tuple[list[dict[str, Any]], list[int]]:
    """``session``'s messages as OpenAI chat messages (reasoning left out: the chat format
    has no place for it), and for each session message the index of its first chat
    message, so that the history before message ``i`` is ``chat[: starts[i]]``."""
    chat: list[dict[str, Any]] = []
    starts: list[int] = []
    for m in session.messages:
        starts.append(len(chat))
        texts = [p.text for p in m.parts if isinstance(p, TextPart) and not p.ignored]
        tools = [p for p in m.parts if isinstance(p, ToolPart)]
        if m.role == "user":
            if texts:
                chat.append({"role": "user", "content": "\n".join(texts)})
            continue
        if not texts and not tools:
            continue
        msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if tools:
            msg["tool_calls"] = [
                {
                    "id": p.call_id,
                    "type": "function",
                    "function": {
                        "name": p.tool,
                        "arguments": json.dumps(p.input, ensure_ascii=False),
                    },
                }
                for p in tools
            ]
        chat.append(msg)
        for p in tools:
            out = p.output if p.status == "completed" else (p.error or "[tool interrupted]")
            chat.append({"role": "tool", "tool_call_id": p.call_id, "content": out})
    starts.append(len(chat))
    return chat, starts


def to_langchain(chat: Sequence[dict[str, Any]]) -> list[Any]:
    """OpenAI chat messages as LangChain messages."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    for m in chat:
        role = m["role"]
        if role == "system":
            out.append(SystemMessage(m["content"]))
        elif role == "user":
            out.append(HumanMessage(m["content"]))
        elif role == "tool":
            out.append(ToolMessage(m["content"], tool_call_id=m["tool_call_id"]))
        else:
            calls = [
                {
                    "name": c["function"]["name"],
                    "args": json.loads(c["function"]["arguments"]),
                    "id": c["id"],
                    "type": "tool_call",
                }
                for c in m.get("tool_calls") or ()
            ]
            out.append(AIMessage(m["content"], tool_calls=calls))
    return out


@dataclass
class Prepared:
    """One recorded session, ready to replay: its compactions dropped, its chat form."""

    name: str
    session: Session
    chat: list[dict[str, Any]]
    starts: list[int]
    assistants: list[int]  # indices of its assistant messages: one step each

    @classmethod
    def load(cls, path: Path) -> Prepared:
        """Read ``path`` with the importers and build the chat form."""
        with warnings.catch_warnings():
            # A log of several runs: its first run (read_session says which in the warning).
            warnings.simplefilter("ignore", MultipleRunsWarning)
            session = without_recorded_compactions(read_session(path))
        chat, starts = to_openai(session)
        assistants = [i for i, m in enumerate(session.messages) if m.role == "assistant"]
        return cls(path.name, session, chat, starts, assistants)

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The session's tools as the measure reads them."""
        return [t.model_dump() for t in self.session.tools]


def sampled(n: int, k: int) -> list[int]:
    """``k`` of ``range(n)`` spread evenly, the first and the last included."""
    if k >= n:
        return list(range(n))
    if k <= 1:
        return [n - 1]
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of one call, after a collection so that no leftover garbage of
    another step is charged to it."""
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


# --- per window ------------------------------------------------------------------------


@dataclass
class Tally:
    """One contender over the sampled steps of one or more sessions."""

    #: seconds per step, by (session, message index) so that ratios compare the same steps
    times: dict[tuple[str, int], float] = field(default_factory=dict)
    over: int = 0
    orphans: int = 0
    #: tokens of each request: how much of the history the budget let it keep
    tokens: list[int] = field(default_factory=list)

    def add(
        self, step: tuple[str, int], seconds: float, tokens: int, budget: int, orphans: int
    ) -> None:
        """Count one request: its time, whether it is over ``budget``, its orphans."""
        self.times[step] = seconds
        self.tokens.append(tokens)
        self.over += int(tokens > budget)
        self.orphans += orphans

    def merge(self, other: Tally) -> None:
        """Add ``other``'s steps to these."""
        self.times.update(other.times)
        self.tokens += other.tokens
        self.over += other.over
        self.orphans += other.orphans

    @property
    def median_ms(self) -> float:
        """Median time per step, in ms."""
        return self.median_of(self.times)

    @property
    def median_tokens(self) -> int:
        """Median size of its requests, in tokens."""
        return int(statistics.median(self.tokens)) if self.tokens else 0

    def median_of(self, steps: Iterable[tuple[str, int]]) -> float:
        """Median time of ``steps`` (those of them this contender ran), in ms."""
        times = [self.times[k] for k in steps if k in self.times]
        return statistics.median(times) * 1e3 if times else float("nan")


@dataclass
class WindowReport:
    """One window over one session (or, merged, over several)."""

    window: int
    session: str
    steps: int  # assistant messages replayed by kilo-rules
    sampled: int  # of which measured (kilo-rules: those before it stopped, if it did)
    kilo: Tally = field(default_factory=Tally)
    litellm: Tally = field(default_factory=Tally)
    langchain: Tally = field(default_factory=Tally)
    compactions: int = 0
    error: str | None = None  # why kilo-rules stopped early, if it did

    def ratio(self, peer: Tally) -> float:
        """``peer``'s median step over kilo-rules', on the steps both ran (kilo-rules
        may have stopped early)."""
        both = self.kilo.times.keys() & peer.times.keys()
        return peer.median_of(both) / self.kilo.median_of(both)

    def merge(self, other: WindowReport) -> None:
        """Fold ``other`` (the same window, another session) into this one."""
        self.steps += other.steps
        self.sampled += other.sampled
        self.kilo.merge(other.kilo)
        self.litellm.merge(other.litellm)
        self.langchain.merge(other.langchain)
        self.compactions += other.compactions
        if other.error:
            self.error = f"{self.error}; {other.error}" if self.error else other.error


def run_window(
    prepared: Prepared,
    window: int,
    *,
    steps: int = DEFAULT_STEPS,
    counter: str = "tiktoken",
    policy: str = DEFAULT_POLICY,
    measure: Measure | None = None,
) -> WindowReport:
    """Replay ``prepared`` under a ``window``-token budget with all three contenders."""
    from langchain_core.messages import trim_messages as lc_trim
    from litellm.utils import trim_messages as litellm_trim

    measure = measure or Measure()
    budget = window - output_cap(window)
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_for(window, counter, Path(tmp), policy)
    runtime = Runtime(plan)
    session = prepared.session
    system = "\n".join(
        p.text
        for m in run(plan, session, StepInput(), until="system").system
        for p in m.parts
        if isinstance(p, Text)
    )
    chat = [{"role": "system", "content": system}, *prepared.chat]
    lc_chat = to_langchain(chat)
    # The peers trim messages only: the tool definitions the request also carries come
    # out of their budget first.
    tools = measure.tools(prepared.tool_definitions())
    peer_budget = budget - tools
    picked = {prepared.assistants[j] for j in sampled(len(prepared.assistants), steps)}
    report = WindowReport(window, prepared.name, 0, len(picked))

    # kilo-rules first: every step, since each starts from the session the last one left.
    live = session.model_copy(update={"messages": []})
    for i, msg in enumerate(session.messages):
        if msg.role != "assistant":
            live = live.model_copy(update={"messages": [*live.messages, msg]})
            continue
        try:
            seconds, result = timed(partial(runtime.step, live))
        except KiloRulesError as exc:  # a policy that cannot go on is a finding, not a crash
            report.error = f"{prepared.name}: kilo-rules stopped at message {i}: {exc}"
            break
        report.steps += 1
        report.compactions += result.compactions
        if i in picked:
            request = result.request
            report.kilo.add(
                (prepared.name, i),
                seconds,
                measure.anthropic(request),
                budget,
                orphans_anthropic(request),
            )
        # The provider's usage for the request kilo-rules built, as an agent would record it.
        usage = TokenUsage(
            input=result.input_tokens,
            output=msg.tokens.output if msg.tokens else 0,
            reasoning=msg.tokens.reasoning if msg.tokens else 0,
        )
        answered = msg.model_copy(update={"tokens": usage})
        live = result.session.model_copy(update={"messages": [*result.session.messages, answered]})

    for i in sorted(picked):
        history = chat[: 1 + prepared.starts[i]]
        seconds, trimmed = timed(
            partial(litellm_trim, history, model=LITELLM_MODEL, max_tokens=peer_budget)
        )
        report.litellm.add(
            (prepared.name, i),
            seconds,
            measure.openai(trimmed) + tools,
            budget,
            orphans_openai(trimmed),
        )
        lc_history = lc_chat[: 1 + prepared.starts[i]]
        # partial() picks the overload without messages, which returns a Runnable.
        seconds, out = timed(
            partial(
                lc_trim,
                lc_history,
                max_tokens=peer_budget,
                token_counter=measure.langchain,
                strategy="last",
                include_system=True,
                start_on=LANGCHAIN_START_ON,
                allow_partial=False,
            )
        )
        kept = cast("list[Any]", out)
        report.langchain.add(
            (prepared.name, i),
            seconds,
            measure.langchain(kept) + tools,
            budget,
            orphans_langchain(kept),
        )
    return report


def run_windows(
    sessions: Sequence[Prepared],
    windows: Sequence[int] = WINDOWS,
    *,
    steps: int = DEFAULT_STEPS,
    counter: str = "tiktoken",
    policy: str = DEFAULT_POLICY,
    progress: Callable[[WindowReport], None] | None = None,
) -> list[WindowReport]:
    """One merged report per window, over all ``sessions``."""
    measure = Measure()
    out = []
    for window in windows:
        merged = WindowReport(window, "all", 0, 0)
        for prepared in sessions:
            one = run_window(
                prepared, window, steps=steps, counter=counter, policy=policy, measure=measure
            )
            if progress is not None:
                progress(one)
            merged.merge(one)
        out.append(merged)
    return out


# --- the report ------------------------------------------------------------------------


def largest_sessions(n: int) -> list[Path]:
    """The ``n`` largest recorded trajectories."""
    files = [p for p in TRAJECTORIES.iterdir() if p.is_file() and p.suffix != ".md"]
    return sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:n]


HEADER = (
    f"{'window':>7} {'session':<44} {'steps':>7} {'kilo ms':>8} {'litellm ms':>10} "
    f"{'x':>6} {'langchain ms':>12} {'x':>6}  over k/li/lc  orphans k/li/lc  compactions  "
    "tokens k/li/lc"
)


def row(r: WindowReport) -> str:
    """One line of the table."""
    return (
        f"{r.window:>7} {r.session[:44]:<44} {f'{len(r.kilo.times)}/{r.sampled}':>7} "
        f"{r.kilo.median_ms:>8.2f} "
        f"{r.litellm.median_ms:>10.2f} {r.ratio(r.litellm):>5.1f}x "
        f"{r.langchain.median_ms:>12.2f} {r.ratio(r.langchain):>5.1f}x  "
        f"{r.kilo.over:>4}/{r.litellm.over}/{r.langchain.over}"
        f"  {r.kilo.orphans:>7}/{r.litellm.orphans}/{r.langchain.orphans}"
        f"  {r.compactions:>11}  "
        f"{r.kilo.median_tokens}/{r.litellm.median_tokens}/{r.langchain.median_tokens}"
    )


def verdict(r: WindowReport) -> str:
    """Whether the window meets the done-when row: >= 10x both peers, kilo-rules with no
    request over budget and no orphan."""
    fast = min(r.ratio(r.litellm), r.ratio(r.langchain)) >= TARGET
    clean = r.kilo.over == 0 and r.kilo.orphans == 0 and r.error is None
    return "ok" if fast and clean else "MISSED"


def main(argv: Sequence[str]) -> int:
    """Print the table; 0 when every window meets the target, 1 otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("sessions", nargs="*", type=Path, help="session files (default: largest)")
    ap.add_argument("--sessions", dest="count", type=int, default=3, help="how many largest")
    ap.add_argument("--windows", default=",".join(str(w) for w in WINDOWS))
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps measured per session")
    ap.add_argument("--counter", choices=("tiktoken", "estimate"), default="tiktoken")
    ap.add_argument("--policy", default=DEFAULT_POLICY, help="policy the bench policy extends")
    args = ap.parse_args(list(argv))
    try:
        import langchain_core  # noqa: F401
        import litellm  # noqa: F401
    except ImportError as exc:
        print(f"bench_peers needs the bench extra (pip install -e '.[bench]'): {exc}")
        return 2
    policy = str(Path(args.policy).resolve()) if _is_file(args.policy) else args.policy
    paths = args.sessions or largest_sessions(args.count)
    windows = [int(w) for w in args.windows.split(",")]
    sessions = [Prepared.load(p) for p in paths]
    for s in sessions:
        print(
            f"session {s.name}: {len(s.session.messages)} messages, "
            f"{len(s.assistants)} steps, {min(args.steps, len(s.assistants))} measured"
        )
    print(
        f"kilo-rules: {policy}, counter {args.counter}; peers: LiteLLM "
        f"trim_messages(model={LITELLM_MODEL!r}), LangChain trim_messages(strategy='last', "
        f"start_on={LANGCHAIN_START_ON}, tiktoken cl100k_base); output cap "
        "min(8192, window/4); ratio = peer median / kilo-rules median (target >= 10x)"
    )
    print(HEADER)
    reports = run_windows(
        sessions,
        windows,
        steps=args.steps,
        counter=args.counter,
        policy=policy,
        progress=lambda r: print(row(r) + (f"\n        {r.error}" if r.error else ""), flush=True),
    )
    print("-" * len(HEADER))
    ok = True
    for r in reports:
        v = verdict(r)
        ok = ok and v == "ok"
        print(f"{row(r)}  {v}")
        if r.error:
            print(f"        {r.error}")
    print(f"command: python benchmarks/bench_peers.py {' '.join(argv)}".rstrip())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
