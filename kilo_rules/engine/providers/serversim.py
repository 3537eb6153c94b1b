"""What a provider's own context management does to a request, for the simulator.

The runtime asks for server-side edits (the policy's ``server`` section, sent as
``context_management``); the provider applies them to the request before the model reads
it, and bills and caches what is left. :class:`ServerEdits` plays them on rendered wire
bodies, step after step:

* **clear_thinking** (Anthropic): thinking blocks of assistant messages older than the
  last ``keep`` are dropped. Exact.
* **clear_tool_uses** (Anthropic): once the input exceeds ``trigger`` tokens, the results
  of tool uses older than the last ``keep`` (tools in ``exclude_tools`` spared) are
  replaced by a short placeholder, oldest first, and their inputs emptied with
  ``clear_tool_inputs``; nothing is cleared unless ``clear_at_least`` tokens go. Exact in
  what is cleared; the placeholder's size is approximated by the placeholder text.
* **compaction** (Anthropic's ``compact`` edit, the Responses API's compaction): once the
  input reaches ``trigger``, the provider summarises every conversation item but the last
  two and the next requests carry the summary instead. *Approximated*: the summary's size
  is 5 % of what it replaces (at least 1,000 tokens, at most 8,000), and the summarising
  call is billed as one more request (its input uncached, its output at the output price).

An edit changes the request from the first thing it clears, so the cache model sees the
prefix change there, as the provider's cache does. Which edits a wire API's provider runs,
and on which key of its body, are its facts (``server`` in
:mod:`kilo_rules.engine.formats.wireapi`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.providers.cachesim import blocks

__all__ = ["ServerEdits", "ServerStep", "refuses"]

#: What a cleared tool result reads (Anthropic does not document its text; a short line).
CLEARED = "[tool result cleared]"
SUMMARY_SHARE = 0.05
SUMMARY_MIN = 1_000
SUMMARY_MAX = 8_000


def refuses(
    input_tokens: int, output: int | None, context: int, input_limit: int | None = None
) -> bool:
    """Whether a provider refuses a request as too long: its input plus the output cap it
    asks for (``max_tokens``; none asked, nothing reserved) exceed the ``context`` window,
    or its input alone exceeds a separate ``input_limit``. A window of 0 is unknown and
    refuses nothing.

    Anthropic: "input length and `max_tokens` exceed context limit"; OpenAI: "This model's
    maximum context length is N tokens. However, you requested M tokens (P in the
    messages, C in the completion)". The one rule the runtime's window stage, the
    ``output-within-window`` acceptance rule and the simulator's replay all apply."""
    if input_limit and input_tokens > input_limit:
        return True
    return bool(context) and input_tokens + (output or 0) > context


@dataclass(frozen=True, slots=True)
class ServerStep:
    """What the provider did to one request: tool uses cleared, thinking blocks dropped,
    whether it compacted (and the tokens the summarising call read and wrote)."""

    cleared_tool_uses: int = 0
    cleared_thinking: int = 0
    compacted: bool = False
    summary_input: int = 0
    summary_output: int = 0


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ServerEdits:
    """The edits of one plan, played over the bodies of one session in order."""

    def __init__(
        self, edits: Sequence[dict[str, Any]], api: str, count: Callable[[str], int]
    ) -> None:
        self.edits = {e["edit"]: e for e in edits}
        self.api = api
        self.facts = wireapi.facts(api).server if wireapi.known(api) else None
        self.count = count
        self.summarized = 0  # conversation items the provider has compacted away
        self.summary_tokens = 0

    def size(self, body: dict[str, Any]) -> int:
        """The body's input tokens as the simulator counts them (block by block, so the
        counter's cache answers for every block a previous step already sent)."""
        return sum(b.tokens for b in blocks(body, self.count))

    @property
    def active(self) -> bool:
        """Whether anything is played at all (an API without these edits plays nothing)."""
        return bool(self.edits) and self.facts is not None

    def apply(self, body: dict[str, Any]) -> tuple[dict[str, Any], ServerStep]:
        """The body as the provider reads it, and what it did."""
        if not self.active or self.facts is None:
            return body, ServerStep()
        runs = self.facts.edits
        out = copy.deepcopy(body)
        key = self.facts.items
        items: list[Any] = out.get(key) or []
        thinking = cleared = 0
        compacted = False
        s_in = s_out = 0
        if self.summarized:
            items = [self._summary_item(), *items[self.summarized :]]
        if "clear_thinking" in runs and "clear_thinking" in self.edits:
            thinking = _clear_thinking(items, self.edits["clear_thinking"]["keep"])
        if "clear_tool_uses" in runs and "clear_tool_uses" in self.edits:
            cleared = self._clear_tool_uses(out, key, items)
        out[key] = items
        c = self.edits.get("compaction") if "compaction" in runs else None
        size = self.size(out) if c is not None and len(items) > 2 else 0
        if c is not None and size >= c["trigger"]:
            s_in = size  # the summarising call reads what the model would have read
            replaced = sum(self.count(_dumps(i)) for i in items[:-2])
            self.summary_tokens = max(SUMMARY_MIN, min(SUMMARY_MAX, round(replaced * 0.05)))
            s_out = self.summary_tokens
            # Later bodies still hold every item the client sent: the provider drops the
            # ones the summary covers (this body's items but the last two, the summary
            # item itself included).
            original = len(body.get(key) or [])
            self.summarized = original - 2
            out[key] = [self._summary_item(), *items[-2:]]
            compacted = True
        return out, ServerStep(cleared, thinking, compacted, s_in, s_out)

    def _summary_item(self) -> dict[str, Any]:
        text = "summary " * self.summary_tokens  # about one token a word
        kind = self.facts.text_type if self.facts is not None else "text"
        return {"role": "user", "content": [{"type": kind, "text": text}]}

    def _clear_tool_uses(self, body: dict[str, Any], key: str, items: list[Any]) -> int:
        e = self.edits["clear_tool_uses"]
        if self.size({**body, key: items}) <= e["trigger"]:
            return 0
        names: dict[str, str] = {}
        uses: list[tuple[dict[str, Any], str]] = []  # (tool_use block, id), oldest first
        for msg in items:
            for block in _blocks(msg):
                if block.get("type") == "tool_use":
                    names[block.get("id", "")] = block.get("name", "")
                    uses.append((block, block.get("id", "")))
        keep = e["keep"]
        old = uses[: max(0, len(uses) - keep)] if keep else uses
        exclude = set(e.get("exclude_tools") or ())
        targets = {i for b, i in old if b.get("name") not in exclude}
        if not targets:
            return 0
        results = [
            block
            for msg in items
            for block in _blocks(msg)
            if block.get("type") == "tool_result" and block.get("tool_use_id") in targets
        ]
        freed = sum(self.count(_dumps(r.get("content"))) for r in results)
        freed -= len(results) * self.count(CLEARED)
        least = e.get("clear_at_least")
        if least and freed < least:
            return 0
        for r in results:
            if r.get("content") != CLEARED:
                r["content"] = CLEARED
        if e.get("clear_tool_inputs"):
            for b, i in old:
                if i in targets:
                    b["input"] = {}
        return len(targets)


def _blocks(msg: Any) -> list[dict[str, Any]]:
    content = msg.get("content") if isinstance(msg, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _clear_thinking(items: list[Any], keep: int | str) -> int:
    if keep == "all":
        return 0
    assistants = [m for m in items if isinstance(m, dict) and m.get("role") == "assistant"]
    old = assistants[: max(0, len(assistants) - int(keep))]
    dropped = 0
    for msg in old:
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        kept = [
            b
            for b in content
            if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))
        ]
        dropped += len(content) - len(kept)
        msg["content"] = kept
    return dropped
