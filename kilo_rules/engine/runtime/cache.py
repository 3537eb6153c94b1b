"""Prompt-cache marker placement: which blocks of a request carry a cache breakpoint.

Two rules from Kilo (``docs/kilo-behaviour.md`` §10):

* ``kilo`` (§10.1, ``ProviderTransform.applyCaching``): the first ``system_first`` system
  messages and the last ``non_system_last`` other messages. Placement ``message`` marks
  the message itself (Kilo does this for Anthropic and Bedrock); ``last-part`` marks its
  last content part, and with ``skip_trailing_environment`` steps back over a trailing
  ``<environment_details>`` or synthetic part to the last stable one (the newer upstream
  behaviour), falling back to the message when there is none.
* ``auto`` (§10.2, the native ``cache-policy``): the last tool definition, the last
  system message and the latest user message. In the latter Kilo's variant marks the last
  text part that is neither ``<environment_details>`` nor synthetic, else the last text
  part, else the last part. It always marks parts, so ``placement`` does not apply.

Marks already in the request (a client's, normally) are kept and count toward the
budget; a block that is already marked is not marked again. A message-level mark and a
mark on the message's last part land on the same block on every wire, so they count as
one spot. When the budget cannot hold every new mark, those nearest the end of the
request are kept (conversation, then system, then tools): a later breakpoint also caches
everything before it. Empty text parts are never chosen, since the providers that take
markers drop them (Kilo filters them out before placing markers, with the same effect).

With ``respect_automatic`` and the provider's automatic caching on, no explicit marks are
added (Kilo's newer behaviour for Anthropic automatic caching).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import Any, Literal

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.request import (
    Approval,
    CacheMark,
    ModelMessage,
    ModelRequest,
    Part,
    Text,
    ToolResult,
)
from kilo_rules.engine.runtime.memo import PrefixMemo

#: Where a mark sits: ("tools", i), ("messages", i), ("messages", i, "parts", j) or
#: ("messages", i, "parts", j, "content", k) for a part inside a tool result.
Spot = tuple[str | int, ...]

_ENVIRONMENT = "<environment_details>"


def place_markers(
    request: ModelRequest,
    settings: CacheSettings,
    memo: PrefixMemo[ModelMessage, _Marks] | None = None,
    key: Hashable = None,
) -> tuple[ModelRequest, list[dict[str, Any]]]:
    """Mark ``request`` by ``settings``; return it with one decision record per choice.

    Each record has ``rule``, ``action`` (``keep``: a mark already there; ``mark``: a mark
    added; ``skip``: a wanted mark not added; ``off``: nothing placed; ``warn``),
    ``target`` (a JSON path such as ``messages[3].parts[1]``, or None), ``role``,
    ``reason``, ``ttl`` for added marks and ``client`` for kept ones. The request passed
    in is not changed. With ``memo`` (and the ``key`` of the session), the marks already
    in the messages this request shares with the one marked before are not looked for
    again.
    """
    marked, decisions = _place(request, settings, memo, key)
    return marked, [{"rule": settings.rule, **d} for d in decisions]


def _place(
    request: ModelRequest,
    settings: CacheSettings,
    memo: PrefixMemo[ModelMessage, _Marks] | None,
    key: Hashable,
) -> tuple[ModelRequest, list[dict[str, Any]]]:
    decisions: list[dict[str, Any]] = []
    existing = _existing(request, memo, key)
    taken = {_key(request, spot) for spot, _ in existing}
    room = max(0, settings.budget - len(taken))
    for spot, mark in existing:
        why = "client mark" if mark.client else "mark already in the request"
        decisions.append(_record(request, "keep", spot, why, client=mark.client))
    if len(taken) > settings.budget:
        decisions.append(
            {
                "action": "warn",
                "target": None,
                "role": None,
                "reason": f"{len(taken)} marks already in the request exceed the budget of "
                f"{settings.budget}; client marks are never removed",
            }
        )
    off = _off_reason(settings)
    if off is not None:
        decisions.append({"action": "off", "target": None, "role": None, "reason": off})
        return request, decisions

    wanted = _kilo(request, settings) if settings.rule == "kilo" else _auto(request, settings)
    fresh: list[tuple[Spot, str]] = []
    for spot, why in wanted:
        where = _key(request, spot)
        if where in taken:
            decisions.append(_record(request, "skip", spot, f"{why}; already marked"))
            continue
        taken.add(where)
        fresh.append((spot, why))

    # A later breakpoint caches everything before it too, so the latest ones are kept.
    by_position = sorted(fresh, key=lambda item: _position(request, item[0]), reverse=True)
    keep = {spot for spot, _ in by_position[:room]}
    added: list[tuple[Spot, CacheMark]] = []
    for spot, why in sorted(fresh, key=lambda item: _position(request, item[0])):
        if spot in keep:
            ttl = _ttl(request, spot, settings)
            decisions.append(_record(request, "mark", spot, why, ttl=ttl))
            mark = CacheMark(ttl=ttl, client=False)
            request = _set(request, spot, mark)
            added.append((spot, mark))
        else:
            budget = f"{why}; over the budget of {settings.budget} (later marks kept)"
            decisions.append(_record(request, "skip", spot, budget))
    # The request's marks now: those it had, and those just set (marking moves nothing).
    return _longest_first(request, decisions, [*existing, *added])


def _longest_first(
    request: ModelRequest,
    decisions: list[dict[str, Any]],
    marks: Sequence[tuple[Spot, CacheMark]],
) -> tuple[ModelRequest, list[dict[str, Any]]]:
    """Raise the marks this stage added before a one-hour mark to one hour.

    Anthropic (and Claude on Bedrock) refuse a one-hour breakpoint that follows a
    five-minute one; a client's one-hour mark late in the conversation means the whole
    prefix before it is to be kept that long anyway. Client marks are never changed: two
    of them in the wrong order are reported."""
    hours = [_position(request, spot) for spot, mark in marks if mark.ttl == "1h"]
    if not hours:
        return request, decisions
    last_hour = max(hours)
    for spot, mark in marks:
        if mark.ttl == "1h" or _position(request, spot) >= last_hour:
            continue
        target = _target(spot)
        if mark.client:
            decisions.append(
                {
                    "action": "warn",
                    "target": target,
                    "role": _role(request, spot),
                    "reason": "a client mark shorter than 1h comes before a 1h mark; "
                    "the provider will refuse the request",
                }
            )
            continue
        request = _set(request, spot, CacheMark(ttl="1h", client=False))
        for d in decisions:
            if d["action"] == "mark" and d["target"] == target:
                d["ttl"] = "1h"
                d["reason"] += "; raised to 1h: a 1h mark follows and longer TTLs come first"
    return request, decisions


def _ttl(request: ModelRequest, spot: Spot, s: CacheSettings) -> Literal["5m", "1h"] | None:
    """Tools and system carry ``ttl``; conversation messages ``message_ttl`` (when set).
    Longer-lived marks come first in the request, as Anthropic requires."""
    if spot[0] == "tools" or request.messages[int(spot[1])].role == "system":
        return s.ttl
    return s.message_ttl or s.ttl


def _off_reason(settings: CacheSettings) -> str | None:
    if settings.rule == "none":
        return "cache rule is none"
    if not settings.enabled:
        return "caching is off for this model (the cache gate did not match)"
    if settings.respect_automatic and settings.automatic_enabled:
        return "the provider's automatic caching is on, so no explicit breakpoints are added"
    if settings.budget <= 0:
        return "the breakpoint budget is 0"
    return None


def _kilo(request: ModelRequest, s: CacheSettings) -> list[tuple[Spot, str]]:
    indexed = list(enumerate(request.messages))
    system = [i for i, m in indexed if m.role == "system"][: max(0, s.system_first)]
    out = [(_placed(request, i, s), f"first {s.system_first} system messages") for i in system]
    return out + _tail(request, s, s.non_system_last)


def _tail(request: ModelRequest, s: CacheSettings, n: int) -> list[tuple[Spot, str]]:
    """The last ``n`` non-system messages, placed as the policy says."""
    rest = [i for i, m in enumerate(request.messages) if m.role != "system"]
    tail = rest[len(rest) - n :] if n > 0 else []
    why = f"last {n} non-system messages"
    return [(_placed(request, i, s), why) for i in tail]


def _placed(request: ModelRequest, i: int, s: CacheSettings) -> Spot:
    spot: Spot = ("messages", i)
    if s.placement == "last-part":
        j = _stable_part(request.messages[i], s.skip_trailing_environment)
        if j is not None:
            spot = ("messages", i, "parts", j)
    return spot


def _auto(request: ModelRequest, s: CacheSettings) -> list[tuple[Spot, str]]:
    out: list[tuple[Spot, str]] = []
    if s.last_tool and request.tools:
        out.append((("tools", len(request.tools) - 1), "last tool definition"))
    indexed = list(enumerate(request.messages))
    systems = [i for i, m in indexed if m.role == "system"]
    if s.last_system and systems:
        out.append((_part_spot(request, systems[-1], None), "last system message"))
    users = [i for i, m in indexed if m.role == "user"]
    if s.latest_user_message and users:
        j = _text_part(request.messages[users[-1]])
        out.append((_part_spot(request, users[-1], j), "latest user message"))
    assistants = [i for i, m in indexed if m.role == "assistant"]
    if s.latest_assistant and assistants:
        j = _text_part(request.messages[assistants[-1]])
        out.append((_part_spot(request, assistants[-1], j), "latest assistant message"))
    # The newer upstream AUTO also keeps a rolling breakpoint on the most recent messages,
    # so a long tool loop reads its own history from the cache.
    return out + _tail(request, s, s.rolling)


def _part_spot(request: ModelRequest, i: int, j: int | None) -> Spot:
    parts = request.messages[i].parts
    if j is None:
        j = _stable_part(request.messages[i], False)
    return ("messages", i, "parts", j) if j is not None and parts else ("messages", i)


def _unstable(part: Part) -> bool:
    """Per-turn text (synthetic, or the environment block): a mark on it never hits."""
    if not isinstance(part, Text):
        return False
    if part.synthetic:
        return True
    text = part.text
    if text[:1].isspace():  # strip only when needed: a text may be megabytes
        text = text.lstrip()
    return text.startswith(_ENVIRONMENT)


def _stable_part(message: ModelMessage, skip_environment: bool) -> int | None:
    """The last part a mark may sit on, or None (then the message itself is marked): a
    message that ends with a tool-approval part is marked as a whole, as Kilo does
    (transform.ts@006a344:361-373)."""
    if message.parts and isinstance(message.parts[-1], Approval):
        return None
    for j in range(len(message.parts) - 1, -1, -1):
        part = message.parts[j]
        if isinstance(part, Text) and part.text == "":
            continue
        if skip_environment and _unstable(part):
            continue
        return j
    return None


def _text_part(message: ModelMessage) -> int | None:
    """The part the native path marks in a message (Kilo's ``markMessageAt``): the last
    text part that is neither the environment block nor synthetic, else the last text
    part, else the last stable part."""
    texts = [j for j, p in enumerate(message.parts) if isinstance(p, Text) and p.text]
    stable = [j for j in texts if not _unstable(message.parts[j])]
    if stable:
        return stable[-1]
    if texts:
        return texts[-1]
    return _stable_part(message, False)


#: The marks in one message: (where in the message, the mark); () for the message itself.
_Marks = tuple[tuple[Spot, CacheMark], ...]


def _message_marks(_: int, msg: ModelMessage) -> _Marks:
    found: list[tuple[Spot, CacheMark]] = []
    if msg.cache is not None:
        found.append(((), msg.cache))
    for j, part in enumerate(msg.parts):
        if part.cache is not None:
            found.append((("parts", j), part.cache))
        if isinstance(part, ToolResult):
            for k, inner in enumerate(part.content):
                if inner.cache is not None:
                    found.append((("parts", j, "content", k), inner.cache))
    return tuple(found)


def _existing(
    request: ModelRequest,
    memo: PrefixMemo[ModelMessage, _Marks] | None = None,
    key: Hashable = None,
) -> list[tuple[Spot, CacheMark]]:
    found: list[tuple[Spot, CacheMark]] = []
    for i, tool in enumerate(request.tools):
        if tool.cache is not None:
            found.append((("tools", i), tool.cache))
    messages = request.messages
    if memo is None:
        per_message = [_message_marks(i, m) for i, m in enumerate(messages)]
    else:
        per_message = memo.values(messages, _message_marks, None, key)
    for i, marks in enumerate(per_message):
        for where, mark in marks:
            found.append((("messages", i, *where), mark))
    return found


def _key(request: ModelRequest, spot: Spot) -> Spot:
    """The spot a mark lands on on the wire: a message's mark lands on its last part."""
    if len(spot) == 2 and spot[0] == "messages":
        parts = request.messages[int(spot[1])].parts
        if parts:
            return ("messages", spot[1], "parts", len(parts) - 1)
    return spot


def _position(request: ModelRequest, spot: Spot) -> tuple[int, ...]:
    """Where a spot sits in the cached prefix (tools, then messages in order)."""
    key = _key(request, spot)
    numbers = tuple(int(x) for x in key if isinstance(x, int))
    return (0, *numbers) if key[0] == "tools" else (1, *numbers)


def _target(spot: Spot) -> str:
    return ".".join(f"{name}[{index}]" for name, index in zip(spot[::2], spot[1::2], strict=True))


def _role(request: ModelRequest, spot: Spot) -> str | None:
    return request.messages[int(spot[1])].role if spot[0] == "messages" else None


def _record(
    request: ModelRequest,
    action: str,
    spot: Spot,
    reason: str,
    *,
    ttl: str | None = None,
    client: bool | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"action": action, "target": _target(spot), "role": _role(request, spot)}
    out["reason"] = reason
    if action == "mark":
        out["ttl"] = ttl
    if client is not None:
        out["client"] = client
    return out


def _set(request: ModelRequest, spot: Spot, mark: CacheMark) -> ModelRequest:
    if spot[0] == "tools":
        tools = list(request.tools)
        tools[int(spot[1])] = replace(tools[int(spot[1])], cache=mark)
        return replace(request, tools=tuple(tools))
    i = int(spot[1])
    messages = list(request.messages)
    msg = messages[i]
    if len(spot) == 2:
        messages[i] = replace(msg, cache=mark)
    else:
        parts = list(msg.parts)
        j = int(spot[3])
        parts[j] = replace(parts[j], cache=mark)
        messages[i] = replace(msg, parts=tuple(parts))
    return replace(request, messages=tuple(messages))
