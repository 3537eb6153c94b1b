"""Pieces both summarizers use: the template's headings, the head as a transcript, text cuts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)

__all__ = [
    "DEFAULT_HEADINGS",
    "Heading",
    "clip",
    "one_line",
    "parse_headings",
    "result_text",
    "section_key",
    "transcript",
]


@dataclass(frozen=True, slots=True)
class Heading:
    """One ``##``/``###`` line of the summary template, kept exactly as written."""

    line: str  # e.g. "### In Progress"
    level: int  # 2 for "##", 3 for "###"
    title: str  # e.g. "In Progress"


_HEADING = re.compile(r"^(#{2,3})[ \t]+(\S.*?)[ \t]*$")


def parse_headings(template: str) -> tuple[Heading, ...]:
    """The ``##`` and ``###`` lines of ``template``, in order, duplicates dropped.

    Lines inside fenced code blocks are skipped: a template may quote markdown as an example.
    """
    out: list[Heading] = []
    seen: set[str] = set()
    fenced = False
    for raw in template.splitlines():
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(raw)
        if m is None:
            continue
        line = f"{m.group(1)} {m.group(2)}"
        if line not in seen:
            seen.add(line)
            out.append(Heading(line, len(m.group(1)), m.group(2)))
    return tuple(out)


# The sections of policies/prompts/summary-template.md, used when a request has no template.
DEFAULT_HEADINGS: tuple[Heading, ...] = parse_headings(
    "## Goal\n## Constraints & Preferences\n## Progress\n### Done\n### In Progress\n"
    "### Blocked\n## Key Decisions\n## Next Steps\n## Critical Context\n## Relevant Files\n"
)

# Heading title → the kind of content the extractive summarizer puts there. Matched by words
# so that a lightly edited template ("Constraints", "Files") still gets its content.
_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("goal", ("goal", "objective", "task")),
    ("constraints", ("constraint", "preference", "instruction", "rule")),
    ("in_progress", ("in progress", "ongoing", "current")),
    ("blocked", ("blocked", "blocker", "issue")),
    ("done", ("done", "completed", "finished")),
    ("decisions", ("decision",)),
    ("next", ("next",)),
    ("context", ("critical", "context", "fact")),
    ("files", ("file", "path")),
    ("progress", ("progress",)),
)


def section_key(title: str) -> str | None:
    """The content kind for a heading title, or None for a heading we have no content for."""
    low = title.lower()
    for key, words in _KEYS:
        if any(w in low for w in words):
            return key
    return None


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis marking the cut."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return text[: max(limit, 0)]
    return text[: limit - 1].rstrip() + "…"


def one_line(text: str) -> str:
    """Whitespace runs (newlines included) collapsed to one space, ends trimmed."""
    return " ".join(text.split())


def result_text(result: ToolResult) -> str:
    """The text of a tool result; media become a one-line placeholder."""
    out: list[str] = []
    for c in result.content:
        if isinstance(c, Text):
            out.append(c.text)
        else:
            out.append(_media(c))
    return "\n".join(out)


def _media(m: Media) -> str:
    return f"[Attached {m.mime}: {m.filename or 'file'}]"


def _args(call: ToolCall) -> str:
    try:
        return json.dumps(call.input, ensure_ascii=False)
    except (TypeError, ValueError):
        # Inputs come from recorded sessions; a value JSON cannot encode still has a repr.
        return repr(call.input)


def _blocks(msg: ModelMessage) -> Iterable[str]:
    for p in msg.parts:
        if isinstance(p, Text):
            yield p.text
        elif isinstance(p, Media):
            yield _media(p)
        elif isinstance(p, ToolCall):
            yield f"{p.name}({_args(p)})"
        elif isinstance(p, ToolResult):
            head = f"{p.name} result" + (" (error)" if p.is_error else "")
            yield f"{head}:\n{result_text(p)}"
        elif isinstance(p, Reasoning):
            # Reasoning is the model's scratchpad; signed or encrypted blocks cannot travel
            # as text anyway, so the transcript carries only what was said and done.
            continue


def transcript(messages: Sequence[ModelMessage]) -> str:
    """The head as plain text: one role-labelled block per message, blank-line separated.

    Tool calls read ``name({json args})`` and results ``name result:`` followed by their text,
    so a model with no tools can still follow what happened.
    """
    blocks: list[str] = []
    for msg in messages:
        body = "\n".join(b for b in _blocks(msg) if b)
        if body:
            blocks.append(f"[{msg.role}]\n{body}")
    return "\n\n".join(blocks)
