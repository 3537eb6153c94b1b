"""What the real endpoints refuse although the body type-checks, written down once.

The SDK request types and the JSON Schemas say which keys a body may hold. The endpoints
check more than that: turn order, call/result pairing, blank text, the cache-breakpoint
budget, where a signature came from, id formats, the window. Those rules live as data
(:data:`RULES`, one :class:`ApiRules` per wire API, each in its API's record) and here as
small checks that read any rendered body through one common view, so the same rule is
written once for every API that has it. Each rule carries, in a comment, the reason or
the upstream error text.

:func:`check_body` runs every check that applies to the API and returns the
:class:`Violation` list, each with the rule's name and a JSON path into the body
(``messages[3].content[0].text``). :func:`rules_for` names the rules an API has.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import Any

from kilo_rules.engine.providers import _check as _check_api
from kilo_rules.engine.providers import _wireview as wire
from kilo_rules.engine.providers._api_rules import ApiRules
from kilo_rules.engine.providers._wireview import Block, Turn, View
from kilo_rules.engine.providers.registry import RULES
from kilo_rules.engine.providers.serversim import refuses

__all__ = ["RULES", "ApiRules", "BodyContext", "Violation", "check_body", "rules_for"]


@dataclass(frozen=True, slots=True)
class Violation:
    """A rule the body breaks: the rule's name, a JSON path into the body, and why."""

    rule: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}: {self.message}"


@dataclass(frozen=True, slots=True)
class BodyContext:
    """What the body alone does not say.

    ``model`` is the API model id (Gemini and Bedrock bodies carry none);
    ``context_window`` and ``input_tokens`` (the caller's estimate of the prompt) enable
    the window check; ``signature_issuers`` maps a reasoning signature (or encrypted
    reasoning) to the family that issued it (``anthropic``, ``google``, ``openai``).
    """

    model: str | None = None
    context_window: int | None = None
    input_tokens: int | None = None
    signature_issuers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def _blank(text: str | None) -> bool:
    return not text or text.isspace()


def _answering(view: View, rules: ApiRules, i: int) -> tuple[Turn, ...] | None:
    """The turns that must answer the calls of turn ``i`` (None: the body ends first), for
    the pairings by position (by id, see :func:`_call_answered_by_id`)."""
    turns = view.turns
    if i + 1 >= len(turns):
        return None
    if rules.pairing == "tool-messages":
        run = []
        for turn in turns[i + 1 :]:
            if turn.role != "tool":
                break
            run.append(turn)
        return tuple(run)
    nxt = turns[i + 1]
    return (nxt,) if nxt.role != rules.assistant_role else ()


def _asked(view: View, rules: ApiRules, j: int) -> list[Block]:
    """The calls the results in turn ``j`` may answer, for the pairings by position (by id,
    see :func:`_result_has_call_by_id`)."""
    asker = _asker(view, rules, j)
    return wire.calls(asker) if asker is not None else []


def _asker(view: View, rules: ApiRules, j: int) -> Turn | None:
    """The assistant turn whose calls the results in turn ``j`` may answer."""
    k = j - 1
    if rules.pairing == "tool-messages":
        while k >= 0 and view.turns[k].role == "tool":
            k -= 1
    if k >= 0 and view.turns[k].role == rules.assistant_role:
        return view.turns[k]
    return None


# --- the checks ----------------------------------------------------------------------

Found = Iterator[tuple[str, str]]  # (path, message); the caller adds the rule's name
Check = Callable[[View, ApiRules, BodyContext], Found]
CHECKS: dict[str, tuple[Check, Callable[[ApiRules], bool]]] = {}


def _rule(name: str, applies: Callable[[ApiRules], bool]) -> Callable[[Check], Check]:
    """Register a check under the rule ``name``, for the APIs where ``applies`` holds."""

    def register(fn: Check) -> Check:
        CHECKS[name] = (fn, applies)
        return fn

    return register


# Anthropic: "messages: first message must use the \"user\" role"; Bedrock: "A conversation
# must start with a user message"; Gemini: a conversation opening on a model turn is refused.
@_rule("first-role", lambda r: r.first_role is not None)
def _first_role(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    if not view.turns:
        yield (
            view.turns_path,
            f"no turns; the conversation must start with a {rules.first_role} turn",
        )
    elif view.turns[0].role != rules.first_role:
        yield (
            view.turns[0].path,
            f"the conversation opens with a {view.turns[0].role!r} turn, not {rules.first_role!r}",
        )


# Anthropic: "roles must alternate between \"user\" and \"assistant\""; Bedrock: "A
# conversation must alternate between user and assistant roles"; Gemini: "Please ensure
# that multiturn requests alternate between user and model", roles "user"/"model" only.
@_rule("alternation", lambda r: bool(r.roles))
def _alternation(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for turn in view.turns:
        if turn.role not in rules.roles:
            yield turn.path, f"role {turn.role!r} is not one of {', '.join(rules.roles)}"
    for prev, turn in pairwise(view.turns):
        if turn.role == prev.role:
            yield turn.path, f"two {turn.role!r} turns in a row ({prev.path} and {turn.path})"


# Anthropic: "tool_use ids were found without tool_result blocks immediately after";
# Bedrock: the same for toolUse; OpenAI: "An assistant message with 'tool_calls' must be
# followed by tool messages responding to each 'tool_call_id'"; Gemini: "Please ensure
# that the number of function response parts is equal to the number of function call
# parts of the function call turn."; Responses API: "No tool output found for function
# call call_…".
@_rule("call-answered", lambda r: True)
def _call_answered(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    if rules.pairing == "by-id":
        yield from _call_answered_by_id(view, rules)
        return
    for i, turn in enumerate(view.turns):
        calls = wire.calls(turn)
        if not calls:
            continue
        answering = _answering(view, rules, i)
        if answering is None and not rules.calls_answered_at_end:
            continue
        results = [r for t in answering or () for r in wire.results(t)]
        ids = {r.call_id for r in results if r.call_id is not None}
        if rules.pairing == "function-turns":
            if len(results) != len(calls):
                yield (
                    turn.path,
                    (
                        f"{len(calls)} function call(s) answered by {len(results)} function "
                        "response(s) in the next content"
                    ),
                )
            if not ids:  # Gemini ids are optional; without them the count is the rule
                continue
        for call in calls:
            if call.call_id is not None and call.call_id not in ids:
                yield call.at("id"), f"call {call.call_id!r} has no result right after it"


# Anthropic: "unexpected `tool_use_id` found in `tool_result` blocks ... Each `tool_result`
# block must have a corresponding `tool_use` block in the previous message"; OpenAI:
# "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'";
# Gemini: "Please ensure that function response turn comes immediately after a function
# call turn."; Responses API: "No tool call found for function call output with call_id
# call_…".
@_rule("result-has-call", lambda r: True)
def _result_has_call(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    if rules.pairing == "by-id":
        yield from _result_has_call_by_id(view)
        return
    for j, turn in enumerate(view.turns):
        results = wire.results(turn)
        if not results:
            continue
        calls = _asked(view, rules, j)
        if not calls:
            for result in results:
                yield result.at("id"), "a result with no call in the turn right before it"
            continue
        ids = {c.call_id for c in calls if c.call_id is not None}
        if rules.pairing == "function-turns" and not ids:
            continue
        caller = "the preceding assistant turn"
        for result in results:
            if result.call_id is not None and result.call_id not in ids:
                yield result.at("id"), f"result for {result.call_id!r}, which {caller} did not call"


# By id, any later item may answer a call and any earlier one may have made it: one pass
# records, per id, the last turn holding its result and the first holding its call, so a
# body is checked in time linear in its turns (the sidecar checks every body it builds).
def _call_answered_by_id(view: View, rules: ApiRules) -> Found:
    last_result: dict[str, int] = {}
    for j, turn in enumerate(view.turns):
        for result in wire.results(turn):
            if result.call_id is not None:
                last_result[result.call_id] = j
    for i, turn in enumerate(view.turns):
        calls = wire.calls(turn)
        if not calls:
            continue
        if i + 1 >= len(view.turns) and not rules.calls_answered_at_end:
            continue
        for call in calls:
            if call.call_id is not None and last_result.get(call.call_id, -1) <= i:
                yield call.at("id"), f"call {call.call_id!r} has no result after it"


def _result_has_call_by_id(view: View) -> Found:
    first_call: dict[str, int] = {}
    first_any: int | None = None
    for i, turn in enumerate(view.turns):
        for call in wire.calls(turn):
            if first_any is None:
                first_any = i
            if call.call_id is not None:
                first_call.setdefault(call.call_id, i)
    for j, turn in enumerate(view.turns):
        results = wire.results(turn)
        if not results:
            continue
        if first_any is None or first_any >= j:
            for result in results:
                yield result.at("id"), "a result with no call before it"
            continue
        for result in results:
            if result.call_id is not None and first_call.get(result.call_id, j) >= j:
                yield (
                    result.at("id"),
                    (f"result for {result.call_id!r}, which no earlier item did not call"),
                )


# Anthropic: "tool_result blocks must come first in the content of the user message,
# before any text" (Bedrock forwards Claude's turns with the same rule).
@_rule("result-placement", lambda r: r.results_first)
def _result_placement(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for turn in view.turns:
        other = False
        for block in turn.blocks:
            if block.kind == "result" and other:
                yield block.path, "a tool result after other content; results must come first"
            elif block.kind not in ("result", "marker"):
                other = True


# Gemini: "Please ensure that function call turn comes immediately after a user turn or
# after a function response turn."
@_rule("call-position", lambda r: r.call_after_user)
def _call_position(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for i, turn in enumerate(view.turns):
        if wire.calls(turn) and (i == 0 or view.turns[i - 1].role != "user"):
            yield turn.path, "a function call turn must come right after a user turn"


# Anthropic: "tool_use ids must be unique"; Bedrock and OpenAI pair results by id too.
@_rule("call-id-unique", lambda r: r.unique_call_ids)
def _call_id_unique(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    seen: dict[str, str] = {}
    for turn in view.turns:
        for call in wire.calls(turn):
            if call.call_id is None:
                continue
            if call.call_id in seen:
                yield (
                    call.at("id"),
                    f"call id {call.call_id!r} is used before at {seen[call.call_id]}",
                )
            else:
                seen[call.call_id] = call.at("id")


# Anthropic: "text content blocks must contain non-whitespace text"; Bedrock refuses blank
# text blocks; Gemini: "Unable to submit request because it has an empty text parameter."
@_rule("text-not-blank", lambda r: r.non_blank_text)
def _text_not_blank(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for block in wire.walk(view):
        if block.kind in ("text", "thinking") and block.text is not None and _blank(block.text):
            if rules.blank_signed_text and block.signature is not None:
                continue
            yield block.at("text"), "blank text; the API refuses whitespace-only text"


# Anthropic: "messages.N: all messages must have non-empty content except for the optional
# final assistant message"; Bedrock: content and toolResult.content have at least one
# block; Gemini: "contents.parts must not be empty".
@_rule("content-not-empty", lambda r: r.non_empty_content)
def _content_not_empty(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    last = len(view.turns) - 1
    for i, turn in enumerate(view.turns):
        if not any(b.kind != "marker" for b in turn.blocks):
            if rules.empty_final_assistant and i == last and turn.role == rules.assistant_role:
                continue
            yield turn.content_path, "empty content"
        if rules.result_content_required:
            for block in wire.results(turn):
                if not any(b.kind != "marker" for b in block.content):
                    yield f"{block.path}.content", "a tool result with empty content"
    if view.system_path is not None and not view.system:
        yield view.system_path, "empty system instruction"


# Anthropic: "A maximum of 4 blocks with cache_control may be provided"; Bedrock: at most
# 4 cache checkpoints; OpenRouter forwards cache_control to Anthropic; OpenAI: at most 4
# explicit prompt_cache_breakpoint marks.
@_rule("marker-budget", lambda r: r.marker_budget is not None)
def _marker_budget(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    marks = list(wire.marks(view))
    budget = rules.marker_budget or 0
    if len(marks) > budget:
        yield marks[budget][0], f"{len(marks)} cache breakpoints; the API allows at most {budget}"


# Anthropic: "cache_control cannot be set for thinking blocks"; Bedrock: "Cache point
# cannot be inserted after reasoning block."
@_rule("marker-on-thinking", lambda r: r.marker_not_on_thinking)
def _marker_on_thinking(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for block in wire.walk(view):
        if block.kind == "thinking" and block.mark is not None:
            yield block.at("mark"), "a cache breakpoint on a thinking block"
    for blocks in wire.lists(view):
        for prev, block in pairwise(blocks):
            if block.kind == "marker" and prev.kind == "thinking":
                yield block.path, "a cache point right after a reasoning block"


# Bedrock: a cachePoint closes the block before it, so it cannot open a content, system
# or tools list ("messages.0.content.0.type: Field required" once forwarded to Claude).
@_rule("marker-first", lambda r: r.marker_not_first)
def _marker_first(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for blocks in wire.lists(view):
        if blocks and blocks[0].kind == "marker":
            yield blocks[0].path, "a cache point with no block before it"


# Anthropic: "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control
# block. Note that blocks are processed in the following order: tools, system, messages";
# Bedrock: checkpoint TTLs must not increase across toolConfig, system, messages.
@_rule("marker-ttl-order", lambda r: r.ttl_order)
def _marker_ttl_order(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    short: str | None = None
    for path, mark in wire.marks(view):
        ttl = mark.get("ttl") or "5m"  # an unspelled ttl is the 5-minute bucket
        if ttl == "1h" and short is not None:
            yield path, f"a 1h cache breakpoint after the 5m one at {short}"
        elif ttl != "1h" and short is None:
            short = path


# Anthropic (behind OpenRouter): "cache_control cannot be set for empty text blocks".
@_rule("marker-on-blank-text", lambda r: r.marked_text_not_blank)
def _marker_on_blank_text(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for block in wire.walk(view):
        if block.kind == "text" and block.mark is not None and _blank(block.text):
            yield block.at("mark"), "a cache breakpoint on blank text"


# OpenAI: "Invalid value for 'content': expected a string, got null." for an assistant
# message without tool_calls.
@_rule("assistant-content", lambda r: r.assistant_needs_content)
def _assistant_content(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for turn in view.turns:
        if turn.role == "assistant" and not turn.has_content and not wire.calls(turn):
            yield turn.content_path, "an assistant message with neither content nor tool_calls"


# A signature verifies only with its issuer: Anthropic "Invalid `signature` in `thinking`
# block"; Gemini "Corrupted thought signature."
@_rule("signature-issuer", lambda r: r.signature_issuer is not None)
def _signature_issuer(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for block in wire.walk(view):
        sig = block.signature
        if sig is None or sig in rules.signature_sentinels:
            continue
        issuer = ctx.signature_issuers.get(sig)
        if issuer is not None and issuer != rules.signature_issuer:
            yield (
                block.at("signature"),
                (f"a signature issued by {issuer}, which {rules.signature_issuer} cannot verify"),
            )


# Gemini 3: "Function call is missing a thought_signature in functionCall parts". Only the
# current turn is validated (the contents after the last user content that is not a
# function response); there the first call of every model content carries a signature.
@_rule("signature-required", lambda r: r.signature_required is not None)
def _signature_required(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    if ctx.model is None or not re.search(rules.signature_required or "", ctx.model):
        return
    start = 0
    for i, turn in enumerate(view.turns):
        if turn.role == "user" and not wire.results(turn):
            start = i + 1
    for turn in view.turns[start:]:
        calls = wire.calls(turn)
        if turn.role == rules.assistant_role and calls and calls[0].signature is None:
            yield calls[0].path, f"{ctx.model} requires a thoughtSignature on this call"


# See the patterns and lengths in RULES.
@_rule("call-id-format", lambda r: r.call_id_pattern is not None or r.call_id_max is not None)
def _call_id_format(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    for block in wire.walk(view):
        if block.kind not in ("call", "result") or block.call_id is None:
            continue
        cid = block.call_id
        if rules.call_id_pattern and not re.fullmatch(rules.call_id_pattern, cid):
            yield block.at("id"), f"id {cid!r} does not match ^{rules.call_id_pattern}$"
        if rules.call_id_max is not None and len(cid) > rules.call_id_max:
            yield block.at("id"), f"id is {len(cid)} characters; at most {rules.call_id_max}"


# See the patterns in RULES.
@_rule("tool-name-format", lambda r: r.tool_name_pattern is not None)
def _tool_name_format(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    pattern = rules.tool_name_pattern or ""
    for block in wire.walk(view):
        checked = block.kind == "tool" or (rules.call_names and block.kind in ("call", "result"))
        if checked and block.name is not None and not re.fullmatch(pattern, block.name):
            yield block.at("name"), f"name {block.name!r} does not match ^{pattern}$"


def _cap(view: View, rules: ApiRules) -> tuple[str, Any] | None:
    value: Any = view.body
    for key in rules.output_cap:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return ".".join(rules.output_cap), value


# Every API refuses an output limit below 1 (Anthropic: "max_tokens: Input should be
# greater than or equal to 1").
@_rule("output-positive", lambda r: bool(r.output_cap))
def _output_positive(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    cap = _cap(view, rules)
    if cap is not None and (isinstance(cap[1], bool) or not isinstance(cap[1], int) or cap[1] < 1):
        yield cap[0], f"output limit {cap[1]!r}; it must be an integer of at least 1"


# Anthropic: "prompt is too long" / "input length and `max_tokens` exceed context limit";
# OpenAI: "This model's maximum context length is N tokens. However, you requested M
# tokens (P in the messages, C in the completion)".
@_rule("output-within-window", lambda r: bool(r.output_cap))
def _output_within_window(view: View, rules: ApiRules, ctx: BodyContext) -> Found:
    if ctx.context_window is None or ctx.input_tokens is None:
        return
    cap = _cap(view, rules)
    path, value = cap if cap is not None else (view.turns_path, 0)
    out = value if isinstance(value, int) and not isinstance(value, bool) else 0
    if refuses(ctx.input_tokens, out, ctx.context_window):
        yield (
            path,
            (
                f"{ctx.input_tokens:,} input + {out:,} output tokens exceed the "
                f"{ctx.context_window:,}-token window"
            ),
        )


def _rules(api: str) -> ApiRules:
    # the renderers' error for an unknown API, with its did-you-mean
    return _check_api(api).rules


def rules_for(api: str) -> tuple[str, ...]:
    """The names of the rules :func:`check_body` checks for wire API ``api``."""
    rules = _rules(api)
    return tuple(name for name, (_, applies) in CHECKS.items() if applies(rules))


def check_body(
    body: Mapping[str, Any], api: str, context: BodyContext | None = None
) -> list[Violation]:
    """Every acceptance rule ``body`` breaks on wire API ``api``, in rule order.

    Rules that need facts the body does not hold (the window, the model, where a
    signature came from) are skipped unless ``context`` supplies them. Raises
    :class:`~kilo_rules.engine.base.errors.CatalogError` for an unknown ``api``.
    """
    rules = _rules(api)
    ctx = context or BodyContext()
    view = wire.read(body, rules.shape, rules.marker_key)
    return [
        Violation(name, path, message)
        for name, (fn, applies) in CHECKS.items()
        if applies(rules)
        for path, message in fn(view, rules, ctx)
    ]
