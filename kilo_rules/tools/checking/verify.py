"""Static verification of a policy on every model it may serve, and the cache-prefix
stability of a recorded session replayed under it.

:func:`verify_policy` compiles the policy for each model and looks for what would go wrong
with that model without a single request being sent: a breakpoint budget over the wire's
limit, breakpoints on a prefix too short for the model's prompt cache, a window with no
room left, an output cap above the model's limit, a tokenizer that cannot be loaded
offline, a model the prompt rules leave without a family prompt. Each finding is a
:class:`~kilo_rules.engine.base.errors.Diagnostic` with a ``verify.*`` code, located at the policy
value or rule that causes it, the models it concerns in ``details["models"]``; the same
finding for many models at one location is one diagnostic listing them.

:func:`prefix_stability` replays a session step by step (as
:mod:`kilo_rules.tools.simulation.simulate` does) and reports every step whose request no longer
starts with the previous step's cached prefix (the bytes before its last breakpoint), with what
changed it. A change made by a compaction is expected; any other is a ``verify.prefix-changed``
finding.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from kilo_rules.engine.base.errors import (
    ContextOverflowError,
    Diagnostic,
    KiloRulesError,
    Location,
    Severity,
)
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import ModelInfo
from kilo_rules.engine.formats.session import Message, Session, TextPart, ToolDefinition
from kilo_rules.engine.frontend.policy_exprs import expression_diagnostics
from kilo_rules.engine.frontend.resolve import ResolvedPolicy, resolve_policy
from kilo_rules.engine.providers.cachesim import Block, blocks
from kilo_rules.engine.runtime.apply import apply_plan, run
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.facade import StepResult
from kilo_rules.engine.runtime.system import layer_texts
from kilo_rules.engine.summarizers.protocol import Summarizer
from kilo_rules.engine.text.tokens import counter_for
from kilo_rules.tools.simulation.simulate import replay

__all__ = [
    "KILO_NOTES",
    "PrefixChange",
    "StabilityReport",
    "match_models",
    "prefix_stability",
    "verify_policy",
]

#: Findings that, located in the bundled kilo-default policy, restate Kilo's own behaviour:
#: reported as notes with the spec reference, never as something to fix there.
KILO_NOTES: Mapping[str, str] = {
    "verify.short-prefix": "Kilo marks the first 2 system messages whatever their length "
    "(docs/kilo-behaviour.md §10.1, ProviderTransform.applyCaching, "
    "provider/transform.ts@006a344:332-333); with Kilo's own tool definitions before them "
    "the prefix is long enough",
}

# plan.warnings codes (compile's window stage) and the verify code each is reported as.
_WINDOW_CODES: Mapping[str, tuple[str, Severity]] = {
    "plan.no-window": ("verify.no-window", "error"),
    "plan.reserved": ("verify.reserved", "error"),
    "plan.tail": ("verify.tail", "warning"),
}


@dataclass(frozen=True, slots=True)
class _Finding:
    """One finding for one model, before findings are grouped by location."""

    code: str
    severity: Severity
    location: Location
    summary: str  # the same for every model it concerns
    model: str
    detail: str = ""  # this model's numbers
    hint: str | None = None


def match_models(models: Iterable[ModelInfo], globs: Sequence[str]) -> list[ModelInfo]:
    """The models whose catalog id matches one of ``globs`` (all of them without globs)."""
    listed = list(models)
    if not globs:
        return listed
    return [m for m in listed if any(fnmatch.fnmatchcase(m.id, g) for g in globs)]


def verify_policy(
    policy: ResolvedPolicy | str | Path,
    models: Sequence[ModelInfo],
    *,
    config: Mapping[str, Any] | None = None,
    tools: Sequence[ToolDefinition] = (),
) -> list[Diagnostic]:
    """Every ``verify.*`` finding of ``policy`` on ``models``, grouped by location.

    ``config`` supplies ``config.*`` values as for
    :func:`~kilo_rules.engine.compiler.compile.compile_policy`; ``tools`` are the tool definitions
    the client sends (they come before the system prompt in the cached prefix; default none, so the
    prefix estimate is the policy's own part). A policy that does not compile for a model is
    reported with its compile diagnostics, and a string its expressions compare with a catalog name
    that no model has (a typo'd ``model.family``, say, which makes a rule apply to no model) as
    ``expr.unknown-value``.
    """
    resolved = policy if isinstance(policy, ResolvedPolicy) else resolve_policy(policy)
    found: list[_Finding] = []
    failed: dict[tuple[str, Location, str], tuple[Diagnostic, list[str]]] = {}
    for model in models:
        try:
            plan = compile_policy(resolved, model, config=config)
        except KiloRulesError as exc:
            for d in exc.diagnostics:
                key = (d.code, d.location, d.message)
                failed.setdefault(key, (d, []))[1].append(model.id)
            continue
        found.extend(_check_plan(plan, tools))
    out = _group(found)
    out.extend(d for d in expression_diagnostics(resolved) if d.code == "expr.unknown-value")
    for d, ids in failed.values():
        details = {**d.details, "models": ids}
        out.append(Diagnostic(d.code, d.message, d.location, details, d.hint, d.severity))
    return sorted(out, key=Diagnostic.sort_key)


# ---------------------------------------------------------------------------- the checks


def _check_plan(plan: Plan, tools: Sequence[ToolDefinition]) -> list[_Finding]:
    return [
        *_budget(plan),
        *_short_prefix(plan, tools),
        *_window(plan),
        *_thresholds(plan),
        *_output(plan),
        *_tokenizer(plan),
        *_prompt(plan),
        *_server(plan),
    ]


def _where(plan: Plan, *names: str) -> Location:
    """Where the first of ``names`` the policy sets is written (its file's first line when
    it sets none)."""
    for name in names:
        v = plan.values.get(name)
        if v is not None:
            return v.location
        loc = plan.where(name)
        if loc is not None:
            return loc
    return Location(plan.policy_file, 1, 1)


def _int(plan: Plan, name: str) -> int | None:
    v = plan.values.get(name)
    if v is None or v.dynamic or isinstance(v.value, bool) or not isinstance(v.value, int | float):
        return None
    return int(v.value)


def _wire_limit(plan: Plan) -> int:
    """Most breakpoints a request to this model may carry: the wire's and the model's."""
    limit = plan.caching.provider_limit
    facts = plan.model.cache
    if facts.kind == "explicit" and facts.max_breakpoints:
        limit = min(limit, facts.max_breakpoints)
    return limit


def _wanted(plan: Plan) -> int:
    """Most marks the breakpoint rule asks for in one request."""
    c = plan.caching.marks
    if c.rule == "kilo":
        return c.system_first + c.non_system_last
    flags = (c.last_tool, c.last_system, c.latest_user_message, c.latest_assistant)
    return sum(flags) + c.rolling


def _budget(plan: Plan) -> list[_Finding]:
    c, m = plan.caching.marks, plan.model
    limit = _wire_limit(plan)
    if not c.enabled or limit <= 0:
        return []
    out: list[_Finding] = []
    written = _int(plan, "cache.budget")
    if written is not None and written > limit:
        out.append(
            _Finding(
                "verify.breakpoint-budget",
                "warning",
                _where(plan, "cache.budget"),
                "cache.budget is over the breakpoints the provider takes; it is capped silently",
                m.id,
                f"{written} > {limit}",
                "write the budget as min(N, model.cache.max_breakpoints)",
            )
        )
    wanted, budget = _wanted(plan), c.budget
    if wanted > budget:
        out.append(
            _Finding(
                "verify.breakpoint-budget",
                "warning",
                _where(plan, "cache.breakpoints.rolling", "cache.breakpoints", "cache.rule"),
                "the breakpoint rule asks for more marks than the budget holds; the earliest "
                "are dropped",
                m.id,
                f"{wanted} wanted, budget {budget}",
                "ask for fewer marks (rolling, system_first, non_system_last)",
            )
        )
    # A provider-placed (automatic) breakpoint takes one of the request's slots.
    automatic = wireapi.facts(m.api).automatic_marker and not c.respect_automatic
    if automatic and min(wanted, budget) + 1 > limit:
        out.append(
            _Finding(
                "verify.breakpoint-budget",
                "warning",
                _where(plan, "cache.respect_automatic"),
                "with the client's automatic caching on, the explicit marks plus the automatic "
                "one exceed the provider's limit and the request is refused",
                m.id,
                f"{min(wanted, budget)} + 1 > {limit}",
                "set cache.respect_automatic: true, or leave a slot free (a smaller budget)",
            )
        )
    return out


def _probe_session(tools: Sequence[ToolDefinition]) -> Session:
    """A session of one short user message: the request it builds is the policy's own
    stable prefix (tools and system) and almost nothing else."""
    text = TextPart(id="verify-part", type="text", text="Hello.")
    msg = Message(id="verify-user", role="user", parts=[text])
    return Session(id="verify", tools=list(tools), messages=[msg])


def _short_prefix(plan: Plan, tools: Sequence[ToolDefinition]) -> list[_Finding]:
    m = plan.model
    minimum = m.cache.min_cacheable_tokens
    if not plan.caching.marks.enabled or m.cache.kind != "explicit" or minimum <= 0:
        return []
    if _wire_limit(plan) <= 0:
        return []
    turn = apply_plan(plan, _probe_session(tools))
    counter, _ = counter_for(m.tokenizer)
    seq = blocks(turn.request, counter.count)
    system_messages = {
        i
        for i, msg in enumerate(turn.request.get("messages") or [])
        if isinstance(msg, Mapping) and msg.get("role") == "system"
    }
    out: list[_Finding] = []
    total = 0
    for b in seq:
        total += b.tokens
        where = b.key.split(":", 1)[0]
        kind = _stable_kind(where, system_messages)
        if kind is None or b.mark is None or total >= minimum:
            continue
        if kind == "tools":
            name, what = "cache.breakpoints.last_tool", "the last tool definition"
        elif plan.caching.marks.rule == "kilo":
            name, what = "cache.breakpoints.system_first", "a system message"
        else:
            name, what = "cache.breakpoints.last_system", "the last system block"
        out.append(
            _Finding(
                "verify.short-prefix",
                "warning",
                _where(plan, name, "cache.breakpoints", "cache.rule"),
                f"the breakpoint on {what} closes a prefix shorter than the model's "
                "minimum cacheable prefix: it is never written, and its slot is wasted",
                m.id,
                f"~{total:,} tokens < {minimum:,} ({b.mark} mark)",
                "mark where the prefix is long enough (the conversation: rolling, "
                "latest_user_message), or leave this mark out for models with a large minimum",
            )
        )
    return out


def _stable_kind(where: str, system_messages: set[int]) -> str | None:
    """``tools`` or ``system`` for a block of the stable prefix, else None."""
    if where == "t":
        return "tools"
    if where == "s":
        return "system"
    if where.startswith("m") and where[1:].isdigit() and int(where[1:]) in system_messages:
        return "system"
    return None


def _window(plan: Plan) -> list[_Finding]:
    out: list[_Finding] = []
    codes = {w.code for w in plan.warnings}
    for w in plan.warnings:
        mapped = _WINDOW_CODES.get(w.code)
        if mapped is None:
            continue
        code, severity = mapped
        summary = {
            "verify.no-window": "budget.usable leaves no room for input",
            "verify.reserved": "budget.reserved is not less than the window",
            "verify.tail": "compaction.preserve_recent_tokens is larger than budget.usable",
        }[code]
        out.append(_Finding(code, severity, w.location, summary, plan.model.id, w.message, w.hint))
    limits = plan.model.limits
    configured = _int(plan, "output.configured")
    if (
        limits.context > 0
        and configured is not None
        and configured >= limits.context
        and "plan.no-window" not in codes
    ):
        out.append(
            _Finding(
                "verify.output-window",
                "error",
                _where(plan, "output.configured", "output.max_tokens"),
                "the output cap is not less than the context window",
                plan.model.id,
                f"{configured:,} >= {limits.context:,}",
                "cap output.configured below the window (min(model.limits.output, ...))",
            )
        )
    return out


def _thresholds(plan: Plan) -> list[_Finding]:
    out: list[_Finding] = []
    v = plan.values.get("overflow.threshold_percent")
    pct = v.value if v is not None and not v.dynamic else None
    if isinstance(pct, int | float) and not isinstance(pct, bool) and not 0 < pct <= 100:
        out.append(
            _Finding(
                "verify.threshold",
                "error",
                _where(plan, "overflow.threshold_percent"),
                "overflow.threshold_percent must be in (0, 100]",
                plan.model.id,
                f"{pct:g}",
                "a percentage of the window, e.g. 80",
            )
        )
    limit, usable = _int(plan, "overflow.limit"), _int(plan, "budget.usable")
    if limit is not None and usable is not None and usable > 0 and limit > usable:
        out.append(
            _Finding(
                "verify.threshold",
                "warning",
                _where(plan, "overflow.limit"),
                "overflow.limit is above budget.usable: requests overflow before the "
                "preflight compacts",
                plan.model.id,
                f"{limit:,} > {usable:,}",
                "take the minimum with budget.usable",
            )
        )
    return out


def _output(plan: Plan) -> list[_Finding]:
    limit = plan.model.limits.output
    configured = _int(plan, "output.configured")
    send = plan.values.get("output.send")
    if send is not None and not send.dynamic and send.value is False:
        return []
    if limit <= 0 or configured is None or configured <= limit:
        return []
    return [
        _Finding(
            "verify.output-limit",
            "error",
            _where(plan, "output.configured", "output.max_tokens"),
            "the output cap is above the model's output limit; the provider refuses it",
            plan.model.id,
            f"{configured:,} > {limit:,}",
            "take min(model.limits.output, ...)",
        )
    ]


def _tokenizer(plan: Plan) -> list[_Finding]:
    counter = plan.settings.tokens.counter
    spec = plan.model.tokenizer if counter == "model" else counter
    _, warning = counter_for(spec)
    if warning is None:
        return []
    whose = "the model's catalog tokenizer" if counter == "model" else "tokens.counter"
    return [
        _Finding(
            "verify.tokenizer",
            "warning",
            _where(plan, "tokens.counter"),
            f"{whose} is not available offline; counts fall back to the estimate",
            plan.model.id,
            spec,
            "use `estimate` or `tiktoken:cl100k_base` (shipped offline)",
        )
    ]


def _prompt(plan: Plan) -> list[_Finding]:
    if not any(layer.source == "family" for layer in plan.layers):
        return []
    if plan.prompt is not None and plan.prompt.file:
        return []
    loc = plan.prompt.location if plan.prompt is not None else _where(plan, "prompts")
    return [
        _Finding(
            "verify.no-prompt",
            "warning",
            loc,
            "prompts.rules choose no prompt file and prompts.default is unset: the family "
            "layer is empty",
            plan.model.id,
            f"family {plan.model.family}",
            "add a rule for this family, or a prompts.default",
        )
    ]


# ---------------------------------------------------------------------------- grouping


def _server(plan: Plan) -> list[_Finding]:
    """A server-side edit the policy enables on a model whose provider does not run it:
    it is not sent, so the context management the author counted on does not happen."""
    from kilo_rules.engine.runtime.server import gated

    supported = plan.model.server_edits
    out = []
    for edit in [e for e, runs in gated(plan) if not runs]:
        name = edit["edit"]
        out.append(
            _Finding(
                "verify.server-edit",
                "warning",
                _where(plan, f"server.{name}.enabled", f"server.{name}"),
                f"server.{name} is enabled but the model's provider does not run it: it is "
                "not sent",
                plan.model.id,
                f"server_edits {sorted(supported)}",
                "enable it in an override for the models that run it (model.server_edits)",
            )
        )
    return out


# functools.lru_cache, not a compiler's cache: it takes no argument, so it holds one value,
# the bundled kilo-default's path, fixed by where the package is installed.
@lru_cache(maxsize=1)
def _kilo_default_file() -> str:
    return str(Path(resolve_policy("kilo-default").file).resolve())


def _is_kilo_default(loc: Location) -> bool:
    try:
        return str(Path(loc.file).resolve()) == _kilo_default_file()
    except (OSError, KiloRulesError):  # pragma: no cover - the bundled policy is always there
        return False


def _models_text(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:6])
    return shown + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")


def _group(found: Sequence[_Finding]) -> list[Diagnostic]:
    groups: dict[tuple[str, Location, str], list[_Finding]] = {}
    for f in found:
        groups.setdefault((f.code, f.location, f.summary), []).append(f)
    out = []
    for (code, loc, summary), items in groups.items():
        severity = items[0].severity
        ids = list(dict.fromkeys(f.model for f in items))
        per_model = {f.model: f.detail for f in items if f.detail}
        details: dict[str, Any] = {"models": ids, "per_model": per_model}
        message = f"{summary} (on {len(ids)} model(s): {_models_text(ids)})"
        hint = items[0].hint
        note = KILO_NOTES.get(code)
        if note is not None and _is_kilo_default(loc):
            details["kilo"] = note
            message = f"note: {message}; this is Kilo's behaviour"
            hint = note
        out.append(Diagnostic(code, message, loc, details, hint, severity))
    return out


# ---------------------------------------------------------------------------- stability


@dataclass(frozen=True, slots=True)
class PrefixChange:
    """A step whose request no longer starts with the previous step's cached prefix.

    ``offset`` is the first differing byte of the request in cache order (tools, system,
    messages; cache marks left out, so a moved breakpoint is no change), within the
    ``previous`` bytes the previous step cached (up to its last breakpoint). ``block`` names
    where that byte sits (``system``, ``tools[2]``, ``messages[5]``); ``cause`` what changed
    it (``compaction``, ``prune``, ``system layer``, ``system transforms``, ``injection``,
    ``tools``, ``history``) and ``layer`` the system layer's id when it is one."""

    step: int
    message_id: str
    offset: int
    previous: int
    block: str
    cause: str
    expected: bool
    location: Location | None = None
    layer: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape."""
        return {
            "step": self.step,
            "message_id": self.message_id,
            "offset": self.offset,
            "previous_prefix_bytes": self.previous,
            "block": self.block,
            "cause": self.cause,
            "layer": self.layer,
            "expected": self.expected,
            "at": str(self.location) if self.location is not None else None,
        }


@dataclass
class StabilityReport:
    """The cache-prefix stability of one session under one plan."""

    policy: str
    model: str
    steps: int = 0
    changes: list[PrefixChange] = field(default_factory=list)
    error: str | None = None  # why the replay stopped early

    @property
    def unexpected(self) -> list[PrefixChange]:
        """The changes no compaction explains."""
        return [c for c in self.changes if not c.expected]

    def diagnostics(self) -> list[Diagnostic]:
        """``verify.prefix-changed`` for every unexpected change, grouped by cause and
        location (the steps listed in the details)."""
        groups: dict[tuple[str, str | None, Location | None], list[PrefixChange]] = {}
        for c in self.unexpected:
            groups.setdefault((c.cause, c.layer, c.location), []).append(c)
        out = []
        for (cause, layer, loc), items in groups.items():
            what = f"system layer {layer!r}" if layer else cause
            steps = [c.step for c in items]
            first = items[0]
            out.append(
                Diagnostic(
                    "verify.prefix-changed",
                    f"{what} changed the cached prefix at {len(steps)} step(s) on "
                    f"{self.model} (first at step {first.step}, byte {first.offset:,} in "
                    f"{first.block})",
                    loc or Location("<session>", 1, 1),
                    {
                        "model": self.model,
                        "models": [self.model],
                        "cause": cause,
                        "layer": layer,
                        "steps": steps,
                        "changes": [c.to_json() for c in items],
                    },
                    "keep per-step values out of everything before the last breakpoint "
                    "(a layer's text, a tool definition, earlier messages)",
                    _severity(cause),
                )
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """Stable JSON shape of the report."""
        return {
            "policy": self.policy,
            "model": self.model,
            "steps": self.steps,
            "changes": [c.to_json() for c in self.changes],
            "unexpected": len(self.unexpected),
            "error": self.error,
        }


def _severity(cause: str) -> Severity:
    # Pruning is a policy's choice to trade the cache for room; anything else is a leak.
    return "warning" if cause == "prune" else "error"


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What one step sent, in cache order, and where its last breakpoint ends."""

    keys: tuple[bytes, ...]
    names: tuple[str, ...]
    cached: int  # blocks up to and including the last marked one (0: no mark)
    live: Session
    step_input: StepInput


def _snapshot(result: StepResult, live: Session, step_input: StepInput) -> _Snapshot:
    seq: list[Block] = blocks(result.request, len)
    messages = result.request.get("messages", result.request.get("contents")) or []
    names = []
    for b in seq:
        where = b.key.split(":", 1)[0]
        if where == "t":
            names.append("tools")
        elif where == "s":
            names.append("system")
        elif where[1:].isdigit():
            i = int(where[1:])
            msg = messages[i] if i < len(messages) else None
            system = isinstance(msg, Mapping) and msg.get("role") in ("system", "developer")
            names.append("system" if system else f"messages[{i}]")
        else:
            names.append(where)
    marked = [i for i, b in enumerate(seq) if b.mark is not None]
    cached = marked[-1] + 1 if marked else 0
    keys = tuple(b.key.encode("utf-8", "surrogatepass") for b in seq)
    return _Snapshot(keys, tuple(names), cached, live, step_input)


def _first_difference(prev: _Snapshot, cur: _Snapshot) -> tuple[int, int] | None:
    """(block index, byte offset) of the first byte of ``prev``'s cached prefix that
    ``cur`` does not repeat; None when ``cur`` starts with all of it."""
    offset = 0
    for i in range(prev.cached):
        old = prev.keys[i]
        new = cur.keys[i] if i < len(cur.keys) else b""
        if old != new:
            common = 0
            for a, b in zip(old, new, strict=False):
                if a != b:
                    break
                common += 1
            return i, offset + common
        offset += len(old)
    return None


def _layers(plan: Plan, session: Session, step_input: StepInput) -> list[tuple[str, str]]:
    """(layer id, text) of every system layer the step would send."""
    st = run(plan, session, step_input, until="guards")
    last_user = next((m for m in reversed(st.view) if m.role == "user"), None)
    settings = plan.settings
    return [
        (layer.id, text)
        for layer, text, _ in layer_texts(
            plan.layers,
            step_input,
            st.context,
            env_fields=settings.environment.static,
            instructions=settings.system.instructions,
            user_system=last_user.system if last_user else None,
        )
        if text.strip()
    ]


def _explain(
    plan: Plan, prev: _Snapshot, cur: _Snapshot, result: StepResult, block: str
) -> tuple[str, bool, Location | None, str | None]:
    """(cause, expected, policy location, layer id) of a change of the cached prefix."""
    decisions = result.decisions
    if result.compactions:
        at = next((d.at for d in decisions if d.stage == "compaction" and d.at), None)
        return "compaction", True, at or plan.where("compaction.auto"), None
    pruned = [m for m in result.mutations if m.get("op") == "mark_compacted"]
    if pruned:
        reason = str(pruned[0].get("reason") or "normal").replace("-", "_")
        return "prune", False, plan.where(f"prune.reasons.{reason}"), None
    if block == "system":
        before = _layers(plan, prev.live, prev.step_input)
        after = _layers(plan, cur.live, cur.step_input)
        for i in range(max(len(before), len(after))):
            old = before[i] if i < len(before) else None
            new = after[i] if i < len(after) else None
            if old != new:
                layer_id = (new or old or ("", ""))[0]
                where = next((lp.location for lp in plan.layers if lp.id == layer_id), None)
                return "system layer", False, where, layer_id
        return "system transforms", False, plan.where("system.transforms"), None
    if block == "tools":
        return "tools", False, plan.where("cache.rule"), None
    injected = [d for d in decisions if d.stage == "inject" and d.at is not None]
    if injected:
        return "injection", False, injected[0].at, None
    return "history", False, plan.where("lowering"), None


def prefix_stability(
    plan: Plan,
    session: Session,
    *,
    summarizer: Summarizer | None = None,
) -> StabilityReport:
    """Replay ``session`` under ``plan`` as
    :func:`kilo_rules.tools.simulation.simulate.simulate` does (its recorded compactions
    dropped, compaction by ``summarizer``, default the offline extractive one, the same
    usage fed back, so the same compactions) and report every step whose request does not
    start with the previous step's cached prefix."""
    report = StabilityReport(plan.policy, plan.model.id)
    step_input = StepInput()
    prev: _Snapshot | None = None
    try:
        for step in replay(plan, session, summarizer=summarizer):
            report.steps += 1
            cur = _snapshot(step.result, step.live, step_input)
            diff = None if prev is None else _first_difference(prev, cur)
            if prev is not None and diff is not None:
                index, offset = diff
                block = prev.names[index]
                cause, expected, at, layer = _explain(plan, prev, cur, step.result, block)
                report.changes.append(
                    PrefixChange(
                        report.steps,
                        step.message.id,
                        offset,
                        sum(len(k) for k in prev.keys[: prev.cached]),
                        block,
                        cause,
                        expected,
                        at,
                        layer,
                    )
                )
            prev = cur
    except ContextOverflowError as exc:
        report.error = exc.diagnostics[0].message
    return report
