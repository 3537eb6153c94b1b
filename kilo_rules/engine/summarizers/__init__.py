"""The summarizers: an offline extractive one (the default) and an HTTP one.

Both implement :class:`kilo_rules.engine.summarizers.protocol.Summarizer`.
:class:`ExtractiveSummarizer` needs no network and gives the same text for the same head;
:class:`HttpSummarizer` asks an OpenAI-compatible or Anthropic endpoint, with timeouts and retries.
"""

from __future__ import annotations

from kilo_rules.engine.summarizers._shared import transcript
from kilo_rules.engine.summarizers.extractive import ExtractiveSummarizer
from kilo_rules.engine.summarizers.http import ANTHROPIC_VERSION, HttpSummarizer

__all__ = ["ANTHROPIC_VERSION", "ExtractiveSummarizer", "HttpSummarizer", "transcript"]
