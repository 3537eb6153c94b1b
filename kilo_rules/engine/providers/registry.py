"""One record per wire API, and the one registry of them.

Each provider module declares its wire API as a :class:`WireApiSpec` named ``SPEC``: its
facts for the layers below (:class:`~kilo_rules.engine.formats.wireapi.WireFacts`: the breakpoint
budgets, the marker shapes a policy may choose, the server edits the provider runs), its
renderer, endpoint and headers, the key its cache markers are written under, and its
acceptance rules. :func:`register` adds a record to the registry, and its facts to
:mod:`kilo_rules.engine.formats.wireapi`'s; the renderers, the endpoint and header look-ups, the
marker count, the acceptance checks, the catalog, the compiler and the simulator all read it.

Adding a wire API is one module that builds a ``WireApiSpec`` and registers it. A built-in
one is its module in this package plus its facts in
:data:`kilo_rules.engine.formats.wireapi.BUILTIN`, the one list of built-in APIs: the catalog,
the policy schema and the compiler sit below the renderers and must know the facts
without importing them, and the package registers the module named after each entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kilo_rules.engine.base.errors import CatalogError, Diagnostic
from kilo_rules.engine.formats.request import ModelRequest
from kilo_rules.engine.formats.wireapi import WireFacts, facts, register_facts, unregister_facts
from kilo_rules.engine.providers._api_rules import ApiRules

__all__ = ["RULES", "Renderer", "WireApiSpec", "register", "spec", "specs", "unregister"]

#: A renderer: the provider-neutral request → the JSON body (deterministic, key order too).
Renderer = Callable[[ModelRequest], dict[str, Any]]

#: A renderer straight to the body's compact JSON (UTF-8 bytes), reusing the fragments of messages
#: it rendered at earlier steps (a ``FragmentStore``; None: render everything).
TextRenderer = Callable[[ModelRequest, Any], bytes]


def _no_headers(_: ModelRequest) -> dict[str, str]:
    return {}


@dataclass(frozen=True, slots=True)
class WireApiSpec:
    """Everything kilo-rules knows about one wire API.

    ``endpoint`` is the URL path (relative to the provider's base URL) the body is posted
    to, or a function of the request for an API that carries the model in the path.
    ``render_json``, when set, builds the same body as text from per-message fragments
    kept across steps. ``marker_key`` is the key that holds one cache breakpoint each in a
    rendered body (None: the API takes no markers). ``rules`` are its acceptance rules;
    their marker key and marker budget are this record's (``marker_key``, and the facts'
    explicit budget or else their default one), filled in here rather than written twice.
    """

    facts: WireFacts
    render: Renderer
    endpoint: str | Callable[[ModelRequest], str]
    rules: ApiRules
    marker_key: str | None = None
    headers: Callable[[ModelRequest], dict[str, str]] = _no_headers
    #: The body as JSON text from per-message fragments, byte-identical to the compact
    #: JSON of ``render``'s body; None: the text is ``render``'s body encoded whole.
    render_json: TextRenderer | None = None

    def __post_init__(self) -> None:
        if self.rules.marker_key is not None or self.rules.marker_budget is not None:
            raise ValueError(f"{self.name}: the rules' marker key and budget come from the record")
        budget = None
        if self.marker_key is not None:
            explicit = self.facts.explicit_breakpoints
            budget = explicit if explicit is not None else self.facts.marker_budget
        rules = replace(self.rules, marker_key=self.marker_key, marker_budget=budget)
        # A frozen record whose rules are derived once, when it is built.
        object.__setattr__(self, "rules", rules)

    @property
    def name(self) -> str:
        """The wire API's name (``model.api`` in the catalog)."""
        return self.facts.name

    def path(self, request: ModelRequest) -> str:
        """The URL path ``request`` is posted to."""
        return self.endpoint if isinstance(self.endpoint, str) else self.endpoint(request)


_REGISTRY: dict[str, WireApiSpec] = {}


def register(record: WireApiSpec) -> WireApiSpec:
    """Add ``record`` to the registry (and its facts to :mod:`kilo_rules.engine.formats.wireapi`'s),
    so that a catalog model may name it and :func:`kilo_rules.engine.providers.render` renders
    it. Registering the same record again is a no-op; another record under a name
    already taken is a :class:`~kilo_rules.engine.base.errors.CatalogError`."""
    old = _REGISTRY.get(record.name)
    if old is not None and old != record:
        raise CatalogError(
            Diagnostic("provider.duplicate-api", f"wire API {record.name!r} is already registered")
        )
    register_facts(record.facts)
    _REGISTRY[record.name] = record
    return record


def unregister(name: str) -> None:
    """Forget a wire API registered with :func:`register` (not a built-in one)."""
    unregister_facts(name)
    _REGISTRY.pop(name, None)


def spec(name: str) -> WireApiSpec:
    """The record of wire API ``name``; a :class:`~kilo_rules.engine.base.errors.CatalogError` with
    a did-you-mean for an unknown one."""
    found = _REGISTRY.get(name)
    if found is None:
        facts(name)  # raises the unknown-API error
        raise CatalogError(Diagnostic("provider.unknown-api", f"wire API {name!r} has no renderer"))
    return found


def specs() -> tuple[WireApiSpec, ...]:
    """Every registered record, in registration order."""
    return tuple(_REGISTRY.values())


class _RulesView(Mapping[str, ApiRules]):
    """The acceptance rules per registered wire API, read at each look-up."""

    def __getitem__(self, name: str) -> ApiRules:
        return _REGISTRY[name].rules

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)


#: The acceptance rules per wire API (a view of the registry).
RULES: Mapping[str, ApiRules] = _RulesView()
