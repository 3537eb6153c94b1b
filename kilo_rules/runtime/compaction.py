"""Compaction: a summary of the head plus a verbatim tail (spec §7, Kilo's ``compaction.ts``).

:func:`select` splits the visible history into the head to summarise and the tail kept
verbatim; :func:`compact` writes the summary with a :class:`~kilo_rules.summarize.Summarizer`
and returns everything as mutations (a compaction request, the summary, the continue or
replayed user message, and the post-compaction prune marks). Nothing is deleted: the head
stays in the session, hidden by the projection (``history.project``).

Two things go beyond Kilo. *Pinning*: user messages matching ``compaction.pin[].
messages_matching`` are carried verbatim into the summary message (format in
``docs/compaction.md``), so standing instructions survive any number of compactions.
*Drift*: a rolling update reports which paths, commands and error strings of the previous
summary the new one no longer mentions.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import Diagnostic, Location, PolicyError
from ..session import CompactionPart, FilePart, Message, Session, TextPart
from ..summarize import Summarizer, SummaryRequest
from .apply import Decision
from .chunks import write_summary
from .history import Turn, compaction_part, completed_compactions, project, turns
from .inject import is_env_part
from .lower import LowerSettings, is_media, lower
from .measure import messages_json
from .prune import PruneSettings, prune

if TYPE_CHECKING:
    from ..plan import Plan

Count = Callable[[str], int]

#: ``metadata["kilo_rules"]`` of the messages a compaction adds.
KIND_REQUEST, KIND_SUMMARY = "compaction-request", "compaction-summary"
KIND_CONTINUE, KIND_REPLAY = "compaction-continue", "compaction-replay"
PIN_MARK = "pinned"
_DEFAULT_LOWER = LowerSettings()
PIN_HEADING = "## Standing instructions"


def _at(plan: Plan, dotted: str) -> str | None:
    try:
        return str(plan.locate(dotted))
    except Exception:  # a setting inherited from nowhere has no location
        return None


def _decide(
    plan: Plan, rule: str, setting: str | None, inputs: dict[str, Any], result: Any
) -> Decision:
    return Decision("compaction", rule, _at(plan, setting) if setting else None, inputs, result)


def lower_settings(plan: Plan, **changes: Any) -> LowerSettings:
    """Lowering as the request does it, for estimating turns and building the summary input."""
    table = plan.setting("lowering.media_in_tool_results") or {}
    base = LowerSettings(
        placeholder=plan.setting("prune.placeholder") or _DEFAULT_LOWER.placeholder,
        compaction_request=plan.setting("compaction.summary.request_text")
        or _DEFAULT_LOWER.compaction_request,
        media_in_tool_results=bool(
            table.get(plan.model.provider, plan.model.media_in_tool_results)
        ),
        media_placeholder=plan.setting("lowering.media_placeholder")
        or _DEFAULT_LOWER.media_placeholder,
        drop_errored_assistant=bool(plan.setting("lowering.drop_errored_assistant", True)),
    )
    return dataclasses.replace(base, **changes)


def preserve_budget(plan: Plan) -> int:
    """Token budget of the verbatim tail: the plan's ``compaction.preserve_recent_tokens``
    (Kilo: ``clamp(floor(usable × 0.25), 2000, 8000)``, spec §7.2)."""
    return int(plan.value("compaction.preserve_recent_tokens"))


@dataclass(frozen=True, slots=True)
class Selection:
    """The head to summarise and the first message of the verbatim tail (None: no tail)."""

    head: list[Message]
    tail_start_id: str | None


def _size(messages: Sequence[Message], settings: LowerSettings, count: Count) -> int:
    # Without media stripping: inline data URLs count at full size (compaction.ts:258-264).
    return count(messages_json(lower(messages, settings)))


def split_turn(
    messages: Sequence[Message], turn: Turn, budget: int, settings: LowerSettings, count: Count
) -> int | None:
    """The start of the first suffix of ``turn`` (never its user message) that fits."""
    if budget <= 0 or turn.end - turn.start <= 1:
        return None
    for start in range(turn.start + 1, turn.end):
        if _size(messages[start : turn.end], settings, count) <= budget:
            return start
    return None


def select(messages: Sequence[Message], plan: Plan, count: Count) -> Selection:
    """Kilo's ``select`` (spec §7.4): keep the newest ``tail_turns`` turns that fit the
    preserve budget, newest first, splitting the first turn that does not fit."""
    limit = int(plan.setting("compaction.tail_turns", 0) or 0)
    everything = Selection(list(messages), None)
    all_turns = turns(messages)
    if limit <= 0 or not all_turns:
        return everything
    budget = preserve_budget(plan)
    settings = lower_settings(plan)
    keep: int | None = None
    total = 0
    for turn in reversed(all_turns[-limit:]):
        size = _size(messages[turn.start : turn.end], settings, count)
        if total + size <= budget:
            total += size
            keep = turn.start
            continue
        split = split_turn(messages, turn, budget - total, settings, count)
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


def _pins(plan: Plan, head: Sequence[Message], previous: Message | None) -> list[dict[str, str]]:
    """Pinned instructions: those of the previous summary, then new matches in the head."""
    found: list[dict[str, str]] = []
    if previous is not None:
        for p in previous.parts:
            if isinstance(p, TextPart) and p.metadata.get("kilo_rules") == PIN_MARK:
                found.extend(p.metadata.get("pins", []))
    patterns = [
        re.compile(str(p["messages_matching"]))
        for p in plan.setting("compaction.pin") or []
        if p.get("messages_matching")
    ]
    seen = {p["id"] for p in found}
    for m in head:
        if m.role == "user" and m.id not in seen and compaction_part(m) is None:
            text = _user_text(m)
            if text and any(rx.search(text) for rx in patterns):
                found.append({"id": m.id, "text": text})
                seen.add(m.id)
    return found


def pinned_section(pins: Sequence[dict[str, str]]) -> str:
    """The text carried into the summary message (documented in docs/compaction.md)."""
    blocks = [f'<instruction from="{p["id"]}">\n{p["text"]}\n</instruction>' for p in pins]
    return "\n\n".join([PIN_HEADING, *blocks])


def summary_body(msg: Message) -> str:
    """A summary message's text without its pinned section."""
    return "\n".join(
        p.text
        for p in msg.parts
        if isinstance(p, TextPart) and p.metadata.get("kilo_rules") != PIN_MARK
    )


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
    placeholder = plan.setting("lowering.media_placeholder") or _DEFAULT_LOWER.media_placeholder
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


def read_template(plan: Plan) -> str:
    """The summary template text: the file ``compaction.summary.template`` names, relative to
    the policy file that declares it."""
    name = plan.setting("compaction.summary.template")
    if not name:
        return ""
    base = Path(plan.locate("compaction.summary.template").file).parent
    return _read(str(base / str(name)))


@functools.lru_cache(maxsize=32)
def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise PolicyError(
            Diagnostic(
                "compaction.template",
                f"cannot read summary template: {exc.strerror}",
                Location(path, 1, 1),
            )
        ) from None


def _instruction(plan: Plan, previous: str | None) -> tuple[str, str, str]:
    """(instruction for this summary, instruction for a new summary, the template)."""
    template = read_template(plan)
    new = plan.setting("compaction.summary.new_instruction") or ""
    update = plan.setting("compaction.summary.update_instruction") or ""
    first = new if previous is None else update.replace("{previous}", previous)

    def join(head: str) -> str:
        return "\n\n".join(x for x in (head, template) if x)

    return join(first), join(new), template


def compact(
    plan: Plan, session: Session, summarizer: Summarizer, *, overflow: bool | None, count: Count
) -> CompactionResult:
    """Compact ``session`` (pure): summarise the head, keep the tail, return mutations.

    ``overflow``: True after a provider overflow error, False for the preflight estimate,
    None for the usage-count check (Kilo's ``compaction.create({auto: true})``)."""
    decisions: list[Decision] = []
    view = project(session.messages)
    pairs = completed_compactions(view)
    hidden = {i for pair in pairs for i in pair}
    previous_msg = view[pairs[-1][1]] if pairs else None
    history = [m for i, m in enumerate(view) if i not in hidden]
    replay: Message | None = None
    if overflow is not None and plan.setting("compaction.replay"):
        replay, history = _pull_replay(history)
    if not history:
        decisions.append(_decide(plan, "nothing-to-compact", None, {}, None))
        return CompactionResult([], decisions, "", None, None)
    sel = select(history, plan, count)
    decisions.append(
        _decide(
            plan,
            "select",
            "compaction.tail_turns",
            {
                "history": len(history),
                "budget": preserve_budget(plan),
                "tail_turns": plan.setting("compaction.tail_turns"),
            },
            {"head": len(sel.head), "tail_start_id": sel.tail_start_id},
        )
    )
    previous = summary_body(previous_msg) if previous_msg is not None else None
    instruction, new_instruction, template = _instruction(plan, previous)
    head = lower(
        sel.head,
        lower_settings(
            plan,
            strip_all_media=bool(plan.setting("compaction.summary.strip_media", True)),
            tool_output_max_chars=plan.setting("compaction.summary.tool_output_max_chars"),
        ),
    )
    out_tokens = int(plan.value("output.configured") or plan.model.limits.output or 0)
    request = SummaryRequest(instruction, tuple(head), out_tokens, previous, template)
    body, how = write_summary(
        plan,
        request,
        new_request=SummaryRequest(new_instruction, tuple(head), out_tokens, None, template),
        update_instruction=plan.setting("compaction.summary.update_instruction") or "",
        summarizer=summarizer,
        count=count,
    )
    decisions.append(
        _decide(
            plan,
            "summary",
            "compaction.summary",
            {"head_messages": len(head), "rolling": previous is not None},
            {**how, "chars": len(body)},
        )
    )
    if previous is not None:
        decisions.append(
            _decide(plan, "drift", None, {"previous_chars": len(previous)}, drift(previous, body))
        )
    pins = _pins(plan, history if sel.tail_start_id is None else sel.head, previous_msg)
    for layer in (p.get("layer") for p in plan.setting("compaction.pin") or []):
        if layer:
            present = any(x.id == layer for x in plan.layers)
            decisions.append(
                _decide(
                    plan,
                    "pin.layer",
                    "compaction.pin",
                    {"layer": layer},
                    "re-sent" if present else "no such layer",
                )
            )

    ids = _Ids(session)
    req_id, req_time = ids.next()
    request_msg = Message(
        id=req_id,
        role="user",
        created=req_time,
        metadata={"kilo_rules": KIND_REQUEST},
        parts=[
            CompactionPart(
                id=f"{req_id}-p1", auto=True, overflow=overflow, tail_start_id=sel.tail_start_id
            )
        ],
    )
    sum_id, sum_time = ids.next()
    parts = [TextPart(id=f"{sum_id}-p1", text=body)]
    if pins:
        parts.append(
            TextPart(
                id=f"{sum_id}-p2",
                text=pinned_section(pins),
                metadata={"kilo_rules": PIN_MARK, "pins": pins},
            )
        )
        decisions.append(
            _decide(plan, "pin", "compaction.pin", {}, {"messages": [p["id"] for p in pins]})
        )
    summary_msg = Message(
        id=sum_id,
        role="assistant",
        created=sum_time,
        parts=parts,
        summary=True,
        finish="stop",
        parent_id=req_id,
        agent="compaction",
        metadata={"kilo_rules": KIND_SUMMARY},
    )
    added = [request_msg, summary_msg]
    if replay is not None:
        added.append(_replay_message(plan, ids, replay, overflow))
        decisions.append(
            _decide(
                plan,
                "replay",
                "compaction.replay",
                {"overflow": overflow},
                {"replayed": replay.id, "as": added[-1].id},
            )
        )
    else:
        text = plan.setting("compaction.continue_text") or ""
        if overflow is True and plan.setting("compaction.overflow_preamble"):
            text = f"{plan.setting('compaction.overflow_preamble')}\n\n{text}"
        cid, ctime = ids.next()
        added.append(
            Message(
                id=cid,
                role="user",
                created=ctime,
                metadata={"kilo_rules": KIND_CONTINUE, "compaction_continue": True},
                parts=[
                    TextPart(
                        id=f"{cid}-p1",
                        text=text,
                        synthetic=True,
                        metadata={"compaction_continue": True},
                    )
                ],
            )
        )
        decisions.append(
            _decide(plan, "continue", "compaction.continue_text", {"overflow": overflow}, cid)
        )
    mutations: list[dict[str, Any]] = [
        {
            "op": "add_message",
            "message": m.model_dump(mode="json"),
            "time": m.created,
            "reason": str(m.metadata["kilo_rules"]),
        }
        for m in added
    ]

    # Post-compaction prune, on the view the model sees next.
    after = project([*session.messages, *added])
    pruned = prune(after, prune_settings(plan), count, "post-compaction")
    mutations.extend(pruned.mutations(ids.time + ids.n))
    decisions.append(
        _decide(
            plan,
            "prune.post-compaction",
            "prune.reasons.post_compaction",
            {},
            {"parts": len(pruned.parts), "tokens": pruned.pruned_tokens, "notes": pruned.notes},
        )
    )
    return CompactionResult(
        mutations,
        decisions,
        body,
        sel.tail_start_id,
        added[-1].id if replay is not None else None,
        [p["id"] for p in pins],
    )


def prune_settings(plan: Plan) -> PruneSettings:
    """``prune.*`` of the plan (constants; a per-step expression falls back to Kilo's)."""

    def num(name: str, default: int) -> int:
        try:
            v = plan.value(name)
        except Exception:  # dynamic values need a step; the engine default is Kilo's
            return default
        return default if v is None else int(v)

    d = PruneSettings()
    return PruneSettings(
        enabled=bool(plan.setting("prune.enabled", d.enabled)),
        normal=bool(plan.setting("prune.reasons.normal", d.normal)),
        post_compaction=bool(plan.setting("prune.reasons.post_compaction", d.post_compaction)),
        payload_limit=bool(plan.setting("prune.reasons.payload_limit", d.payload_limit)),
        protect_turns=int(plan.setting("prune.protect_turns", d.protect_turns)),
        protect_tokens=num("prune.protect_tokens", d.protect_tokens),
        minimum_tokens=num("prune.minimum_tokens", d.minimum_tokens),
        protected_tools=tuple(plan.setting("prune.protected_tools", d.protected_tools)),
    )
