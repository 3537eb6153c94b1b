"""``kilo-rules diff A B``: what changes between two policies, for a pull request.

For each model, the plan values that differ (both values, both places), the overrides
applied under one policy only, the cache settings, system layers, family prompt, system
transforms and stages that differ; models without a difference share one line. With
``--session``, each session is replayed under both policies and the first step whose
request or decisions differ is shown side by side, then a summary of the replay.

Like ``git diff``, the command exits 0 whatever it finds; ``--exit-code`` makes it exit 1
when the policies differ.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kilo_rules.engine.base.errors import CatalogError, Diagnostic, Location, render_github
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog
from kilo_rules.engine.importers import read_session
from kilo_rules.tools.checking.diff import (
    DecisionChange,
    LayerChange,
    ModelDiff,
    PolicyDiff,
    SessionDiff,
    SettingChange,
    ValueChange,
    diff_policies,
    diff_session,
    match_models,
    representative_models,
)
from kilo_rules.tools.checking.explain import where
from kilo_rules.tools.cli import _options as opt
from kilo_rules.tools.cli._runner import EXIT_DIAGNOSTICS, EXIT_OK, relative
from kilo_rules.tools.cli._table import ELLIPSIS, FULL_HINT, render_table, shorten

#: How much of a value or decision result the tables show without ``--full``.
VALUE_WIDTH = 40
#: Lines of a request diff shown without ``--full``.
DIFF_LINES = 120


def register(sub: opt.Subcommands) -> None:
    """Add ``diff`` to the subcommands."""
    p = opt.add_command(
        sub,
        "diff",
        summary="what changes between two policies, per model and on sessions",
        description="Compare two policies: the plan values, overrides, cache settings and "
        "system layers that differ for each model, with where each policy sets them; with "
        "--session, the first step of a replay whose request or decisions differ "
        "(docs/diff.md). Exits 0 unless --exit-code and the policies differ.",
    )
    p.add_argument("a", metavar="A", help="the policy compared from: bundled name or path")
    p.add_argument("b", metavar="B", help="the policy compared to: bundled name or path")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="ID|GLOB",
        help="a catalog id, a glob over catalog ids (anthropic/*) or a model file (repeatable; "
        "default: one model per provider and family of the catalog)",
    )
    p.add_argument(
        "--all-models", action="store_true", help="compare on every model of the catalog"
    )
    p.add_argument(
        "--session",
        action="append",
        default=[],
        metavar="FILE",
        help="replay this Session v1 file or recorded agent log under both policies "
        "(repeatable); on the --model models, else on the model the session ran with",
    )
    opt.add_run(p)
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="compare at most the first N requests of each session",
    )
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when the policies differ (default: exit 0 either way, like git diff)",
    )
    opt.add_config(p)
    opt.add_allow_read(p)
    opt.add_format(p, "github", what="; json: the differences as data; github: annotations")
    opt.add_full(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Compare, print, and say whether anything differs when ``--exit-code`` asks."""
    if args.steps is not None and args.steps < 1:
        raise ValueError("--steps must be 1 or more")
    models = _models(args.model, all_models=args.all_models)
    result, pairs = diff_policies(args.a, args.b, models, config=opt.config(args.config))
    explicit = bool(args.model)
    for ref in args.session:
        session = read_session(ref, run=args.run)
        chosen = pairs if explicit else [_pair(args, session.model, models, pairs)]
        for pa, pb in chosen:
            result.sessions.append(
                diff_session(pa, pb, session, name=ref, steps=args.steps, full=args.full)
            )
    if args.format == "json":
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False, default=str))
    elif args.format == "github":
        annotations = github_annotations(result)
        if annotations:
            print(render_github(relative(annotations)))
    else:
        print(render_diff(result, full=args.full))
    return EXIT_DIAGNOSTICS if args.exit_code and not result.same else EXIT_OK


def _models(refs: Sequence[str], *, all_models: bool) -> list[ModelInfo]:
    catalog = bundled_catalog()
    if all_models:
        found = list(catalog.models)
    elif not refs:
        found = representative_models(catalog)
    else:
        found = []
        for ref in refs:
            if Path(ref).suffix in (".yaml", ".yml", ".json") and Path(ref).is_file():
                found.append(opt.model(ref))
                continue
            matched = match_models(ref, catalog)
            if not matched:
                raise ValueError(f"--model {ref!r} matches no model of the catalog")
            found.extend(matched)
    return list({m.id: m for m in found}.values())


def _pair(
    args: argparse.Namespace,
    recorded: str | None,
    models: Sequence[ModelInfo],
    pairs: Sequence[tuple[Plan, Plan]],
) -> tuple[Plan, Plan]:
    """The plans for the model the session ran with, else for the first model compared."""
    if recorded:
        try:
            model = bundled_catalog().get(recorded)
        except CatalogError:
            model = None
        if model is not None:
            for m, pair in zip(models, pairs, strict=True):
                if m.id == model.id:
                    return pair
            from kilo_rules.engine.compiler.compile import compile_policy

            cfg = opt.config(args.config)
            return compile_policy(args.a, model, config=cfg), compile_policy(
                args.b, model, config=cfg
            )
    return pairs[0]


# ---------------------------------------------------------------------------- text


def _labels(d: PolicyDiff) -> tuple[str, str]:
    return (d.a, d.b) if d.a != d.b else ("A", "B")


def _file(path: str) -> str:
    return Location(path, 1, 1).relative().file


def _value(value: Any, dynamic: bool, at: Location | None) -> str:
    if at is None:
        return "(unset)"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return f"per step: {value}" if dynamic else text


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


class _Cutter:
    """Cuts cells to a width unless ``full``, remembering whether any was cut."""

    def __init__(self, full: bool, width: int = VALUE_WIDTH) -> None:
        self.width = None if full else width
        self.cut = False

    def __call__(self, text: str) -> str:
        shown = shorten(text, self.width)
        self.cut = self.cut or shown != text
        return shown


def _value_rows(values: Sequence[ValueChange], labels: tuple[str, str], cut: _Cutter) -> str:
    rows = [
        (
            v.name,
            cut(_value(v.a, v.a_dynamic, v.a_at)),
            where(v.a_at),
            cut(_value(v.b, v.b_dynamic, v.b_at)),
            where(v.b_at),
        )
        for v in values
    ]
    headers = ("value", labels[0], "set at", labels[1], "set at")
    return render_table(headers, rows, indent="    ")


def _layer_line(c: LayerChange, labels: tuple[str, str]) -> str:
    if c.kind == "added":
        return f"    + {c.id} (only in {labels[1]}, at {where(c.b_at)})"
    if c.kind == "removed":
        return f"    - {c.id} (only in {labels[0]}, at {where(c.a_at)})"
    assert c.a is not None and c.b is not None
    parts = []
    for key in c.what:
        if key == "position":
            parts.append("position")
        elif key == "text":
            parts.append(f"text ({c.a['chars']} → {c.b['chars']} chars)")
        else:
            parts.append(f"{key} {_text(c.a[key])} → {_text(c.b[key])}")
    return f"    ~ {c.id}: {'; '.join(parts)} (at {where(c.a_at)} / {where(c.b_at)})"


def _setting_line(s: SettingChange, cut: _Cutter) -> str:
    if s.section == "prompt":

        def prompt(p: dict[str, Any] | None) -> str:
            return "none" if p is None else f"{p['rule']} -> {p['file']} ({p['chars']} chars)"

        return f"  family prompt: {prompt(s.a)} → {prompt(s.b)}"
    name = s.key if s.section in ("stages",) else f"{s.section}.{s.key}"
    return f"  {name}: {cut(_text(s.a))} → {cut(_text(s.b))}"


def _model_block(m: ModelDiff, labels: tuple[str, str], cut: _Cutter) -> list[str]:
    lines = []
    if m.values:
        lines.append(f"  values ({len(m.values)}):")
        lines.append(_value_rows(m.values, labels, cut))
    for o in m.overrides:
        label = labels[0] if o.side == "a" else labels[1]
        lines.append(f"  override {o.name}: applied in {label} only (at {where(o.at)})")
    cache = [s for s in m.settings if s.section == "cache"]
    if cache:
        shown = "; ".join(f"{s.key} {cut(_text(s.a))} → {cut(_text(s.b))}" for s in cache)
        lines.append(f"  cache settings: {shown}")
    lines.extend(_setting_line(s, cut) for s in m.settings if s.section != "cache")
    if m.layers:
        lines.append("  system layers:")
        lines.extend(_layer_line(c, labels) for c in m.layers)
    return lines


def _names(models: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(models[:limit])
    more = len(models) - limit
    return shown + (f", and {more} more" if more > 0 else "")


def _decision_rows(changes: Sequence[DecisionChange], cut: _Cutter) -> list[tuple[str, ...]]:
    return [
        (
            c.stage,
            c.rule,
            cut(_text(c.a)) if c.a_made else "-",
            cut(_text(c.b)) if c.b_made else "-",
        )
        for c in changes
    ]


def _session_block(s: SessionDiff, labels: tuple[str, str], full: bool) -> list[str]:
    cut = _Cutter(full)
    lines = [f"session {s.session} on {s.model}:"]
    first = s.first
    if first is None:
        lines.append("  no step differs")
    else:
        lines.append(f"  first divergence: step {first.step} (answering {first.message_id})")
        for label, why in ((labels[0], first.stopped_a), (labels[1], first.stopped_b)):
            if why:
                lines.append(f"    {label} stopped here: {why}")
        if first.decisions:
            lines.append("    decisions that differ:")
            rows = _decision_rows(first.decisions, cut)
            headers = ("stage", "rule", labels[0], labels[1])
            lines.append(render_table(headers, rows, indent="      "))
            if cut.cut:
                lines.append(f"      {FULL_HINT}")
        if first.same_request:
            lines.append("    request body: the same")
        elif first.request_a is not None and first.request_b is not None:
            diff = first.diff(labels=labels, full=full)
            lines.append("    request body:")
            shown = diff if full else diff[:DIFF_LINES]
            lines.extend(f"      {line}" for line in shown)
            if len(shown) < len(diff):
                lines.append(
                    f"      ({len(diff) - len(shown):,} more diff lines; strings cut in the "
                    f"middle end in {ELLIPSIS}: --full shows both whole)"
                )
    stopped = [
        f"{label} stopped at step {s.steps + 1}: {why}"
        for label, why in ((labels[0], s.stopped_a), (labels[1], s.stopped_b))
        if why
    ]
    lines.append(
        f"  {s.steps:,} of {s.requests_total:,} steps compared, {s.identical:,} with identical "
        f"requests; compactions {s.compactions_a} in {labels[0]}, {s.compactions_b} in "
        f"{labels[1]}"
        + (
            f"; provider overflows {s.overflows_a} / {s.overflows_b}"
            if s.overflows_a or s.overflows_b
            else ""
        )
        + f"; first divergence: {'none' if first is None else f'step {first.step}'}"
    )
    lines.extend(f"  {line}" for line in stopped)
    return lines


def render_diff(d: PolicyDiff, *, full: bool = False) -> str:
    """The comparison for people: one block per group of models that differ alike, one
    line for the models without a difference, then one block per session replayed."""
    labels = _labels(d)
    lines = [
        f"diff: {labels[0]} = {d.a} ({_file(d.a_file)}), {labels[1]} = {d.b} ({_file(d.b_file)})"
        if labels != (d.a, d.b)
        else f"diff: {d.a} ({_file(d.a_file)}) → {d.b} ({_file(d.b_file)}), "
        f"{len(d.models)} model(s)"
    ]
    groups: dict[str, list[ModelDiff]] = {}
    for m in d.models:
        if not m.same:
            groups.setdefault(m.changes_key(), []).append(m)
    cut = _Cutter(full)
    for group in groups.values():
        lines.append("")
        lines.append(f"{_names([m.model for m in group], limit=len(group))}:")
        lines.extend(_model_block(group[0], labels, cut))
    same = [m.model for m in d.models if m.same]
    if same:
        lines.append("")
        lines.append(f"no differences on {len(same)} model(s): {_names(same)}")
    if cut.cut:
        lines.append(FULL_HINT)
    for s in d.sessions:
        lines.append("")
        lines.extend(_session_block(s, labels, full))
    if d.same:
        lines.append("")
        lines.append("no differences")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- github


def _grouped(items: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
    """(A, B, model) triples grouped by (A, B), the models of each in order."""
    out: dict[tuple[str, str], list[str]] = {}
    for a, b, model in items:
        out.setdefault((a, b), []).append(model)
    return out


def _pairs_text(items: Iterable[tuple[str, str, str]]) -> str:
    return "\n".join(f"{a} → {b} on {_names(ms)}" for (a, b), ms in _grouped(items).items())


def github_annotations(d: PolicyDiff) -> list[Diagnostic]:
    """One annotation per value (and override, layer, cache setting) that differs, placed
    where B sets it (B's first line when B does not set it), naming the models."""
    labels = _labels(d)
    top = Location(d.b_file, 1, 1)
    values: dict[tuple[str, Location], list[tuple[str, str, str]]] = {}
    others: dict[tuple[str, str, Location], list[tuple[str, str, str]]] = {}
    for m in d.models:
        for v in m.values:
            placed = f" ({where(v.a_at)})" if v.a_at is not None else ""
            a = f"{_value(v.a, v.a_dynamic, v.a_at)}{placed}"
            values.setdefault((v.name, v.b_at or top), []).append(
                (a, _value(v.b, v.b_dynamic, v.b_at), m.model)
            )
        for o in m.overrides:
            side = labels[0] if o.side == "a" else labels[1]
            key = ("diff.override", f"override {o.name}", o.at or top)
            others.setdefault(key, []).append((f"applied in {side} only", "", m.model))
        for c in m.layers:
            key = ("diff.layer", f"system layer {c.id}", c.b_at or top)
            others.setdefault(key, []).append((c.kind, ", ".join(c.what), m.model))
        for s in m.settings:
            key = ("diff.setting", f"{s.section}.{s.key}", top)
            others.setdefault(key, []).append((_text(s.a), _text(s.b), m.model))
    out = [
        Diagnostic(
            "diff.value",
            f"{name} differs from {labels[0]}:\n{_pairs_text(items)}",
            at,
            severity="warning",
        )
        for (name, at), items in values.items()
    ]
    for (code, what, at), items in others.items():
        if code == "diff.setting":
            body = _pairs_text(items)
        else:
            body = "\n".join(
                f"{a}{f' ({b})' if b else ''} on {_names(ms)}"
                for (a, b), ms in _grouped(items).items()
            )
        message = f"{what} differs from {labels[0]}:\n{body}"
        out.append(Diagnostic(code, message, at, severity="warning"))
    for sd in d.sessions:
        if sd.first is not None:
            out.append(
                Diagnostic(
                    "diff.session",
                    f"session {sd.session} on {sd.model}: the requests first differ at step "
                    f"{sd.first.step} of {sd.steps} compared ({sd.identical} identical)",
                    top,
                    severity="warning",
                )
            )
    return out
