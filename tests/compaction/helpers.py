"""Builders for compaction tests: a recording fake summarizer and sized sessions."""

from __future__ import annotations

import threading
from typing import Any

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.session import Session, TokenUsage
from kilo_rules.engine.runtime.measure import messages_json
from kilo_rules.engine.summarizers.protocol import SummarizerError, SummaryRequest

from ..runtime.helpers import assistant, model, session, text, tool, user

__all__ = [
    "FakeSummarizer",
    "assistant",
    "chars",
    "derived",
    "model",
    "plan_for",
    "session",
    "text",
    "tool",
    "user",
]


class FakeSummarizer:
    """Records every request; answers ``SUMMARY <n>`` (or raises an overflow once, or
    for requests bigger than ``overflow_over`` tokens)."""

    def __init__(
        self, *, reply: str | None = None, overflow_first: bool = False, overflow_over: int = 0
    ) -> None:
        self.requests: list[SummaryRequest] = []
        self.reply = reply
        self.overflow_first = overflow_first
        self.overflow_over = overflow_over
        self._lock = threading.Lock()

    def summarize(self, request: SummaryRequest) -> str:
        with self._lock:
            self.requests.append(request)
            n = len(self.requests)
            if self.overflow_first and n == 1:
                raise SummarizerError("prompt is too long", overflow=True)
        size = len(messages_json(request.messages)) // 4
        if self.overflow_over and size > self.overflow_over:
            raise SummarizerError("prompt is too long", overflow=True)
        return self.reply if self.reply is not None else f"SUMMARY {n}"


def plan_for(context: int, output: int, **config: Any) -> Plan:
    """kilo-default for an inline model with the given window."""
    return compile_policy(
        "kilo-default",
        model(limits={"context": context, "output": output}),
        config=config or None,
    )


def derived(tmp_path: Any, body: str, context: int = 20_000, output: int = 10_000) -> Plan:
    """A policy that extends kilo-default with ``body`` (YAML), compiled for an inline model."""
    path = tmp_path / "derived.yaml"
    path.write_text(f"version: 1\nname: derived\nextends: kilo-default\n{body}", encoding="utf-8")
    return compile_policy(
        path,
        model(limits={"context": context, "output": output}),
        config={"output_token_max": 2000},
    )


def chars(tokens: int) -> str:
    """A text that the estimate counts as ``tokens`` tokens."""
    return "x" * (4 * tokens)


def three_turns(count: int) -> Session:
    """Three user turns whose last answer reports ``count`` tokens of usage."""
    return session(
        user("u1", "first"),
        assistant("a1", text("a1t", chars(3_000))),
        user("u2", "second"),
        assistant("a2", text("a2t", chars(3_000))),
        user("u3", "third"),
        assistant("a3", text("a3t", "ok"), tokens=TokenUsage(input=count - 100, output=100)),
    )
