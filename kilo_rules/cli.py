"""The ``kilo-rules`` command line. ``main(argv) -> int``; each failure class has its exit code:

* 0 (``EXIT_OK``): success.
* 1 (``EXIT_DIAGNOSTICS``): diagnostics, the input is wrong (a policy, model, session or log).
* 2 (``EXIT_USAGE``): usage or I/O problems (a bad option, a file that cannot be read).
* 3 (``EXIT_OVER_WINDOW``): ``build --strict`` built a request that does not fit the model's
  context window (without ``--strict`` the same request exits 0 with a warning on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from . import __version__
from .errors import Diagnostic, KiloRulesError, Location, render_github, render_json, render_text

if TYPE_CHECKING:
    from .catalog import ModelInfo
    from .plan import Plan
    from .runtime.apply import Decision, TurnResult
    from .runtime.context import StepInput

EXIT_OK, EXIT_DIAGNOSTICS, EXIT_USAGE, EXIT_OVER_WINDOW = 0, 1, 2, 3


def _print_diagnostics(
    diags: Sequence[Diagnostic], fmt: str, sources: dict[str, str], out: TextIO
) -> None:
    from .check import relativize

    shown = [dataclasses.replace(d, location=relativize(d.location)) for d in diags]
    rel_sources = {relativize(Location(f, 1, 1)).file: t for f, t in sources.items()}
    if fmt == "json":
        print(render_json(shown), file=out)
    elif fmt == "github":
        if shown:
            print(render_github(shown), file=out)
    elif shown:
        print(render_text(shown, rel_sources), file=out)


def cmd_check(args: argparse.Namespace) -> int:
    """Validate policy and catalog files."""
    from .check import check_paths

    report = check_paths(args.paths)
    for problem in report.usage_errors:
        print(f"kilo-rules check: {problem}", file=sys.stderr)
    _print_diagnostics(report.diagnostics, args.format, report.sources, sys.stdout)
    if args.format == "text":
        n_err = len(report.errors)
        n_warn = len(report.diagnostics) - n_err
        summary = f"checked {len(report.files)} file(s): {n_err} error(s), {n_warn} warning(s)"
        print(summary, file=sys.stderr)
    return report.exit_code


def cmd_schema(args: argparse.Namespace) -> int:
    """Print, write or verify the JSON Schemas generated from the models."""
    from .jsonschemas import generated_schemas, render
    from .load import schema_root

    schemas = generated_schemas()
    root = Path(str(schema_root()))
    if args.write or args.check:
        stale = []
        for name, schema in schemas.items():
            target = root / name
            text = render(schema)
            current = target.read_text(encoding="utf-8") if target.exists() else None
            if current != text:
                stale.append(name)
                if args.write:
                    target.write_text(text, encoding="utf-8")
        if args.check and stale:
            print(
                f"stale schemas: {', '.join(stale)} (run kilo-rules schema --write)",
                file=sys.stderr,
            )
            return EXIT_DIAGNOSTICS
        return EXIT_OK
    name = args.name if args.name.endswith(".json") else f"{args.name}.v1.json"
    if name not in schemas:
        print(f"unknown schema {args.name!r}; known: {', '.join(schemas)}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(render(schemas[name]))
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    """List the bundled model catalog."""
    from .catalog import bundled_catalog

    cat = bundled_catalog()
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in cat.models], indent=2))
        return EXIT_OK
    print(f"{'id':44} {'api':18} {'context':>9} {'input':>9} {'output':>8}  cache")
    for m in cat.models:
        inp = f"{m.limits.input:,}" if m.limits.input else "-"
        print(
            f"{m.id:44} {m.api:18} {m.limits.context:>9,} {inp:>9} {m.limits.output:>8,}  "
            f"{m.cache.kind}"
        )
    print(f"{len(cat.models)} models, catalog as of {cat.as_of}", file=sys.stderr)
    return EXIT_OK


def _model(ref: str) -> ModelInfo:
    """A catalog id, or a YAML/JSON file describing a model inline."""
    from .catalog import bundled_catalog, model_from_data

    path = Path(ref)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        from .load import load_yaml_file

        doc = load_yaml_file(path)
        return model_from_data(doc.data, file=str(path))
    return bundled_catalog().get(ref)


def _policy(ref: str | None) -> str:
    """The ``--policy`` given, else ``KILO_RULES_POLICY``, else kilo-default."""
    from .settings import Settings

    return ref or Settings().policy


def _config(pairs: Sequence[str]) -> dict[str, Any]:
    """``config.*`` values: the environment (``KILO_RULES_*``), then ``--config`` pairs."""
    from .settings import Settings

    out: dict[str, Any] = Settings().config()
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--config expects key=value, got {pair!r}")
        name = key if key.startswith("config.") else f"config.{key}"
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the compiled plan of a policy for one model."""
    from .compile import compile_policy

    plan = compile_policy(_policy(args.policy), _model(args.model), config=_config(args.config))
    if args.json:
        print(json.dumps(plan.to_json(), indent=2, ensure_ascii=False))
    else:
        print(plan.describe())
    return EXIT_OK


def _step(args: argparse.Namespace) -> StepInput:
    from .runtime.context import Agent, StepInput, Workspace

    return StepInput(
        agent=Agent(name=args.agent),
        workspace=Workspace(cwd=str(Path(args.cwd).resolve())),
        step=args.step,
        max_steps=args.max_steps,
        provider=args.provider,
    )


def over_window(plan: Plan, result: TurnResult) -> str | None:
    """One line for the user when the request in ``result`` does not fit the context window
    of ``plan``'s model, else None.

    "Fits" is :attr:`TurnResult.fits`: the request's input as the plan's counter measures
    it (system and tools included, no safety factor), plus the output cap sent, within the
    window. Providers refuse a request over it as too long."""
    if result.fits:
        return None
    output = result.model_request.max_tokens or 0
    total = result.input_tokens + output
    out = f"{output:,} output cap" if output else "no output cap"
    cap = next((d for d in result.decisions if d.rule.startswith("cap.")), None)
    reported = cap.inputs.get("reported") if cap is not None else None
    how = (
        "usage reported for the last step"
        if reported == result.input_tokens
        else f"counted with {result.counter}"
    )
    return (
        f"the request does not fit the context window of {plan.model.id}: "
        f"{result.input_tokens:,} input tokens ({how}) + {out} = "
        f"{total:,} > {result.context:,}; {_next_step(result)}"
    )


def _next_step(result: TurnResult) -> str:
    """What the policy does about an oversized request, from its overflow checks."""
    checks = [
        _check_text(d)
        for d in result.decisions
        if d.stage == "guards" and d.rule in ("overflow", "preflight", "window")
    ]
    if result.compaction_needed:
        return f"the policy would compact first ({'; '.join(checks)})"
    why = "; ".join(checks) or "automatic compaction is off"
    return f"the policy would not compact first ({why}): expect the provider to reject it"


_LABELS = {"overflow": "last step used", "preflight": "preflight estimate"}
_WINDOW = {"compact": "overflow.unfit: compact", "send": "overflow.unfit: send"}
_NOT = {">=": "<", ">": "<="}


def _relative(at: str) -> str:
    from .check import relativize

    try:
        file, line, col = at.rsplit(":", 2)
        return str(relativize(Location(file, int(line), int(col))))
    except ValueError:
        return at


def _check_text(d: Decision) -> str:
    where = f" at {_relative(d.at)}" if d.at else ""
    if d.rule == "window":
        if str(d.result) not in _WINDOW:  # e.g. "send: automatic compaction is off"
            return str(d.result).partition(": ")[2]
        return f"{_WINDOW[str(d.result)]}{where}"
    if isinstance(d.result, str):  # e.g. "skipped: mid tool loop"
        return f"{d.rule} {d.result}{where}"
    value = d.inputs.get("count", d.inputs.get("normalized", 0))
    comparison = str(d.inputs.get("comparison", ">="))
    op = comparison if d.result else _NOT.get(comparison, "<")
    return f"{_LABELS[d.rule]} {value:,} {op} limit {d.inputs.get('limit', 0):,}{where}"


def cmd_build(args: argparse.Namespace) -> int:
    """Build the request of the next step of a session."""
    from .compile import compile_policy
    from .explain import explain_turn
    from .importers import read_session

    plan = compile_policy(_policy(args.policy), _model(args.model), config=_config(args.config))
    result = plan.apply(read_session(args.session, run=args.run), _step(args))
    if args.explain and args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    elif args.explain:
        print(explain_turn(result))
    elif args.json:
        print(json.dumps(result.request, indent=2, ensure_ascii=False))
    else:
        print(result.body())
    problem = over_window(plan, result)
    if problem is None:
        return EXIT_OK
    print(f"kilo-rules build: warning: {problem}", file=sys.stderr)
    return EXIT_OVER_WINDOW if args.strict else EXIT_OK


DEMO_SESSION = Path("examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl")


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the bundled default: check the bundled policies, compile
    kilo-default, build a request for a recorded session and explain every decision."""
    from .check import check_paths
    from .compile import compile_policy
    from .explain import explain_turn
    from .load import resource_root

    report = check_paths([str(resource_root())])
    _print_diagnostics(report.diagnostics, "text", report.sources, sys.stdout)
    print(
        f"== check: bundled policies and catalog: {len(report.files)} file(s), "
        f"{len(report.errors)} error(s)"
    )
    if report.exit_code:
        return report.exit_code
    plan = compile_policy("kilo-default", _model(args.model))
    print("\n== plan")
    print(plan.describe())
    session_ref = args.session or str(DEMO_SESSION)
    if not Path(session_ref).is_file():
        print(f"\n(no example session at {session_ref}; pass --session FILE)")
        return EXIT_OK
    from .importers import read_session

    session = read_session(session_ref)
    print(f"\n== build: next step of {session_ref} ({len(session.messages)} messages)")
    result = plan.apply(session, _step(args))
    print(explain_turn(result))
    return EXIT_OK


def _add_build_args(p: argparse.ArgumentParser) -> None:
    apis = ["anthropic", "openai", "bedrock", "gemini", "openai-compatible"]
    p.add_argument("--provider", choices=apis, help="wire format (default: the model's)")
    p.add_argument("--agent", default="code", help="agent (mode) name")
    p.add_argument("--cwd", default=".", help="working directory of the agent")
    p.add_argument("--step", type=int, default=1, help="step number in the turn")
    p.add_argument("--max-steps", type=int, default=None, help="the agent's step limit")
    p.add_argument("--run", type=int, default=None, help="run number in multi-run logs")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="kilo-rules",
        description="Context policies as code: check, compile and apply YAML policies.",
    )
    parser.add_argument("--version", action="version", version=f"kilo-rules {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check", help="validate policy and catalog files (for CI)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, directories or globs")
    p.add_argument("--format", choices=["text", "json", "github"], default="text")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("schema", help="print, write or verify the JSON Schemas")
    p.add_argument("name", nargs="?", default="policy", help="policy, session or catalog")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="regenerate schemas/*.json")
    g.add_argument("--check", action="store_true", help="fail if schemas/*.json are stale")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("models", help="list the bundled model catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("plan", help="print the compiled plan of a policy for one model")
    p.add_argument("--policy", default=None, help="bundled name or path (KILO_RULES_POLICY)")
    p.add_argument("--model", required=True, help="catalog id or a model file")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config.* values, e.g. output_token_max=8000",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("build", help="build the request for the next step of a session")
    p.add_argument("--policy", default=None, help="bundled name or path (KILO_RULES_POLICY)")
    p.add_argument("--model", required=True, help="catalog id or a model file")
    p.add_argument("--session", required=True, help="Session v1 JSON or a recorded log")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--explain", action="store_true", help="show the decisions")
    p.add_argument("--json", action="store_true", help="pretty JSON (with --explain: all)")
    p.add_argument(
        "--strict",
        action="store_true",
        help=f"exit {EXIT_OVER_WINDOW} when the request does not fit the context window",
    )
    _add_build_args(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("demo", help="check, compile and build on the bundled default")
    p.add_argument("--model", default="anthropic/claude-sonnet-4-5")
    p.add_argument("--session", default=None, help="session to build for")
    _add_build_args(p)
    p.set_defaults(func=cmd_demo)

    from . import cli_simulate
    from .importers import cli as import_cli

    p = sub.add_parser("import", help="import a recorded agent log into Session v1")
    import_cli.add_arguments(p)
    p.set_defaults(func=import_cli.run)

    p = sub.add_parser("simulate", help="replay a recorded session under policies; compare cost")
    cli_simulate.add_arguments(p)
    p.set_defaults(func=cli_simulate.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help / usage errors
        return int(exc.code or 0) if exc.code in (0, None) else EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return guarded(lambda: int(args.func(args)))


def guarded(action: Callable[[], int], prog: str = "kilo-rules") -> int:
    """Run ``action``, turning each failure class into its exit code and a message."""
    try:
        return action()
    except KiloRulesError as exc:
        print(render_text(exc.diagnostics), file=sys.stderr)
        return EXIT_DIAGNOSTICS
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{prog}: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # pragma: no cover
        return 130
