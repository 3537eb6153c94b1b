"""The runtime facade: one call per agent step, compaction included.

``apply_plan`` builds one request and says whether Kilo would compact first; it does not
compact, because compaction calls a summarizer. :class:`Runtime` closes the loop the way
Kilo's prompt loop does (spec §8): normal prune when the plan's gate allows it
(kilo-default: with ``config.compaction.prune: true``), apply, and — when the usage count
reached the limit, the preflight estimate did, or the provider rejected the last request
as too long (:meth:`Runtime.overflowed`) — compact, persist, apply again.
``compaction.attempt_rule`` says what ``compaction.max_attempts`` caps: compactions per
user turn (Kilo), or consecutive compactions that freed less than
``compaction.min_progress`` of the request (for long autonomous runs); one more is a
:class:`~kilo_rules.engine.base.errors.ContextOverflowError` ("Compaction exhausted: …").

A minimal agent loop is in ``docs/compaction.md``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.errors import ContextOverflowError, Diagnostic, Location
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.runtime.apply import Decision, StepResult, apply_plan
from kilo_rules.engine.runtime.compaction import compact
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.history import compaction_part
from kilo_rules.engine.runtime.mutations import apply_mutations
from kilo_rules.engine.runtime.prune import prune_session
from kilo_rules.engine.runtime.trace import plan_caches

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan
    from kilo_rules.engine.summarizers.protocol import Summarizer
    from kilo_rules.engine.text.tokens import TokenCounter

__all__ = ["Runtime", "StepResult"]

_ADDED = ("compaction-request", "compaction-summary", "compaction-continue", "compaction-replay")


def _turn_key(session: Session) -> str:
    """The user message that opened the current turn (what Kilo's prompt loop runs for):
    the newest user message that compaction did not add."""
    for m in reversed(session.messages):
        if (
            m.role == "user"
            and compaction_part(m) is None
            and m.metadata.get("kilo_rules") not in _ADDED
        ):
            return m.id
    return ""


class Runtime:
    """Apply a plan step after step, compacting when the policy says so.

    ``summarizer`` defaults to the offline extractive one; ``counter`` to the counter the
    policy names (``tokens.counter``). Attempts are counted in memory per session id, so
    one Runtime can serve many sessions (thread-safe)."""

    def __init__(
        self,
        plan: Plan,
        summarizer: Summarizer | None = None,
        *,
        counter: TokenCounter | None = None,
    ) -> None:
        self.plan = plan
        self._summarizer = summarizer
        if counter is None:  # the counter apply uses, with its per-message count cache
            counter = plan_caches(plan).counter
        self.counter = counter
        self._lock = threading.Lock()
        self._attempts: dict[str, tuple[str, int]] = {}
        self._overflowed: set[str] = set()

    @property
    def summarizer(self) -> Summarizer:
        """The summarizer in use (the extractive one unless one was given)."""
        if self._summarizer is None:
            from kilo_rules.engine.summarizers import ExtractiveSummarizer

            self._summarizer = ExtractiveSummarizer()
        return self._summarizer

    def overflowed(self, session: Session) -> None:
        """Report that the provider rejected the last request of ``session`` as too long:
        the next :meth:`step` compacts in overflow mode (replay, media placeholders)."""
        with self._lock:
            self._overflowed.add(session.id)

    def attempts(self, session: Session) -> int:
        """The compactions ``compaction.attempt_rule`` counts so far for ``session``: those
        of its current user turn (``turn``), or the latest run of compactions that freed
        too little (``no-progress``)."""
        key = self._attempt_key(session)
        with self._lock:
            old_key, n = self._attempts.get(session.id, ("", 0))
        return n if old_key == key else 0

    def _attempt_key(self, session: Session) -> str:
        # Under no-progress the count runs across user turns: only progress resets it.
        return _turn_key(session) if self.plan.settings.compaction.attempt_rule == "turn" else ""

    def _may_compact(self, session: Session) -> None:
        """Refuse one more compaction once the attempt rule's count reached the cap."""
        c = self.plan.settings.compaction
        n = self.attempts(session)
        if n < c.max_attempts:
            return
        why = (
            f"after {n} attempts"
            if c.attempt_rule == "turn"
            else f"after {n} compactions in a row freed less than {c.min_progress:.0%} of the "
            "request"
        )
        raise ContextOverflowError(
            Diagnostic(
                "runtime.compaction_exhausted",
                f"Compaction exhausted: context still exceeds model limits {why}",
                self._where("compaction.max_attempts"),
                details={
                    "session": session.id,
                    "turn": _turn_key(session),
                    "attempts": n,
                    "attempt_rule": c.attempt_rule,
                },
                hint="raise compaction.max_attempts, or count only compactions that make no "
                "progress (compaction.attempt_rule: no-progress)"
                if c.attempt_rule == "turn"
                else "the kept tail and pins alone exceed the window: lower "
                "compaction.tail_turns or preserve_recent_tokens, or use a larger window",
            )
        )

    def _compacted(self, session: Session, before: int, after: int) -> None:
        """Count a compaction that succeeded (``before`` and ``after``: the request's input
        tokens around it), and consume the provider's overflow report it answered. Only a
        success does either: a summarizer that fails leaves the next step to compact in the
        same mode, with the same attempts left."""
        c = self.plan.settings.compaction
        key = self._attempt_key(session)
        progressed = before > 0 and before - after >= c.min_progress * before
        with self._lock:
            old_key, n = self._attempts.get(session.id, ("", 0))
            n = n if old_key == key else 0
            if c.attempt_rule == "no-progress" and progressed:
                n = 0
            else:
                n += 1
            self._attempts[session.id] = (key, n)
            self._overflowed.discard(session.id)

    def _where(self, dotted: str) -> Location:
        # An engine default has no place in the policy: point at the policy file.
        return self.plan.where(dotted) or Location(self.plan.policy_file, 1, 1)

    def _decide(
        self, rule: str, setting: str | None, inputs: dict[str, Any], result: Any
    ) -> Decision:
        return Decision("compaction", rule, self.plan.where(setting), inputs, result)

    def _reason(self, session: Session, result: StepResult) -> str | None:
        with self._lock:
            provider = session.id in self._overflowed
        return "provider" if provider else result.compaction_needed

    def step(self, session: Session, step_input: StepInput | None = None) -> StepResult:
        """The request for the next step of ``session``, compacting first if needed."""
        step_input = step_input or StepInput()
        decisions: list[Decision] = []
        mutations: list[dict[str, Any]] = []
        now = max((m.created for m in session.messages), default=0)
        pruned = prune_session(self.plan, session, "normal", now=now, count=self.counter.count)
        if pruned.allowed:
            decisions.append(
                self._decide(
                    "prune.normal",
                    "prune.reasons.normal",
                    {},
                    {"parts": len(pruned.parts), "tokens": pruned.pruned_tokens},
                )
            )
            if pruned.parts:
                mutations.extend(pruned.mutations())
                session = apply_mutations(session, pruned.mutations())
        result = apply_plan(self.plan, session, step_input)
        compactions = 0
        reason = self._reason(session, result)
        while reason is not None:
            self._may_compact(session)
            decisions.extend(result.decisions)
            # A request that cannot fit is compacted as the provider's refusal would be.
            overflow = {"provider": True, "window": True, "preflight": False}.get(reason)
            done = compact(
                self.plan, session, self.summarizer, overflow=overflow, count=self.counter.count
            )
            decisions.extend(done.decisions)
            mutations.extend(result.mutations)
            mutations.extend(done.mutations)
            session = apply_mutations(session, [*result.mutations, *done.mutations])
            compactions += 1
            before = result.input_tokens
            result = apply_plan(self.plan, session, step_input)
            self._compacted(session, before, result.input_tokens)
            reason = self._reason(session, result)
        decisions.extend(result.decisions)
        mutations.extend(result.mutations)
        # result.session is the session it was built from with its own mutations applied.
        return dataclasses.replace(
            result, decisions=decisions, mutations=mutations, compactions=compactions
        )
