"""Regular expressions that run in linear time: every pattern the engine runs goes through
here and is compiled by RE2.

Python's ``re`` backtracks, so a pattern written by a policy author (``.*.*.*x``,
``(a?){24}a{24}``) can take exponential time on an ordinary model id or message. RE2 runs
any pattern it accepts in time linear in the text, and refuses what it cannot run that way
(backreferences, lookaround, possessive quantifiers) when the pattern is compiled, so a
policy is rejected by ``check`` instead of hanging at run time. The syntax is RE2's, close
to Python's for everything a policy needs (classes, ``\\b``, ``(?i)``, anchors, counted
repetition up to 1000).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from kilo_rules.engine.base.errors import UNKNOWN, Diagnostic, KiloRulesError, Location

#: Longest pattern accepted: a bound on compile time and on the compiled program's size.
MAX_PATTERN_LENGTH = 4096
#: Memory RE2 may use for one compiled pattern (its default is 8 MiB); a pattern whose
#: program does not fit is refused at compile time.
MAX_PROGRAM_BYTES = 2 << 20
#: How many compiled patterns are kept.
CACHE_SIZE = 512


class Pattern(Protocol):
    """The part of a compiled RE2 pattern the engine uses."""

    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> object | None: ...


class RegexError(KiloRulesError):
    """A regular expression RE2 cannot run (bad syntax, a backreference, lookaround, too
    long); carries a located diagnostic."""

    def __init__(self, diagnostics: Diagnostic | list[Diagnostic], reason: str) -> None:
        super().__init__(diagnostics)
        self.reason = reason


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_PROGRAM_BYTES
    # RE2 would otherwise print each refused pattern to stderr.
    options.log_errors = False
    return options


_OPTIONS = _options()
_BACKREFERENCE = re2.compile(r"\\[1-9]|\(\?P=", _OPTIONS)


def _reason(pattern: str, raw: object) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if text.startswith(("invalid perl operator: (?=", "invalid perl operator: (?!")):
        return "lookahead ((?=...), (?!...)) is not supported"
    if text.startswith(("invalid perl operator: (?<=", "invalid perl operator: (?<!")):
        return "lookbehind ((?<=...), (?<!...)) is not supported"
    if text.startswith(("invalid escape sequence: \\", "invalid perl operator: (?P")) and (
        _BACKREFERENCE.search(pattern)
    ):
        return "backreferences (\\1, (?P=name)) are not supported"
    return text


@lru_cache(maxsize=CACHE_SIZE)
def _compile(pattern: str) -> Pattern:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(
            f"the pattern is {len(pattern):,} characters long; the limit is {MAX_PATTERN_LENGTH:,}"
        )
    try:
        compiled: Pattern = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise ValueError(_reason(pattern, exc.args[0] if exc.args else exc)) from None
    except TypeError as exc:  # a surrogate or other text RE2 cannot encode as UTF-8
        raise ValueError(str(exc)) from None
    except UnicodeEncodeError as exc:
        raise ValueError(f"the pattern is not valid text: {exc.reason}") from None
    return compiled


def regex_problem(pattern: str) -> str | None:
    """Why RE2 refuses ``pattern``, or None when it compiles."""
    try:
        _compile(pattern)
    except ValueError as exc:
        return str(exc)
    return None


def compile_regex(
    pattern: str, location: Location = UNKNOWN, *, code: str = "regex.invalid"
) -> Pattern:
    """``pattern`` compiled by RE2 (cached); a pattern RE2 cannot run raises
    :class:`RegexError` with a diagnostic ``code`` at ``location``."""
    try:
        return _compile(pattern)
    except ValueError as exc:
        reason = str(exc)
        raise RegexError(
            Diagnostic(
                code,
                f"regular expression {_shown(pattern)} cannot be used: {reason}",
                location,
                hint="patterns use RE2 syntax, which runs in linear time: no "
                "backreferences or lookaround",
            ),
            reason,
        ) from None


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 60 else pattern[:57] + "...")
