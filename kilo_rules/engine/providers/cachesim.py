"""A prompt-cache simulator over rendered request bodies.

Providers cache *prefixes* of the request in their own order: tools, then system, then
messages. :func:`blocks` cuts a wire body into that ordered sequence of blocks (one tool,
one system block, one content part of a message, …), each with its token count and the
cache breakpoint it carries, if any. :class:`CacheSimulator` then plays the provider's
cache over successive requests:

* ``explicit`` (Anthropic, Bedrock, OpenAI-compatible servers forwarding to Anthropic):
  a breakpoint whose prefix holds at least ``min_cacheable_tokens`` writes that prefix to
  the cache, in the 5-minute or 1-hour bucket its mark names. A later request reads the
  longest cached prefix it repeats byte for byte (marks aside), looking back at most
  ``lookback`` blocks before each of its own breakpoints, as Anthropic does (about 20);
  the tokens after the read up to its last breakpoint are written, the rest is uncached.
* ``automatic`` (OpenAI, Gemini, DeepSeek): nothing is written on purpose; the longest
  prefix shared with any earlier request is read once it reaches the minimum, rounded
  down to the minimum plus a multiple of 128 tokens (OpenAI's documented increments).
* ``none``: nothing is cached.

Prefixes are compared at block granularity: a block that changed in its middle counts as
changed from its start, so a read is never over-estimated. Time is optional: with
``seconds_per_step`` set, step ``k`` happens at ``k * seconds_per_step`` and an entry not
read or written within its TTL (300 s or 3600 s) expires; unset, nothing expires.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["AUTOMATIC_INCREMENT", "Block", "CacheSimulator", "CacheStep", "blocks"]

#: Automatic caches grow in steps of this many tokens above the minimum (OpenAI).
AUTOMATIC_INCREMENT = 128

#: Seconds an entry lives after its last use, per bucket.
TTL_SECONDS: Mapping[str, int] = {"5m": 300, "1h": 3600}

Ttl = Literal["5m", "1h"]
CacheKind = Literal["explicit", "automatic", "none"]

# Keys that mark a content part (or message) as a breakpoint, across wire APIs.
_MARK_KEYS = ("cache_control", "prompt_cache_breakpoint")


@dataclass(frozen=True, slots=True)
class Block:
    """One cacheable unit of a request: its canonical bytes (marks stripped, position
    included), its tokens, and the TTL of a breakpoint placed after it (None: no mark)."""

    key: str
    tokens: int
    mark: Ttl | None = None


def _ttl(mark: Any) -> Ttl:
    return "1h" if isinstance(mark, Mapping) and mark.get("ttl") == "1h" else "5m"


def _strip(value: Any) -> Any:
    """``value`` without cache marks, so a moved breakpoint does not look like a change."""
    if isinstance(value, Mapping):
        return {k: _strip(v) for k, v in value.items() if k not in _MARK_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, Mapping) and "cachePoint" in v)]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _Cutter:
    """Accumulates blocks; a Bedrock ``cachePoint`` element marks the block before it."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self.count = count
        self.out: list[Block] = []

    def add(self, where: str, value: Any, mark: Ttl | None = None) -> None:
        if isinstance(value, Mapping) and "cachePoint" in value:
            self.mark_last(_ttl(value["cachePoint"]))
            return
        if mark is None and isinstance(value, Mapping):
            for k in _MARK_KEYS:
                if k in value:
                    mark = _ttl(value[k])
        text = _dumps(_strip(value))
        self.out.append(Block(f"{where}:{text}", self.count(text), mark))

    def mark_last(self, ttl: Ttl) -> None:
        if self.out:
            last = self.out[-1]
            self.out[-1] = Block(last.key, last.tokens, ttl)

    def many(self, where: str, values: Any) -> None:
        if isinstance(values, list):
            for v in values:
                self.add(where, v)
        elif values:
            self.add(where, values)


def _message(cut: _Cutter, i: int, msg: Any) -> None:
    if not isinstance(msg, Mapping):
        cut.add(f"m{i}", msg)
        return
    where = f"m{i}"
    content = msg.get("content", msg.get("parts"))
    calls = msg.get("tool_calls")
    head = {k: v for k, v in msg.items() if k not in ("content", "parts", "tool_calls")}
    # The header (role, tool_call_id, …) opens the message, so two messages with the same
    # parts but different roles never share a prefix past it.
    cut.add(where, {k: v for k, v in head.items() if k not in _MARK_KEYS})
    cut.many(where, content)
    cut.many(where, calls)
    for k in _MARK_KEYS:  # a message-level mark covers the message's last block
        if k in msg:
            cut.mark_last(_ttl(msg[k]))


def blocks(body: Mapping[str, Any], count: Callable[[str], int]) -> list[Block]:
    """The blocks of a wire body in cache-prefix order: tools, system, messages.

    Understands the bodies of every wire API (Anthropic ``tools``/``system``/``messages``,
    Bedrock ``toolConfig``/``system``/``messages``, OpenAI ``tools``/``messages``, Gemini
    ``tools``/``systemInstruction``/``contents``, OpenAI Responses ``tools``/``instructions``/
    ``input``). Settings such as ``model`` or
    ``max_tokens`` are not prompt tokens and are left out. A top-level Anthropic
    ``cache_control`` (automatic caching) is a breakpoint on the last block.
    """
    cut = _Cutter(count)
    tool_config = body.get("toolConfig")
    tools = tool_config.get("tools") if isinstance(tool_config, Mapping) else body.get("tools")
    cut.many("t", tools)
    system = body.get("system")
    if isinstance(system, str):
        cut.add("s", {"text": system})
    else:
        cut.many("s", system)
    instruction = body.get("systemInstruction")
    if isinstance(instruction, Mapping):
        cut.many("s", instruction.get("parts"))
    if isinstance(body.get("instructions"), str):  # the Responses API's system text
        cut.add("s", {"text": body["instructions"]})
    items = body.get("messages", body.get("contents", body.get("input")))
    for i, msg in enumerate(items if isinstance(items, list) else []):
        _message(cut, i, msg)
    if "cache_control" in body:
        cut.mark_last(_ttl(body["cache_control"]))
    return cut.out


@dataclass(frozen=True, slots=True)
class CacheStep:
    """How the input of one request splits: read from the cache, written to it (by
    bucket), and neither. ``read + write_5m + write_1h + uncached == input``."""

    input: int
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0

    @property
    def write(self) -> int:
        """Tokens written to either bucket."""
        return self.write_5m + self.write_1h

    @property
    def uncached(self) -> int:
        """Tokens billed at the plain input price."""
        return self.input - self.read - self.write


@dataclass
class _Entry:
    ttl: Ttl
    used: float  # time of the last read or write


def _chain(seq: list[Block]) -> Iterator[bytes]:
    """Hash of every prefix: item i identifies blocks[0..i] (inclusive)."""
    h = hashlib.blake2b(digest_size=16)
    for b in seq:
        h.update(b.key.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
        yield h.copy().digest()


class CacheSimulator:
    """The provider's prompt cache across the requests of one session.

    ``kind`` and ``min_tokens`` come from the model's catalog entry (``cache.kind``,
    ``cache.min_cacheable_tokens``). ``lookback`` (explicit caches) is how many blocks
    before a breakpoint are checked for a hit (None: any). ``seconds_per_step`` turns
    on expiry (see the module docstring).
    """

    def __init__(
        self,
        kind: CacheKind,
        min_tokens: int,
        *,
        lookback: int | None = 20,
        seconds_per_step: float | None = None,
    ) -> None:
        self.kind = kind
        self.min_tokens = min_tokens
        self.lookback = lookback
        self.seconds_per_step = seconds_per_step
        self._entries: dict[bytes, _Entry] = {}
        self._steps = 0

    def _alive(self, key: bytes, now: float) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        if self.seconds_per_step is not None and now - entry.used > TTL_SECONDS[entry.ttl]:
            del self._entries[key]
            return False
        return True

    def step(self, seq: list[Block]) -> CacheStep:
        """Send one request made of ``seq``; returns its split and updates the cache."""
        now = self._steps * (self.seconds_per_step or 0.0)
        self._steps += 1
        prefix: list[int] = []
        total = 0
        for b in seq:
            total += b.tokens
            prefix.append(total)
        if self.kind == "none" or not seq:
            return CacheStep(total)
        hashes = list(_chain(seq))
        if self.kind == "automatic":
            return self._automatic(hashes, prefix, now)
        return self._explicit(seq, hashes, prefix, now)

    def _automatic(self, hashes: list[bytes], prefix: list[int], now: float) -> CacheStep:
        total = prefix[-1]
        hit = next((i for i in range(len(hashes) - 1, -1, -1) if self._alive(hashes[i], now)), -1)
        shared = prefix[hit] if hit >= 0 else 0
        read = 0
        if shared > 0 and shared >= self.min_tokens:
            steps = (shared - self.min_tokens) // AUTOMATIC_INCREMENT
            read = self.min_tokens + steps * AUTOMATIC_INCREMENT
        if hit >= 0:
            self._entries[hashes[hit]].used = now
        # Every prefix of this request can be matched by a later one.
        for h in hashes:
            self._entries.setdefault(h, _Entry("5m", now)).used = now
        return CacheStep(total, read=read)

    def _explicit(
        self, seq: list[Block], hashes: list[bytes], prefix: list[int], now: float
    ) -> CacheStep:
        total = prefix[-1]
        marks = [i for i, b in enumerate(seq) if b.mark is not None]
        hit = -1
        for bp in marks:
            floor = 0 if self.lookback is None else max(0, bp - self.lookback)
            for i in range(bp, floor - 1, -1):
                if i <= hit:
                    break
                if self._alive(hashes[i], now):
                    hit = i
                    break
        read = prefix[hit] if hit >= 0 else 0
        if hit >= 0:
            self._entries[hashes[hit]].used = now
        written = {"5m": 0, "1h": 0}
        start = read
        for bp in marks:
            ttl = seq[bp].mark or "5m"
            if prefix[bp] < self.min_tokens:
                continue  # below the minimum the provider silently caches nothing
            if bp > hit:
                # The segment since the last written (or read) point is billed at the
                # bucket of the breakpoint that closes it.
                written[ttl] += prefix[bp] - start
                start = prefix[bp]
            entry = self._entries.get(hashes[bp])
            if entry is None:
                self._entries[hashes[bp]] = _Entry(ttl, now)
            else:
                entry.used = now
        return CacheStep(total, read=read, write_5m=written["5m"], write_1h=written["1h"])
