"""Summarizers: what turns a compaction's head into the summary text.

A :class:`Summarizer` receives a :class:`SummaryRequest` — the instruction (new or rolling
update, plus the template) and the head of the conversation already lowered for the
summary (media stripped, tool outputs capped) — and returns the summary text. Two real
implementations live in ``kilo_rules.engine.summarizers``: an offline extractive one (the default)
and an HTTP one for OpenAI-compatible and Anthropic endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location
from kilo_rules.engine.formats.request import ModelMessage


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """One summary to write."""

    instruction: str  # the new/update instruction followed by the template, blank-line joined
    messages: tuple[ModelMessage, ...]  # the head (or one chunk), lowered for the summary
    max_output_tokens: int  # the output budget of the summary
    previous_summary: str | None = None  # set for a rolling update
    template: str = ""  # the section template alone (for offline summarizers)


@runtime_checkable
class Summarizer(Protocol):
    """Writes a summary. Raise :class:`SummarizerError` on failure."""

    def summarize(self, request: SummaryRequest) -> str:
        """The summary text for ``request``."""
        ...


_NOWHERE = Location("<summarizer>", 1, 1)


class SummarizerError(KiloRulesError):
    """A summarizer could not produce a summary (network, HTTP status, bad response).

    Its diagnostic says which failure (``code``: ``summarizer.failed`` unless the raiser
    names it better) and carries ``retryable`` and ``overflow`` in its details. A summarizer
    is a service, not a source file, so the location is ``<summarizer>:1:1`` unless the
    raiser has a better one. ``str()`` is the bare message, so that callers can fold it into
    their own text ("summarizer overflow: ...")."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        overflow: bool = False,
        code: str = "summarizer.failed",
        location: Location = _NOWHERE,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        facts = {"retryable": retryable, "overflow": overflow, **(details or {})}
        super().__init__(Diagnostic(code, message, location, details=facts))
        #: Another attempt may succeed (timeouts, 429, 5xx).
        self.retryable = retryable
        #: The provider said the summary input itself is too long (use the chunked path).
        self.overflow = overflow

    def __str__(self) -> str:
        return self.diagnostic.message
