"""The names an expression may read, with their types, and how definitions depend on them.

A :class:`Vocabulary` is a flat, declared schema: full dotted name → type (and a line of
documentation). Policies add their own names (``budget.usable``, ``output.max_tokens``)
with :meth:`Vocabulary.extended`; :func:`order_definitions` then sorts those definitions
so that each is computed after the names it reads, and reports cycles.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.errors import Diagnostic, ExprError, Location, did_you_mean
from kilo_rules.engine.frontend.expr.nodes import Expr, Name, walk
from kilo_rules.engine.frontend.expr.types import (
    BOOL,
    FLOAT,
    INT,
    NUMBER,
    STR,
    Type,
    assignable,
    list_of,
    nullable,
    type_of_value,
)

if TYPE_CHECKING:
    from kilo_rules.engine.formats.catalog import ModelInfo

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_RESERVED = frozenset(
    {
        "and",
        "or",
        "not",
        "in",
        "if",
        "else",
        "true",
        "false",
        "null",
        "contains",
        "startswith",
        "endswith",
        "matches",
    }
)

_DEFAULT: dict[str, tuple[Type, str]] = {
    # model.* — the catalog's ModelInfo, flattened.
    "model.id": (STR, "Catalog id, e.g. anthropic/claude-sonnet-4-5."),
    "model.provider": (STR, "Provider id, e.g. anthropic, openrouter, amazon-bedrock."),
    "model.sdk": (STR, "AI SDK package (models.dev npm), e.g. @ai-sdk/anthropic."),
    "model.family": (STR, "Model family, e.g. claude, gpt, gemini."),
    "model.api_id": (STR, "The id sent to the provider's API."),
    "model.api": (
        STR,
        "Wire format: anthropic, openai, openai-responses, bedrock, gemini, "
        "openai-compatible, copilot.",
    ),
    "model.name": (nullable(STR), "Display name, if known."),
    "model.limits.context": (INT, "Context window in tokens (input + output)."),
    "model.limits.input": (nullable(INT), "Separate input limit, where the provider has one."),
    "model.limits.output": (INT, "Maximum output tokens (0 = unknown)."),
    "model.prices.input": (nullable(FLOAT), "USD per million uncached input tokens."),
    "model.prices.output": (nullable(FLOAT), "USD per million output tokens."),
    "model.prices.cache_write": (nullable(FLOAT), "USD per million cache-write tokens (5 min)."),
    "model.prices.cache_write_1h": (nullable(FLOAT), "USD per million cache-write tokens (1 h)."),
    "model.prices.cache_read": (nullable(FLOAT), "USD per million cache-read tokens."),
    "model.cache.kind": (STR, "Prompt cache: explicit, automatic or none."),
    "model.cache.max_breakpoints": (INT, "Most explicit cache breakpoints per request."),
    "model.cache.min_cacheable_tokens": (INT, "Shortest prefix the provider caches."),
    "model.prompt": (nullable(STR), "Prompt variant metadata (anthropic, gemini, beast, ...)."),
    "model.tokenizer": (STR, "Token counter: estimate, or tiktoken:<encoding>."),
    "model.reasoning": (BOOL, "The model emits reasoning."),
    "model.media_in_tool_results": (BOOL, "Tool results may carry images."),
    "model.modalities": (list_of(STR), "Input modalities (text, image, pdf, audio, video)."),
    # session.* — the conversation so far.
    "session.turns": (INT, "User turns so far."),
    "session.messages": (INT, "Messages in the session."),
    "session.compactions": (INT, "Compactions performed so far."),
    "session.has_summary": (BOOL, "A completed summary exists."),
    "session.last.input": (INT, "Input tokens of the last finished assistant message."),
    "session.last.output": (INT, "Output tokens of the last finished assistant message."),
    "session.last.reasoning": (INT, "Reasoning tokens of the last finished assistant message."),
    "session.last.cache_read": (INT, "Cache-read tokens of the last finished assistant."),
    "session.last.cache_write": (INT, "Cache-write tokens of the last finished assistant."),
    "session.last.total": (INT, "Total tokens the provider reported for it."),
    "session.last.count": (
        INT,
        "input + output + reasoning + cache_read + cache_write, or "
        "total when those are all 0 (Kilo's overflow count).",
    ),
    # request.* — the request being built.
    "request.estimated_tokens": (INT, "Estimated input tokens of the request."),
    "request.bytes": (INT, "Serialised size of the request body in bytes."),
    "request.media": (INT, "Media payloads (images, PDFs) in the request."),
    "request.mid_tool_loop": (BOOL, "A tool result follows the last user message."),
    "request.step": (INT, "Step number within the current user turn (1-based)."),
    "request.max_steps": (nullable(INT), "The agent's step limit, if any."),
    # agent.* — the agent (mode) answering.
    "agent.name": (STR, "Agent or mode name, e.g. code, build, plan."),
    "agent.has_prompt": (BOOL, "The agent brings its own system prompt."),
    "agent.skills_enabled": (BOOL, "The skill permission is enabled."),
    "agent.task_enabled": (BOOL, "The task (sub-agent) tool is enabled."),
    # env.* — where the agent runs.
    "env.platform": (STR, "Operating system: linux, darwin, win32."),
    "env.cwd": (STR, "Working directory."),
    # config.* — the user's agent configuration (null when not set).
    "config.output_token_max": (nullable(INT), "Output-token ceiling override."),
    "config.compaction.auto": (nullable(BOOL), "Automatic compaction switch."),
    "config.compaction.reserved": (nullable(INT), "Tokens reserved for the compaction."),
    "config.compaction.threshold_percent": (nullable(NUMBER), "Compact at this % of the window."),
    "config.compaction.prune": (nullable(BOOL), "Prune old tool output."),
}


class Vocabulary(Mapping[str, Type]):
    """An immutable mapping of readable names to their types, with documentation."""

    def __init__(self, names: Mapping[str, Type | tuple[Type, str]]) -> None:
        self._types: dict[str, Type] = {}
        self._docs: dict[str, str] = {}
        for name, entry in names.items():
            if not _NAME.fullmatch(name) or name.split(".")[0] in _RESERVED:
                raise ValueError(f"{name!r} is not a valid dotted name")
            kind, doc = entry if isinstance(entry, tuple) else (entry, "")
            self._types[name] = kind
            self._docs[name] = doc
        self._groups = frozenset(
            ".".join(name.split(".")[:i])
            for name in self._types
            for i in range(1, name.count(".") + 1)
        )

    def __getitem__(self, name: str) -> Type:
        return self._types[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def doc(self, name: str) -> str:
        """The one-line description of ``name``."""
        return self._docs[name]

    def is_group(self, name: str) -> bool:
        """Whether ``name`` is a prefix of names (``model.limits``), not a name itself."""
        return name in self._groups and name not in self._types

    def members(self, group: str) -> list[str]:
        """The names directly or indirectly under ``group``."""
        return sorted(n for n in self._types if n.startswith(group + "."))

    def suggest(self, name: str) -> str | None:
        """The known name ``name`` was most likely meant to be."""
        return did_you_mean(name, self._types)

    def extended(self, extra: Mapping[str, Type | tuple[Type, str]]) -> Vocabulary:
        """A new vocabulary with ``extra`` names added (e.g. a policy's own definitions).

        Redefining an existing name is an error: a policy cannot shadow ``model.*``.
        """
        clash = sorted(set(extra) & set(self._types))
        if clash:
            raise ValueError(f"already defined: {', '.join(clash)}")
        merged: dict[str, Type | tuple[Type, str]] = {
            n: (t, self._docs[n]) for n, t in self._types.items()
        }
        merged.update(extra)
        return Vocabulary(merged)

    def check_context(self, context: Mapping[str, Any]) -> list[str]:
        """Names whose value in ``context`` is missing or of the wrong type (for tests and
        integrations; evaluation itself does not re-check types on every call)."""
        problems = []
        for name, kind in self._types.items():
            if name not in context:
                problems.append(f"{name}: missing")
            elif not assignable(type_of_value(context[name]), kind):
                value = context[name]
                problems.append(f"{name}: expected {kind}, got {type_of_value(value)}")
        return problems


# functools.cache, not a compiler's cache: it takes no argument, so it holds one value,
# the built-in names, fixed by the package.
@cache
def default_vocabulary() -> Vocabulary:
    """The built-in names: ``model.*``, ``session.*``, ``request.*``, ``agent.*``, ``env.*``
    and ``config.*``."""
    return Vocabulary(_DEFAULT)


def model_values(model: ModelInfo) -> dict[str, Any]:
    """The ``model.*`` entries of an evaluation context, read from a catalog descriptor."""
    prices = model.prices
    return {
        "model.id": model.id,
        "model.provider": model.provider,
        "model.sdk": model.sdk,
        "model.family": model.family,
        "model.api_id": model.api_id,
        "model.api": model.api,
        "model.name": model.name,
        "model.limits.context": model.limits.context,
        "model.limits.input": model.limits.input,
        "model.limits.output": model.limits.output,
        "model.prices.input": prices.input if prices else None,
        "model.prices.output": prices.output if prices else None,
        "model.prices.cache_write": prices.cache_write if prices else None,
        "model.prices.cache_write_1h": prices.cache_write_1h if prices else None,
        "model.prices.cache_read": prices.cache_read if prices else None,
        "model.cache.kind": model.cache.kind,
        "model.cache.max_breakpoints": model.cache.max_breakpoints,
        "model.cache.min_cacheable_tokens": model.cache.min_cacheable_tokens,
        "model.prompt": model.prompt,
        "model.tokenizer": model.tokenizer,
        "model.reasoning": model.reasoning,
        "model.media_in_tool_results": model.media_in_tool_results,
        "model.modalities": list(model.modalities),
    }


def name_nodes(expr: Expr) -> list[Name]:
    """The first use of each name ``expr`` reads, in source order (nothing located yet:
    locating is the costly part, and most callers need only the names)."""
    seen: dict[str, Name] = {}
    for node in walk(expr.root):
        if isinstance(node, Name) and (node.name not in seen or node.start < seen[node.name].start):
            seen[node.name] = node
    return sorted(seen.values(), key=lambda n: n.start)


def free_names(expr: Expr) -> list[tuple[str, Location]]:
    """The names ``expr`` reads, each once, in source order, located at its first use."""
    return [(n.name, expr.location(n)) for n in name_nodes(expr)]


def order_definitions(defs: Mapping[str, Expr]) -> list[str]:
    """The names of ``defs`` ordered so that each comes after the definitions it reads.

    Names an expression reads that are not in ``defs`` (vocabulary names) are ignored.
    Independent definitions keep their given order. A cycle raises :class:`ExprError`
    (code ``expr.cycle``) located at the reference that closes it.
    """
    refs = {
        name: [(n.name, e) for n in name_nodes(e) if n.name in defs] for name, e in defs.items()
    }
    done: set[str] = set()
    order: list[str] = []
    for root in defs:
        if root in done:
            continue
        # Iterative depth-first search: `path` is the chain of definitions being resolved.
        path: list[str] = [root]
        pending: list[Iterator[tuple[str, Expr]]] = [iter(refs[root])]
        while pending:
            step = next(pending[-1], None)
            if step is None:
                pending.pop()
                finished = path.pop()
                done.add(finished)
                order.append(finished)
                continue
            ref, holder = step
            if ref in done:
                continue
            if ref in path:
                location = next(loc for r, loc in free_names(holder) if r == ref)
                cycle = [*path[path.index(ref) :], ref]
                message = (
                    f"{ref} refers to itself"
                    if len(cycle) == 2
                    else "definitions refer to each other in a cycle: " + " -> ".join(cycle)
                )
                raise ExprError(
                    Diagnostic("expr.cycle", message, location, details={"cycle": cycle})
                )
            path.append(ref)
            pending.append(iter(refs[ref]))
    return order
