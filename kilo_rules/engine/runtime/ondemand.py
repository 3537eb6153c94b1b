"""On-demand instructions: when a read tool opens a file under a directory that has its
own instruction file (``AGENTS.md``...), that file is attached to the tool result, once
per assistant message and never when the system prompt already carries it (Kilo's
``InstructionPrompt.resolve``)."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kilo_rules.engine.base import safefs
from kilo_rules.engine.formats.request import ModelMessage, Text, ToolCall, ToolResult
from kilo_rules.engine.frontend.checks import MAX_FILE_BYTES
from kilo_rules.engine.runtime.context import Workspace

READ_TOOLS = frozenset({"read", "Read", "view", "read_file"})
PATH_KEYS = ("filePath", "file_path", "path")


def _read_path(call: ToolCall, ws: Workspace) -> str | None:
    for key in PATH_KEYS:
        value = call.input.get(key)
        if isinstance(value, str) and value:
            return os.path.join(ws.cwd, value)  # an absolute value replaces cwd  # noqa: PTH118
    return None


def _candidates(
    file: str, names: Sequence[str], stop: str, memo: dict[str, str | None]
) -> list[str]:
    """Instruction files between the file's directory and the workspace root, nearest
    first; in each directory the first configured name that exists, as written (where it
    leads is decided when it is read, beneath ``stop``). ``memo`` remembers directories
    already looked at during this request. Paths are strings, not ``Path``s: this runs for
    every read call of the history on every step."""
    # normpath, not realpath: no system call per read. A symlinked directory on the way
    # is caught when the file is read (safefs.read_beneath resolves and confines it).
    current = os.path.dirname(safefs.lexical(file))  # noqa: PTH120
    if not safefs.is_within(current, stop):
        return []  # outside the workspace: nothing to attach
    found = []
    while True:
        if current not in memo:
            here = (os.path.join(current, n) for n in names)  # noqa: PTH118
            memo[current] = next((p for p in here if os.path.isfile(p)), None)  # noqa: PTH113
        hit = memo[current]
        if hit is not None:
            found.append(hit)
        parent = os.path.dirname(current)  # noqa: PTH120
        if current == stop or parent == current:
            return found
        current = parent


def attach(
    messages: Sequence[ModelMessage],
    names: Sequence[str],
    loaded: Collection[Path],
    ws: Workspace,
) -> tuple[list[ModelMessage], list[dict[str, Any]]]:
    """Messages with on-demand instruction files appended to read results, and decisions;
    ``loaded`` are the instruction files the system prompt already carries."""
    calls: dict[str, tuple[str | None, ToolCall]] = {}
    for m in messages:
        if m.role == "assistant":
            for p in m.parts:
                if isinstance(p, ToolCall) and p.name in READ_TOOLS:
                    calls[p.call_id] = (m.source_id, p)
    if not calls:
        return list(messages), []
    in_system = {str(p) for p in loaded}
    claimed: dict[str | None, set[str]] = {}
    memo: dict[str, str | None] = {}
    refused: set[str] = set()
    stop = safefs.lexical(ws.root or ws.cwd)
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
                for written in _candidates(path, names, stop, memo) if path else []:
                    f = os.path.realpath(written)
                    if f in in_system or f in seen:
                        continue
                    try:
                        f, data = safefs.read_beneath(stop, written, max_bytes=MAX_FILE_BYTES)
                        body = data.decode("utf-8")
                    except (OSError, UnicodeDecodeError) as exc:
                        if written not in refused:
                            refused.add(written)
                            decisions.append(
                                {"rule": "on_demand.skipped", "file": written, "warning": str(exc)}
                            )
                        continue
                    seen.add(f)
                    note = f"Instructions from: {f}\n{body}"
                    extra.append(
                        Text(f"<system-reminder>\n{note}\n</system-reminder>", synthetic=True)
                    )
                    decisions.append({"rule": "on_demand", "file": f, "call": part.call_id})
                if extra:
                    part = replace(part, content=(*part.content, *extra))
                    changed = True
            parts.append(part)
        out.append(replace(m, parts=tuple(parts)) if changed else m)
    return out, decisions
