"""An offline, deterministic summarizer that fills the template from the head's own words.

No model is involved: the Goal comes from the user's first and latest requests, the
Constraints from their "always / never / must / prefer" sentences, Progress and Next Steps
from tool activity and the assistant's statements, Critical Context from the exact error
lines and commands seen, and Relevant Files from every path a tool touched. Paths, commands
and error lines are copied byte-exact. A rolling update keeps the previous text's bullets,
adds the new ones and drops duplicates.

>>> from kilo_rules.engine.summarizers.protocol import SummaryRequest
>>> from kilo_rules.engine.formats.request import ModelMessage, Text
>>> head = (ModelMessage("user", (Text("Fix the parser. Never touch the lexer."),)),)
>>> text = ExtractiveSummarizer().summarize(SummaryRequest("", head, 1000))
>>> print(text.split("\\n\\n")[1])
## Constraints & Preferences
- Never touch the lexer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kilo_rules.engine.base.cancel import checkpoint
from kilo_rules.engine.summarizers import _sections
from kilo_rules.engine.summarizers._shared import (
    DEFAULT_HEADINGS,
    Heading,
    clip,
    parse_headings,
    section_key,
)
from kilo_rules.engine.summarizers.protocol import SummaryRequest

__all__ = ["ExtractiveSummarizer"]

EMPTY = "- (none)"
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_PLACEHOLDERS = frozenset({"", "(none)", "none", "none.", "n/a", "-", "—", "nothing yet"})
# Sections that describe the current state: new content replaces the old, since an old
# "in progress" or "next" item is usually finished or superseded by now.
_STATE = frozenset({"in_progress", "blocked", "next"})
# Which bullets survive a cap: standing facts keep the oldest, running logs keep the newest.
_KEEP_FIRST = frozenset({"constraints", "files"})


@dataclass(frozen=True, slots=True)
class ExtractiveSummarizer:
    """The default :class:`~kilo_rules.engine.summarizers.protocol.Summarizer`: offline,
    deterministic, fast.

    ``max_bullets`` bounds each section (Relevant Files has ``max_files``),
    ``max_bullet_chars`` each bullet, and the whole text is kept within about
    ``request.max_output_tokens × chars_per_token`` characters by dropping the least
    important bullets first; the headings are always kept.
    """

    max_bullets: int = 12
    max_files: int = 24
    max_bullet_chars: int = 300
    chars_per_token: int = 4

    def summarize(self, request: SummaryRequest) -> str:
        """The sections of ``request.template`` (or the built-in ones) filled from the head."""
        headings = parse_headings(request.template) or DEFAULT_HEADINGS
        checkpoint()  # the head may be long: a summary nobody waits for stops here
        new = _sections.build(request.messages, self.max_bullet_chars)
        checkpoint()
        previous = (
            _parse_previous(request.previous_summary, headings) if request.previous_summary else {}
        )
        body: dict[str, list[str]] = {}
        for i, h in enumerate(headings):
            key = section_key(h.title)
            fresh = new.get(key, []) if key is not None and not _is_parent(headings, i) else []
            old = previous.get(h.line, [])
            body[h.line] = self._merge(key, old, fresh)
        _bound(headings, body, max(0, request.max_output_tokens) * self.chars_per_token)
        return _render(headings, body)

    def _merge(self, key: str | None, old: list[str], fresh: list[str]) -> list[str]:
        limit = self.max_files if key == "files" else self.max_bullets
        if key == "files":
            merged = _sections.merge_files(old, fresh)
        elif key in _STATE and fresh:
            merged = fresh
        else:
            merged = _dedupe(old + fresh)
        # A bullet is one line: a stray line break in a recorded value must not start a
        # line of its own (it could even read as a heading).
        merged = [clip(" ".join(b.splitlines()), self.max_bullet_chars) for b in merged]
        if len(merged) <= limit:
            return merged
        if key in _KEEP_FIRST:
            return merged[:limit]
        if key == "goal" and limit > 1:
            return merged[:1] + merged[-(limit - 1) :]  # the original ask and the latest ones
        return merged[-limit:]


def _is_parent(headings: tuple[Heading, ...], i: int) -> bool:
    """A ``##`` heading directly followed by ``###`` ones holds only those subsections."""
    return i + 1 < len(headings) and headings[i + 1].level > headings[i].level


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".;:!")


def _dedupe(bullets: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for b in bullets:
        n = _norm(b)
        if n not in _PLACEHOLDERS and n not in seen:
            seen.add(n)
            out.append(b)
    return out


def _parse_previous(text: str, headings: tuple[Heading, ...]) -> dict[str, list[str]]:
    """The previous text's bullets under each of our headings.

    A heading is matched by its exact title first and by content kind second, so a text
    written by a model that renamed a heading slightly still carries over. Prose lines count
    as bullets; text before the first heading is dropped.
    """
    by_title = {h.title.lower(): h.line for h in headings}
    by_key: dict[str, str] = {}
    for h in headings:
        key = section_key(h.title)
        if key is not None:
            by_key.setdefault(key, h.line)
    out: dict[str, list[str]] = {}
    current: str | None = None
    for raw in text.splitlines():
        m = re.match(r"^\s*(#{1,6})\s+(.*?)\s*#*\s*$", raw)
        if m:
            title = m.group(2).strip().lower()
            key = section_key(title)
            current = by_title.get(title) or (by_key.get(key) if key is not None else None)
            continue
        line = _BULLET.sub("", raw).strip()
        if current is not None and _norm(line) not in _PLACEHOLDERS:
            out.setdefault(current, []).append(line)
    return out


def _render(headings: tuple[Heading, ...], body: dict[str, list[str]]) -> str:
    blocks: list[str] = []
    for i, h in enumerate(headings):
        bullets = body.get(h.line, [])
        lines = [h.line]
        if bullets:
            lines += [f"- {b}" for b in bullets]
        elif not _is_parent(headings, i):
            lines.append(EMPTY)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _bound(headings: tuple[Heading, ...], body: dict[str, list[str]], budget: int) -> None:
    """Drop bullets, longest section first, until the rendered text fits ``budget``.

    Within a section the bullet dropped is the one its cap policy values least (the newest
    for standing facts, the oldest for running logs); headings are never dropped.
    """

    def size() -> int:
        return len(_render(headings, body))

    total = size()
    keys = {h.line: section_key(h.title) for h in headings}
    while total > budget:
        checkpoint()  # one bullet dropped per round, the body rendered again each time
        line = max(
            (ln for ln, bs in body.items() if bs),
            key=lambda ln: sum(len(b) + 3 for b in body[ln]),
            default=None,
        )
        if line is None:
            return
        bullets = body[line]
        dropped = (
            bullets.pop() if keys[line] in _KEEP_FIRST or keys[line] == "goal" else (bullets.pop(0))
        )
        total -= len(dropped) + 3
        if not bullets:
            total = size()  # the placeholder line replaces the last bullet
