"""compile(policy, model) → Plan, as an ordered table of stages.

Read top to bottom, the table is the compiler: apply the overrides whose condition holds
for the model, evaluate every value that depends only on the model, choose the family
prompt, resolve the system layers and the cache settings, and fix the order of the
runtime stages. ``until=`` stops after a named stage (for tests and ``kilo-rules plan``).
A compiled plan is cached per (policy revision, model, config), in a bounded cache that
re-reads nothing while the policy and prompt files keep their modification time and size.
The caches belong to a :class:`Compiler`: :func:`compile_policy` uses the default one, and
whoever wants caches of their own (a policy store, a test, a cold benchmark) makes another.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from kilo_rules.engine.base import sandbox
from kilo_rules.engine.base.errors import Diagnostic, KiloRulesError, Location, PolicyError
from kilo_rules.engine.base.lru import CacheStats, LRUCache
from kilo_rules.engine.base.settings import CONFIG_FIELDS, check_config
from kilo_rules.engine.base.source import nearest
from kilo_rules.engine.compiler.knobs import KNOB_NAMES, Knobs, build_knobs
from kilo_rules.engine.compiler.plan import (
    CachePlan,
    CacheSettings,
    ChunkModel,
    LayerPlan,
    Plan,
    PromptChoice,
    Value,
)
from kilo_rules.engine.formats.catalog import (
    EXPLICIT_BREAKPOINTS,
    WIRE_BREAKPOINTS,
    ModelInfo,
    bundled_catalog,
)
from kilo_rules.engine.formats.load import JsonPath, lookup
from kilo_rules.engine.formats.policy import PolicyBody
from kilo_rules.engine.frontend.checks import (
    check_inputs,
    read_file,
    referenced_files,
    semantic_diagnostics,
)
from kilo_rules.engine.frontend.expr import CompiledExpr, model_values, order_definitions
from kilo_rules.engine.frontend.policy_exprs import (
    DEFAULT_EXPRESSION_CACHES,
    ExpressionCaches,
    PolicyExpressions,
    compile_policy_expressions,
    value_leaves,
)
from kilo_rules.engine.frontend.resolve import (
    DEFAULT_RESOLVE_CACHES,
    ResolveCaches,
    ResolvedPolicy,
    resolve_policy,
)

#: The order in which ``apply_plan`` runs its stages (docs/architecture.md, "Apply").
RUNTIME_STAGES = (
    "history",
    "inject",
    "lower",
    "guards",
    "system",
    "output",
    "cache",
    "window",
    "render",
)

#: The ``config.*`` names a policy may read, typed once in :mod:`kilo_rules.engine.base.settings`.
CONFIG_NAMES = tuple(CONFIG_FIELDS)


@dataclass
class _Build:
    compiler: Compiler
    policy: ResolvedPolicy
    model: ModelInfo
    config: dict[str, Any]
    exprs: PolicyExpressions | None = None
    data: dict[str, Any] = field(default_factory=dict)
    origin: dict[JsonPath, JsonPath] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)
    settings: PolicyBody = field(default_factory=PolicyBody)
    dynamic: list[tuple[str, CompiledExpr]] = field(default_factory=list)
    prompt: PromptChoice | None = None
    layers: list[LayerPlan] = field(default_factory=list)
    knobs: Knobs | None = None
    caching: CachePlan = field(default_factory=lambda: CachePlan(CacheSettings(), 0))
    stages: tuple[str, ...] = ()
    summary_template: str = ""
    chunk_model: ChunkModel | None = None
    warnings: list[Diagnostic] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # files read besides the policy chain

    def source(self, path: JsonPath) -> JsonPath:
        """Where in the resolved policy a value of the merged data came from (an override
        copies values from elsewhere)."""
        hit = nearest(self.origin, path)
        return (*hit[0], *hit[1]) if hit is not None else path

    def locate(self, path: JsonPath) -> Location:
        return self.policy.locate(self.source(path))

    def expr_at(self, path: JsonPath) -> CompiledExpr | None:
        assert self.exprs is not None
        return self.exprs.compiled.get(self.source(path))

    def get(self, path: JsonPath, default: Any = None) -> Any:
        return lookup(self.data, path, default)

    def evaluate(self, path: JsonPath, what: str) -> Any:
        """The value at ``path``, evaluating it when it is an expression (model-only)."""
        raw = self.get(path)
        compiled = self.expr_at(path)
        if compiled is None:
            return raw
        dynamic = [n for n in compiled.names if n not in self.context]
        if dynamic:
            raise PolicyError(
                Diagnostic(
                    "plan.dynamic",
                    f"{what} is decided once per model, but reads {dynamic[0]}",
                    self.locate(path),
                    hint="use only model.*, config.* and values that depend on them here",
                )
            )
        return compiled(self.context)


def _stage_checks(b: _Build) -> None:
    """Every check ``kilo-rules check`` runs on a policy — the semantic checks (files named,
    layers, providers, contradictions, ...) and the expressions — run once per policy
    revision and read roots; any error stops the compile with all of them."""
    errors = b.compiler.checked(b.policy)
    if errors:
        raise PolicyError(errors)


def _stage_expressions(b: _Build) -> None:
    # Parsed once per policy revision, however many models and configs it is compiled for.
    b.exprs = b.compiler.expressions(b.policy)
    b.context = {**model_values(b.model), **{n: b.config.get(n) for n in CONFIG_NAMES}}


def _merge_into(
    b: _Build, target: dict[str, Any], over: dict[str, Any], path: JsonPath, src: JsonPath
) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge_into(b, target[k], v, (*path, k), (*src, k))
        else:
            target[k] = copy.deepcopy(v)
            b.origin[(*path, k)] = (*src, k)


def _stage_overrides(b: _Build) -> None:
    b.data = {k: copy.deepcopy(v) for k, v in b.policy.data.items() if k != "overrides"}
    for i, ov in enumerate(b.policy.data.get("overrides") or []):
        when = b.exprs.compiled.get(("overrides", i, "when")) if b.exprs else None
        holds = bool(when(b.context)) if when is not None else bool(ov["when"])
        if holds:
            b.applied.append(ov.get("name") or f"overrides[{i}]")
            _merge_into(b, b.data, ov["set"], (), ("overrides", i, "set"))


def _stage_values(b: _Build) -> None:
    leaves = {name: path for name, path, _ in value_leaves(b.data)}
    defs = {n: c.expr for n, p in leaves.items() if (c := b.expr_at(p)) is not None}
    ordered = order_definitions(defs)
    order = [n for n in leaves if n not in defs] + ordered
    dynamic_names: set[str] = set()
    for name in order:
        path = leaves[name]
        compiled = b.expr_at(path)
        loc = b.locate(path)
        if compiled is None:
            value = b.get(path)
            b.values[name] = Value(name, value, loc, None, False)
            b.context[name] = value
            continue
        reads_dynamic = any(
            n in dynamic_names or not (n in b.context or n.startswith(("model.", "config.")))
            for n in compiled.names
        )
        if reads_dynamic:
            dynamic_names.add(name)
            b.dynamic.append((name, compiled))
            b.values[name] = Value(name, None, loc, compiled.text, True, compiled)
            continue
        value = compiled(b.context)
        b.values[name] = Value(name, value, loc, compiled.text, False)
        b.context[name] = value


def _stage_settings(b: _Build) -> None:
    """The merged policy as typed settings: every field validated, every knob the policy
    leaves out at the model's one default, and every value decided for this model in place
    of its expression. A knob decided per step is left at its default in the settings and
    compiled into its :class:`~kilo_rules.engine.compiler.knobs.Setting` (``Plan.knobs``),
    so no expression text reaches the runtime; a per-step condition that must be decided
    per model (a prune gate) stays text here, for the model to refuse, located."""
    data = {k: copy.deepcopy(v) for k, v in b.data.items() if k in PolicyBody.model_fields}
    for name, v in b.values.items():
        if v.expression is None or (v.dynamic and name not in KNOB_NAMES):
            continue
        node = data
        *parents, leaf = name.split(".")
        for part in parents:
            node = node[part]
        if v.dynamic:
            del node[leaf]
        else:
            node[leaf] = v.value
    try:
        b.settings = PolicyBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path: JsonPath = tuple(first["loc"])
        where = ".".join(str(p) for p in path)
        raise PolicyError(
            Diagnostic(
                "plan.value",
                f"{where}: {first['msg']} (got {first['input']!r})",
                b.locate(path),
            )
        ) from None
    per_step = dict(b.dynamic)
    b.knobs = build_knobs(
        _reader(b.settings),
        {name: per_step[name] for name in KNOB_NAMES if name in per_step},
        lambda name: name in b.values,
    )


def _reader(settings: PolicyBody) -> Callable[[str], Any]:
    """A setting of ``settings`` by dotted name (``prune.protect_tokens``)."""
    return lambda name: functools.reduce(getattr, name.split("."), settings)


def _read_prompt(b: _Build, path: JsonPath, what: str) -> tuple[str, str]:
    """(file, text) of the prompt file named at ``path``, read through the sandbox."""
    source = b.source(path)
    target, text = read_file(b.policy, source, b.get(path), what)
    b.files.append(b.policy.file_ref(source, b.get(path)).path)
    return str(target), text.strip()


def _stage_prompt(b: _Build) -> None:
    for i, rule in enumerate(b.get(("prompts", "rules")) or []):
        rp: JsonPath = ("prompts", "rules", i)
        if not b.evaluate((*rp, "when"), "a prompt rule"):
            continue
        file, text = _read_prompt(b, (*rp, "prompt"), "prompt")
        for key in rule.get("replace") or {}:
            value = b.evaluate((*rp, "replace", key), "a prompt placeholder")
            text = text.replace("{{" + key + "}}", str(value))
        name = rule.get("name") or f"rules[{i}]"
        b.prompt = PromptChoice(name, file, b.locate((*rp, "when")), text)
        return
    if b.get(("prompts", "default")) is None:
        b.prompt = PromptChoice(None, "", b.locate(("prompts",)), "")
        return
    file, text = _read_prompt(b, ("prompts", "default"), "default prompt")
    b.prompt = PromptChoice("default", file, b.locate(("prompts", "default")), text)


def _stage_system(b: _Build) -> None:
    for i, layer in enumerate(b.get(("system", "layers")) or []):
        lp: JsonPath = ("system", "layers", i)
        when = b.expr_at((*lp, "when"))
        cond: CompiledExpr | None = None
        if when is not None:
            if all(n in b.context for n in when.names):
                if not when(b.context):
                    continue
            else:
                cond = when
        elif layer.get("when") is False:
            continue
        text: str | None = None
        source = layer.get("source")  # the checks refused a layer without one
        if source == "file":
            text = _read_prompt(b, (*lp, "path"), "layer file")[1]
        elif source == "text":
            text = layer.get("text") or ""
        elif source == "soul":
            path = (*lp, "path") if layer.get("path") else ("prompts", "soul")
            text = _read_prompt(b, path, "soul")[1] if b.get(path) else ""
        elif source == "family":
            text = b.prompt.text if b.prompt else ""
        b.layers.append(
            LayerPlan(layer["id"], source, b.locate(lp), text, cond, layer.get("replaces"))
        )


def _model_only(b: _Build, name: str, what: str) -> None:
    """Refuse, located, a value the compiler needs once per model that reads the session."""
    v = b.values.get(name)
    if v is not None and v.dynamic:
        b.evaluate(tuple(name.split(".")), what)


def _stage_cache(b: _Build) -> None:
    c = b.settings.cache
    for name in ("cache.when", "cache.placement", "cache.budget"):
        _model_only(b, name, name)
    shape = next((v for k, v in c.shapes.items() if k == b.model.api), None)
    provider_limit = WIRE_BREAKPOINTS.get(b.model.api, 0)
    if shape == "explicit":
        provider_limit = EXPLICIT_BREAKPOINTS.get(b.model.api, provider_limit)
    if shape == "none":
        provider_limit = 0
    budget = provider_limit
    if isinstance(c.budget, int):
        budget = min(budget, c.budget)
    if b.model.cache.kind == "explicit" and b.model.cache.max_breakpoints:
        budget = min(budget, b.model.cache.max_breakpoints)
    if c.placement not in ("message", "last-part"):
        raise PolicyError(
            Diagnostic(
                "plan.value",
                f"cache.placement must be 'message' or 'last-part', got {c.placement!r}",
                b.locate(("cache", "placement")),
            )
        )
    bp = c.breakpoints
    placement: Literal["message", "last-part"] = (
        "message" if c.placement == "message" else "last-part"
    )
    marks = CacheSettings(
        rule=c.rule,
        enabled=bool(c.when) and c.rule != "none",
        placement=placement,
        system_first=bp.system_first,
        non_system_last=bp.non_system_last,
        last_tool=bp.last_tool,
        last_system=bp.last_system,
        latest_user_message=bp.latest_user_message,
        latest_assistant=bp.latest_assistant,
        rolling=bp.rolling,
        budget=max(0, budget),
        ttl=c.ttl,
        message_ttl=c.message_ttl,
        skip_trailing_environment=c.skip_trailing_environment,
        respect_automatic=c.respect_automatic,
    )
    b.caching = CachePlan(marks, provider_limit, shape)


def _stage_compaction(b: _Build) -> None:
    """What compaction needs, decided now so that a step never reads a policy file or
    compiles again: the summary template text, and chunking's ``model'`` (Kilo's
    ``compaction-chunks.ts:116-124``: the same model with ``limit.output =
    maxOutputTokens(model, min(output_max, outputTokenMax ?? output_max))``, whose window
    the policy's own ``budget.usable`` rule gives)."""
    compaction = b.settings.compaction
    if compaction.summary.template:
        path = ("compaction", "summary", "template")
        b.summary_template = _read_prompt(b, path, "summary template")[1]
    if not compaction.chunking.enabled:
        return
    output_max = compaction.chunking.output_max
    flag = b.config.get("config.output_token_max")
    cap = min(output_max, int(flag)) if flag is not None else output_max
    values: Mapping[str, Value] = b.values
    if flag is None or int(flag) != cap:
        config = {**b.config, "config.output_token_max": cap}
        values = b.compiler.compile(b.policy, b.model, config=config, until="values").values
    configured = values.get("output.configured")
    out = configured.value if configured is not None else None
    b.chunk_model = ChunkModel(int(values["budget.usable"].value), int(out or cap))


def _stage_window(b: _Build) -> None:
    """Warnings about a window this policy leaves (almost) no room in, for this model:
    nothing a step could fix, so they are said once, where the policy decides them."""
    limits = b.model.limits
    if limits.context <= 0:
        return  # an unknown window: the policy cannot size anything against it
    window = limits.input or limits.context
    s = b.settings

    def warn(code: str, message: str, name: str, hint: str) -> None:
        where = b.values[name].location if name in b.values else b.locate(())
        b.warnings.append(Diagnostic(code, message, where, hint=hint, severity="warning"))

    usable, reserved, answer = s.budget.usable, s.budget.reserved, s.output.configured
    if isinstance(reserved, int) and reserved >= window:
        warn(
            "plan.reserved",
            f"budget.reserved is {reserved:,} for {b.model.id}, not less than its "
            f"{window:,}-token window",
            "budget.reserved",
            "reserve less for the answer, or cap output.max_tokens for this model",
        )
    if isinstance(usable, int) and usable <= 0:
        warn(
            "plan.no-window",
            f"budget.usable is {usable:,} for {b.model.id}: its {limits.context:,}-token "
            "window leaves no room for input"
            + (f" after {answer:,} tokens for the answer" if isinstance(answer, int) else ""),
            "budget.usable",
            "every request would overflow and compact; lower output.max_tokens or "
            "budget.reserved for this model (an override), or fix the model entry",
        )
    tail = s.compaction.preserve_recent_tokens
    if isinstance(tail, int) and isinstance(usable, int) and usable > 0 and tail > usable:
        warn(
            "plan.tail",
            f"compaction.preserve_recent_tokens is {tail:,} for {b.model.id}, more than "
            f"the {usable:,} usable tokens: the kept tail alone may overflow",
            "compaction.preserve_recent_tokens",
            "size the tail from budget.usable (e.g. a quarter of it)",
        )


def _stage_runtime(b: _Build) -> None:
    b.stages = RUNTIME_STAGES


STAGES: tuple[tuple[str, Callable[[_Build], None]], ...] = (
    ("checks", _stage_checks),
    ("expressions", _stage_expressions),
    ("overrides", _stage_overrides),
    ("values", _stage_values),
    ("settings", _stage_settings),
    ("prompt", _stage_prompt),
    ("system", _stage_system),
    ("cache", _stage_cache),
    ("compaction", _stage_compaction),
    ("window", _stage_window),
    ("runtime", _stage_runtime),
)


def _no_knobs() -> Knobs:
    """The knobs of a plan compiled only up to a stage before ``settings``: each at the
    policy model's default."""
    return build_knobs(_reader(PolicyBody()), {}, lambda _: False)


def _revision(policy: ResolvedPolicy) -> str:
    h = hashlib.sha256()
    for doc in policy.chain:
        h.update(doc.file.encode())
        h.update(doc.text.encode())
    return h.hexdigest()[:16]


#: Compiled plans (and resolved policies, checks, expressions) a compiler keeps by default,
#: least recently used dropped first.
CACHE_SIZE = 64

_Stamp = tuple[tuple[str, int, int], ...]
T = TypeVar("T")

_Roots = tuple[Path, ...]
# (policy revision, read roots, model, config)
_PlanKey = tuple[str, _Roots, str, str]
# (policy revision, read roots, what else the checks read)
_CheckKey = tuple[str, _Roots, tuple[str, ...]]
# (reference, working directory, read roots)
_ResolveKey = tuple[str, str, _Roots]


def _stamp(files: Iterable[str | Path]) -> _Stamp:
    """What a file's content is taken to be: its path, modification time and size (as
    Python's own bytecode cache does); a missing file stamps as (-1, -1)."""
    out = []
    for f in files:
        try:
            st = Path(f).stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(f), -1, -1))
    return tuple(out)


def _fresh(hit: tuple[_Stamp, T] | None) -> T | None:
    """The cached value, unless one of the files it was made from changed since."""
    if hit is None or _stamp(f for f, _, _ in hit[0]) != hit[0]:
        return None
    return hit[1]


def _named_files(policy: ResolvedPolicy) -> list[Path]:
    """The files a policy names, as written: a check's verdict holds while they keep their
    modification time and size (a missing one that appears changes its stamp)."""
    return [policy.file_ref(path, value).path for path, value in referenced_files(policy)]


class Compiler:
    """Compiles policies into plans, and owns every cache that takes: compiled plans,
    resolved policies, check verdicts and compiled expressions (by policy revision), and
    the parsed files and expressions beneath them (:class:`~kilo_rules.engine.frontend.resolve.
    ResolveCaches`, :class:`~kilo_rules.engine.frontend.policy_exprs.ExpressionCaches`).

    As Jinja's ``Environment`` owns its template cache: every cache is bounded (``size``
    entries of plans, resolved policies, checks and expressions; the file and expression
    caches have bounds of their own), is one :class:`~kilo_rules.engine.base.lru.LRUCache`, is keyed
    by content (a policy's revision hashes its files' names and text) and is thread-safe,
    so one compiler may serve every thread of a server. A cached plan or resolved policy
    is reused only while the files it was made from keep their modification time and size.

    :func:`compile_policy` uses :func:`default_compiler`; a policy store owns a compiler of
    its own, and a test or a cold benchmark makes a new one (``Compiler()``) instead of
    touching the process's caches. ``resolve_caches`` and ``expression_caches`` share the
    lower caches with others (the default compiler shares the modules' defaults).
    """

    def __init__(
        self,
        size: int = CACHE_SIZE,
        *,
        resolve_caches: ResolveCaches | None = None,
        expression_caches: ExpressionCaches | None = None,
    ) -> None:
        self.size = size
        self.resolve_caches = ResolveCaches() if resolve_caches is None else resolve_caches
        self.expression_caches = (
            ExpressionCaches() if expression_caches is None else expression_caches
        )
        # -> (stamp of the files the plan read, plan)
        self._plans: LRUCache[_PlanKey, tuple[_Stamp, Plan]] = LRUCache(size)
        # policy revision -> its compiled expressions (they depend on nothing else)
        self._expressions: LRUCache[str, PolicyExpressions] = LRUCache(size)
        # -> (stamp of the files the policy names, its error diagnostics)
        self._checked: LRUCache[_CheckKey, tuple[_Stamp, list[Diagnostic]]] = LRUCache(size)
        # -> (stamp of the policy files, resolved policy)
        self._resolved: LRUCache[_ResolveKey, tuple[_Stamp, ResolvedPolicy]] = LRUCache(size)

    def caches(self) -> dict[str, LRUCache[Any, Any]]:
        """Every cache the compiler owns, by name (``plans``, ``resolved``, ...,
        ``documents``, ``trees``, ...)."""
        return {
            "plans": self._plans,
            "expressions": self._expressions,
            "checked": self._checked,
            "resolved": self._resolved,
            **self.resolve_caches.caches(),
            **self.expression_caches.caches(),
        }

    def stats(self) -> dict[str, CacheStats]:
        """Hits, misses and size of each cache, by name."""
        return {name: c.stats() for name, c in self.caches().items()}

    def clear(self) -> None:
        """Forget every entry of every cache (the next compile is cold)."""
        for c in self.caches().values():
            c.clear()

    def resolve(self, ref: str | Path) -> ResolvedPolicy:
        """``resolve_policy(ref)`` with this compiler's caches, reused while none of the
        chain's files changed (the read roots are those in force)."""
        key = (str(ref), str(Path.cwd()), sandbox.operator_roots())
        resolved = _fresh(self._resolved.get(key))
        if resolved is None:
            resolved = resolve_policy(ref, read_roots=key[2], caches=self.resolve_caches)
            files = [d.file for d in resolved.chain if not d.file.startswith("<")]
            self._resolved.put(key, (_stamp(files), resolved))
        return resolved

    def resolve_policy(
        self, ref: str | Path, *, read_roots: Iterable[str | Path] | None = None
    ) -> ResolvedPolicy:
        """:func:`~kilo_rules.engine.frontend.resolve.resolve_policy` sharing this compiler's file
        caches (not kept as a resolved policy: for callers that keep what they resolve)."""
        return resolve_policy(ref, read_roots=read_roots, caches=self.resolve_caches)

    def expressions(self, policy: ResolvedPolicy) -> PolicyExpressions:
        """Every expression of ``policy`` compiled, once per policy revision."""
        return self._expressions.get_or(
            _revision(policy),
            lambda: compile_policy_expressions(policy, self.expression_caches),
        )

    def checked(self, policy: ResolvedPolicy) -> list[Diagnostic]:
        """The error diagnostics ``kilo-rules check`` reports for ``policy`` (warnings do
        not stop a compile), computed once per revision and read roots while the files it
        names are unchanged."""
        key = (_revision(policy), policy.read_roots, check_inputs(policy))
        errors = _fresh(self._checked.get(key))
        if errors is None:
            diags = semantic_diagnostics(policy)
            try:
                self.expressions(policy)
            except KiloRulesError as exc:
                diags.extend(exc.diagnostics)
            errors = [d for d in diags if d.severity == "error"]
            self._checked.put(key, (_stamp(_named_files(policy)), errors))
        return errors

    def compile(
        self,
        policy: ResolvedPolicy | str | Path,
        model: ModelInfo | str,
        *,
        config: Mapping[str, Any] | None = None,
        until: str | None = None,
    ) -> Plan:
        """Compile ``policy`` for ``model`` into a :class:`Plan` (cached per revision);
        see :func:`compile_policy`."""
        names = [n for n, _ in STAGES]
        if until is not None and until not in names:
            raise ValueError(f"unknown stage {until!r}; stages: {', '.join(names)}")
        resolved = policy if isinstance(policy, ResolvedPolicy) else self.resolve(policy)
        info = model if isinstance(model, ModelInfo) else bundled_catalog().get(model)
        cfg = {
            k if k.startswith("config.") else f"config.{k}": v for k, v in (config or {}).items()
        }
        key = (
            _revision(resolved),
            resolved.read_roots,
            info.model_dump_json(),
            json.dumps(cfg, sort_keys=True, default=str),
        )
        if until is None:
            cached = _fresh(self._plans.get(key))
            if cached is not None:
                return cached
        cfg = check_config(cfg)
        build = _Build(self, resolved, info, cfg)
        for name, stage in STAGES:
            stage(build)
            if name == until:
                break
        plan = Plan(
            policy=resolved.name,
            policy_file=resolved.file,
            revision=key[0],
            model=info,
            config=dict(cfg),
            data=build.data,
            overrides=tuple(build.applied),
            values=dict(build.values),
            prompt=build.prompt,
            layers=tuple(build.layers),
            caching=build.caching,
            knobs=build.knobs if build.knobs is not None else _no_knobs(),
            stages=build.stages,
            _locate=build.locate,
            settings=build.settings,
            summary_template=build.summary_template,
            chunk_model=build.chunk_model,
            warnings=tuple(build.warnings),
        )
        if until is None:
            files = dict.fromkeys([*_named_files(resolved), *build.files])
            self._plans.put(key, (_stamp(files), plan))
        return plan


# The one compiler of the module-level functions, sharing the caches that calls naming
# none use (resolve_policy, parse): what the process computed once it reuses everywhere.
_DEFAULT = Compiler(
    resolve_caches=DEFAULT_RESOLVE_CACHES, expression_caches=DEFAULT_EXPRESSION_CACHES
)


def default_compiler() -> Compiler:
    """The compiler :func:`compile_policy` uses (one per process)."""
    return _DEFAULT


def clear_cache() -> None:
    """Forget everything the default compiler cached (``default_compiler().clear()``)."""
    _DEFAULT.clear()


def compile_policy(
    policy: ResolvedPolicy | str | Path,
    model: ModelInfo | str,
    *,
    config: Mapping[str, Any] | None = None,
    until: str | None = None,
) -> Plan:
    """Compile ``policy`` for ``model`` into a :class:`Plan` (cached per revision).

    ``policy`` is a resolved policy, a bundled name or a path; ``model`` a descriptor or a
    catalog id. ``config`` supplies ``config.*`` names (e.g. ``config.output_token_max``),
    each checked against its type and range. The policy passes every check ``kilo-rules
    check`` runs first: a policy that check rejects raises :class:`PolicyError` here too.
    Files the policy names are read only inside its own tree, the bundled policies and
    the roots it was resolved with (:func:`kilo_rules.engine.base.sandbox.allow_read`). The caches
    are those of :func:`default_compiler`; ``Compiler().compile(...)`` uses caches of its own.
    """
    return _DEFAULT.compile(policy, model, config=config, until=until)
