"""The options several commands share, declared once, and what they resolve to.

Each ``add_*`` function declares one option (or one group) on a command's parser; the
functions below them turn the parsed strings into what the library takes: a model, a
policy reference, ``config.*`` values, a :class:`StepInput`."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog, model_from_data
from kilo_rules.engine.formats.load import load_yaml_file
from kilo_rules.tools.cli._runner import EPILOG

if TYPE_CHECKING:
    from kilo_rules.engine.runtime.context import StepInput
    from kilo_rules.tools.simulation.fleet import Executor, Progress

#: The subcommands of the ``kilo-rules`` parser, which each command module adds itself to.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

_POLICY_HELP = "bundled name or path (default: KILO_RULES_POLICY, else kilo-default)"


def add_command(
    sub: Subcommands, name: str, *, summary: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand's parser: ``summary`` in the list of commands, ``description`` atop its
    own ``--help``, the exit codes below it."""
    return sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


#: The ``--format`` choices beyond text and json of a command that reports diagnostics
#: (``kilo_rules.tools.checking.report.render`` writes each).
DIAGNOSTIC_FORMATS = ("github", "sarif", "junit")

#: What :data:`DIAGNOSTIC_FORMATS` give, for the end of ``--format``'s help.
DIAGNOSTIC_FORMATS_HELP = (
    "; github: workflow annotations; sarif: SARIF 2.1.0 for code scanning; junit: JUnit XML"
)


def add_format(parser: argparse.ArgumentParser, *extra: str, what: str = "") -> None:
    """``--format text|json`` (plus ``extra`` choices such as :data:`DIAGNOSTIC_FORMATS`)."""
    parser.add_argument(
        "--format",
        choices=["text", "json", *extra],
        default="text",
        help=f"output format (default: text){what}",
    )


def add_full(parser: argparse.ArgumentParser) -> None:
    """``--full``: show long values whole instead of cut with an ellipsis."""
    parser.add_argument(
        "--full", action="store_true", help="show long values whole (default: cut them short)"
    )


def add_policy(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """``--policy``: one policy, or with ``many`` a repeatable one to compare."""
    if many:
        parser.add_argument(
            "--policy",
            action="append",
            default=[],
            metavar="POLICY",
            help=f"{_POLICY_HELP}; repeat to compare",
        )
    else:
        parser.add_argument("--policy", default=None, metavar="POLICY", help=_POLICY_HELP)


def add_model(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    """``--model``: a catalog id or a model file; required unless there is a default."""
    parser.add_argument(
        "--model",
        required=default is None,
        default=default,
        metavar="MODEL",
        help="catalog id or a YAML/JSON model file" + (f" (default: {default})" if default else ""),
    )


def add_session(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--session`` and ``--run``: a Session v1 file or a recorded log, and which run."""
    parser.add_argument(
        "--session",
        required=required,
        default=None,
        metavar="FILE",
        help="Session v1 JSON or a recorded agent log (see docs/cli.md)",
    )
    add_run(parser)


def add_run(parser: argparse.ArgumentParser) -> None:
    """``--run N``: one run of a multi-run log."""
    parser.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="N",
        help="which run of a multi-run log (OpenHands output.jsonl), 0-based",
    )


def add_config(parser: argparse.ArgumentParser) -> None:
    """``--config KEY=VALUE``, repeatable."""
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config.* value, e.g. output_token_max=8000 (repeatable; wins over KILO_RULES_*)",
    )


def add_step(parser: argparse.ArgumentParser) -> None:
    """What the agent is doing at the step built: wire format, agent, cwd, step numbers."""
    group = parser.add_argument_group("the step")
    group.add_argument(
        "--provider", choices=sorted(wireapi.names()), help="wire format (default: the model's)"
    )
    group.add_argument("--agent", default="code", help="agent (mode) name (default: code)")
    group.add_argument("--cwd", default=".", help="working directory of the agent")
    group.add_argument("--step", type=int, default=1, help="step number in the turn")
    group.add_argument("--max-steps", type=int, default=None, help="the agent's step limit")


def model(ref: str) -> ModelInfo:
    """A catalog id, or a YAML/JSON file describing a model inline."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        return model_from_data(load_yaml_file(path).data, file=str(path))
    return bundled_catalog().get(ref)


def settings_in_environment() -> bool:
    """Whether any environment variable may be a setting: its name starts with ``KILO_``
    (the settings read ``KILO_RULES_*``, ``KILO_RULES_NET_*`` and Kilo's own
    ``KILO_DISABLE_*``), in any case, as pydantic-settings compares names.

    Without one, the settings are their defaults, so a command that only needs them to
    start (``check``) does not load pydantic-settings, nor the asyncio, ssl and dotenv it
    imports, to read an environment that sets nothing."""
    return any(name.lower().startswith("kilo_") for name in os.environ)


def policy(ref: str | None) -> str:
    """The ``--policy`` given, else ``KILO_RULES_POLICY``, else kilo-default."""
    from kilo_rules.engine.base.settings import Settings

    return ref or Settings().policy


def policies(refs: Sequence[str]) -> list[str]:
    """The repeated ``--policy`` values, else the one default of :func:`policy`."""
    return list(refs) or [policy(None)]


def config(pairs: Sequence[str]) -> dict[str, Any]:
    """``config.*`` values: the environment (``KILO_RULES_*``), then ``--config`` pairs,
    each checked against its setting's type and range (a bad one exits 2)."""
    from kilo_rules.engine.base.settings import Settings, parse_config

    return {**Settings().config(), **parse_config(pairs)}


def add_allow_read(parser: argparse.ArgumentParser) -> None:
    """``--allow-read DIR``, repeatable: one more directory policies may read files under."""
    parser.add_argument(
        "--allow-read",
        action="append",
        default=[],
        metavar="DIR",
        help="let policies read files under DIR too (repeatable; adds to KILO_RULES_READ_ROOTS; "
        "by default a policy reads only under its own directory and the bundled policies)",
    )


def read_roots(args: argparse.Namespace) -> list[Path]:
    """The directories ``KILO_RULES_READ_ROOTS`` and ``--allow-read`` add (each must be an
    existing directory: a typo would otherwise widen nothing, silently)."""
    if not hasattr(args, "allow_read"):  # a command that reads no policy
        return []
    named = [*_environment_read_roots(), *args.allow_read]
    roots = []
    for raw in named:
        path = Path(raw).expanduser()
        if not path.is_dir():
            raise ValueError(f"--allow-read / KILO_RULES_READ_ROOTS: {raw!r} is not a directory")
        roots.append(path)
    return roots


def _environment_read_roots() -> tuple[str, ...]:
    """``KILO_RULES_READ_ROOTS`` (its variable read, and every other setting checked, only
    when the environment holds one: :func:`settings_in_environment`)."""
    if not settings_in_environment():
        return ()
    from kilo_rules.engine.base.settings import Settings

    return Settings().read_roots


def step(args: argparse.Namespace) -> StepInput:
    """The step described by :func:`add_step`'s options."""
    from kilo_rules.engine.runtime.context import Agent, StepInput, Workspace

    return StepInput(
        agent=Agent(name=args.agent),
        workspace=Workspace(cwd=str(Path(args.cwd).resolve())),
        step=args.step,
        max_steps=args.max_steps,
        provider=args.provider,
    )


def add_corpus(parser: argparse.ArgumentParser, *, title: str) -> argparse._ArgumentGroup:
    """The options of a command that replays many sessions at once, in a group titled
    ``title``: ``--jobs``, ``--executor``, ``--scheduler`` and ``--no-progress``
    (:func:`corpus_run` resolves them). Returns the group, for the command's own options."""
    group = parser.add_argument_group(title)
    group.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="sessions replayed at once (default: every core)",
    )
    group.add_argument(
        "--executor",
        choices=("process", "dask", "serial"),
        default=None,
        help="local processes (default), a Dask cluster (the distributed extra), or serial",
    )
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a running Dask scheduler (tcp://host:8786); implies --executor dask",
    )
    group.add_argument(
        "--no-progress", action="store_true", help="no progress on stderr for many sessions"
    )
    return group


class CorpusRun(TypedDict):
    """How :func:`~kilo_rules.tools.simulation.fleet.run_corpus` runs, as its keyword arguments."""

    executor: Executor
    workers: int
    scheduler: str | None
    progress: Progress | None


def check_jobs(args: argparse.Namespace) -> None:
    """Refuse a ``--jobs`` outside 1..256."""
    if args.jobs is not None and not 1 <= args.jobs <= 256:
        raise ValueError("--jobs must be within 1..256")


@contextlib.contextmanager
def corpus_run(args: argparse.Namespace, total: int) -> Iterator[CorpusRun]:
    """:func:`add_corpus`'s options for a run of ``total`` sessions, while the block runs:
    the executor (``--scheduler`` implies Dask), the workers (default: one per session up
    to the CPUs) and, unless ``--no-progress``, the progress shown on stderr."""
    from kilo_rules.tools.simulation.fleet import progress_reporter

    check_jobs(args)
    with contextlib.ExitStack() as stack:
        yield CorpusRun(
            executor="dask" if args.scheduler else (args.executor or "process"),
            workers=args.jobs or min(total, os.cpu_count() or 1),
            scheduler=args.scheduler,
            progress=None if args.no_progress else stack.enter_context(progress_reporter(total)),
        )
