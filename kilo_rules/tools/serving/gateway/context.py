"""What the gateway does to one request: find what the ledger already compacted, decide
whether the policy compacts now, and splice the client's own body.

The client assembled its system prompt, tools and history itself; the gateway manages only
the context. Every item it does not replace is forwarded as the client's own JSON text
(:mod:`~kilo_rules.tools.serving.gateway.jsonspan`), so tools, tool choice, thinking blocks
and their signatures, and the client's cache marks arrive byte for byte — and when no rule
changes anything, the upstream receives the client's exact bytes.

Compaction uses the engine as a step does: the history (with the head the ledger already
replaced) is imported into Session v1 by the importer of the client's API, the routed plan
decides (its ``compaction_limit`` against the provider's last reported usage plus the new
items, or an estimate), :func:`~kilo_rules.engine.runtime.compaction.compact` writes the
summary and picks the verbatim tail, and the summary is rendered for the client's wire API.
The replacement is recorded in the ledger under the hash chain of the items it replaces.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.request import ModelRequest
from kilo_rules.engine.formats.session import Message, Session, TextPart
from kilo_rules.engine.importers import anthropic_messages, openai_chat, openai_responses
from kilo_rules.engine.importers._source import Record, Source
from kilo_rules.engine.providers import PROVIDER_BREAKPOINT_LIMITS, render
from kilo_rules.engine.runtime.compaction import KIND_CONTINUE, KIND_REQUEST, KIND_SUMMARY, compact
from kilo_rules.engine.runtime.guards import compaction_limit
from kilo_rules.engine.runtime.history import project
from kilo_rules.engine.runtime.lower import lower, lower_settings
from kilo_rules.engine.runtime.mutations import apply_mutations
from kilo_rules.engine.runtime.trace import plan_caches
from kilo_rules.engine.summarizers.protocol import Summarizer
from kilo_rules.tools.serving.gateway.jsonspan import Scanned, Span, repeated, scan, splice
from kilo_rules.tools.serving.gateway.ledger import (
    Entry,
    LedgerError,
    SqliteLedger,
    canonical,
    chain,
)
from kilo_rules.tools.serving.gateway.protocols import Protocol

__all__ = ["ContextManager", "Prepared"]

_IMPORTERS: Mapping[str, Callable[[Source, int], Any]] = {
    "anthropic_messages": anthropic_messages.convert,
    "openai_chat": openai_chat.convert,
    "openai_responses": openai_responses.convert,
}
_MARK = {"type": "ephemeral"}
#: Bytes of a body that pick its slot of remembered scans, and scans per slot.
_HEAD = 4096
_SLOT = 8


@dataclass
class Prepared:
    """The body to forward and what was decided about it."""

    body: bytes
    changed: bool = False
    rules: list[str] = field(default_factory=list)
    revision: str | None = None
    conversation: str = ""  # hash of the first item's chain: the conversation, in logs
    passthrough: str | None = None  # why the request was not managed
    tokens: int = 0  # the input the trigger compared (reported usage or estimate)
    limit: int | None = None
    items: int = 0  # items the client sent
    forwarded_items: int = 0
    #: Where the usage of the reply is recorded: (prefix hash, items, boundary key, root).
    usage_key: tuple[str, int, str, str] | None = None
    plan: Plan | None = None


@dataclass(frozen=True, slots=True)
class _Item:
    digest: bytes  # of the canonical form (what the chain hashes)
    tokens: int


class ContextManager:
    """Prepares requests for one gateway: shared caches, one ledger, one summarizer."""

    def __init__(
        self,
        ledger: SqliteLedger | None,
        summarizer: Summarizer,
        *,
        scans_bytes: int = 512 << 20,
    ) -> None:
        self.ledger = ledger
        self.summarizer = summarizer
        self._limits: LRUCache[int, tuple[Plan, int | None]] = LRUCache(256)
        # The last body of each conversation, by the digest of its first bytes: the next
        # body parses, hashes and counts only what it adds. Bounded by bytes of body.
        self._scans: LRUCache[bytes, tuple[Scanned, ...]] = LRUCache(
            scans_bytes, weigh=lambda group: sum(len(s.raw) for s in group)
        )
        self._others: LRUCache[bytes, int] = LRUCache(4096)

    # -- the pieces -----------------------------------------------------------------------
    def scan(self, protocol: Protocol, text: str, raw: bytes) -> Scanned:
        """The client's body parsed, with the spans of its members and history items;
        what an earlier body of the same conversation repeats byte for byte from its start
        is taken from that body's scan, not parsed again."""
        # Conversations that share their first bytes (one agent's system prompt) share a
        # slot of a few scans; the one the body repeats most of is resumed from.
        slot = hashlib.sha256(protocol.name.encode() + raw[:_HEAD]).digest()
        group = self._scans.get(slot) or ()
        if len(group) > 1:
            previous: Scanned | None = max(group, key=lambda g: repeated(g, raw, quick=True))
        else:
            previous = group[0] if group else None
        scanned = scan(text, protocol.items, raw=raw, previous=previous)
        if previous is not None and scanned.reused:
            for key, value in previous.memo.items():  # per element: those still the same
                scanned.memo[key] = value[: scanned.reused]

        if scanned.items:
            kept = tuple(g for g in group if g is not previous)[: _SLOT - 1]
            self._scans.put(slot, (scanned, *kept))
        return scanned

    def _limit(self, plan: Plan) -> int | None:
        hit = self._limits.get(id(plan))
        if hit is not None and hit[0] is plan:
            return hit[1]
        limit = compaction_limit(plan, plan.context({}))
        self._limits.put(id(plan), (plan, limit))
        return limit

    # -- one request ----------------------------------------------------------------------
    def prepare(
        self,
        protocol: Protocol,
        scanned: Scanned,
        raw: bytes,
        plan: Plan,
        scope: str,
        *,
        overflow: bool = False,
        compact: bool = True,
    ) -> Prepared:
        """The body to forward for the client's ``raw`` body (``scanned`` from it), under
        ``plan``. ``overflow``: the upstream refused the last attempt as too long, so
        compact whatever the trigger says. ``compact=False`` (counting tokens) applies what
        the ledger recorded but never compacts anew."""
        out = Prepared(raw, plan=plan)
        spans = scanned.items
        items = scanned.value.get(protocol.items)
        if spans is None or not isinstance(items, list) or not items:
            out.passthrough = f"no {protocol.items} array to manage"
            return out
        text = scanned.text
        n = len(items)
        out.items = out.forwarded_items = n
        counter = plan_caches(plan).counter
        cells: list[_Item] = scanned.memo.setdefault(("cells", id(counter)), [])
        # Only the items after those the previous body of the conversation repeats: the
        # cells of the others came over with the scan.
        for value in items[len(cells) :]:
            data = canonical(value)
            text_of = data.decode("utf-8", "surrogatepass")
            cells.append(_Item(hashlib.sha256(data).digest(), counter.count(text_of)))
        hashes: list[str] = scanned.memo.setdefault(("chain", scope), [])
        hashes += chain(
            scope, (c.digest for c in cells[len(hashes) :]), hashes[-1] if hashes else None
        )
        out.conversation = hashes[0][:16]
        lead = protocol.leading(items)
        entry: Entry | None = None
        if self.ledger is not None:
            try:
                entry = self.ledger.longest(hashes)
            except LedgerError as exc:
                out.passthrough = str(exc)
                return out
            if entry is not None and not lead < entry.position < n:
                entry = None
        replacement: list[Any] = json.loads(entry.replacement) if entry is not None else []
        start = entry.position if entry is not None else lead
        if entry is not None:
            out.rules.append("ledger.hit")

        limit = self._limit(plan)
        out.limit = limit
        out.tokens = self._tokens(
            scanned, protocol, plan, cells, hashes, entry, replacement, lead, start
        )
        if compact and (overflow or (limit is not None and out.tokens >= limit)):
            try:
                made = self._compact(protocol, scanned, plan, items, lead, entry, start, hashes)
            except LedgerError as exc:
                out.passthrough = str(exc)
                return out
            if made is not None:
                entry = made
                replacement = json.loads(made.replacement)
                start = made.position
                out.rules.append("compaction")
        boundary = entry.key if entry is not None else ""
        out.usage_key = (hashes[-1], n, boundary, hashes[0])

        edits: dict[Span, str] = {}
        if entry is not None:
            marked = self._marked(protocol, scanned, replacement, start)
            parts = [text[s.start : s.end] for s in spans[:lead]]
            parts += [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in marked]
            parts += [text[s.start : s.end] for s in spans[start:]]
            edits[scanned.members[protocol.items]] = "[" + ",".join(parts) + "]"
            out.forwarded_items = lead + len(replacement) + n - start
        cap = self._output_cap(protocol, scanned, plan)
        if cap is not None:
            edits[cap[0]] = str(cap[1])
            out.rules.append("output.cap")
        if edits:
            out.body = splice(text, edits).encode("utf-8", "surrogatepass")
            out.changed = True
        return out

    def _tokens(
        self,
        scanned: Scanned,
        protocol: Protocol,
        plan: Plan,
        cells: Sequence[_Item],
        hashes: Sequence[str],
        entry: Entry | None,
        replacement: Sequence[Any],
        lead: int,
        start: int,
    ) -> int:
        """The input the trigger compares: the provider's last reported usage for this
        history (with this compaction) plus the items sent since, or the estimate."""
        boundary = entry.key if entry is not None else ""
        reported = None
        if self.ledger is not None:
            try:
                reported = self.ledger.last_usage(hashes, boundary)
            except LedgerError:
                reported = None
        if reported is not None and reported[0] >= start:
            k, usage = reported
            return usage.total + sum(c.tokens for c in cells[k:])
        counter = plan_caches(plan).counter
        # The system prompt, tools and options: the same text turn after turn, counted once.
        others = "".join(
            scanned.text[sp.start : sp.end]
            for k, sp in scanned.members.items()
            if k != protocol.items
        )
        key = hashlib.sha256(f"{id(counter)}\x00{others}".encode("utf-8", "surrogatepass")).digest()
        total = self._others.get_or(key, lambda: counter.count(others))
        total += sum(counter.count(json.dumps(r, ensure_ascii=False)) for r in replacement)
        return total + sum(c.tokens for c in cells[:lead]) + sum(c.tokens for c in cells[start:])

    def _compact(
        self,
        protocol: Protocol,
        scanned: Scanned,
        plan: Plan,
        items: list[Any],
        lead: int,
        previous: Entry | None,
        start: int,
        hashes: Sequence[str],
    ) -> Entry | None:
        """Compact the history as sent (the ledger's head already replaced); the new entry,
        or None when the policy finds nothing to cut."""
        replacement: list[Any] = json.loads(previous.replacement) if previous else []
        sent = [*items[:lead], *replacement, *items[start:]]
        doc = dict(scanned.value)
        doc[protocol.items] = sent
        source = Source("<request>", "json", [Record("<request>", 1, scanned.text, doc)])
        session = _IMPORTERS[protocol.importer](source, 0)
        if previous is not None and previous.pair:
            session = _with_pair(session, previous.pair, lead, len(replacement))
        count = plan_caches(plan).counter.count
        # Kilo's usage-count mode (None): the client's own tail carries its latest turn, so
        # the last user message is never replayed after the summary.
        done = compact(plan, session, self.summarizer, overflow=None, count=count)
        first = lead + len(replacement)  # where the client's own items start in ``sent``
        wanted = _index(done.tail_start_id) if done.tail_start_id else len(sent) - 1
        cut = _tail_start(protocol, sent, max(wanted, first), first)
        if cut is None or cut <= first:
            return None
        position = start + (cut - first)
        view = project(apply_mutations(session, done.mutations).messages)
        added = [m for m in view if m.metadata.get("kilo_rules") in (KIND_REQUEST, KIND_SUMMARY)]
        if protocol.role(sent[cut]) == "assistant":  # a user turn between summary and tail
            added += [m for m in view if m.metadata.get("kilo_rules") == KIND_CONTINUE][:1] or [
                _continue(plan)
            ]
        wire = _render(plan, protocol, added)
        if not wire:
            return None
        body = json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
        pair = json.dumps([m.model_dump(mode="json") for m in added[:2]], ensure_ascii=False)
        entry = Entry(hashes[position - 1], position, body, len(done.summary_text), pair=pair)
        # Without a ledger every request is compacted on its own (a summary per request).
        return self.ledger.record(entry, hashes[0]) if self.ledger is not None else entry

    def _marked(
        self, protocol: Protocol, scanned: Scanned, replacement: list[Any], start: int
    ) -> list[Any]:
        """The replacement with a cache mark on its last block (Anthropic), so that the
        summary is read from the cache on the next turns — unless the client's own marks
        already use every breakpoint the provider allows."""
        if protocol.provider != "anthropic" or not replacement:
            return replacement
        text = scanned.text
        spans = scanned.items or ()
        kept = sum(text.count('"cache_control"', s.start, s.end) for s in spans[start:])
        others = [s for k, s in scanned.members.items() if k != protocol.items]
        kept += sum(text.count('"cache_control"', s.start, s.end) for s in others)
        if kept >= PROVIDER_BREAKPOINT_LIMITS.get(protocol.wire_api, 0):
            return replacement
        last = json.loads(json.dumps(replacement[-1]))
        content = last.get("content") if isinstance(last, dict) else None
        if isinstance(content, str):
            last["content"] = content = [{"type": "text", "text": content}]
        if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
            return replacement
        content[-1]["cache_control"] = _MARK
        return [*replacement[:-1], last]

    def _output_cap(
        self, protocol: Protocol, scanned: Scanned, plan: Plan
    ) -> tuple[Span, int] | None:
        """The output member to lower, when the client asks for more than the policy caps
        the output at (``output.max_tokens``); None when nothing is to change."""
        try:
            cap = plan.resolve(plan.knobs.output_configured)
        except KiloRulesError:
            return None
        if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
            return None
        for key in protocol.output_keys:
            asked = scanned.value.get(key)
            if isinstance(asked, int) and not isinstance(asked, bool) and key in scanned.members:
                return (scanned.members[key], cap) if asked > cap else None
        return None


def _with_pair(session: Session, pair: str, lead: int, count: int) -> Session:
    """``session`` with the messages imported from the replacement items (positions
    ``lead`` to ``lead + count``) put back as the engine's compaction they render: its
    request and its summary, pins included, so the next summary updates this one."""
    request, summary = (Message.model_validate(m) for m in json.loads(pair))
    request = request.model_copy(update={"id": f"msg_{lead:06d}"})
    summary = summary.model_copy(update={"id": f"msg_{lead + 1:06d}", "parent_id": request.id})
    kept = [m for m in session.messages if not lead <= _index(m.id) < lead + count]
    head = [m for m in kept if _index(m.id) < lead]
    return session.model_copy(update={"messages": [*head, request, summary, *kept[len(head) :]]})


def _continue(plan: Plan) -> Message:
    text = plan.settings.compaction.continue_text or "Continue."
    part = TextPart(id="continue-p1", text=text)
    return Message(id="continue", role="user", created=0, parts=[part])


def _index(message_id: str) -> int:
    """The item index a Session message id was made from (``msg_000042`` → 42)."""
    stem = message_id.removeprefix("msg_").split("_", 1)[0].split("-", 1)[0]
    return int(stem) if stem.isdigit() else -1


def _tail_start(protocol: Protocol, sent: Sequence[Any], at: int, first: int) -> int | None:
    """The first item at or after ``at`` a kept tail may open with (a user message, or an
    assistant turn); else the last one before it, after ``first``; else None."""
    for i in range(at, len(sent)):
        if protocol.role(sent[i]) is not None:
            return i
    for i in range(min(at, len(sent)) - 1, first, -1):
        if protocol.role(sent[i]) is not None:
            return i
    return None


def _render(plan: Plan, protocol: Protocol, messages: Sequence[Message]) -> list[Any]:
    """``messages`` (the compaction's request and summary) as the client API's items."""
    lowered = lower(messages, lower_settings(plan, has_summary=True))
    request = ModelRequest(model=plan.model.api_id or plan.model.id, messages=tuple(lowered))
    body = render(request, protocol.wire_api)
    items = body.get("input" if protocol.items == "input" else "messages")
    return list(items) if isinstance(items, list) else []
