"""On-demand instructions: when a read tool opens a file under a directory that has its
own instruction file (``AGENTS.md``...), that file is attached to the tool result, once
per assistant message and never when the system prompt already carries it (Kilo's
``InstructionPrompt.resolve``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..request import ModelMessage, Text, ToolCall, ToolResult
from .context import Workspace

READ_TOOLS = frozenset({"read", "Read", "view", "read_file"})
PATH_KEYS = ("filePath", "file_path", "path")


def _read_path(call: ToolCall, ws: Workspace) -> Path | None:
    for key in PATH_KEYS:
        value = call.input.get(key)
        if isinstance(value, str) and value:
            p = Path(value)
            return p if p.is_absolute() else Path(ws.cwd) / p
    return None


def _candidates(
    file: Path, names: Sequence[str], stop: Path, memo: dict[Path, Path | None]
) -> list[Path]:
    """Instruction files between the file's directory and the workspace root, nearest
    first; in each directory the first configured name that exists. ``memo`` remembers
    directories already looked at during this request."""
    # normpath, not resolve(): no system call per read (symlinked trees are rare here).
    current = Path(os.path.normpath(os.path.abspath(file))).parent  # noqa: PTH100
    try:
        current.relative_to(stop)
    except ValueError:
        return []  # outside the workspace: nothing to attach
    found = []
    while True:
        if current not in memo:
            hit = next((current / n for n in names if (current / n).is_file()), None)
            memo[current] = hit.resolve() if hit is not None else None
        hit = memo[current]
        if hit is not None:
            found.append(hit)
        if current == stop or current.parent == current:
            return found
        current = current.parent


def attach(
    messages: Sequence[ModelMessage],
    names: Sequence[str],
    loaded: set[Path],
    ws: Workspace,
) -> tuple[list[ModelMessage], list[dict[str, Any]]]:
    """Messages with on-demand instruction files appended to read results, and decisions."""
    calls: dict[str, tuple[str | None, ToolCall]] = {}
    for m in messages:
        if m.role == "assistant":
            for p in m.parts:
                if isinstance(p, ToolCall) and p.name in READ_TOOLS:
                    calls[p.call_id] = (m.source_id, p)
    if not calls:
        return list(messages), []
    claimed: dict[str | None, set[Path]] = {}
    memo: dict[Path, Path | None] = {}
    stop = Path(os.path.normpath(os.path.abspath(ws.root or ws.cwd)))  # noqa: PTH100
    decisions: list[dict[str, Any]] = []
    out: list[ModelMessage] = []
    for m in messages:
        if m.role != "tool":
            out.append(m)
            continue
        parts = []
        changed = False
        for part in m.parts:
            hit = calls.get(part.call_id) if isinstance(part, ToolResult) else None
            if isinstance(part, ToolResult) and hit is not None and not part.is_error:
                owner, call = hit
                path = _read_path(call, ws)
                seen = claimed.setdefault(owner, set())
                extra: list[Text] = []
                for f in _candidates(path, names, stop, memo) if path else []:
                    if f in loaded or f in seen:
                        continue
                    seen.add(f)
                    try:
                        body = f.read_text(encoding="utf-8")
                    except (OSError, UnicodeDecodeError):
                        continue
                    note = f"Instructions from: {f}\n{body}"
                    extra.append(
                        Text(f"<system-reminder>\n{note}\n</system-reminder>", synthetic=True)
                    )
                    decisions.append({"rule": "on_demand", "file": str(f), "call": part.call_id})
                if extra:
                    part = replace(part, content=(*part.content, *extra))
                    changed = True
            parts.append(part)
        out.append(replace(m, parts=tuple(parts)) if changed else m)
    return out, decisions
