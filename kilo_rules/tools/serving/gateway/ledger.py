"""The compaction ledger: what the gateway forwarded in place of a history's head.

An agent resends its whole history every turn. When the policy compacts, the gateway
records the items it sent in place of the first ``position`` items (the summary) under the
hash chain of those items (:func:`chain`); every later request whose history starts with
the same items — verified by the chain, never by a session id — is sent with the same
replacement, byte for byte, so the provider's prompt cache keeps hitting and a summary is
made once. A history that no longer matches (the client compacted by itself) finds no
entry and starts fresh.

The embedded store is SQLite in WAL mode: it survives restarts, is shared by the worker
processes of one machine, and is bounded (entries expire ``ttl_seconds`` after their last
use; beyond ``max_entries`` the least recently used go first). The provider's reported
usage is kept beside it, per history prefix, for the next request's compaction trigger.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilo_rules.tools.serving.gateway.protocols import Usage

__all__ = ["Entry", "LedgerError", "SqliteLedger", "canonical", "chain"]


class LedgerError(Exception):
    """The ledger store failed; the gateway passes the request through and says why."""


def _strip_marks(value: Any) -> Any:
    """``value`` without ``cache_control`` members, at any depth. A client moves its cache
    marks every turn (Claude Code marks the newest messages): the same message with or
    without a mark is the same history. Iterative: a body nests as deep as the JSON parser
    allows, deeper than Python's call stack."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        node, parent, slot = stack.pop()
        if isinstance(node, dict):
            copy: Any = {}
            for k, v in node.items():
                if k != "cache_control":
                    copy[k] = None
                    stack.append((v, copy, k))
        elif isinstance(node, list):
            copy = [None] * len(node)
            stack.extend((v, copy, i) for i, v in enumerate(node))
        else:
            copy = node
        parent[slot] = copy
    return root[0]


def canonical(item: Any) -> bytes:
    """The bytes an item is hashed as: sorted keys, no whitespace, cache marks left out."""
    text = json.dumps(_strip_marks(item), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def chain(scope: str, digests: Iterable[bytes], last: str | None = None) -> list[str]:
    """``out[i]``: the hash of the first ``i + 1`` items, each given by its digest, under
    ``scope`` (tenant, upstream and protocol: two tenants never share an entry). With
    ``last`` (the hash of the items before these), the chain goes on from it."""
    h = bytes.fromhex(last) if last else hashlib.sha256(scope.encode()).digest()
    out: list[str] = []
    for d in digests:
        h = hashlib.sha256(h + d).digest()
        out.append(h.hex())
    return out


@dataclass(frozen=True, slots=True)
class Entry:
    """One compaction: the first ``position`` items (chain hash ``key``) are sent as the
    items of the JSON array ``replacement``."""

    key: str
    position: int
    replacement: str
    summary_chars: int = 0
    created: float = 0.0
    #: The compaction as the engine wrote it (its request and summary, Session v1 JSON):
    #: the next compaction of the conversation updates this summary and keeps its pins.
    pair: str = ""


class SqliteLedger:
    """The ledger in one SQLite file; safe across threads and processes."""

    def __init__(
        self,
        path: str | Path,
        *,
        ttl_seconds: float = 7 * 86400,
        max_entries: int = 100_000,
        max_entry_bytes: int = 8 << 20,
    ) -> None:
        self.path = Path(path)
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self._lock = threading.Lock()
        self._writes = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=5.0, check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(
                """
                CREATE TABLE IF NOT EXISTS compactions (
                    key TEXT PRIMARY KEY, root TEXT NOT NULL, position INTEGER NOT NULL,
                    replacement TEXT NOT NULL, summary_chars INTEGER NOT NULL,
                    created REAL NOT NULL, used REAL NOT NULL, pair TEXT NOT NULL);
                CREATE INDEX IF NOT EXISTS compactions_root ON compactions(root, position);
                CREATE INDEX IF NOT EXISTS compactions_used ON compactions(used);
                CREATE TABLE IF NOT EXISTS usage (
                    key TEXT NOT NULL, boundary TEXT NOT NULL, root TEXT NOT NULL,
                    position INTEGER NOT NULL, input INTEGER NOT NULL,
                    cache_read INTEGER NOT NULL, cache_write INTEGER NOT NULL,
                    output INTEGER NOT NULL, used REAL NOT NULL, PRIMARY KEY (key, boundary));
                CREATE INDEX IF NOT EXISTS usage_root ON usage(root, boundary, position);
                CREATE INDEX IF NOT EXISTS usage_used ON usage(used);
                """
            )
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"cannot open the ledger {self.path}: {exc}") from None

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            with self._lock:
                return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger: {exc}") from None

    # -- compactions ----------------------------------------------------------------------
    def longest(self, hashes: Sequence[str]) -> Entry | None:
        """The entry of the longest prefix whose chain hash is in ``hashes`` (``hashes[i]``
        being the hash of the first ``i + 1`` items), or None.

        One indexed query, whatever the length of the history: the entries of a
        conversation share its first item's hash (``root``), and each candidate is
        verified against the chain at its own position."""
        if not hashes:
            return None
        rows = self._run(
            "SELECT key, position, replacement, summary_chars, created, pair FROM compactions "
            "WHERE root = ? AND position <= ? ORDER BY position DESC LIMIT 64",
            (hashes[0], len(hashes)),
        )
        best: Entry | None = None
        for key, position, replacement, chars, created, pair in rows:
            if 0 < position <= len(hashes) and hashes[position - 1] == key:
                best = Entry(key, position, replacement, chars, created, pair)
                break
        if best is not None:
            now = time.time()
            self._run(
                "UPDATE compactions SET used = ? WHERE key = ? AND used < ?",
                (now, best.key, now - 60),
            )
        return best

    def record(self, entry: Entry, root: str) -> Entry:
        """Store ``entry`` (of the conversation whose first item hashes to ``root``) unless
        one is recorded for its key already; either way, the entry now recorded (a
        concurrent writer's, when it won)."""
        size = len(entry.replacement.encode("utf-8", "surrogatepass")) + len(entry.pair)
        if size > self.max_entry_bytes:
            raise LedgerError(f"a replacement over {self.max_entry_bytes} bytes is not kept")
        now = time.time()
        self._run(
            "INSERT OR IGNORE INTO compactions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.key,
                root,
                entry.position,
                entry.replacement,
                entry.summary_chars,
                now,
                now,
                entry.pair,
            ),
        )
        self._maybe_evict(now)
        rows = self._run(
            "SELECT key, position, replacement, summary_chars, created, pair FROM compactions "
            "WHERE key = ?",
            (entry.key,),
        )
        return Entry(*rows[0]) if rows else entry

    # -- usage ----------------------------------------------------------------------------
    def last_usage(self, hashes: Sequence[str], boundary: str) -> tuple[int, Usage] | None:
        """The usage reported for the longest prefix in ``hashes`` sent with the compaction
        ``boundary`` ("" for none): (its length in items, the usage). One indexed query."""
        if not hashes:
            return None
        rows = self._run(
            "SELECT key, position, input, cache_read, cache_write, output FROM usage "
            "WHERE root = ? AND boundary = ? AND position <= ? ORDER BY position DESC LIMIT 64",
            (hashes[0], boundary, len(hashes)),
        )
        for key, position, i, r, w, o in rows:
            if 0 < position <= len(hashes) and hashes[position - 1] == key:
                return position, Usage(i, r, w, o)
        return None

    def record_usage(self, key: str, position: int, boundary: str, usage: Usage, root: str) -> None:
        """Store what the provider reported for the request of ``position`` items."""
        now = time.time()
        self._run(
            "INSERT OR REPLACE INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                boundary,
                root,
                position,
                usage.input,
                usage.cache_read,
                usage.cache_write,
                usage.output,
                now,
            ),
        )
        self._maybe_evict(now)

    def _maybe_evict(self, now: float) -> None:
        self._writes += 1
        if self._writes % 64 != 1:
            return
        cutoff = now - self.ttl_seconds
        for table in ("compactions", "usage"):
            self._run(f"DELETE FROM {table} WHERE used < ?", (cutoff,))
            self._run(
                f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                "ORDER BY used DESC LIMIT -1 OFFSET ?)",
                (self.max_entries,),
            )
