"""Writing the summary of a compaction's head: one request, or chunks and a reduce.

Also here: the summary input's lowering settings, the instruction (new or rolling update,
plus the policy's template file) and the drift report of a rolling update.

Kilo sends the whole head to the summarizer in one request unless that request would not
fit the model (``compaction-chunks.ts``, spec §7.5): the need test is
``ceil(estimate(headJSON) × factor) + out' > usable(model')`` where ``model'`` is the same
model with its output limited to ``chunking.output_max``. Then the head is split into
chunks of ``max(min_budget, floor(usable' × budget_ratio))`` tokens, each chunk is
summarised (``parallel`` at a time) and the chunk summaries are merged by a reduce of depth
at most ``max_reduce_depth``. A single-shot summary that the provider rejects as too long
(:class:`~kilo_rules.engine.summarizers.protocol.SummarizerError` with ``overflow=True``) takes the
same path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.cancel import checkpoint
from kilo_rules.engine.compiler.plan import ChunkModel
from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    Part,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.runtime.measure import messages_json
from kilo_rules.engine.summarizers.protocol import Summarizer, SummarizerError, SummaryRequest
from kilo_rules.engine.text.tokens import count_joined
from kilo_rules.engine.text.truncate import truncate_for_summary

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan

Count = Callable[[str], int]

#: How chunk summaries are handed to a merge request (engine wording, not a policy knob).
MERGE_ITEM = '<partial-summary part="{index}" of="{total}">\n{text}\n</partial-summary>'


@dataclass(frozen=True, slots=True)
class ChunkSettings:
    """``compaction.chunking.*`` of the plan."""

    enabled: bool
    budget_ratio: float
    min_budget: int
    parallel: int
    max_reduce_depth: int
    clip_text_chars: int
    clip_tool_chars: int
    factor: float  # tokens.preflight_factor: the need test scales the estimate like preflight

    @classmethod
    def from_plan(cls, plan: Plan) -> ChunkSettings:
        """Read every knob from the plan."""
        c = plan.settings.compaction.chunking
        return cls(
            enabled=c.enabled,
            budget_ratio=c.budget_ratio,
            min_budget=c.min_budget,
            parallel=c.parallel,
            max_reduce_depth=c.max_reduce_depth,
            clip_text_chars=c.clip_text_chars,
            clip_tool_chars=c.clip_tool_chars,
            factor=plan.settings.tokens.preflight_factor,
        )


#: Kilo's ``model'`` for chunked compaction (decided at compile: ``Plan.chunk_model``).
SmallModel = ChunkModel


def small_model(plan: Plan) -> SmallModel:
    """Chunked compaction's ``model'``, as the plan compiled it."""
    if plan.chunk_model is None:
        raise ValueError("chunked compaction is off in this plan (compaction.chunking.enabled)")
    return plan.chunk_model


def message_jsons(messages: Sequence[ModelMessage]) -> list[str]:
    """Each message's part of :func:`messages_json` (which joins them with commas inside
    brackets)."""
    return [messages_json([m])[1:-1] for m in messages]


def list_count(jsons: Sequence[str], count: Count) -> int:
    """``count(messages_json(messages))`` from the messages' own JSON (``jsons``): the
    counter puts a list together from its members where it can (an estimate, cached
    tiktoken: :func:`~kilo_rules.engine.text.tokens.count_joined`), so a message's JSON is
    tokenized once however many lists hold it."""
    parts = ["["]
    for k, text in enumerate(jsons):
        if k:
            parts.append(",")
        parts.append(text)
    parts.append("]")
    return count_joined(count, parts)


def needed(
    messages: Sequence[ModelMessage],
    model: SmallModel,
    factor: float,
    count: Count,
    jsons: Sequence[str] | None = None,
) -> bool:
    """Whether the head cannot be summarised in one request of ``model'`` (``jsons``: the
    messages' :func:`message_jsons`, when already made)."""
    jsons = message_jsons(messages) if jsons is None else jsons
    tokens = math.ceil(list_count(jsons, count) * factor)
    return tokens + model.output > model.usable


def chunk_budget(settings: ChunkSettings, model: SmallModel) -> int:
    """Tokens per chunk: ``max(min_budget, floor(usable' × budget_ratio))``."""
    return max(settings.min_budget, math.floor(model.usable * settings.budget_ratio))


def _clip(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    cut = limit - 1 if 0xD800 <= ord(text[limit - 1]) <= 0xDBFF else limit
    return f"{text[:cut]}\n[... {len(text) - cut} chars clipped]"


def _clip_part(part: Part, s: ChunkSettings) -> Part:
    if isinstance(part, Text):
        return replace(part, text=_clip(part.text, s.clip_text_chars))
    if isinstance(part, Reasoning):
        return Reasoning(_clip(part.text, s.clip_text_chars))
    if isinstance(part, ToolCall):
        raw = json.dumps(part.input, ensure_ascii=False, separators=(",", ":"))
        if len(raw) <= s.clip_tool_chars:
            return part
        return replace(part, input={"input": truncate_for_summary(raw, s.clip_tool_chars)})
    if isinstance(part, ToolResult):
        content: tuple[Text | Media, ...] = tuple(
            Text(truncate_for_summary(c.text, s.clip_tool_chars)) if isinstance(c, Text) else c
            for c in part.content
        )
        return replace(part, content=content)
    return part


def _units(messages: Sequence[ModelMessage]) -> list[list[int]]:
    """Indices of messages grouped so that a tool call and its results never land in two
    chunks."""
    units: list[list[int]] = []
    for i, m in enumerate(messages):
        if m.role == "tool" and units and messages[units[-1][-1]].role in ("assistant", "tool"):
            units[-1].append(i)
        else:
            units.append([i])
    return units


def split(
    messages: Sequence[ModelMessage],
    budget: int,
    settings: ChunkSettings,
    count: Count,
    jsons: Sequence[str] | None = None,
) -> list[tuple[ModelMessage, ...]]:
    """Greedy chunks of at most ``budget`` tokens (a chunk's size is the sum of its units').

    A unit larger than the budget on its own becomes its own chunk, its texts clipped at
    ``clip_text_chars`` and its tool inputs and outputs at ``clip_tool_chars``.
    ``jsons``: the messages' :func:`message_jsons`, when already made."""
    jsons = message_jsons(messages) if jsons is None else jsons
    chunks: list[tuple[ModelMessage, ...]] = []
    current: list[ModelMessage] = []
    size = 0
    for indices in _units(messages):
        checkpoint()
        unit = [messages[i] for i in indices]
        tokens = list_count([jsons[i] for i in indices], count)
        if tokens > budget:
            if current:
                chunks.append(tuple(current))
                current, size = [], 0
            clipped = [
                replace(m, parts=tuple(_clip_part(p, settings) for p in m.parts)) for m in unit
            ]
            chunks.append(tuple(clipped))
            continue
        if current and size + tokens > budget:
            chunks.append(tuple(current))
            current, size = [], 0
        current.extend(unit)
        size += tokens
    if current:
        chunks.append(tuple(current))
    return chunks


def _map(summarizer: Summarizer, requests: Sequence[SummaryRequest], parallel: int) -> list[str]:
    if len(requests) == 1 or parallel == 1:
        return [summarizer.summarize(r) for r in requests]
    # Threads: summarizers are I/O bound (HTTP); order of the results is the order of chunks.
    with ThreadPoolExecutor(max_workers=min(parallel, len(requests))) as pool:
        return list(pool.map(summarizer.summarize, requests))


def _merge_request(
    base: SummaryRequest, texts: Sequence[str], previous: str | None, update: str
) -> SummaryRequest:
    items = [
        ModelMessage("user", (Text(MERGE_ITEM.format(index=i + 1, total=len(texts), text=t)),))
        for i, t in enumerate(texts)
    ]
    instruction = base.instruction
    if previous is not None:
        instruction = "\n\n".join(
            x for x in (update.replace("{previous}", previous), base.template) if x
        )
    return replace(base, instruction=instruction, messages=tuple(items), previous_summary=previous)


def _groups(texts: Sequence[str], budget: int, count: Count) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for t in texts:
        tokens = count(t)
        if groups[-1] and size + tokens > budget:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += tokens
    return groups


def summarize_chunked(
    base: SummaryRequest,
    *,
    new_request: SummaryRequest,
    update_instruction: str,
    summarizer: Summarizer,
    settings: ChunkSettings,
    model: SmallModel,
    count: Count,
    jsons: Sequence[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Summarise ``base.messages`` in chunks, then reduce. ``new_request`` is the same request
    with the new-summary instruction (chunks are independent of the previous summary; it is
    folded in by the last merge). ``jsons``: the messages' :func:`message_jsons`, when
    already made."""
    budget = chunk_budget(settings, model)
    chunks = split(base.messages, budget, settings, count, jsons)
    one = replace(new_request, max_output_tokens=model.output, previous_summary=None)
    texts = _map(summarizer, [replace(one, messages=c) for c in chunks], settings.parallel)
    previous = base.previous_summary
    depth = 0
    while len(texts) > 1 or (previous is not None and depth == 0):
        if depth >= settings.max_reduce_depth:
            texts = ["\n\n".join(texts)]  # out of depth: keep every partial summary
            break
        groups = _groups(texts, budget, count)
        last = len(groups) == 1
        requests = [
            _merge_request(one, g, previous if last else None, update_instruction) for g in groups
        ]
        texts = _map(summarizer, requests, settings.parallel)
        depth += 1
        if last:
            break
    info = {"chunks": len(chunks), "budget": budget, "reduce_depth": depth, "usable": model.usable}
    return texts[0] if texts else "", info


def write_summary(
    plan: Plan,
    request: SummaryRequest,
    *,
    new_request: SummaryRequest,
    update_instruction: str,
    summarizer: Summarizer,
    count: Count,
) -> tuple[str, dict[str, Any]]:
    """The summary text of ``request`` and how it was written (for the decisions)."""
    settings = ChunkSettings.from_plan(plan)
    if not settings.enabled:
        return summarizer.summarize(request), {"mode": "single"}
    model = small_model(plan)
    jsons = message_jsons(request.messages)  # for the need test and the chunks alike
    how: dict[str, Any]
    if needed(request.messages, model, settings.factor, count, jsons):
        how = {"mode": "chunked", "why": "head does not fit model'"}
    else:
        try:
            return summarizer.summarize(request), {"mode": "single"}
        except SummarizerError as exc:
            if not exc.overflow:
                raise
            how = {"mode": "chunked", "why": f"summarizer overflow: {exc}"}
    text, info = summarize_chunked(
        request,
        new_request=new_request,
        update_instruction=update_instruction,
        summarizer=summarizer,
        settings=settings,
        model=model,
        count=count,
        jsons=jsons,
    )
    return text, {**how, **info}


def instructions(plan: Plan, previous: str | None) -> tuple[str, str, str]:
    """(instruction for this summary, instruction for a new summary, the template)."""
    template = plan.summary_template
    summary = plan.settings.compaction.summary
    new, update = summary.new_instruction, summary.update_instruction
    first = new if previous is None else update.replace("{previous}", previous)

    def join(head: str) -> str:
        return "\n\n".join(x for x in (head, template) if x)

    return join(first), join(new), template


_FACTS = {
    "paths": re.compile(
        r"(?<![\w/.-])(?:~|\.{1,2})?/?(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|ts|js|tsx|"
        r"jsx|go|rs|java|rb|md|json|ya?ml|toml|txt|sh|cfg|ini|sql|html|css)\b"
    ),
    "commands": re.compile(r"`([^`\n]{1,200})`"),
    "errors": re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b(?::[^\n`]{0,120})?"),
}


def facts(text: str) -> dict[str, set[str]]:
    """Paths, commands (inline code with a space) and error strings a summary mentions."""
    out = {
        k: {m.group(m.lastindex or 0).strip() for m in rx.finditer(text)}
        for k, rx in _FACTS.items()
    }
    out["commands"] = {c for c in out["commands"] if " " in c}  # a bare `name` is a path or id
    return out


def drift(previous: str, current: str) -> dict[str, Any]:
    """What of the previous summary's exact facts the new one still carries."""
    out: dict[str, Any] = {}
    retained = dropped = 0
    for kind, items in facts(previous).items():
        lost = sorted(x for x in items if x not in current)
        retained += len(items) - len(lost)
        dropped += len(lost)
        out[kind] = {"retained": len(items) - len(lost), "dropped": lost[:20]}
    return {"retained": retained, "dropped": dropped, **out}
