"""The Plan: a policy compiled for one model. Frozen, printable, serialisable.

Everything that depends only on the model is decided here, with the location in the policy
that decided it; what depends on the session is kept as compiled expressions evaluated per
step. Each decision is also callable alone (``plan.value("budget.usable")``,
``plan.prompt``, ``plan.cache_settings()``...), so a rule can be tested without a turn.

A step reads settings in one typed form: ``plan.settings`` (the policy model, validated,
each knob at its value for this model) and ``plan.knobs`` (every knob a policy may write as
an expression, a :class:`~kilo_rules.engine.compiler.knobs.Setting` read with ``.at(ctx)``),
the cache decision as :class:`CachePlan`. A plan holds no mutable state: what steps on one
plan share (token counts, lowered messages) the runtime keeps beside it
(:func:`kilo_rules.engine.runtime.trace.plan_caches`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.engine.base.frozen import FrozenDict, freeze
from kilo_rules.engine.base.settings import CONFIG_FIELDS
from kilo_rules.engine.compiler.knobs import Knobs, Setting
from kilo_rules.engine.formats.catalog import ModelInfo
from kilo_rules.engine.formats.policy import OutputCap, PolicyBody
from kilo_rules.engine.frontend.expr import CompiledExpr, model_values

if TYPE_CHECKING:
    from kilo_rules.engine.text.truncate import TruncateResult

T = TypeVar("T")


def _seconds(value: Any) -> int | None:
    """A retention given as seconds or as a duration such as ``7d`` (the expression
    language's duration literal)."""
    from kilo_rules.engine.frontend.expr.parser import decode_duration

    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    try:
        return decode_duration(text)
    except (AssertionError, KeyError, ValueError):
        return None


def _rel_file(file: str) -> str:
    return Location(file, 1, 1).relative().file


def transforms_line(transforms: Sequence[str], collapse: str) -> str:
    """The plan output's line for the system transforms a step runs and the collapse
    rule after them."""
    return f"  system transforms: {', '.join(transforms) or 'none'} (then collapse {collapse})"


def _rel(loc: Location) -> str:
    return str(loc.relative())


@dataclass(frozen=True, slots=True)
class ChunkModel:
    """Kilo's ``model'`` for chunked compaction: the usable window and the output budget
    of the same model with its output capped at ``compaction.chunking.output_max``."""

    usable: int
    output: int


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """The compiled cache policy for one model.

    ``enabled`` is the policy gate's result for this model. ``budget`` is the most marks
    the request may carry in total, already capped by the caller to the provider's limit.
    """

    rule: Literal["kilo", "auto", "none"] = "kilo"
    enabled: bool = True
    placement: Literal["message", "last-part"] = "message"
    system_first: int = 2
    non_system_last: int = 2
    last_tool: bool = True
    last_system: bool = True
    latest_user_message: bool = True
    latest_assistant: bool = False
    rolling: int = 0
    budget: int = 4
    ttl: Literal["5m", "1h"] | None = None
    message_ttl: Literal["5m", "1h"] | None = None  # conversation marks; None: same as ttl
    skip_trailing_environment: bool = False
    respect_automatic: bool = True
    automatic_enabled: bool = False


@dataclass(frozen=True, slots=True)
class CachePlan:
    """The cache decision for one model: the marker settings (automatic caching off; a
    step says whether its request asks for it), the provider's limit of breakpoints and
    the marker shape the policy chose for the wire format (None: the format has no choice)."""

    marks: CacheSettings
    provider_limit: int
    shape: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The decision as the plan output has always printed it (stable field names)."""
        m = self.marks
        return {
            "rule": m.rule,
            "enabled": m.enabled,
            "placement": m.placement,
            "system_first": m.system_first,
            "non_system_last": m.non_system_last,
            "last_tool": m.last_tool,
            "last_system": m.last_system,
            "latest_user_message": m.latest_user_message,
            "latest_assistant": m.latest_assistant,
            "rolling": m.rolling,
            "budget": m.budget,
            "provider_limit": self.provider_limit,
            "ttl": m.ttl,
            "message_ttl": m.message_ttl,
            "skip_trailing_environment": m.skip_trailing_environment,
            "respect_automatic": m.respect_automatic,
            "shape": self.shape,
        }


@dataclass(frozen=True, slots=True)
class CapDecision:
    """The cap sent, and which row of the decision table chose it."""

    value: int | None
    rule: str
    estimated: int | None = None
    tokens: int | None = None
    available: int | None = None


@dataclass(frozen=True, slots=True)
class Value:
    """A policy value: decided at compile time (``dynamic`` false) or per step."""

    name: str
    value: Any
    location: Location
    expression: str | None
    dynamic: bool
    #: The expression compiled, for a value decided per step (:meth:`Plan.context`).
    compiled: CompiledExpr | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "at": str(self.location)}
        if self.expression is not None:
            out["expression"] = self.expression
        if self.dynamic:
            out["dynamic"] = True
        return out


@dataclass(frozen=True, slots=True)
class PromptChoice:
    """The family prompt the selection rules chose."""

    rule: str | None
    file: str
    location: Location
    text: str


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """One system layer; ``condition`` is set when it must be decided per step."""

    id: str
    source: str
    location: Location
    text: str | None
    condition: CompiledExpr | None = None
    replaces: str | None = None


@dataclass(frozen=True)
class Plan:
    """A compiled policy for one model."""

    policy: str
    policy_file: str
    revision: str
    model: ModelInfo
    config: dict[str, Any]
    data: dict[str, Any]
    overrides: tuple[str, ...]
    #: Every value the policy defines, by dotted name, in evaluation order: the one
    #: source of the evaluation context (:meth:`context`).
    values: dict[str, Value]
    prompt: PromptChoice | None
    layers: tuple[LayerPlan, ...]
    #: The cache decision, typed (``cache`` is its old dict form).
    caching: CachePlan
    #: Every knob a policy may write as an expression, typed (see :mod:`.knobs`).
    knobs: Knobs
    stages: tuple[str, ...]
    _locate: Callable[[tuple[str | int, ...]], Location] = field(repr=False, compare=False)
    #: The policy's typed settings for this model: each knob validated, at the model's
    #: default when the policy leaves it out, model-only expressions already evaluated.
    #: A knob decided per step is at its default here; ``knobs`` holds its expression.
    settings: PolicyBody = field(default_factory=PolicyBody, repr=False)
    #: The summary template text (``compaction.summary.template``), read at compile.
    summary_template: str = ""
    #: The window of chunked compaction's summary requests (None: chunking is off).
    chunk_model: ChunkModel | None = None
    #: What compile found doubtful for this model (a window with no room left, ...).
    warnings: tuple[Diagnostic, ...] = ()
    # Derived from model, config and values once, for context(): what every step's
    # context starts from, and the per-step values in evaluation order.
    _static: FrozenDict[str, Any] = field(init=False, repr=False, compare=False)
    _per_step: tuple[tuple[str, CompiledExpr], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("config", "data"):
            object.__setattr__(self, name, freeze(getattr(self, name)))
        values = {k: replace(v, value=freeze(v.value)) for k, v in self.values.items()}
        object.__setattr__(self, "values", FrozenDict(values))
        static = {**model_values(self.model), **{n: self.config.get(n) for n in CONFIG_FIELDS}}
        static.update((v.name, v.value) for v in values.values() if not v.dynamic)
        object.__setattr__(self, "_static", freeze(static))
        per_step = tuple((v.name, v.compiled) for v in values.values() if v.compiled is not None)
        object.__setattr__(self, "_per_step", per_step)

    @property
    def static_context(self) -> FrozenDict[str, Any]:
        """The evaluation context every step starts from: ``model.*``, ``config.*`` and
        the values decided for the model (read-only)."""
        return self._static

    @property
    def dynamic(self) -> tuple[tuple[str, CompiledExpr], ...]:
        """(name, compiled expression) of each value decided per step, in the order
        :meth:`context` evaluates them."""
        return self._per_step

    # ------------------------------------------------------------------ single decisions

    def locate(self, dotted: str) -> Location:
        """Where a setting of the effective policy was written."""
        return self._locate(tuple(dotted.split(".")))

    def where(self, dotted: str | None) -> Location | None:
        """Where the rule behind a decision is written; None for a decision that no setting
        makes (or a setting the policy cannot place)."""
        if dotted is None:
            return None
        try:
            return self.locate(dotted)
        except Exception:  # a lookup failure must never fail the step it explains
            return None

    def context(self, dynamic: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An evaluation context: static values plus ``dynamic`` names, with every
        per-step policy value evaluated in order."""
        ctx = dict(self._static)
        if dynamic:
            ctx.update(dynamic)
        for name, compiled in self._per_step:
            ctx[name] = compiled(ctx)
        return ctx

    def value(self, name: str, dynamic: Mapping[str, Any] | None = None) -> Any:
        """A policy value by dotted name (``budget.usable``); per-step values need the
        session/request names they read in ``dynamic``."""
        v = self.values.get(name)
        if v is None:
            raise KeyError(name)
        if not v.dynamic:
            return v.value
        return self.context(dynamic)[name]

    def resolve(self, setting: Setting[T], dynamic: Mapping[str, Any] | None = None) -> T:
        """A knob outside a step's stages: its value, or for a per-step knob its value in
        the context ``dynamic`` completes (as :meth:`value` evaluates it)."""
        if not setting.per_step:
            return setting.value
        return setting.at(self.context(dynamic))

    @property
    def cache(self) -> FrozenDict[str, Any]:
        """The cache decision as a read-only dict (``caching.to_json()``), for callers that
        read it by key; new code reads :attr:`caching`."""
        return FrozenDict(self.caching.to_json())

    def cache_settings(self, *, automatic_enabled: bool = False) -> CacheSettings:
        """The cache-marker settings for this model."""
        marks = self.caching.marks
        return marks if not automatic_enabled else replace(marks, automatic_enabled=True)

    def usable(self, dynamic: Mapping[str, Any] | None = None) -> int:
        """The usable input window (``budget.usable``, spec §3)."""
        return int(self.value("budget.usable", dynamic))

    def cap_settings(self) -> OutputCap:
        """``output.cap.*``: the capOutputTokens constants."""
        return self.settings.output.cap

    def truncate_tool_output(
        self, text: str, *, call_id: str, task_enabled: bool = True
    ) -> TruncateResult:
        """Cut a tool's output as ``tool_output.*`` says (spec §11.1), spilling the full text
        to ``tool_output.spill_dir`` and removing spilled files older than the retention."""
        from pathlib import Path

        from kilo_rules.engine.text.truncate import cleanup_spill_dir, truncate_output

        t = self.settings.tool_output
        spill = Path(t.spill_dir).expanduser()
        retention = _seconds(t.retention)
        if retention is not None and spill.is_dir():
            cleanup_spill_dir(spill, retention_seconds=retention)
        return truncate_output(
            text,
            spill_dir=spill,
            call_id=call_id,
            max_lines=t.max_lines,
            max_bytes=t.max_bytes,
            direction=t.direction,
            task_enabled=task_enabled,
        )

    # ------------------------------------------------------------------ output

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON-ready data (stable field names)."""
        return {
            "policy": self.policy,
            "policy_file": self.policy_file,
            "revision": self.revision,
            "model": self.model.model_dump(mode="json", exclude_none=True),
            "config": self.config,
            "overrides": list(self.overrides),
            "values": {k: v.to_json() for k, v in self.values.items()},
            "prompt": None
            if self.prompt is None
            else {
                "rule": self.prompt.rule,
                "file": self.prompt.file,
                "at": str(self.prompt.location),
                "chars": len(self.prompt.text),
            },
            "layers": [
                {
                    "id": layer.id,
                    "source": layer.source,
                    "at": str(layer.location),
                    **({"when": layer.condition.text} if layer.condition else {}),
                }
                for layer in self.layers
            ],
            "system": {
                "transforms": list(self.settings.system.transforms),
                "collapse": self.settings.system.collapse,
            },
            "cache": self.caching.to_json(),
            "stages": list(self.stages),
            "warnings": [d.to_json() for d in self.warnings],
        }

    def describe(self) -> str:
        """A readable summary: every value with its origin, the prompt, layers, cache."""
        m = self.model
        lines = [
            f"plan: policy {self.policy} ({_rel_file(self.policy_file)}) for {m.id}",
            f"  model: {m.api} api, api id {m.api_id}, context {m.limits.context:,}"
            + (f", input {m.limits.input:,}" if m.limits.input else "")
            + f", output {m.limits.output:,}, cache {m.cache.kind}",
            f"  overrides applied: {', '.join(self.overrides) or 'none'}",
            "  values:",
        ]
        width = max((len(k) for k in self.values), default=0)
        by_place = sorted(self.values.values(), key=lambda v: (v.location.file, v.location.line))
        for v in by_place:
            name = v.name
            if isinstance(v.value, str) and "\n" in v.value:
                shown = json.dumps(v.value)
                shown = shown if len(shown) <= 60 else f"{shown[:59]}… ({len(v.value)} chars)"
            else:
                shown = "(per step)" if v.dynamic else json.dumps(v.value)
            lines.append(f"    {name:<{width}} = {shown:<12}  {_rel(v.location)}")
        if self.prompt:
            lines.append(
                f"  family prompt: {self.prompt.rule} -> {_rel_file(self.prompt.file)} "
                f"({len(self.prompt.text)} chars, rule at {_rel(self.prompt.location)})"
            )
        lines.append(
            "  system layers: "
            + ", ".join(
                layer.id + (f" [when {layer.condition.text}]" if layer.condition else "")
                for layer in self.layers
            )
        )
        lines.append(
            transforms_line(self.settings.system.transforms, self.settings.system.collapse)
        )
        c = self.caching.marks
        lines.append(
            f"  cache: rule {c.rule}, {'on' if c.enabled else 'off'}, placement "
            f"{c.placement}, budget {c.budget} (provider limit {self.caching.provider_limit})"
        )
        lines.append(f"  stages: {' -> '.join(self.stages)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()
