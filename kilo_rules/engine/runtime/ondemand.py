"""On-demand instructions: when a read tool opens a file under a directory that has its
own instruction file (``AGENTS.md``...), that file is attached to the tool result, once
per assistant message and never when the system prompt already carries it (Kilo's
``InstructionPrompt.resolve``).

Kilo resolves the files when the read tool runs and stores them in the tool output;
kilo-rules stores nothing in the session, so every step resolves them again for every
read of the history, against the filesystem as it is at that step: a file that appeared
since is attached to earlier reads too, one that is gone no longer is (the request is a
function of the session and the workspace, whichever process builds it). A step looks at
each directory, resolves each instruction file and reads it at most once, however many
reads and assistant messages lead to it (:class:`_Lookups`)."""

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
    every distinct read path of the history on every step."""
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


class _Lookups:
    """What one step learnt from the filesystem: the instruction file of each directory,
    the candidates of each read path, the real path and the content of each file."""

    def __init__(self, names: Sequence[str], stop: str) -> None:
        self.names = names
        self.stop = stop
        self.dirs: dict[str, str | None] = {}
        self.chains: dict[str, list[str]] = {}
        self.reals: dict[str, str] = {}
        self.reads: dict[str, tuple[str, str] | Exception] = {}

    def candidates(self, path: str) -> list[str]:
        found = self.chains.get(path)
        if found is None:
            found = self.chains[path] = _candidates(path, self.names, self.stop, self.dirs)
        return found

    def real(self, written: str) -> str:
        found = self.reals.get(written)
        if found is None:
            found = self.reals[written] = os.path.realpath(written)
        return found

    def read(self, written: str) -> tuple[str, str] | Exception:
        """(real path, text) of the instruction file, read beneath the workspace, or why
        it was refused."""
        found = self.reads.get(written)
        if found is None:
            try:
                f, data = safefs.read_beneath(self.stop, written, max_bytes=MAX_FILE_BYTES)
                found = (f, data.decode("utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                found = exc
            self.reads[written] = found
        return found


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
    refused: set[str] = set()
    stop = safefs.lexical(ws.root or ws.cwd)
    look = _Lookups(names, stop)
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
                for written in look.candidates(path) if path else []:
                    f = look.real(written)
                    if f in in_system or f in seen:
                        continue
                    read = look.read(written)
                    if isinstance(read, Exception):
                        if written not in refused:
                            refused.add(written)
                            decisions.append(
                                {"rule": "on_demand.skipped", "file": written, "warning": str(read)}
                            )
                        continue
                    f, body = read
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
