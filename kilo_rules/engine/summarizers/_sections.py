"""Facts → bullets, one list per section kind (the keys of ``_shared.section_key``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from kilo_rules.engine.formats.request import ModelMessage
from kilo_rules.engine.summarizers._facts import Call, Facts, error_lines, gather, urls
from kilo_rules.engine.summarizers._shared import clip, one_line, result_text

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[*])")
_LEAD = re.compile(r"^(?:#+\s*|>\s*|[-*+•]\s+|\d+[.)]\s+|\*\*)+")
_CONSTRAINT = re.compile(
    r"\b(?:always|never|must(?:n't)?|don't|do not|should(?:n't)?|prefer(?:ably)?|avoid"
    r"|make sure|ensure|required?|only use|without|keep)\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:decided|decide to|instead|because|will use|we'll use|i'll use|going to use|chose"
    r"|choose|rather than|switch(?:ed)? to|go with|the fix is|the approach|in order to)\b",
    re.IGNORECASE,
)
_DONE = re.compile(
    r"\b(?:fixed|done|completed?|implemented|added|created|updated|passed|passes|succeeded"
    r"|successfully|resolved|confirmed|reproduced|removed|verified|works now)\b",
    re.IGNORECASE,
)
_FUTURE = re.compile(r"^(?:let me|let's|now let|i'll|i will|next,? i|we'll|we will)\b", re.I)
_NOT = re.compile(r"\b(?:not|no longer|yet to|todo)\b|n't\b", re.IGNORECASE)
_NEXT = re.compile(
    r"\b(?:next|then|will|need to|needs to|should|let me|let's|todo|remaining|still have to"
    r"|going to|plan to)\b",
    re.IGNORECASE,
)
_CHANGES = ("created", "edited", "deleted")
_RANK = {"created": 0, "edited": 0, "deleted": 0, "read": 1, "ran": 2, "searched": 3}
_FILE_BULLET = re.compile(r"^`([^`]+)`(?:\s+—\s+(.*))?$")


def sentences(text: str) -> Iterator[str]:
    """Prose sentences of ``text``: code blocks skipped, list markers and headings removed."""
    for raw in _FENCE.sub("\n", text).splitlines():
        line = _LEAD.sub("", raw.strip()).strip()
        for s in _SPLIT.split(line.replace("**", "")):
            s = s.strip()
            if len(s.split()) >= 3:
                yield s


def build(messages: Sequence[ModelMessage], width: int) -> dict[str, list[str]]:
    """Bullets (without the ``- ``) for every section kind, from the head alone."""
    facts = gather(messages)
    last_text = facts.assistant_texts[-1] if facts.assistant_texts else ""
    earlier = facts.assistant_texts[:-1]
    return {
        "goal": _goal(facts, width),
        "constraints": _dedupe(
            s for t in facts.user_texts for s in sentences(t) if _CONSTRAINT.search(s)
        ),
        "done": _done(facts, earlier),
        "in_progress": _in_progress(facts, last_text),
        "blocked": _blocked(facts),
        "decisions": _dedupe(
            s for t in facts.assistant_texts for s in sentences(t) if _DECISION.search(s)
        ),
        "next": _next(facts, last_text),
        "context": _context(facts),
        "files": [_file_bullet(p, a) for p, a in _ranked(facts.files)],
    }


def _dedupe(items: Iterator[str] | list[str]) -> list[str]:
    out: dict[str, str] = {}
    for item in items:
        out.setdefault(" ".join(item.lower().split()), item)
    return list(out.values())


def _goal(facts: Facts, width: int) -> list[str]:
    texts = facts.user_texts
    picked = texts[:1] + texts[-1:] if len(texts) > 1 else texts
    return _dedupe(clip(one_line(t), width) for t in picked)


def _code(text: str) -> str:
    """``text`` in backticks, exact; a multi-line command shows its first line."""
    lines = text.strip().splitlines() or [""]
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return f"`{lines[0]}`{more}"


def _done(facts: Facts, earlier: list[str]) -> list[str]:
    out: list[str] = []
    for path, actions in facts.files.items():
        for a in actions:
            if a in _CHANGES:
                out.append(f"{a.capitalize()} `{path}`")
    counts: dict[str, int] = {}
    for c in facts.calls:
        if c.result is not None and not c.failed:
            counts[c.action] = counts.get(c.action, 0) + 1
    activity = [f"{n} {a}" for a, n in sorted(counts.items()) if a not in _CHANGES]
    if activity:
        out.append("Tool calls completed: " + ", ".join(activity))
    claims = [
        s
        for t in earlier
        for s in sentences(t)
        if _DONE.search(s) and not _FUTURE.search(s) and not _NOT.search(s) and not s.endswith("?")
    ]
    return _dedupe(out[:6] + claims)


def _in_progress(facts: Facts, last_text: str) -> list[str]:
    out = list(sentences(last_text))[:2]
    for c in facts.calls:
        if c.result is None:
            out.append(f"`{c.call.name}` on {_code(c.target)} has no result yet")
    return _dedupe(out)


def _first_error(c: Call) -> str:
    text = result_text(c.result) if c.result is not None else ""
    lines = list(error_lines(text)) or [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else "failed"
    return first.removeprefix("<tool_use_error>").removesuffix("</tool_use_error>")


def _blocked(facts: Facts) -> list[str]:
    """Failed calls not followed by a successful call on the same target."""
    ok_after: dict[str, int] = {}
    for c in facts.calls:
        if c.result is not None and not c.failed:
            ok_after[c.target] = c.index
    out = [
        f"`{c.call.name}` on {_code(c.target)}: {_first_error(c)}"
        for c in facts.calls
        if c.failed and ok_after.get(c.target, -1) < c.index
    ]
    return _dedupe(out)


def _next(facts: Facts, last_text: str) -> list[str]:
    if facts.last_role == "user" and facts.user_texts:
        return [f"Answer the latest request: {one_line(facts.user_texts[-1])}"]
    picked = [s for s in sentences(last_text) if _NEXT.search(s)]
    return _dedupe(picked or list(sentences(last_text))[-2:])


def _context(facts: Facts) -> list[str]:
    errors = [f"Error seen: {e}" for e in facts.errors[-6:]]
    values = _dedupe(u for t in facts.user_texts for u in urls(t))[:2]
    commands: dict[str, bool] = {}
    for c in facts.calls:
        if c.command is not None:
            commands.pop(c.command, None)
            commands[c.command] = c.failed or c.result is None
    ran = [f"Ran {_code(cmd)}" + (" (failed)" if bad else "") for cmd, bad in commands.items()]
    room = max(12 - len(errors) - len(values), 4)
    return errors + ran[-room:] + [f"Reference: {v}" for v in values]


def _ranked(files: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    order = {p: i for i, p in enumerate(files)}
    return sorted(
        files.items(),
        key=lambda kv: (
            min((_RANK.get(a.split(" ")[0], 4) for a in kv[1]), default=4),
            order[kv[0]],
        ),
    )


def _file_bullet(path: str, actions: list[str]) -> str:
    return f"`{path}` — {', '.join(actions)}" if actions else f"`{path}`"


def merge_files(old: list[str], fresh: list[str]) -> list[str]:
    """Relevant Files bullets of both texts, one per path, actions unioned, re-ranked."""
    files: dict[str, list[str]] = {}
    loose: list[str] = []
    for bullet in old + fresh:
        m = _FILE_BULLET.match(bullet.strip())
        if m is None:
            if bullet.strip() and bullet not in loose:
                loose.append(bullet)
            continue
        actions = files.setdefault(m.group(1), [])
        for a in (m.group(2) or "").split(","):
            a = a.strip()
            if a and a not in actions:
                actions.append(a)
    return [_file_bullet(p, a) for p, a in _ranked(files)] + loose
