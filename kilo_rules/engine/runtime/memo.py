"""Caches that let step k+1 reuse the work of step k.

Session messages and the messages lowered from them are immutable, so their lowering and
their JSON depend only on their content (and the settings used). An agent that keeps its
session in memory passes the same objects back every step, and they are found by identity
at no cost; a stateless service reads the session from JSON every step, so every object is
new, and its messages are found by content instead (:class:`ContentMemo`). Both maps are
bounded, so a long-lived plan cannot grow without end.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.formats.session import Message
from kilo_rules.engine.runtime.history import compaction_part, is_completed_summary

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class IdentityLRU(LRUCache[K, V]):
    """A bounded map from objects (by identity) to values; thread-safe."""

    def __init__(self, maxsize: int = 8192) -> None:
        super().__init__(maxsize, by_identity=True)


class UnkeyableError(Exception):
    """A value that has no content key (an object of a type JSON does not have)."""


def data_key(value: object) -> Hashable:
    """A key equal for equal JSON-like data (dicts, lists, strings, numbers, booleans,
    None), sharing its strings: equal keys are confirmed by comparing content, never by a
    digest that could collide. Every scalar but a string keeps its type (``True`` and ``1``
    are equal in Python but are written differently). Raises :class:`UnkeyableError` for
    anything else."""
    kind = type(value)
    if kind is str or value is None:
        return value
    if kind is dict:
        return (dict, *[(k, data_key(v)) for k, v in value.items()])  # type: ignore[attr-defined]
    if kind is list or kind is tuple:
        return (kind, *[data_key(v) for v in value])  # type: ignore[attr-defined]
    if kind is bool or kind is int:
        return (kind, value)
    if kind is float:
        return (float, repr(value))  # -0.0 == 0.0 and nan != nan, but not as text
    raise UnkeyableError(kind.__name__)


class ContentKey:
    """A content key hashed by a short summary of the content (e.g. ids), compared in
    full: a lookup never hashes every byte of a message, and two keys are equal only when
    their contents are. Contents that share a summary (versions of one message) share a
    hash bucket, which costs a comparison, never a wrong answer."""

    __slots__ = ("_hash", "content")

    def __init__(self, content: Hashable, summary: Hashable) -> None:
        self.content = content
        self._hash = hash(summary)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is ContentKey
            and self._hash == other._hash
            and self.content == other.content
        )


class ContentMemo(Generic[K, V]):
    """Values per immutable object: found by identity, or else by content (a new object
    equal to one seen before, e.g. a session read back from JSON); thread-safe.

    ``key`` gives an object's content key: everything the cached computation reads from
    it, so that objects with equal keys give equal values (None: do not cache by content).
    """

    def __init__(self, key: Callable[[K], Hashable | None], maxsize: int = 8192) -> None:
        self._key = key
        self._by_id: IdentityLRU[K, V] = IdentityLRU(maxsize)
        self._by_content: LRUCache[Hashable, V] = LRUCache(maxsize)

    def get_or(self, obj: K, make: Callable[[], V]) -> V:
        """The value for ``obj`` (or for an object of equal content), else ``make()``."""
        value = self._by_id.get(obj)
        if value is not None:
            return value
        key = self._key(obj)
        value = self._by_content.get_or(key, make) if key is not None else make()
        self._by_id.put(obj, value)
        return value

    def __len__(self) -> int:
        return len(self._by_id)


@dataclass(frozen=True, slots=True)
class SessionFacts:
    """What a step reads from the whole message list, summary or not: the policy's
    ``session.*`` values and the newest creation time."""

    messages: int
    turns: int  # user messages without a compaction part (history.turns)
    compactions: int  # completed compactions (history.completed_compactions)
    has_summary: bool  # a finished summary message
    latest: int  # the newest ``created`` (0: none)


@dataclass(frozen=True, slots=True)
class _Scan:
    seen: list[Message]
    # id of a message with a compaction part -> whether the last message of that id has one
    compaction_ids: dict[str, bool]
    parents: tuple[str | None, ...]  # the parent ids of completed summaries
    turns: int
    has_summary: bool
    latest: int

    def facts(self) -> SessionFacts:
        done = sum(1 for p in self.parents if p is not None and self.compaction_ids.get(p))
        return SessionFacts(len(self.seen), self.turns, done, self.has_summary, self.latest)


_EMPTY = _Scan([], {}, (), 0, False, 0)


class FactsMemo:
    """:class:`SessionFacts` per message list, extended from the list seen before.

    An agent hands the same message objects back every step with new ones after them;
    the list seen last for a session (found by its first message) is compared with the
    new one by identity, at C speed, and only the messages after it are read. So a step
    after a compaction reads its tail, not the history before the summary again. A list
    that is no extension of the one seen (a session read back from JSON, an edit) is read
    whole. Bounded and thread-safe."""

    def __init__(self, maxsize: int = 256) -> None:
        self._by_first: IdentityLRU[Message, _Scan] = IdentityLRU(maxsize)

    def facts(self, messages: Sequence[Message]) -> SessionFacts:
        """The facts of ``messages``."""
        if not messages:
            return _EMPTY.facts()
        first = messages[0]
        scan = self._by_first.get(first) or _EMPTY
        n = len(scan.seen)
        prefix = messages[:n]
        if n > len(messages) or (prefix if isinstance(prefix, list) else list(prefix)) != scan.seen:
            scan, n = _EMPTY, 0
        if n < len(messages):
            scan = _extend(scan, list(messages), n)
            self._by_first.put(first, scan)
        return scan.facts()


def _extend(scan: _Scan, messages: list[Message], start: int) -> _Scan:
    ids = dict(scan.compaction_ids)
    parents = list(scan.parents)
    turns, has_summary, latest = scan.turns, scan.has_summary, scan.latest
    for m in messages[start:]:
        compaction = compaction_part(m) is not None
        if compaction or m.id in ids:  # only compaction ids matter: the dict stays small
            ids[m.id] = compaction
        if m.role == "user" and not compaction:
            turns += 1
        if is_completed_summary(m):
            parents.append(m.parent_id)
        has_summary = has_summary or bool(m.summary and m.finish)
        latest = max(latest, m.created)
    return _Scan(messages, ids, tuple(parents), turns, has_summary, latest)


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items ``a`` and ``b`` share: found by halving, each comparison a
    slice comparison in C, which takes the same objects as equal without looking inside
    (objects that are not the same are compared by value, so equal content counts too)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi - 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixMemo(Generic[K, V]):
    """Per-item values of a list, the values of the items it shares with the list seen
    before taken over without a look-up.

    Step k+1 of an agent sends what step k sent and a little more: the lists are found by
    their first item (by identity) and the context the values were made in (equal
    contexts only), their common prefix is found at C speed (:func:`common_prefix`), and
    only the items after it are looked up or made. Bounded and thread-safe: an entry is
    replaced whole, never changed."""

    def __init__(self, maxsize: int = 256) -> None:
        self._lists: LRUCache[Hashable, tuple[Hashable, list[K], list[V]]] = LRUCache(maxsize)

    def values(
        self,
        items: Sequence[K],
        make: Callable[[int, K], V],
        context: Hashable = None,
        key: Hashable = None,
    ) -> list[V]:
        """``make(index, item)`` for every item, reusing the values of the shared prefix
        (whose items sit at the same indexes). The list seen before is the one stored
        under ``key`` (by default: under its first item, by identity)."""
        if not items:
            return []
        seq = items if isinstance(items, list) else list(items)  # a list equals no tuple
        # An identity key is safe: the entry holds the item, so its id is not reused.
        slot = key if key is not None else (PrefixMemo, id(seq[0]))
        entry = self._lists.get(slot)
        n = 0
        out: list[V] = []
        if entry is not None and entry[0] == context:
            n = common_prefix(entry[1], seq)
            out = entry[2][:n]
        if n < len(seq) or entry is None:
            out.extend(make(i, seq[i]) for i in range(n, len(seq)))
            self._lists.put(slot, (context, list(seq), out))
        return out


class Fragments:
    """The rendered wire text of lowered messages, per message object and wire API, kept
    across steps (the providers' :class:`~kilo_rules.engine.providers._shared.FragmentStore`).

    A lowered message is immutable and the runtime hands the same object back every step
    it is unchanged (lowering is cached by content), so its fragment is found by identity:
    first along the list rendered last (:class:`PrefixMemo`), then in a bounded map; a
    message whose context changed (a cache mark moved onto it, a new environment block) is
    a new object and is rendered again. The fragments are immutable text, so nothing a
    caller does with a body built from them reaches the next body. Thread-safe; two
    threads missing one message may both render it, with equal results."""

    def __init__(self, maxsize: int = 8192) -> None:
        self._by_message: IdentityLRU[object, dict[str, Any]] = IdentityLRU(maxsize)
        self._lists: dict[str, PrefixMemo[object, Any]] = {}

    def turns(self, messages: Sequence[Any], api: str, make: Callable[[Any], T]) -> list[T]:
        """The fragment of each of ``messages`` on ``api``, ``make(message)`` when new."""
        lists = self._lists.get(api)
        if lists is None:
            lists = self._lists.setdefault(api, PrefixMemo())

        def one(_: int, msg: Any) -> T:
            per_api = self._by_message.get_or(msg, dict)
            found = per_api.get(api)
            if found is None:
                found = per_api[api] = make(msg)
            return found

        return lists.values(messages, one)

    def __len__(self) -> int:
        return len(self._by_message)

    def __bool__(self) -> bool:
        # A store is a store even while empty: ``if fragments:`` must not turn reuse off.
        return True
