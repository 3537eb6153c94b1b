"""What changes between two policies: their plans model by model, and the requests they
build on recorded sessions.

:func:`diff_policies` compiles both policies for each model and keeps what differs: plan
values (each with the place in each policy that set it), overrides applied under one
policy only, cache settings, system layers, the family prompt, the system transforms and
the stages. A value counts as different when its effect differs for that model: the same
value written in another place, or by another expression that gives the same result, is
no difference.

:func:`diff_session` replays a recorded session under both plans step by step, each with
its own :class:`~kilo_rules.engine.runtime.facade.Runtime` (so each compacts when its policy says
so, retrying a request the provider would refuse as too long, as
:mod:`kilo_rules.tools.simulation.simulate` does), and finds the first step where the request sent
or a decision differs. Decisions are compared without their policy locations: the same rule read
from another file is the same decision.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kilo_rules.engine.base.errors import ContextOverflowError, Location
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import LayerPlan, Plan, Value
from kilo_rules.engine.formats.catalog import Catalog, ModelInfo
from kilo_rules.engine.formats.session import Message, Session, TokenUsage
from kilo_rules.engine.frontend.resolve import ResolvedPolicy, resolve_policy
from kilo_rules.engine.runtime.apply import Decision
from kilo_rules.engine.runtime.facade import Runtime, StepResult
from kilo_rules.engine.summarizers.protocol import Summarizer
from kilo_rules.tools.simulation.simulate import MAX_OVERFLOW_RETRIES, without_recorded_compactions

__all__ = [
    "DecisionChange",
    "Divergence",
    "LayerChange",
    "ModelDiff",
    "OverrideChange",
    "PolicyDiff",
    "SessionDiff",
    "SettingChange",
    "ValueChange",
    "diff_plans",
    "diff_policies",
    "diff_session",
    "elide",
    "match_models",
    "representative_models",
    "request_diff",
]

#: Strings longer than this are cut in the middle in request diffs (unless ``full``).
ELIDE_AT = 160
#: Characters kept at each end of a string cut in the middle.
ELIDE_KEEP = 60

Side = Literal["a", "b"]


def _at(loc: Location | None) -> str | None:
    return None if loc is None else str(loc)


def _canon(value: Any) -> str:
    # JSON text, not ==: True == 1 in Python, yet a policy that swaps them changes the request.
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


# ---------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class ValueChange:
    """A plan value that differs: both values (``None`` with ``at`` None when the policy
    does not have it) and where each policy sets it. A per-step value shows its
    expression."""

    name: str
    a: Any
    b: Any
    a_at: Location | None
    b_at: Location | None
    a_dynamic: bool = False
    b_dynamic: bool = False

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the change."""
        return {
            "name": self.name,
            "a": {"value": self.a, "at": _at(self.a_at), "dynamic": self.a_dynamic},
            "b": {"value": self.b, "at": _at(self.b_at), "dynamic": self.b_dynamic},
        }


@dataclass(frozen=True, slots=True)
class OverrideChange:
    """An override applied for this model under one policy only (``side``), and where it
    is written."""

    name: str
    side: Side
    at: Location | None

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the change."""
        return {"name": self.name, "applied_in": self.side, "at": _at(self.at)}


@dataclass(frozen=True, slots=True)
class SettingChange:
    """A compiled setting outside the values that differs: ``section`` is ``cache``,
    ``prompt``, ``system`` or ``stages``."""

    section: str
    key: str
    a: Any
    b: Any

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the change."""
        return {"section": self.section, "key": self.key, "a": self.a, "b": self.b}


@dataclass(frozen=True, slots=True)
class LayerChange:
    """A system layer added, removed or changed (``what`` names the fields that differ:
    ``source``, ``when``, ``replaces``, ``text``, ``position``)."""

    id: str
    a_at: Location | None
    b_at: Location | None
    what: tuple[str, ...]
    a: dict[str, Any] | None
    b: dict[str, Any] | None

    @property
    def kind(self) -> Literal["added", "removed", "changed"]:
        """Added in B, removed from A, or changed."""
        if self.a is None:
            return "added"
        return "removed" if self.b is None else "changed"

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the change."""
        return {
            "id": self.id,
            "kind": self.kind,
            "differs": list(self.what),
            "a": None if self.a is None else {**self.a, "at": _at(self.a_at)},
            "b": None if self.b is None else {**self.b, "at": _at(self.b_at)},
        }


@dataclass(frozen=True, slots=True)
class ModelDiff:
    """What differs between the two plans for one model."""

    model: str
    values: tuple[ValueChange, ...] = ()
    overrides: tuple[OverrideChange, ...] = ()
    settings: tuple[SettingChange, ...] = ()
    layers: tuple[LayerChange, ...] = ()

    @property
    def same(self) -> bool:
        """Nothing differs for this model."""
        return not (self.values or self.overrides or self.settings or self.layers)

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the model's differences."""
        return {
            "model": self.model,
            "same": self.same,
            "values": [v.to_json() for v in self.values],
            "overrides": [o.to_json() for o in self.overrides],
            "settings": [s.to_json() for s in self.settings],
            "layers": [lay.to_json() for lay in self.layers],
        }

    def changes_key(self) -> str:
        """The differences without the model id: models with equal keys differ alike."""
        data = self.to_json()
        del data["model"]
        return _canon(data)


def _shown(v: Value) -> Any:
    return v.expression if v.dynamic else v.value


def _value_changes(a: Plan, b: Plan) -> list[ValueChange]:
    out = []
    for name in sorted(set(a.values) | set(b.values)):
        va, vb = a.values.get(name), b.values.get(name)
        sa = None if va is None else (va.dynamic, _canon(_shown(va)))
        sb = None if vb is None else (vb.dynamic, _canon(_shown(vb)))
        if sa == sb:
            continue
        out.append(
            ValueChange(
                name,
                None if va is None else _shown(va),
                None if vb is None else _shown(vb),
                None if va is None else va.location,
                None if vb is None else vb.location,
                va is not None and va.dynamic,
                vb is not None and vb.dynamic,
            )
        )
    return out


def _override_places(resolved: ResolvedPolicy | None) -> dict[str, Location]:
    if resolved is None:
        return {}
    places: dict[str, Location] = {}
    for i, ov in enumerate(resolved.data.get("overrides") or []):
        # the name compile reports for an override without one
        name = (ov.get("name") if isinstance(ov, dict) else None) or f"overrides[{i}]"
        places.setdefault(name, resolved.locate(("overrides", i)))
    return places


def _override_changes(
    a: Plan, b: Plan, ra: ResolvedPolicy | None, rb: ResolvedPolicy | None
) -> list[OverrideChange]:
    out: list[OverrideChange] = []
    sides: tuple[tuple[Side, Plan, Plan, ResolvedPolicy | None], ...] = (
        ("a", a, b, ra),
        ("b", b, a, rb),
    )
    for side, plan, other, resolved in sides:
        places = _override_places(resolved)
        out.extend(
            OverrideChange(name, side, places.get(name))
            for name in plan.overrides
            if name not in other.overrides
        )
    return out


def _layer_data(layer: LayerPlan) -> dict[str, Any]:
    text = layer.text
    return {
        "source": layer.source,
        "when": layer.condition.text if layer.condition is not None else None,
        "replaces": layer.replaces,
        # a digest: the texts are long, and the file or prompt that holds them is named
        "text": None if text is None else hashlib.sha256(text.encode()).hexdigest()[:12],
        "chars": None if text is None else len(text),
    }


def _layer_changes(a: Plan, b: Plan) -> list[LayerChange]:
    by_a = {layer.id: (i, layer) for i, layer in enumerate(a.layers)}
    by_b = {layer.id: (i, layer) for i, layer in enumerate(b.layers)}
    order = [*by_a, *(k for k in by_b if k not in by_a)]
    # positions among the layers both have: adding one layer does not move the others
    common_a = [k for k in by_a if k in by_b]
    common_b = [k for k in by_b if k in by_a]
    out = []
    for lid in order:
        la, lb = by_a.get(lid), by_b.get(lid)
        da = None if la is None else _layer_data(la[1])
        db = None if lb is None else _layer_data(lb[1])
        what: list[str] = []
        if da is not None and db is not None:
            what = [k for k in ("source", "when", "replaces", "text") if da[k] != db[k]]
            if common_a.index(lid) != common_b.index(lid):
                what.append("position")
            if not what:
                continue
        out.append(
            LayerChange(
                lid,
                None if la is None else la[1].location,
                None if lb is None else lb[1].location,
                tuple(what),
                da,
                db,
            )
        )
    return out


def _prompt(plan: Plan) -> dict[str, Any] | None:
    p = plan.prompt
    if p is None:
        return None
    return {
        "rule": p.rule,
        "file": Path(p.file).name,
        "chars": len(p.text),
        "text": hashlib.sha256(p.text.encode()).hexdigest()[:12],
    }


def _setting_changes(a: Plan, b: Plan) -> list[SettingChange]:
    out = []
    cache_a, cache_b = a.caching.to_json(), b.caching.to_json()
    for key in sorted(set(cache_a) | set(cache_b)):
        ca, cb = cache_a.get(key), cache_b.get(key)
        if _canon(ca) != _canon(cb):
            out.append(SettingChange("cache", key, ca, cb))
    pa, pb = _prompt(a), _prompt(b)
    if pa != pb:
        out.append(SettingChange("prompt", "family", pa, pb))
    sa, sb = a.settings.system, b.settings.system
    if list(sa.transforms) != list(sb.transforms):
        out.append(SettingChange("system", "transforms", list(sa.transforms), list(sb.transforms)))
    if sa.collapse != sb.collapse:
        out.append(SettingChange("system", "collapse", sa.collapse, sb.collapse))
    if a.stages != b.stages:
        out.append(SettingChange("stages", "stages", list(a.stages), list(b.stages)))
    return out


def diff_plans(
    a: Plan,
    b: Plan,
    *,
    resolved: tuple[ResolvedPolicy | None, ResolvedPolicy | None] = (None, None),
) -> ModelDiff:
    """What differs between two plans compiled for the same model. ``resolved`` (the two
    policies as resolved) lets an override applied under one policy only be located."""
    return ModelDiff(
        a.model.id,
        tuple(_value_changes(a, b)),
        tuple(_override_changes(a, b, *resolved)),
        tuple(_setting_changes(a, b)),
        tuple(_layer_changes(a, b)),
    )


@dataclass(frozen=True)
class PolicyDiff:
    """Two policies compared: per model, then per session."""

    a: str
    b: str
    a_file: str
    b_file: str
    models: list[ModelDiff]
    sessions: list[SessionDiff] = field(default_factory=list)

    @property
    def same(self) -> bool:
        """No model and no session shows a difference."""
        return all(m.same for m in self.models) and all(s.same for s in self.sessions)

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the comparison."""
        return {
            "version": 1,
            "a": {"policy": self.a, "file": self.a_file},
            "b": {"policy": self.b, "file": self.b_file},
            "same": self.same,
            "models": [m.to_json() for m in self.models],
            "sessions": [s.to_json() for s in self.sessions],
        }


def diff_policies(
    a: str | Path,
    b: str | Path,
    models: Sequence[ModelInfo],
    *,
    config: Mapping[str, Any] | None = None,
) -> tuple[PolicyDiff, list[tuple[Plan, Plan]]]:
    """Compile both policies (bundled names or paths) for each model and compare the
    plans. Returns the comparison (without sessions) and the plans, pair by model, for
    :func:`diff_session`."""
    ra, rb = resolve_policy(a), resolve_policy(b)
    pairs = [
        (compile_policy(ra, m, config=config), compile_policy(rb, m, config=config)) for m in models
    ]
    diffs = [diff_plans(pa, pb, resolved=(ra, rb)) for pa, pb in pairs]
    return PolicyDiff(ra.name, rb.name, ra.file, rb.file, diffs), pairs


# ---------------------------------------------------------------------------- models


def representative_models(catalog: Catalog) -> list[ModelInfo]:
    """One model per provider and family of ``catalog``: the first it lists."""
    seen: dict[tuple[str, str], ModelInfo] = {}
    for m in catalog.models:
        seen.setdefault((m.provider, m.family), m)
    return list(seen.values())


def match_models(pattern: str, catalog: Catalog) -> list[ModelInfo]:
    """The catalog models whose id matches the glob ``pattern`` (``anthropic/*``), in
    catalog order; a pattern without wildcards names one model by id or api id."""
    if not any(c in pattern for c in "*?["):
        return [catalog.get(pattern)]
    return [m for m in catalog.models if fnmatch.fnmatchcase(m.id, pattern)]


# ---------------------------------------------------------------------------- sessions


@dataclass(frozen=True, slots=True)
class DecisionChange:
    """A decision of one step whose result differs, or that one policy only made
    (``a_made``, ``b_made``). ``inputs`` holds the inputs that differ, as (A, B) pairs."""

    stage: str
    rule: str
    a: Any
    b: Any
    a_at: Location | None
    b_at: Location | None
    a_made: bool
    b_made: bool
    inputs: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the change."""
        return {
            "stage": self.stage,
            "rule": self.rule,
            "a": {"result": self.a, "at": _at(self.a_at)} if self.a_made else None,
            "b": {"result": self.b, "at": _at(self.b_at)} if self.b_made else None,
            "inputs": {k: {"a": va, "b": vb} for k, (va, vb) in self.inputs.items()},
        }


def _keyed(decisions: Iterable[Decision]) -> dict[tuple[str, str, int], Decision]:
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for d in decisions:
        n = seen.get((d.stage, d.rule), 0)
        seen[(d.stage, d.rule)] = n + 1
        out[(d.stage, d.rule, n)] = d
    return out


def decision_changes(a: Sequence[Decision], b: Sequence[Decision]) -> list[DecisionChange]:
    """The decisions that differ between two steps, matched by stage, rule and order of
    appearance: made by one step only, or with another result. Inputs alone do not count
    (a limit written differently that decides the same is no difference), nor does where
    the rule is written; the inputs that differ come with each change, to explain it."""
    ka, kb = _keyed(a), _keyed(b)
    order = [*ka, *(k for k in kb if k not in ka)]
    out = []
    for key in order:
        da, db = ka.get(key), kb.get(key)
        if da is not None and db is not None:
            inputs = {
                k: (da.inputs.get(k), db.inputs.get(k))
                for k in dict.fromkeys([*da.inputs, *db.inputs])
                if _canon(da.inputs.get(k)) != _canon(db.inputs.get(k))
            }
            if _canon(da.result) == _canon(db.result):
                continue
        else:
            inputs = {}
        out.append(
            DecisionChange(
                key[0],
                key[1],
                None if da is None else da.result,
                None if db is None else db.result,
                None if da is None else da.at,
                None if db is None else db.at,
                da is not None,
                db is not None,
                inputs,
            )
        )
    return out


def elide(node: Any, limit: int | None = ELIDE_AT) -> Any:
    """``node`` with every string longer than ``limit`` cut in the middle; the cut names
    how many characters it dropped and a digest of the whole string, so two strings that
    differ only where they were cut still differ. ``limit`` None keeps them whole."""
    if limit is None:
        return node
    if isinstance(node, str):
        if len(node) <= limit:
            return node
        keep = min(ELIDE_KEEP, limit // 2)
        digest = hashlib.sha256(node.encode()).hexdigest()[:8]
        gone = len(node) - 2 * keep
        return f"{node[:keep]}…[{gone:,} chars, #{digest}]…{node[-keep:]}"
    if isinstance(node, Mapping):
        return {k: elide(v, limit) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [elide(v, limit) for v in node]
    return node


def request_diff(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    labels: tuple[str, str] = ("a", "b"),
    full: bool = False,
    context: int = 3,
) -> list[str]:
    """A unified diff of two request bodies as indented JSON, long strings cut in the
    middle (:func:`elide`) unless ``full``."""
    limit = None if full else ELIDE_AT
    ta = json.dumps(elide(a, limit), indent=2, ensure_ascii=False).splitlines()
    tb = json.dumps(elide(b, limit), indent=2, ensure_ascii=False).splitlines()
    return list(difflib.unified_diff(ta, tb, *labels, n=context, lineterm=""))


@dataclass(frozen=True)
class Divergence:
    """The first step where the two plans differ: the requests both sent (None for a
    policy that stopped there, with ``why``) and the decisions that differ."""

    step: int  # 1-based request number
    message_id: str  # the recorded assistant message the request answers
    decisions: list[DecisionChange]
    request_a: dict[str, Any] | None
    request_b: dict[str, Any] | None
    stopped_a: str | None = None
    stopped_b: str | None = None

    @property
    def same_request(self) -> bool:
        """Both sent the same body (only decisions differ)."""
        return self.request_a is not None and self.request_a == self.request_b

    def diff(self, *, labels: tuple[str, str] = ("a", "b"), full: bool = False) -> list[str]:
        """The unified diff of the two bodies (empty when one policy stopped)."""
        if self.request_a is None or self.request_b is None:
            return []
        return request_diff(self.request_a, self.request_b, labels=labels, full=full)

    def to_json(
        self, *, labels: tuple[str, str] = ("a", "b"), full: bool = False
    ) -> dict[str, Any]:
        """Stable JSON shape: the decisions and the request diff, not the whole bodies."""
        return {
            "step": self.step,
            "message_id": self.message_id,
            "same_request": self.same_request,
            "stopped": {"a": self.stopped_a, "b": self.stopped_b},
            "decisions": [d.to_json() for d in self.decisions],
            "request_diff": self.diff(labels=labels, full=full),
        }


@dataclass
class SessionDiff:
    """One session replayed under both plans on one model."""

    session: str
    model: str
    requests_total: int  # the requests the recorded session made (compactions dropped)
    steps: int = 0  # steps both policies built a request for, compared
    identical: int = 0  # of those, the steps whose requests are byte for byte the same
    compactions_a: int = 0
    compactions_b: int = 0
    overflows_a: int = 0  # requests a provider would have refused as too long
    overflows_b: int = 0
    stopped_a: str | None = None  # why the replay stopped early (compaction exhausted)
    stopped_b: str | None = None
    first: Divergence | None = None
    labels: tuple[str, str] = ("a", "b")
    full: bool = False

    @property
    def same(self) -> bool:
        """No step differed."""
        return self.first is None

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the replay's summary and first divergence."""
        return {
            "session": self.session,
            "model": self.model,
            "requests_total": self.requests_total,
            "steps_compared": self.steps,
            "identical_requests": self.identical,
            "compactions": {"a": self.compactions_a, "b": self.compactions_b},
            "provider_overflows": {"a": self.overflows_a, "b": self.overflows_b},
            "stopped": {"a": self.stopped_a, "b": self.stopped_b},
            "first_divergence": None
            if self.first is None
            else self.first.to_json(labels=self.labels, full=self.full),
        }


class _Side:
    """One plan stepping through the session."""

    def __init__(self, plan: Plan, summarizer: Summarizer | None) -> None:
        self.runtime = Runtime(plan, summarizer)
        self.live: Session | None = None
        self.compactions = 0
        self.overflows = 0
        self.stopped: str | None = None

    def step(self, live: Session) -> StepResult | None:
        """The request sent for the next step, retried while the provider would refuse
        it as too long; None once compaction is exhausted (``stopped`` says why)."""
        try:
            result = self.runtime.step(live)
            self.compactions += result.compactions
            tries = 0
            while not result.fits:
                if tries >= MAX_OVERFLOW_RETRIES:
                    self.stopped = (
                        f"the request still exceeds the window after {tries} provider overflows"
                    )
                    return None
                tries += 1
                self.overflows += 1
                self.runtime.overflowed(result.session)
                result = self.runtime.step(result.session)
                self.compactions += result.compactions
        except ContextOverflowError as exc:
            self.stopped = exc.diagnostics[0].message
            return None
        return result


def _answered(result: StepResult, msg: Message) -> Session:
    """The session after ``msg`` answered the request of ``result``, with the usage a
    provider would report for *that* request: the recorded usage belongs to the recorded
    context, and would make a policy that compacted see the old, larger size again."""
    t = msg.tokens
    usage = TokenUsage(
        input=result.input_tokens,
        output=t.output if t else 0,
        reasoning=t.reasoning if t else 0,
    )
    grown = result.session
    answered = msg.model_copy(update={"tokens": usage})
    return grown.model_copy(update={"messages": [*grown.messages, answered]})


def diff_session(
    a: Plan,
    b: Plan,
    session: Session,
    *,
    name: str | None = None,
    steps: int | None = None,
    summarizer: Summarizer | None = None,
    full: bool = False,
) -> SessionDiff:
    """Replay ``session`` under both plans (the same model) and compare every step.

    The compactions the recorded agent made are dropped first: each plan compacts where
    its policy says. ``steps`` stops after that many requests; ``summarizer`` writes the
    summaries (default: the offline extractive one, so a replay is deterministic);
    ``full`` keeps long strings whole in the request diff of the result."""
    original = without_recorded_compactions(session)
    total = sum(1 for m in original.messages if m.role == "assistant")
    out = SessionDiff(
        name or session.id,
        a.model.id,
        total,
        labels=(a.policy, b.policy) if a.policy != b.policy else ("a", "b"),
        full=full,
    )
    sides = (_Side(a, summarizer), _Side(b, summarizer))
    empty = original.model_copy(update={"messages": []})
    lives = [empty, empty]
    n = 0
    for msg in original.messages:
        if msg.role != "assistant":
            lives = [lv.model_copy(update={"messages": [*lv.messages, msg]}) for lv in lives]
            continue
        if steps is not None and n >= steps:
            break
        n += 1
        ra, rb = (side.step(lv) for side, lv in zip(sides, lives, strict=True))
        if ra is None or rb is None:
            alike = ra is None and rb is None and sides[0].stopped == sides[1].stopped
            if out.first is None and not alike:
                out.first = Divergence(
                    n,
                    msg.id,
                    [],
                    None if ra is None else ra.request,
                    None if rb is None else rb.request,
                    sides[0].stopped,
                    sides[1].stopped,
                )
            break
        out.steps += 1
        same_request = ra.request == rb.request
        out.identical += same_request
        if out.first is None:
            changes = decision_changes(ra.decisions, rb.decisions)
            if changes or not same_request:
                out.first = Divergence(n, msg.id, changes, ra.request, rb.request)
        lives = [_answered(r, msg) for r in (ra, rb)]
    out.compactions_a, out.compactions_b = sides[0].compactions, sides[1].compactions
    out.overflows_a, out.overflows_b = sides[0].overflows, sides[1].overflows
    out.stopped_a, out.stopped_b = sides[0].stopped, sides[1].stopped
    return out
