"""Semantic checks the JSON Schema cannot express, as small registered generators.

Each check receives the resolved policy and yields diagnostics; the caller collects them.
They run after schema validation, so they may assume well-typed values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .catalog import PROVIDERS
from .errors import Diagnostic, did_you_mean
from .load import JsonPath, lookup
from .resolve import ResolvedPolicy, policy_bodies

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
    """A policy-relative file reference as a path (relative to the file that wrote it)."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else policy.declared_in(path) / p


@check("missing-file")
def _missing_files(policy: ResolvedPolicy) -> Iterator[Diagnostic]:
    for path, value in referenced_files(policy):
        target = resolve_file(policy, path, value)
        if not target.is_file():
            siblings = (
                sorted(x.name for x in target.parent.glob("*")) if target.parent.is_dir() else []
            )
            guess = did_you_mean(target.name, siblings)
            yield Diagnostic(
                "policy.missing-file",
                f"prompt file {value!r} does not exist",
                policy.locate(path),
                details={"resolved": str(target)},
                hint=f"did you mean {guess!r}?"
                if guess
                else "paths are relative to the policy file",
            )


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
    from .catalog import bundled_catalog

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
