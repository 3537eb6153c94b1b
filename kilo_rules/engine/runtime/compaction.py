"""Compaction: a summary of the head plus a verbatim tail (spec §7, Kilo's ``compaction.ts``).

:func:`select` splits the visible history into the head to summarise and the tail kept
verbatim; :func:`compact` writes the summary with a
:class:`~kilo_rules.engine.summarizers.protocol.Summarizer` and returns everything as mutations (a
compaction request, the summary, the continue or replayed user message, and the post-compaction
prune marks). Nothing is deleted: the head stays in the session, hidden by the projection
(``history.project``).

Two things go beyond Kilo. *Pinning*: user messages matching ``compaction.pin[].
messages_matching`` are carried verbatim into the summary message (format in
``docs/compaction.md``), so standing instructions survive any number of compactions.
*Drift*: a rolling update reports which paths, commands and error strings of the previous
summary the new one no longer mentions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.cancel import checkpoint
from kilo_rules.engine.base.regex import compile_regex
from kilo_rules.engine.formats.session import CompactionPart, FilePart, Message, Session, TextPart
from kilo_rules.engine.runtime.apply import Decision
from kilo_rules.engine.runtime.chunks import drift, instructions, write_summary
from kilo_rules.engine.runtime.history import (
    Turn,
    compaction_part,
    completed_compactions,
    project,
    turns,
)
from kilo_rules.engine.runtime.inject import is_env_part
from kilo_rules.engine.runtime.lower import LowerSettings, is_media, lower, lower_settings
from kilo_rules.engine.runtime.measure import JsonCache
from kilo_rules.engine.runtime.prune import prune, prune_settings
from kilo_rules.engine.runtime.trace import PlanCaches, plan_caches
from kilo_rules.engine.summarizers.protocol import Summarizer, SummaryRequest

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan

Count = Callable[[str], int]

#: ``metadata["kilo_rules"]`` of the messages a compaction adds.
KIND_REQUEST, KIND_SUMMARY = "compaction-request", "compaction-summary"
KIND_CONTINUE, KIND_REPLAY = "compaction-continue", "compaction-replay"
PIN_MARK = "pinned"
PIN_HEADING = "## Standing instructions"


def _decide(
    plan: Plan, rule: str, setting: str | None, inputs: dict[str, Any], result: Any
) -> Decision:
    return Decision("compaction", rule, plan.where(setting), inputs, result)


def preserve_budget(plan: Plan) -> int:
    """Token budget of the verbatim tail: the plan's ``compaction.preserve_recent_tokens``
    (Kilo: ``clamp(floor(usable × 0.25), 2000, 8000)``, spec §7.2)."""
    budget = plan.resolve(plan.knobs.preserve_recent_tokens)
    return 0 if budget is None else budget  # none stated: no turn fits, all is summarised


@dataclass(frozen=True, slots=True)
class Selection:
    """The head to summarise and the first message of the verbatim tail (None: no tail)."""

    head: list[Message]
    tail_start_id: str | None


class Sizes:
    """Token counts of runs of ``messages``, as ``count`` measures their lowered JSON
    (without media stripping: inline data URLs count at full size, compaction.ts:258-264).

    Each message is lowered and serialised once (through the plan's caches when a step
    has filled them), so choosing a tail costs one pass over the history, not one per
    candidate suffix. When the counter adds up piece by piece (the estimate, a per-message
    count cache) a run is counted from prefix sums; otherwise its JSON is counted whole."""

    def __init__(
        self,
        messages: Sequence[Message],
        settings: LowerSettings,
        count: Count,
        caches: PlanCaches | None = None,
    ) -> None:
        self.json = caches.json if caches is not None else JsonCache(count)
        lower_cache = caches.lower if caches is not None else None
        # Lowering is per message once historical media are kept (the summary input's
        # settings never strip them), so a run's JSON is its messages' pieces in order.
        self.pieces = [
            [self.json.plain(m) for m in lower([msg], settings, lower_cache)] for msg in messages
        ]
        self.sums = [0]
        self.lengths = [0]
        for pieces in self.pieces:
            self.sums.append(self.sums[-1] + sum(p.weight for p in pieces))
            self.lengths.append(self.lengths[-1] + len(pieces))

    def of(self, start: int, end: int) -> int:
        """The count of ``messages[start:end]``."""
        return self.json.count_run(
            self.sums[end] - self.sums[start],
            self.lengths[end] - self.lengths[start],
            lambda: [p for ps in self.pieces[start:end] for p in ps],
        )


def split_turn(
    messages: Sequence[Message],
    turn: Turn,
    budget: int,
    settings: LowerSettings,
    count: Count,
    sizes: Sizes | None = None,
) -> int | None:
    """The start of the first suffix of ``turn`` (never its user message) that fits."""
    if budget <= 0 or turn.end - turn.start <= 1:
        return None
    sizes = sizes or Sizes(messages, settings, count)
    for start in range(turn.start + 1, turn.end):
        checkpoint()
        if sizes.of(start, turn.end) <= budget:
            return start
    return None


def select(messages: Sequence[Message], plan: Plan, count: Count) -> Selection:
    """Kilo's ``select`` (spec §7.4): keep the newest ``tail_turns`` turns that fit the
    preserve budget, newest first, splitting the first turn that does not fit."""
    limit = plan.settings.compaction.tail_turns
    everything = Selection(list(messages), None)
    all_turns = turns(messages)
    if limit <= 0 or not all_turns:
        return everything
    budget = preserve_budget(plan)
    settings = lower_settings(plan)
    sizes = Sizes(messages, settings, count, plan_caches(plan))
    keep: int | None = None
    total = 0
    for turn in reversed(all_turns[-limit:]):
        checkpoint()
        size = sizes.of(turn.start, turn.end)
        if total + size <= budget:
            total += size
            keep = turn.start
            continue
        split = split_turn(messages, turn, budget - total, settings, count, sizes)
        if split is not None:
            keep = split
        break  # older turns are never considered once one does not fit
    if keep is None or keep == 0:
        return everything
    return Selection(list(messages[:keep]), messages[keep].id)


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact` decided; ``mutations`` persist it."""

    mutations: list[dict[str, Any]]
    decisions: list[Decision]
    summary_text: str
    tail_start_id: str | None
    replayed_message_id: str | None
    pinned: list[str] = field(default_factory=list)


def _user_text(msg: Message) -> str:
    return "\n".join(p.text for p in msg.parts if isinstance(p, TextPart) and not p.synthetic)


def _is_continuation(msg: Message) -> bool:
    return bool(msg.metadata.get("compaction_continue")) or any(
        isinstance(p, TextPart) and p.metadata.get("compaction_continue") for p in msg.parts
    )


def _real_user(msg: Message) -> bool:
    return msg.role == "user" and compaction_part(msg) is None and not _is_continuation(msg)


def _pull_replay(history: list[Message]) -> tuple[Message | None, list[Message]]:
    """The newest real user message, and the history cut before it, if older user
    content remains (spec §7.5, ``compaction.ts:394-415``)."""
    for i in range(len(history) - 1, -1, -1):
        if _real_user(history[i]):
            if any(_real_user(m) for m in history[:i]):
                return history[i], history[:i]
            break
    return None, history


def _pins(
    plan: Plan, history: Sequence[Message], head: Sequence[Message], previous: Message | None
) -> list[dict[str, str]]:
    """Pinned instructions: those of the previous summary, then the task (the first user
    message of the history, once it leaves the tail) and new matches in the head."""
    found: list[dict[str, str]] = []
    if previous is not None:
        for p in previous.parts:
            if isinstance(p, TextPart) and p.metadata.get("kilo_rules") == PIN_MARK:
                found.extend(p.metadata.get("pins", []))
    pins = plan.settings.compaction.pin
    patterns = [compile_regex(p.messages_matching) for p in pins if p.messages_matching]
    seen = {p["id"] for p in found}
    if any(p.task for p in pins) and not any(p.get("kind") == "task" for p in found):
        first = next((m for m in history if _real_user(m)), None)
        in_head = first is not None and any(m.id == first.id for m in head)
        if first is not None and in_head and first.id not in seen and _user_text(first):
            found.insert(0, {"id": first.id, "text": _user_text(first), "kind": "task"})
            seen.add(first.id)
    for m in head:
        if m.role == "user" and m.id not in seen and compaction_part(m) is None:
            text = _user_text(m)
            if text and any(rx.search(text) for rx in patterns):
                found.append({"id": m.id, "text": text})
                seen.add(m.id)
    return found


def pinned_section(pins: Sequence[dict[str, str]]) -> str:
    """The text carried into the summary message (documented in docs/compaction.md)."""
    blocks = [
        f'<{tag} from="{p["id"]}">\n{p["text"]}\n</{tag}>'
        for p in pins
        for tag in ["task" if p.get("kind") == "task" else "instruction"]
    ]
    return "\n\n".join([PIN_HEADING, *blocks])


def summary_body(msg: Message) -> str:
    """A summary message's text without its pinned section."""
    return "\n".join(
        p.text
        for p in msg.parts
        if isinstance(p, TextPart) and p.metadata.get("kilo_rules") != PIN_MARK
    )


class _Ids:
    """Deterministic ids that sort after every existing one (suffixes of the largest id)."""

    def __init__(self, session: Session) -> None:
        self.base = max((m.id for m in session.messages), default="msg")
        self.time = max((m.created for m in session.messages), default=0)
        self.n = 0

    def next(self) -> tuple[str, int]:
        self.n += 1
        return f"{self.base}-k{self.n}", self.time + self.n


def _replay_message(plan: Plan, ids: _Ids, original: Message, overflow: bool | None) -> Message:
    mid, created = ids.next()
    placeholder = plan.settings.lowering.media_placeholder
    parts: list[Any] = []
    for k, p in enumerate(x for x in original.parts if not is_env_part(x)):
        if isinstance(p, CompactionPart):
            continue
        pid = f"{mid}-p{k + 1}"
        if isinstance(p, FilePart) and is_media(p.mime) and overflow is True:
            text = placeholder.format(mime=p.mime, name=p.filename or "file")
            parts.append(TextPart(id=pid, text=text))
        else:
            parts.append(p.model_copy(update={"id": pid}))
    meta = {"kilo_rules": KIND_REPLAY, "compaction_replay_of": original.id}
    return Message(
        id=mid,
        role="user",
        created=created,
        parts=parts,
        agent=original.agent,
        model=original.model,
        system=original.system,
        metadata=meta,
    )


def _continue_message(plan: Plan, ids: _Ids, overflow: bool | None) -> Message:
    text = plan.settings.compaction.continue_text
    preamble = plan.settings.compaction.overflow_preamble
    if overflow is True and preamble:
        text = f"{preamble}\n\n{text}"
    mid, created = ids.next()
    # Kilo marks the part; the message carries the flag too for stores without part metadata.
    flag = {"compaction_continue": True}
    part = TextPart(id=f"{mid}-p1", text=text, synthetic=True, metadata=flag)
    meta = {"kilo_rules": KIND_CONTINUE, **flag}
    return Message(id=mid, role="user", created=created, metadata=meta, parts=[part])


def compact(
    plan: Plan, session: Session, summarizer: Summarizer, *, overflow: bool | None, count: Count
) -> CompactionResult:
    """Compact ``session`` (pure): summarise the head, keep the tail, return mutations.

    ``overflow``: True after a provider overflow error, False for the preflight estimate,
    None for the usage-count check (Kilo's ``compaction.create({auto: true})``)."""
    decisions: list[Decision] = []

    def note(rule: str, setting: str | None, inputs: dict[str, Any], result: Any) -> None:
        decisions.append(_decide(plan, rule, setting, inputs, result))

    view = project(session.messages)
    pairs = completed_compactions(view)
    hidden = {i for pair in pairs for i in pair}
    previous_msg = view[pairs[-1][1]] if pairs else None
    history = [m for i, m in enumerate(view) if i not in hidden]
    replay: Message | None = None
    settings = plan.settings.compaction
    if overflow is not None and settings.replay:
        replay, history = _pull_replay(history)
    if not history:
        note("nothing-to-compact", None, {}, None)
        return CompactionResult([], decisions, "", None, None)
    sel = select(history, plan, count)
    budget, tail_turns = preserve_budget(plan), settings.tail_turns
    inputs = {"history": len(history), "budget": budget, "tail_turns": tail_turns}
    note(
        "select",
        "compaction.tail_turns",
        inputs,
        {"head": len(sel.head), "tail": sel.tail_start_id},
    )

    previous = summary_body(previous_msg) if previous_msg is not None else None
    instruction, new_instruction, template = instructions(plan, previous)
    strip = settings.summary.strip_media
    cap = settings.summary.tool_output_max_chars
    summary_input = lower_settings(plan, strip_all_media=strip, tool_output_max_chars=cap)
    head = tuple(lower(sel.head, summary_input, plan_caches(plan).lower))
    configured = plan.resolve(plan.knobs.output_configured)
    out_tokens = int(configured or plan.model.limits.output or 0)
    body, how = write_summary(
        plan,
        SummaryRequest(instruction, head, out_tokens, previous, template),
        new_request=SummaryRequest(new_instruction, head, out_tokens, None, template),
        update_instruction=settings.summary.update_instruction,
        summarizer=summarizer,
        count=count,
    )
    inputs = {"head_messages": len(head), "rolling": previous is not None}
    note("summary", "compaction.summary", inputs, {**how, "chars": len(body)})
    if previous is not None:
        note("drift", None, {"previous_chars": len(previous)}, drift(previous, body))
    head_msgs = history if sel.tail_start_id is None else sel.head
    pins = _pins(plan, history, head_msgs, previous_msg)
    for layer in (p.layer for p in settings.pin):
        if layer:
            sent = "re-sent" if any(x.id == layer for x in plan.layers) else "no such layer"
            note("pin.layer", "compaction.pin", {"layer": layer}, sent)
    if pins:
        note("pin", "compaction.pin", {}, {"messages": [p["id"] for p in pins]})

    ids = _Ids(session)
    req_id, req_time = ids.next()
    part = CompactionPart(
        id=f"{req_id}-p1", auto=True, overflow=overflow, tail_start_id=sel.tail_start_id
    )
    meta = {"kilo_rules": KIND_REQUEST}
    added = [Message(id=req_id, role="user", created=req_time, metadata=meta, parts=[part])]
    added.append(_summary_message(ids, req_id, body, pins))
    if replay is not None:
        added.append(_replay_message(plan, ids, replay, overflow))
        replay_note = {"replayed": replay.id, "as": added[-1].id}
        note("replay", "compaction.replay", {"overflow": overflow}, replay_note)
    else:
        added.append(_continue_message(plan, ids, overflow))
        note("continue", "compaction.continue_text", {"overflow": overflow}, added[-1].id)
    mutations: list[dict[str, Any]] = [
        {"op": "add_message", "message": m.model_dump(mode="json"), "time": m.created}
        | {"reason": str(m.metadata["kilo_rules"])}
        for m in added
    ]

    # Post-compaction prune, on the view the model sees next.
    after = project([*session.messages, *added])
    pruned = prune(after, prune_settings(plan), count, "post-compaction")
    mutations.extend(pruned.mutations(ids.time + ids.n))
    marked = {"parts": len(pruned.parts), "tokens": pruned.pruned_tokens, "notes": pruned.notes}
    note("prune.post-compaction", "prune.reasons.post_compaction", {}, marked)
    replayed = added[-1].id if replay is not None else None
    pinned = [p["id"] for p in pins]
    return CompactionResult(mutations, decisions, body, sel.tail_start_id, replayed, pinned)


def _summary_message(ids: _Ids, parent: str, body: str, pins: list[dict[str, str]]) -> Message:
    mid, created = ids.next()
    parts = [TextPart(id=f"{mid}-p1", text=body)]
    if pins:
        meta: dict[str, Any] = {"kilo_rules": PIN_MARK, "pins": pins}
        parts.append(TextPart(id=f"{mid}-p2", text=pinned_section(pins), metadata=meta))
    return Message(
        id=mid,
        role="assistant",
        created=created,
        parts=parts,
        summary=True,
        finish="stop",
        parent_id=parent,
        agent="compaction",
        metadata={"kilo_rules": KIND_SUMMARY},
    )
