"""The decision log: one JSON line per build, appended to a file.

Each line says when a build was answered, under which revision, for which model and wire
provider, how many decisions the step made and which rules they were, how long it took and
with what status. Lines are written whole under a lock (and with ``O_APPEND``, so two
processes sharing the file do not interleave within a line) and bounded in size: a line
that would exceed :data:`MAX_LINE_BYTES` loses its rule names first, then has its strings cut.

The file is opened for each line, so that a log rotated away (renamed by logrotate) is
followed by a new file at the same path without a signal or a restart.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

#: The longest line written, newline included.
MAX_LINE_BYTES = 16 * 1024
#: The longest string field kept (a model id, an error code) before it is cut.
MAX_FIELD_CHARS = 256


class LogRecord(Protocol):
    """What a line is made from: its fields (``rules`` among them), strings already cut."""

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        """The line's fields."""
        ...


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """What one line of the log says about one build."""

    revision: str | None
    model: str | None
    provider: str | None
    rules: Sequence[str]
    decisions: int
    duration_ms: float
    status: int
    error: str | None = None

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        """The line's fields, strings cut to :data:`MAX_FIELD_CHARS`."""
        when = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {
            "time": when.replace("+00:00", "Z"),
            "revision": cut(self.revision),
            "model": cut(self.model),
            "provider": cut(self.provider),
            "decisions": self.decisions,
            "rules": [cut(r) for r in dict.fromkeys(self.rules)],
            "duration_ms": round(self.duration_ms, 3),
            "status": self.status,
        }
        if self.error is not None:
            out["error"] = cut(self.error)
        return out


def cut(text: str | None) -> str | None:
    """``text`` cut to :data:`MAX_FIELD_CHARS`."""
    if text is None or len(text) <= MAX_FIELD_CHARS:
        return text
    return text[: MAX_FIELD_CHARS - 1] + "…"


def encode_line(record: LogRecord, now: datetime | None = None) -> bytes:
    """One line of the log (newline included), at most :data:`MAX_LINE_BYTES` long."""
    data = record.to_json(now)
    line = _dumps(data)
    if len(line) > MAX_LINE_BYTES:
        # The rule names are what may grow without bound (one per decision); the count says
        # how many there were.
        rules = data.get("rules") or []
        data["rules_truncated"] = True
        while rules and len(line) > MAX_LINE_BYTES:
            del rules[len(rules) // 2 :]
            line = _dumps(data)
    return line


def _dumps(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class DecisionLog:
    """Appends :class:`BuildRecord` (or any :class:`LogRecord`) lines to ``path``; safe
    to call from many threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def write(self, record: LogRecord) -> None:
        """Append one line. A write that fails (a full disk, a removed directory) raises
        ``OSError``; the caller decides whether a build should fail for it."""
        line = encode_line(record)
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                view = memoryview(line)
                while view:  # a regular file takes it all at once; a short write goes on
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
