"""Summarizers: what turns a compaction's head into the summary text.

A :class:`Summarizer` receives a :class:`SummaryRequest` — the instruction (new or rolling
update, plus the template) and the head of the conversation already lowered for the
summary (media stripped, tool outputs capped) — and returns the summary text. Two real
implementations live in ``kilo_rules.summarizers``: an offline extractive one (the default)
and an HTTP one for OpenAI-compatible and Anthropic endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .request import ModelMessage


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


class SummarizerError(Exception):
    """A summarizer could not produce a summary (network, HTTP status, bad response)."""

    def __init__(self, message: str, *, retryable: bool = False, overflow: bool = False) -> None:
        super().__init__(message)
        #: Another attempt may succeed (timeouts, 429, 5xx).
        self.retryable = retryable
        #: The provider said the summary input itself is too long (use the chunked path).
        self.overflow = overflow
