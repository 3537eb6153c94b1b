"""The settings a step reads, typed once when the plan compiles.

A policy writes some knobs as a value *or* an expression (``IntExpr``, ``BoolExpr``... in
:mod:`kilo_rules.engine.formats.policy`). The file model keeps accepting both; the compiled
plan does not hand either form on. Each such knob becomes one :class:`Setting`: for a value
the model decides (a number, or an expression on ``model.*`` and ``config.*``) the typed
value itself, for an expression on per-step names the compiled expression and the type its
result is converted to. The runtime reads every one the same way, ``setting.at(ctx)``, with
the step's evaluation context (:meth:`~kilo_rules.engine.compiler.plan.Plan.context`), and
never sees expression text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from kilo_rules.engine.frontend.expr import CompiledExpr

T = TypeVar("T")


def _number(value: Any) -> float | int:
    """A number as the expression produced it (an int stays an int, as it prints)."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else float(value)


#: How a per-step result of each expression kind becomes its setting's type.
CONVERT: Mapping[str, Callable[[Any], Any]] = {
    "int": int,
    "number": _number,
    "number?": _number,
    "bool": bool,
}


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One knob of a compiled plan, by its dotted name.

    ``value`` is the knob for this model. A knob the policy decides per step also carries
    its compiled expression (``per_step``); ``value`` is then what stands in outside a step
    and when the expression gives null (the knob's default in the policy model)."""

    name: str
    value: T
    expr: CompiledExpr | None = field(default=None, repr=False, compare=False)
    convert: Callable[[Any], T] | None = field(default=None, repr=False, compare=False)

    @property
    def per_step(self) -> bool:
        """Whether the knob is decided per step."""
        return self.expr is not None

    def at(self, ctx: Mapping[str, Any]) -> T:
        """The knob in a step whose evaluation context is ``ctx``: the plan's context, in
        which every per-step value is already evaluated once (an expression is evaluated
        here only when ``ctx`` lacks it)."""
        if self.expr is None:
            return self.value
        raw = ctx[self.name] if self.name in ctx else self.expr(ctx)
        if raw is None or self.convert is None:
            return self.value
        return self.convert(raw)


@dataclass(frozen=True, slots=True)
class Knobs:
    """Every knob of a plan that a policy may write as an expression, typed.

    The cache knobs (``cache.budget``, ``cache.placement``, ``cache.when``) and the prune
    gates are decided per model and are part of the plan's cache settings and prune
    settings; layer and prompt-rule conditions are the plan's layers and prompt."""

    output_max_tokens: Setting[int | None]
    output_configured: Setting[int | None]
    output_send: Setting[bool | None]
    budget_reserved: Setting[int | None]
    budget_usable: Setting[int | None]
    preflight_enabled: Setting[bool | None]
    threshold_percent: Setting[float | int | None]
    threshold_window: Setting[int | None]
    overflow_limit: Setting[int | None]
    payload_max_bytes: Setting[int | None]
    prune_protect_tokens: Setting[int]
    prune_minimum_tokens: Setting[int]
    preserve_recent_tokens: Setting[int | None]
    #: The size at which the plan compacts: ``overflow.limit`` when the policy writes it
    #: (even as null), else ``budget.usable``.
    compaction_limit: Setting[int | None]

    def settings(self) -> dict[str, Setting[Any]]:
        """Every knob by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Knob field → (dotted name, expression kind); ``compaction_limit`` is chosen from two.
KNOBS: Mapping[str, tuple[str, str]] = {
    "output_max_tokens": ("output.max_tokens", "int"),
    "output_configured": ("output.configured", "int"),
    "output_send": ("output.send", "bool"),
    "budget_reserved": ("budget.reserved", "int"),
    "budget_usable": ("budget.usable", "int"),
    "preflight_enabled": ("overflow.preflight.enabled", "bool"),
    "threshold_percent": ("overflow.threshold_percent", "number?"),
    "threshold_window": ("overflow.threshold_window", "int"),
    "overflow_limit": ("overflow.limit", "int"),
    "payload_max_bytes": ("payload.max_bytes", "int"),
    "prune_protect_tokens": ("prune.protect_tokens", "int"),
    "prune_minimum_tokens": ("prune.minimum_tokens", "int"),
    "preserve_recent_tokens": ("compaction.preserve_recent_tokens", "int"),
}

#: The dotted names of the knobs, which the plan's settings leave at their default when
#: they are decided per step (the expression lives in the knob only).
KNOB_NAMES = frozenset(name for name, _ in KNOBS.values())


def build_knobs(
    value_of: Callable[[str], Any],
    per_step: Mapping[str, CompiledExpr],
    written: Callable[[str], bool],
) -> Knobs:
    """The knobs of a plan: ``value_of(name)`` is a knob's typed value for the model (its
    default when decided per step), ``per_step`` the compiled expressions of the knobs
    decided per step, ``written(name)`` whether the policy writes a knob at all."""
    made: dict[str, Setting[Any]] = {}
    for attr, (name, kind) in KNOBS.items():
        convert = CONVERT[kind]
        value = value_of(name)
        if isinstance(value, str):  # an expression left in place of a value: a compiler bug
            raise TypeError(f"{name} is still expression text after compile: {value!r}")
        typed = None if value is None else convert(value)
        made[attr] = Setting(name, typed, per_step.get(name), convert)
    limit = "overflow_limit" if written("overflow.limit") else "budget_usable"
    return Knobs(**made, compaction_limit=made[limit])
