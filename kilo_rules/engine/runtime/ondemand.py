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
reads and assistant messages lead to it (:class:`_Lookups`).

The result for the history is the same from one step to the next unless the filesystem
changed under it, so :class:`OnDemandMemo` keeps each step's walk: the next step checks
again every fact the walk read from disk (which file each directory holds, where each
file leads, its content: O(distinct directories and files), not O(history)) and, when
none changed, takes over the result for the messages it shares with the list walked
before and walks only the new ones. Any change on disk, or a new message that would change
how an earlier read is matched, walks the whole list again."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.formats.request import ModelMessage, Text, ToolCall, ToolResult
from kilo_rules.engine.frontend.checks import MAX_FILE_BYTES
from kilo_rules.engine.runtime.context import Workspace
from kilo_rules.engine.runtime.memo import common_prefix

READ_TOOLS = frozenset({"read", "Read", "view", "read_file"})
PATH_KEYS = ("filePath", "file_path", "path")

_Read = tuple[str, str] | Exception  # (real path, text) of an instruction file, or why not
_Call = tuple[str | None, ToolCall]  # (the assistant message's source id, the read call)
# A file whose status changed this close to when it was read may have changed again within
# the filesystem's timestamp granularity (a kernel tick on Linux, 2 s on FAT) without its
# status showing it: it is read again rather than trusted (git's "racily clean" entries).
RACY_NS = 2_000_000_000


def _status(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_path(call: ToolCall, ws: Workspace) -> str | None:
    for key in PATH_KEYS:
        value = call.input.get(key)
        if isinstance(value, str) and value:
            return os.path.join(ws.cwd, value)  # an absolute value replaces cwd  # noqa: PTH118
    return None


def _same_read(a: _Read, b: _Read) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and str(a) == str(b)  # the refusal's decision shows str()
    return a == b


class _Lookups:
    """What one step learnt from the filesystem: the instruction file of each directory,
    the candidates of each read path, the real path and the content of each file. Filled
    in during one step, never changed once a memo holds it."""

    def __init__(self, names: Sequence[str], stop: str) -> None:
        self.names = names
        self.stop = stop
        self.dirs: dict[str, str | None] = {}
        self.chains: dict[str, list[str]] = {}
        self.reals: dict[str, str] = {}
        self.reads: dict[str, _Read] = {}
        # file -> (its status before it was read, when): to trust the text on a later step
        self.stamps: dict[str, tuple[tuple[int, ...], int]] = {}

    def directory(self, current: str) -> str | None:
        """The first configured name that is a file in ``current``, as written."""
        if current not in self.dirs:
            here = (os.path.join(current, n) for n in self.names)  # noqa: PTH118
            self.dirs[current] = next((p for p in here if os.path.isfile(p)), None)  # noqa: PTH113
        return self.dirs[current]

    def candidates(self, path: str) -> list[str]:
        """Instruction files between the file's directory and the workspace root, nearest
        first; in each directory the first configured name that exists, as written (where
        it leads is decided when it is read, beneath ``stop``). Paths are strings, not
        ``Path``s: this runs for every distinct read path of the history."""
        found = self.chains.get(path)
        if found is None:
            found = self.chains[path] = self._candidates(path)
        return found

    def _candidates(self, file: str) -> list[str]:
        # normpath, not realpath: no system call per read. A symlinked directory on the
        # way is caught when the file is read (safefs.read_beneath resolves and confines it).
        current = os.path.dirname(safefs.lexical(file))  # noqa: PTH120
        if not safefs.is_within(current, self.stop):
            return []  # outside the workspace: nothing to attach
        found = []
        while True:
            hit = self.directory(current)
            if hit is not None:
                found.append(hit)
            parent = os.path.dirname(current)  # noqa: PTH120
            if current == self.stop or parent == current:
                return found
            current = parent

    def real(self, written: str) -> str:
        found = self.reals.get(written)
        if found is None:
            found = self.reals[written] = os.path.realpath(written)
        return found

    def read(self, written: str) -> _Read:
        """(real path, text) of the instruction file, read beneath the workspace, or why
        it was refused."""
        found = self.reads.get(written)
        if found is None:
            at = time.time_ns()
            try:
                # Status first: a change during the read shows in the next step's status.
                stamp = (_status(os.stat(written)), at)  # noqa: PTH116
                f, data = safefs.read_beneath(self.stop, written, max_bytes=MAX_FILE_BYTES)
                found = (f, data.decode("utf-8"))
                self.stamps[written] = stamp
            except (OSError, UnicodeDecodeError) as exc:
                found = exc
            self.reads[written] = found
        return found

    def _unchanged(self, written: str, now: _Lookups) -> bool:
        """Whether the text read from ``written`` is still its content: the same real path
        (``now`` has resolved it again), the same file with the same status, which had not
        changed for a while when it was read."""
        stamp = self.stamps.get(written)
        if stamp is None or now.reals.get(written) != self.reals.get(written):
            return False
        try:
            st = os.stat(written)  # noqa: PTH116
        except OSError:
            return False
        status, at = stamp
        return _status(st) == status and max(st.st_mtime_ns, st.st_ctime_ns) < at - RACY_NS

    def again(self) -> tuple[_Lookups, bool]:
        """This step's lookups, filled in by asking the filesystem again everything these
        asked, and whether every answer is the same. Which file each directory holds and
        where each leads are asked again; a file's text is read again unless its status
        shows it unchanged (one ``stat``, where a read beneath the root costs a ``realpath``
        and an ``open`` per directory on its way)."""
        now = _Lookups(self.names, self.stop)
        same = True
        for d, hit in self.dirs.items():
            same = now.directory(d) == hit and same
        for w, real in self.reals.items():
            same = now.real(w) == real and same
        for w, read in self.reads.items():
            if self._unchanged(w, now):
                now.reads[w], now.stamps[w] = read, self.stamps[w]
            else:
                same = _same_read(now.read(w), read) and same
        if same:
            now.chains = dict(self.chains)  # they follow from the directories alone
        return now, same


@dataclass(frozen=True, slots=True)
class _Delta:
    """What one message added to the walk's state, so that a step whose list leaves the
    message out can take it back."""

    calls: tuple[str, ...] = ()  # read calls it made
    unmatched: tuple[str, ...] = ()  # ids of its results no read call matched, first here
    claims: tuple[tuple[str | None, str], ...] = ()  # (assistant message, file) attached
    refusals: tuple[str, ...] = ()  # instruction files first refused here
    decisions: int = 0


@dataclass(frozen=True, slots=True)
class _State:
    """The walk's state after some messages; never changed once made."""

    calls: dict[str, _Call]
    unmatched: frozenset[str]
    claimed: dict[str | None, frozenset[str]]
    refused: frozenset[str]
    decisions: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class _Walked:
    """One step's walk: its context and list, the result and what each message added."""

    context: Hashable
    messages: list[ModelMessage]
    out: list[ModelMessage]
    deltas: list[_Delta | None]
    state: _State
    look: _Lookups

    def upto(self, n: int) -> _State | None:
        """The state after the first ``n`` messages, or None when it cannot be told without
        walking them again (a message left out made a read call, which earlier results
        may have been matched with)."""
        if n == len(self.messages):
            return self.state
        tail = [d for d in self.deltas[n:] if d is not None]
        if any(d.calls for d in tail):
            return None
        s = self.state
        claimed = dict(s.claimed)
        for d in tail:
            for owner, f in d.claims:
                claimed[owner] = claimed[owner] - {f}
        unmatched = s.unmatched.difference(*(d.unmatched for d in tail))
        refused = s.refused.difference(*(d.refusals for d in tail))
        kept = len(s.decisions) - sum(d.decisions for d in tail)
        return _State(s.calls, unmatched, claimed, refused, s.decisions[:kept])


def _read_calls(m: ModelMessage) -> list[tuple[str, _Call]]:
    if m.role != "assistant":
        return []
    return [
        (p.call_id, (m.source_id, p))
        for p in m.parts
        if isinstance(p, ToolCall) and p.name in READ_TOOLS
    ]


class _Walker:
    """Walks tool messages in order, attaching instruction files, from a given state."""

    def __init__(self, start: _State, in_system: frozenset[str], ws: Workspace, look: _Lookups):
        self.calls = start.calls
        self.start = start
        self.unmatched: set[str] = set()  # besides the start's
        self.claimed = dict(start.claimed)
        self.refused = set(start.refused)
        self.decisions = list(start.decisions)
        self.in_system = in_system
        self.ws = ws
        self.look = look

    def state(self) -> _State:
        return _State(
            self.calls,
            self.start.unmatched.union(self.unmatched) if self.unmatched else self.start.unmatched,
            self.claimed,
            frozenset(self.refused),
            tuple(self.decisions),
        )

    def message(self, m: ModelMessage) -> tuple[ModelMessage, _Delta | None]:
        """The message with its read results' instruction files, and what it added."""
        if m.role != "tool":
            made = tuple(cid for cid, _ in _read_calls(m))
            return m, (_Delta(calls=made) if made else None)
        look, decisions = self.look, self.decisions
        before = len(decisions)
        unmatched: list[str] = []
        claims: list[tuple[str | None, str]] = []
        refusals: list[str] = []
        parts = []
        changed = False
        for part in m.parts:
            if not isinstance(part, ToolResult) or part.is_error:
                parts.append(part)
                continue
            hit = self.calls.get(part.call_id)
            if hit is None:
                # Only where an id is first unmatched: taking the message back keeps it
                # for the earlier result.
                cid = part.call_id
                if cid not in self.start.unmatched and cid not in self.unmatched:
                    self.unmatched.add(cid)
                    unmatched.append(cid)
                parts.append(part)
                continue
            owner, call = hit
            path = _read_path(call, self.ws)
            extra: list[Text] = []
            for written in look.candidates(path) if path else []:
                f = look.real(written)
                if f in self.in_system or f in self.claimed.get(owner, ()):
                    continue
                read = look.read(written)
                if isinstance(read, Exception):
                    if written not in self.refused:
                        self.refused.add(written)
                        refusals.append(written)
                        decisions.append(
                            {"rule": "on_demand.skipped", "file": written, "warning": str(read)}
                        )
                    continue
                f, body = read
                # A new set, not the one in the state this walk started from.
                self.claimed[owner] = self.claimed.get(owner, frozenset()) | {f}
                claims.append((owner, f))
                note = f"Instructions from: {f}\n{body}"
                extra.append(Text(f"<system-reminder>\n{note}\n</system-reminder>", synthetic=True))
                decisions.append({"rule": "on_demand", "file": f, "call": part.call_id})
            if extra:
                part = replace(part, content=(*part.content, *extra))
                changed = True
            parts.append(part)
        out = replace(m, parts=tuple(parts)) if changed else m
        added = len(decisions) - before
        if not (unmatched or claims or refusals or added):
            return out, None
        return out, _Delta((), tuple(unmatched), tuple(claims), tuple(refusals), added)


_EMPTY = _State({}, frozenset(), {}, frozenset(), ())


def _walk(
    messages: list[ModelMessage],
    start: _State,
    in_system: frozenset[str],
    ws: Workspace,
    look: _Lookups,
) -> tuple[list[ModelMessage], list[_Delta | None], _State]:
    walker = _Walker(start, in_system, ws, look)
    out: list[ModelMessage] = []
    deltas: list[_Delta | None] = []
    for m in messages:
        got, delta = walker.message(m)
        out.append(got)
        deltas.append(delta)
    return out, deltas, walker.state()


def _all_calls(messages: Sequence[ModelMessage]) -> tuple[dict[str, _Call], bool]:
    """The read calls by id (the last of an id wins), and whether every id is unique."""
    calls: dict[str, _Call] = {}
    unique = True
    for m in messages:
        for cid, hit in _read_calls(m):
            unique = unique and cid not in calls
            calls[cid] = hit
    return calls, unique


class OnDemandMemo:
    """Each step's on-demand walk, per session, for the next step on the same plan.

    A step re-asks the filesystem what the last walk asked (:meth:`_Lookups.again`); when
    every answer is the same, the messages it shares with the list walked last (their
    common prefix, found at C speed) keep their result and state, and only the messages
    after them are walked. Bounded (least recently used sessions go) and thread-safe: an
    entry is replaced whole, never changed."""

    def __init__(self, maxsize: int = 256) -> None:
        self._walks: LRUCache[Hashable, _Walked] = LRUCache(maxsize)

    def attach(
        self,
        messages: list[ModelMessage],
        in_system: frozenset[str],
        ws: Workspace,
        look: _Lookups,
        key: Hashable,
    ) -> tuple[list[ModelMessage], list[dict[str, Any]]]:
        context = (tuple(look.names), in_system, ws.cwd, look.stop)
        # An identity key is safe: the entry holds the message, so its id is not reused.
        slot = key if key is not None else (OnDemandMemo, id(messages[0]))
        prev = self._walks.get(slot)
        walked: _Walked | None = None
        if prev is not None and prev.context == context:
            look, same = prev.look.again()
            if same:
                walked = _extend(prev, messages, in_system, ws, look)
        if walked is None:
            calls, unique = _all_calls(messages)
            start = replace(_EMPTY, calls=calls)
            out, deltas, state = _walk(messages, start, in_system, ws, look)
            walked = _Walked(context, messages, out, deltas, state, look)
            if not unique:  # a later call of an id changes earlier matches: walk it whole
                return out, [dict(d) for d in state.decisions]
        self._walks.put(slot, walked)
        return list(walked.out), [dict(d) for d in walked.state.decisions]

    def __len__(self) -> int:
        return len(self._walks)


def _extend(
    prev: _Walked,
    messages: list[ModelMessage],
    in_system: frozenset[str],
    ws: Workspace,
    look: _Lookups,
) -> _Walked | None:
    """The walk of ``messages`` from ``prev``'s, walking only the messages after their
    common prefix; None when the new messages would change how earlier ones are matched."""
    n = common_prefix(prev.messages, messages)
    start = prev.upto(n)
    if start is None:
        return None
    new = messages[n:]
    calls = start.calls
    made, unique = _all_calls(new)
    if made:
        if not unique or any(c in calls or c in start.unmatched for c in made):
            return None  # a new call with the id of an earlier call or result
        calls = {**calls, **made}
    out, deltas, state = _walk(new, replace(start, calls=calls), in_system, ws, look)
    return _Walked(
        prev.context,
        messages,
        prev.out[:n] + out,
        prev.deltas[:n] + deltas,
        state,
        look,
    )


def attach(
    messages: Sequence[ModelMessage],
    names: Sequence[str],
    loaded: Collection[Path],
    ws: Workspace,
    memo: OnDemandMemo | None = None,
    key: Hashable = None,
) -> tuple[list[ModelMessage], list[dict[str, Any]]]:
    """Messages with on-demand instruction files appended to read results, and decisions;
    ``loaded`` are the instruction files the system prompt already carries. With a
    ``memo``, the walk of the list seen last under ``key`` (by default: under its first
    message) is carried on rather than done again; the result is the same."""
    seq = messages if isinstance(messages, list) else list(messages)
    in_system = frozenset(str(p) for p in loaded)
    look = _Lookups(names, safefs.lexical(ws.root or ws.cwd))
    if not seq:
        return [], []
    if memo is not None:
        return memo.attach(seq, in_system, ws, look, key)
    calls, _ = _all_calls(seq)
    out, _, state = _walk(seq, replace(_EMPTY, calls=calls), in_system, ws, look)
    return out, list(state.decisions)
