"""Tool-output truncation, as Kilo does it (behaviour spec §11).

Two cuts exist. At tool execution (:func:`truncate_output`, spec §11.1) an output longer than
``MAX_LINES`` lines or ``MAX_BYTES`` UTF-8 bytes is replaced by a head (or tail) preview plus a
hint naming a spill file that holds the full text. At summary time
(:func:`truncate_for_summary`, spec §11.2) a tool output fed to the summarizer is cut to a
number of UTF-16 code units. Both measure text the way Kilo's JavaScript does (UTF-8 bytes
via ``Buffer.byteLength``, lengths in UTF-16 units), so previews and counts match it exactly.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kilo_rules.engine.base import safefs

__all__ = [
    "DELEGATE_ADVICE",
    "GREP_ADVICE",
    "HINT_TEMPLATE",
    "MAX_BYTES",
    "MAX_LINES",
    "RETENTION_SECONDS",
    "TruncateResult",
    "cleanup_spill_dir",
    "spill_path_for",
    "truncate_for_summary",
    "truncate_output",
]

#: Line limit of a tool output (Kilo ``Truncate.MAX_LINES``).
MAX_LINES = 2000
#: Byte limit of a tool output, UTF-8 (Kilo ``Truncate.MAX_BYTES``, 50 KiB).
MAX_BYTES = 50 * 1024
#: How long spill files are kept (7 days).
RETENTION_SECONDS = 7 * 24 * 3600

#: Default hint; ``{path}`` is the spill file, ``{advice}`` one of the two advices below.
HINT_TEMPLATE = (
    "The tool call succeeded but the output was truncated. Full output saved to: {path}\n{advice}"
)
#: Advice when the agent may delegate (the Task tool is not denied), Kilo's text
#: (``truncate.ts@5124c73:133``): how to search and read the file (Grep, and Read with
#: offset/limit) and that a sub-agent, not the agent itself, should do it.
DELEGATE_ADVICE = (
    "Use the Task tool to have explore agent process this file with Grep and Read (with "
    "offset/limit). Do NOT read the full file yourself - delegate to save context."
)
#: Advice when the agent cannot delegate, Kilo's text (``truncate.ts@5124c73:134``).
GREP_ADVICE = (
    "Use Grep to search the full content or Read with offset/limit to view specific sections."
)

Direction = Literal["head", "tail"]
Unit = Literal["lines", "bytes"]

_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PREFIX_CHARS = 48
_SUMMARY_NOTE = "\n[Tool output truncated for compaction: omitted {} chars]"


@dataclass(frozen=True, slots=True)
class TruncateResult:
    """What :func:`truncate_output` produced.

    ``content`` is what the model sees. When ``truncated`` is false it is the original text,
    ``removed`` is 0 and nothing was written. Otherwise ``removed`` counts what the preview
    left out, in ``unit`` (``bytes`` whenever the byte limit stopped the walk), and
    ``spill_path`` is the file that holds the full output.
    """

    content: str
    truncated: bool
    removed: int = 0
    unit: Unit = "lines"
    spill_path: Path | None = None


def _utf8(text: str) -> bytes:
    """UTF-8 bytes as Node's ``Buffer.from(text)`` would produce them."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A Python str can hold surrogates (e.g. from lax JSON). JavaScript pairs adjacent
        # surrogates into one character and replaces lone ones by U+FFFD; a UTF-16 round
        # trip does exactly that.
        fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return fixed.encode("utf-8")


def _utf8_len(text: str) -> int:
    if text.isascii():  # the common case; avoids allocating the encoded copy
        return len(text)
    return len(_utf8(text))


def spill_path_for(spill_dir: Path, call_id: str) -> Path:
    """The spill file of a tool call, directly inside ``spill_dir``; one file per id.

    An id of at most 64 ASCII letters, digits, ``_`` and ``-`` (what providers issue) names
    ``tool_<call_id>``, as in Kilo. Any other id comes from a model or a log and may hold
    anything, so its name is a readable prefix (those characters kept, the others replaced
    by ``_``, cut to 48) and, after a ``.`` that no plain name has, 16 hex digits of the
    SHA-256 of the exact id: distinct ids never share a file, a name stays far below file
    system limits, and no id can reach outside ``spill_dir``.
    """
    if not call_id:
        raise ValueError("call_id must not be empty")
    if _PLAIN_ID.fullmatch(call_id):
        return Path(spill_dir) / f"tool_{call_id}"
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    prefix = _UNSAFE.sub("_", call_id[:_PREFIX_CHARS])
    return Path(spill_dir) / f"tool_{prefix}.{digest}"


def _write_spill(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all, so that a reader never sees a half-written file; private (0600),
    # as a tool's output may hold what only its user may read.
    safefs.write_atomic(path, _utf8(text), mode=0o600)


def truncate_output(
    text: str,
    *,
    spill_dir: Path,
    call_id: str,
    max_lines: int = MAX_LINES,
    max_bytes: int = MAX_BYTES,
    direction: Direction = "head",
    task_enabled: bool = True,
    hint_template: str = HINT_TEMPLATE,
) -> TruncateResult:
    """Cut a tool output to ``max_lines`` lines and ``max_bytes`` UTF-8 bytes (Kilo
    ``Truncate.output``, spec §11.1).

    The text is returned unchanged, and nothing is written, iff it has at most ``max_lines``
    lines (split on ``"\\n"``) and at most ``max_bytes`` bytes. Otherwise lines are taken
    from the start (``head``) or the end (``tail``) while fewer than ``max_lines`` are kept;
    each costs its bytes plus one for the joining newline (none for the first kept line),
    and the walk stops at the first line that would exceed ``max_bytes`` — so a single
    oversized line gives an empty preview. The full text goes to :func:`spill_path_for`, and
    the content is the preview, a ``...<n> <unit> truncated...`` marker and the hint.

    ``hint_template`` may use ``{path}`` and ``{advice}``; advice is :data:`DELEGATE_ADVICE`
    when ``task_enabled`` (the agent may use the Task tool: the search and read advice,
    handed to a sub-agent), else :data:`GREP_ADVICE` (search and read it yourself).
    """
    if max_lines < 0 or max_bytes < 0:
        raise ValueError("max_lines and max_bytes must not be negative")
    if direction not in ("head", "tail"):
        raise ValueError(f"direction must be 'head' or 'tail', not {direction!r}")
    path = spill_path_for(spill_dir, call_id)  # validate the id even when nothing is cut

    lines = text.split("\n")
    total_bytes = _utf8_len(text)
    if len(lines) <= max_lines and total_bytes <= max_bytes:
        return TruncateResult(text, truncated=False)

    kept: list[str] = []
    kept_bytes = 0
    hit_bytes = False
    order = lines if direction == "head" else reversed(lines)
    for line in order:
        if len(kept) >= max_lines:
            break
        size = _utf8_len(line) + (1 if kept else 0)
        if kept_bytes + size > max_bytes:
            hit_bytes = True
            break
        kept.append(line)
        kept_bytes += size
    if direction == "tail":
        kept.reverse()

    removed = total_bytes - kept_bytes if hit_bytes else len(lines) - len(kept)
    unit: Unit = "bytes" if hit_bytes else "lines"
    preview = "\n".join(kept)

    _write_spill(path, text)
    advice = DELEGATE_ADVICE if task_enabled else GREP_ADVICE
    # str.replace, not str.format: a custom template may contain literal braces.
    hint = hint_template.replace("{path}", str(path)).replace("{advice}", advice)
    marker = f"...{removed} {unit} truncated..."
    if direction == "head":
        content = f"{preview}\n\n{marker}\n\n{hint}"
    else:
        content = f"{marker}\n\n{hint}\n\n{preview}"
    return TruncateResult(content, truncated=True, removed=removed, unit=unit, spill_path=path)


def cleanup_spill_dir(
    spill_dir: Path,
    *,
    retention_seconds: float = RETENTION_SECONDS,
    now: float | None = None,
) -> list[Path]:
    """Delete ``tool_*`` spill files last modified more than ``retention_seconds`` before
    ``now`` (default: the current time) and return them, sorted. A missing directory is
    fine; other files are left alone."""
    root = Path(spill_dir)
    if not root.is_dir():
        return []
    cutoff = (time.time() if now is None else now) - retention_seconds
    removed: list[Path] = []
    for entry in root.glob("tool_*"):
        try:
            if entry.is_symlink() or not entry.is_file():
                continue
            if entry.stat().st_mtime < cutoff:
                entry.unlink()
                removed.append(entry)
        except FileNotFoundError:  # another process cleaned it up first
            continue
    return sorted(removed)


def truncate_for_summary(text: str, max_chars: int | None) -> str:
    """Cut a tool output fed to the summarizer to ``max_chars`` UTF-16 code units (Kilo
    ``truncateToolOutput``, spec §11.2).

    When the text is longer, it is cut at ``max_chars`` units — one unit earlier if the cut
    would split a surrogate pair — and ``"\\n[Tool output truncated for compaction: omitted
    <n> chars]"`` is appended, ``n`` being the omitted UTF-16 units. ``None`` means no limit.
    """
    if max_chars is None:
        return text
    if max_chars < 0:
        raise ValueError("max_chars must not be negative")
    if 2 * len(text) <= max_chars:
        return text  # fits even if every code point were astral (2 units)
    if text.isascii():  # one unit per code point: plain slicing is exact
        if len(text) <= max_chars:
            return text
        return f"{text[:max_chars]}{_SUMMARY_NOTE.format(len(text) - max_chars)}"
    units = text.encode("utf-16-le", "surrogatepass")
    total = len(units) // 2
    if total <= max_chars:
        return text
    end = max_chars
    if end > 0:
        last = int.from_bytes(units[2 * end - 2 : 2 * end], "little")
        if 0xD800 <= last <= 0xDBFF:  # a high surrogate: its pair would be split
            end -= 1
    kept = units[: 2 * end].decode("utf-16-le", "surrogatepass")
    return f"{kept}{_SUMMARY_NOTE.format(total - end)}"
