"""The facts about each wire API that the layers below the renderers need, as data.

A wire API is one JSON shape requests are sent as (Anthropic Messages, Chat Completions,
the Responses API, …). Its full record, :class:`kilo_rules.engine.providers.registry.WireApiSpec`,
lives with its renderer in :mod:`kilo_rules.engine.providers`; the part of it the catalog, the
compiler, the policy schema and the simulator read is a :class:`WireFacts`, kept here so
that they read it without importing the renderers. :data:`BUILTIN` holds the facts of the
APIs kilo-rules ships; registering a ``WireApiSpec`` (``kilo_rules.engine.providers.register``)
adds its facts to the same registry, which :func:`names` and :func:`facts` read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from kilo_rules.engine.base.errors import CatalogError, Diagnostic, did_you_mean

__all__ = [
    "BUILTIN",
    "FactsView",
    "ServerEditFacts",
    "WireFacts",
    "facts",
    "known",
    "names",
    "register_facts",
    "unregister_facts",
]


@dataclass(frozen=True, slots=True)
class ServerEditFacts:
    """Context management the provider runs on its side when the request asks (the
    policy's ``server`` section), as the simulator plays it: the ``edits`` it runs, the
    body key of the conversation ``items`` they act on, and the content type of the text
    block its compaction summary is written as."""

    edits: frozenset[str]
    items: str
    text_type: str = "text"


@dataclass(frozen=True, slots=True)
class WireFacts:
    """What the layers below the renderers know about one wire API.

    ``marker_budget`` is the most cache breakpoints one request may carry by default (0:
    the API caches implicitly and takes none); ``explicit_breakpoints`` the budget when
    the policy's ``cache.shapes`` asks for explicit ones (None: no such choice);
    ``marker_shapes`` the values ``cache.shapes`` may give it (empty: not a choice);
    ``server`` the context edits the provider runs (None: none); ``automatic_marker``
    whether a client may ask the provider to place one cache breakpoint itself (Anthropic's
    automatic caching), which then takes one of the request's slots.
    """

    name: str
    marker_budget: int = 0
    explicit_breakpoints: int | None = None
    marker_shapes: tuple[str, ...] = ()
    server: ServerEditFacts | None = None
    automatic_marker: bool = False


#: The facts of the wire APIs kilo-rules ships, in the catalog's order. Anthropic and
#: Bedrock count tools, system and messages together; OpenAI-compatible servers forward the
#: marks to Anthropic (OpenRouter), and so does GitHub Copilot for its Claude models
#: (``copilot_cache_control``), so the same 4 applies. OpenAI (Chat Completions and the
#: Responses API) and Gemini cache implicitly; OpenAI models from GPT-5.6 take up to 4
#: ``prompt_cache_breakpoint`` on request, on both OpenAI APIs alike.
BUILTIN: tuple[WireFacts, ...] = (
    WireFacts(
        "anthropic",
        marker_budget=4,
        server=ServerEditFacts(
            frozenset({"clear_thinking", "clear_tool_uses", "compaction"}), "messages"
        ),
        automatic_marker=True,
    ),
    WireFacts("openai", explicit_breakpoints=4, marker_shapes=("explicit", "none")),
    WireFacts(
        "openai-responses",
        explicit_breakpoints=4,
        marker_shapes=("explicit", "none"),
        server=ServerEditFacts(frozenset({"compaction"}), "input", "input_text"),
    ),
    WireFacts("bedrock", marker_budget=4),
    WireFacts("gemini"),
    WireFacts("openai-compatible", marker_budget=4, marker_shapes=("cache_control", "none")),
    WireFacts("copilot", marker_budget=4),
)

_REGISTRY: dict[str, WireFacts] = {f.name: f for f in BUILTIN}


def register_facts(wire: WireFacts) -> WireFacts:
    """Add the facts of one more wire API (``kilo_rules.engine.providers.register`` calls this
    with a record's facts). Registering the same facts again is a no-op; other facts under
    a name already taken are a :class:`~kilo_rules.engine.base.errors.CatalogError`."""
    old = _REGISTRY.get(wire.name)
    if old is not None and old != wire:
        raise CatalogError(
            Diagnostic("provider.duplicate-api", f"wire API {wire.name!r} is already registered")
        )
    _REGISTRY[wire.name] = wire
    return wire


def unregister_facts(name: str) -> None:
    """Forget a registered wire API (a built-in one cannot be forgotten)."""
    if any(f.name == name for f in BUILTIN):
        raise CatalogError(Diagnostic("provider.builtin-api", f"wire API {name!r} is built in"))
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered wire API: the built-in ones in the catalog's order, then the ones
    registered since, in registration order."""
    return tuple(_REGISTRY)


def known(name: str) -> bool:
    """Whether ``name`` is a registered wire API."""
    return name in _REGISTRY


def facts(name: str) -> WireFacts:
    """The facts of wire API ``name``; a :class:`~kilo_rules.engine.base.errors.CatalogError` with a
    did-you-mean for an unknown one."""
    found = _REGISTRY.get(name)
    if found is not None:
        return found
    known_names = sorted(_REGISTRY)
    guess = did_you_mean(name, known_names)
    raise CatalogError(
        Diagnostic(
            "provider.unknown-api",
            f"unknown wire API {name!r}",
            details={"known": known_names},
            hint=f"did you mean {guess!r}?" if guess else f"use one of {', '.join(known_names)}",
        )
    )


V = TypeVar("V")


class FactsView(Mapping[str, V]):
    """A read-only mapping from wire API name to one fact, read from the registry at each
    look-up, so a wire API registered later is seen; names whose fact is None are left
    out."""

    def __init__(self, fact: Callable[[WireFacts], V | None]) -> None:
        self._fact = fact

    def __getitem__(self, name: str) -> V:
        wire = _REGISTRY.get(name)
        value = None if wire is None else self._fact(wire)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(n for n, w in _REGISTRY.items() if self._fact(w) is not None))

    def __len__(self) -> int:
        return sum(1 for w in _REGISTRY.values() if self._fact(w) is not None)

    def __repr__(self) -> str:
        return f"FactsView({dict(self)!r})"
