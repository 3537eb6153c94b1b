"""System prompt assembly (spec §9): layers in the policy's order, assembled into blocks,
then the policy's system transforms (Kilo's plugin hook, :mod:`kilo_rules.engine.base.plugins`) and
Kilo's collapse of what they leave.

Instruction files are discovered as Kilo does: the first global file that exists; in the
project, the nearest file of the first name found walking up from the working directory
(ancestors are not stacked); configured globs; URLs fetched through
:mod:`kilo_rules.engine.base.net` (total deadline, size cap, address and redirect rules) and cached
for ``url_ttl_seconds``, where a failure leaves the layer empty and records a warning.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import NetworkError
from kilo_rules.engine.base.net import NetClient, UrlCache, network_settings
from kilo_rules.engine.base.plugins import (
    SystemTransform,
    SystemTransformContext,
    TransformLoadError,
    find_system_transform,
)
from kilo_rules.engine.compiler.plan import LayerPlan
from kilo_rules.engine.formats.policy import Instructions
from kilo_rules.engine.frontend.checks import MAX_FILE_BYTES, instruction_path_problem
from kilo_rules.engine.runtime.context import StepInput, Workspace

if TYPE_CHECKING:
    from kilo_rules.engine.formats.session import Message
    from kilo_rules.engine.runtime.trace import StepRun

SKILLS_INTRO = (
    "Skills provide specialised instructions for particular tasks.\n"
    "Load a skill with the skill tool when the task matches its description."
)


def _expand(path: str, ws: Workspace) -> Path:
    if path.startswith("~"):
        home = Path(ws.home) if ws.home else Path.home()
        return home / path[2:] if path.startswith("~/") else home
    return Path(path)


@dataclass(frozen=True, slots=True)
class InstructionFile:
    """A local instruction file discovery found: its real path, and the directory it must
    still lie under when it is read (the home, the directory it was found in, or the
    workspace)."""

    path: Path
    root: Path


def find_up(name: str, start: Path, stop: Path | None) -> Path | None:
    """The nearest ``name`` in ``start`` or its ancestors, not above ``stop`` (nothing when
    ``start`` is not under ``stop``)."""
    limit = os.path.realpath(stop) if stop else None
    return _find_up(name, os.path.realpath(start), limit)


def _find_up(name: str, current: str, limit: str | None) -> Path | None:
    # Strings, not Paths: discovery runs every step, and this is most of its cost.
    if limit is not None and current != limit and not current.startswith(_dir(limit)):
        return None
    while True:
        candidate = os.path.join(current, name)  # noqa: PTH118
        if os.path.isfile(candidate):  # noqa: PTH113 - False, not an OSError, for any bad name
            return Path(candidate)
        parent = os.path.dirname(current)  # noqa: PTH120
        if current == limit or parent == current:
            return None
        current = parent


def _dir(path: str) -> str:
    return path if path.endswith(os.sep) else path + os.sep


def _vet(path: Path, root: Path) -> tuple[InstructionFile | None, str | None]:
    """(``path`` as an instruction file if it may be read, else the reason it may not):
    under ``root`` once symlinks are resolved, opened without following one
    (:func:`kilo_rules.engine.base.safefs.open_beneath`), regular, within the cap."""
    try:
        real, fd = safefs.open_beneath(root, path)
    except safefs.ReadRefused as exc:
        return None, str(exc)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        return None, f"{path}: not a regular file; not read"
    if st.st_size > MAX_FILE_BYTES:
        return None, f"{path}: {st.st_size:,} bytes, over the {MAX_FILE_BYTES:,}-byte cap; not read"
    return InstructionFile(Path(real), Path(os.path.realpath(root))), None


def discover_instruction_files(
    settings: Instructions, ws: Workspace
) -> tuple[list[InstructionFile], list[str]]:
    """(local instruction files in the order they are sent, why other candidates were left
    out). Kilo's discovery, confined: the first global file that exists, under the user's
    home; the nearest file of the first project name found walking up from the working
    directory, inside the directory it was found in; glob matches inside the workspace,
    found without following a directory symlink and within ``glob_max_entries`` and
    ``glob_timeout_seconds`` (a glob cut short says so, and keeps what it found).
    Names that are not relative (``/etc/x``, ``../x``) are never looked up: ``check``
    refuses them in a policy, and here they are skipped with a reason."""
    found: list[InstructionFile] = []
    skipped: list[str] = []
    bad = [k for k in ("cwd", "root", "home") if "\x00" in (getattr(ws, k) or "")]
    if bad:  # no file can have that name: nothing is looked up, and the trace says why
        return [], [f"workspace {', '.join(bad)} holds a NUL byte; no instruction file read"]
    home = Path(ws.home) if ws.home else Path.home()
    for g in settings.global_files:
        if why := instruction_path_problem("global_files", g):
            skipped.append(f"global file {g!r} {why}")
            continue
        p = _expand(g, ws)
        if os.path.lexists(p):
            hit, why = _vet(p, home)
            if hit is not None:
                found.append(hit)
                break
            skipped.append(str(why))
    cwd = Path(ws.cwd)
    root = Path(ws.root) if ws.root else None
    real_cwd = os.path.realpath(cwd) if settings.project_files else ""
    real_root = os.path.realpath(root) if root else None
    for name in settings.project_files:
        if why := instruction_path_problem("project_files", name):
            skipped.append(f"project file {name!r} {why}")
            continue
        at = _find_up(name, real_cwd, real_root)
        if at is not None:
            hit, why = _vet(at, at.parent)
            if hit is not None:
                found.append(hit)
                break
            skipped.append(str(why))
    workspace = root or cwd
    for pattern in settings.globs:
        if why := instruction_path_problem("globs", pattern):
            skipped.append(f"glob {pattern!r} {why}")
            continue
        walked = safefs.glob_beneath(
            cwd,
            pattern,
            max_entries=settings.glob_max_entries,
            max_seconds=settings.glob_timeout_seconds,
        )
        for m in walked.matches:
            if os.path.isdir(m):  # noqa: PTH112 - a glob also matches directories
                continue
            hit, why = _vet(Path(m), workspace)
            if hit is not None:
                found.append(hit)
            else:
                skipped.append(str(why))
        if walked.cut is not None:
            skipped.append(
                f"glob {pattern!r} {walked.cut} (system.instructions.glob_max_entries, "
                f"glob_timeout_seconds); the {len(walked.matches):,} matches found before are used"
            )
    return list(dict.fromkeys(found)), skipped


def instruction_files(settings: Instructions, ws: Workspace) -> list[Path]:
    """Local instruction files, in the order they are sent (see
    :func:`discover_instruction_files`; the candidates it leaves out are not read)."""
    return [f.path for f in discover_instruction_files(settings, ws)[0]]


def read_instruction_file(file: InstructionFile) -> str:
    """The text of a discovered instruction file, opened again beneath its root without
    following a symlink (a file or directory swapped since discovery is refused, a FIFO or
    device put in its place is refused, not waited on) and read to at most the cap.
    Raises :class:`OSError` (:class:`kilo_rules.engine.base.safefs.ReadRefused`) or
    :class:`UnicodeDecodeError` with the reason."""
    _, data = safefs.read_beneath(file.root, file.path, max_bytes=MAX_FILE_BYTES)
    return data.decode("utf-8")


#: Instruction texts by (fetcher, URL, deadline, cap), kept ``url_ttl_seconds``; a failure
#: is kept for at most NEGATIVE_TTL_SECONDS, so that a URL that hangs or fails costs one
#: deadline per half minute rather than one per step.
NEGATIVE_TTL_SECONDS = 30.0
URL_CACHE: UrlCache[str] = UrlCache(256, negative_ttl=NEGATIVE_TTL_SECONDS)


def fetch_url(url: str, timeout: float, max_bytes: int) -> str:
    """GET an instruction URL under the network policy in force (``net.use_network``):
    ``timeout`` is the total deadline of the call and ``max_bytes`` the size cap, on the
    wire and decoded. Raises :class:`~kilo_rules.engine.base.errors.NetworkError`."""
    return NetClient(network_settings()).get_text(url, deadline=timeout, max_bytes=max_bytes)


def instructions_text(
    settings: Instructions, step: StepInput, files: Sequence[InstructionFile] | None = None
) -> tuple[str, list[str], list[dict[str, Any]]]:
    """(layer text, loaded paths, decisions) of the instruction layer; ``files`` are the
    local instruction files when the caller has already looked them up."""
    parts: list[str] = []
    loaded: list[str] = []
    decisions: list[dict[str, Any]] = []
    if files is None:
        files = discover_instruction_files(settings, step.workspace)[0]
    for file in files:
        try:
            parts.append(f"Instructions from: {file.path}\n{read_instruction_file(file)}")
            loaded.append(str(file.path))
        except (OSError, UnicodeDecodeError) as exc:
            decisions.append({"rule": "instructions.file", "warning": f"{file.path}: {exc}"})
    fetch = step.fetch or fetch_url
    timeout, cap = settings.url_timeout_seconds, settings.url_max_bytes
    for url in settings.urls:
        try:
            text = URL_CACHE.get(
                (fetch, url, timeout, cap),
                settings.url_ttl_seconds,
                functools.partial(fetch, url, timeout, cap),
            )
        except NetworkError as exc:
            d = exc.diagnostic
            decisions.append(
                {"rule": "instructions.url", "url": url, "warning": d.message, "code": d.code}
            )
            continue
        except Exception as exc:  # an injected fetcher may raise anything
            decisions.append({"rule": "instructions.url", "url": url, "warning": str(exc)})
            continue
        parts.append(f"Instructions from: {url}\n{text}")
        loaded.append(url)
    if loaded:
        decisions.append({"rule": "instructions", "loaded": loaded})
    return "\n".join(parts), loaded, decisions


def skills_text(step: StepInput) -> str:
    """The skills list: intro lines plus every described skill, sorted by name."""
    if not step.agent.skills_enabled:
        return ""
    described = sorted((s for s in step.agent.skills if s.description), key=lambda s: s.name)
    if not described:
        return ""
    lines = [SKILLS_INTRO, "<available_skills>"]
    lines.extend(f"- {s.name}: {s.description}" for s in described)
    lines.append("</available_skills>")
    return "\n".join(lines)


def static_environment(fields: Sequence[str], ws: Workspace) -> str:
    """The static environment block of the system prompt."""
    lines = []
    for f in fields:
        if f == "working_directory":
            lines.append(f"  Working directory: {ws.cwd}")
        elif f == "workspace_root":
            lines.append(f"  Workspace root: {ws.root or ws.cwd}")
        elif f == "is_git_repo":
            lines.append(f"  Is directory a git repo: {'yes' if ws.is_git_repo else 'no'}")
        elif f == "platform":
            lines.append(f"  Platform: {ws.platform}")
        elif f == "shell" and ws.shell:
            lines.append(f"  Shell: {ws.shell}")
    if not lines:
        return ""
    body = "\n".join(lines)
    intro = "Here is some useful information about the environment you are running in:"
    return f"{intro}\n<env>\n{body}\n</env>"


def layer_texts(
    layers: Sequence[LayerPlan],
    step: StepInput,
    context: dict[str, Any],
    *,
    env_fields: Sequence[str],
    instructions: Instructions,
    user_system: str | None,
    files: Sequence[InstructionFile] | None = None,
) -> Iterator[tuple[LayerPlan, str, list[dict[str, Any]]]]:
    """(layer, text, decisions) for every layer whose condition holds."""
    for layer in layers:
        if layer.condition is not None and not layer.condition(context):
            continue
        decisions: list[dict[str, Any]] = []
        if layer.source in ("file", "text", "soul", "family"):
            text = layer.text or ""
        elif layer.source == "agent":
            text = step.agent.prompt or ""
        elif layer.source == "environment":
            text = static_environment(env_fields, step.workspace)
        elif layer.source == "instructions":
            text, _, decisions = instructions_text(instructions, step, files)
        elif layer.source == "skills":
            text = skills_text(step)
        elif layer.source == "user":
            text = user_system or ""
        else:  # pragma: no cover - the schema admits no other source
            text = ""
        yield layer, text, decisions


def assemble(
    texts: Sequence[tuple[str, str]],
    *,
    blocks: int,
    separator: str,
    collapse: Literal["header-rest", "join"] = "header-rest",
) -> list[str]:
    """Join the (layer id, text) pairs into system blocks; empty texts are dropped.

    One block by default (Kilo). With ``blocks: k`` and ``header-rest``, the first k−1
    layers keep their own blocks and the rest are joined into the last one; ``join``
    makes one block whatever ``blocks`` says."""
    nonempty = [t for _, t in texts if t.strip()]
    if not nonempty:
        return []
    if blocks <= 1 or collapse == "join":
        return [separator.join(nonempty)]
    head = nonempty[: blocks - 1]
    rest = nonempty[blocks - 1 :]
    return head + ([separator.join(rest)] if rest else [])


def step_instructions(r: StepRun) -> tuple[Instructions, list[InstructionFile]]:
    """The instruction settings and local instruction files of this step, looked up on
    the filesystem once (lowering and system assembly both need them)."""
    hit: tuple[Instructions, list[InstructionFile]] | None = r.cached.get("instructions")
    if hit is None:
        settings = r.plan.settings.system.instructions
        files, skipped = discover_instruction_files(settings, r.step.workspace)
        for why in skipped:
            r.decide(
                "system",
                "instructions.file",
                "system.instructions",
                {},
                {"warning": why},
                "warning",
            )
        hit = (settings, files)
        r.cached["instructions"] = hit
    return hit


def kilo_collapse(system: Sequence[str], header: str | None, separator: str) -> list[str]:
    """Kilo's rule after the plugin hook (``request.ts@0361076:90-94``): more than 2 blocks
    whose first is still the original ``header`` become ``[header, the rest joined]``; a
    changed header (or 2 blocks or fewer) leaves the blocks as they are."""
    if len(system) > 2 and header is not None and system[0] == header:
        return [system[0], separator.join(system[1:])]
    return list(system)


def _not_blocks(value: Any) -> str | None:
    """What is wrong with a transform's result as system blocks, or None."""
    if not isinstance(value, list | tuple):
        return f"gave {type(value).__name__}, not a list of strings"
    bad = [b for b in value if not isinstance(b, str)]
    if bad:
        return f"gave a list holding {type(bad[0]).__name__}, not only strings"
    return None


def transform_system(
    system: Sequence[str],
    names: Sequence[str],
    context: SystemTransformContext,
    find: Callable[[str], SystemTransform | None] = find_system_transform,
) -> tuple[list[str], list[dict[str, Any]]]:
    """(blocks, one decision per transform): the ``names`` run in order on ``system``.

    Each transform gets a copy of the blocks so far, so that one that fails (unknown, not
    loadable, raising, or returning something other than a list of strings) leaves them as
    they were: its decision carries a warning and the next transform runs as if it had not
    been named. A failing plugin must never fail the step it was meant to adjust."""
    current = list(system)
    decisions: list[dict[str, Any]] = []
    for name in names:
        before = current
        inputs = {"name": name, "blocks": len(before)}
        problem: str | None = None
        try:
            fn = find(name)
            if fn is None:
                problem = f"no system transform named {name!r} is registered or installed"
            else:
                work = list(before)
                returned = fn(work, context)
                value = work if returned is None else returned
                if (why := _not_blocks(value)) is not None:
                    problem = f"transform {name!r} {why}"
                else:
                    current = list(value)
        except TransformLoadError as exc:
            problem = str(exc)
        except Exception as exc:  # a plugin may raise anything
            problem = f"transform {name!r} failed: {type(exc).__name__}: {exc}"
        if problem is not None:
            result: dict[str, Any] = {"warning": f"{problem}; the system prompt is unchanged"}
        else:
            header = "changed" if current[:1] != before[:1] else "kept"
            result = {"blocks": len(current), "chars": [len(b) for b in current], "header": header}
        decisions.append({"inputs": inputs, "result": result})
    return current, decisions


def transform_context(r: StepRun) -> SystemTransformContext:
    """What the system transforms of this step are told about its request."""
    m = r.plan.model
    return SystemTransformContext(
        model_id=m.id,
        provider=m.provider,
        family=m.family,
        api_id=m.api_id,
        agent=r.step.agent.name,
        session_id=r.session.id,
        step=r.step.step,
    )


def build_system(r: StepRun, view: Sequence[Message], ctx: dict[str, Any]) -> list[str]:
    """The system blocks of this step (spec §9.1): the layers whose condition holds,
    assembled into ``system.blocks``, then the ``system.transforms`` in order, then the
    ``system.collapse`` rule. Every step of it is a ``system`` decision."""
    plan = r.plan
    settings, files = step_instructions(r)
    last_user = next((m for m in reversed(view) if m.role == "user"), None)
    texts: list[tuple[str, str]] = []
    replaced: set[str] = set()
    produced = list(
        layer_texts(
            plan.layers,
            r.step,
            ctx,
            env_fields=plan.settings.environment.static,
            instructions=settings,
            user_system=last_user.system if last_user else None,
            files=files,
        )
    )
    for layer, text, _ in produced:
        if layer.replaces and text.strip():
            replaced.add(layer.replaces)
    for layer, text, ds in produced:
        for d in ds:
            warn = "warning" in d
            r.decide(
                "system",
                str(d.pop("rule")),
                "system.instructions",
                {},
                d,
                "warning" if warn else "info",
            )
        if layer.id in replaced:
            continue
        texts.append((layer.id, text))
    sys = plan.settings.system
    blocks = assemble(texts, blocks=sys.blocks, separator=sys.separator)
    r.decide(
        "system",
        "layers",
        "system.layers",
        {"layers": [i for i, t in texts if t.strip()]},
        {
            "blocks": len(blocks),
            "chars": [len(b) for b in blocks],
            "family_prompt": plan.prompt.rule if plan.prompt else None,
        },
    )
    return _transform_and_collapse(r, blocks)


def _transform_and_collapse(r: StepRun, blocks: list[str]) -> list[str]:
    sys = r.plan.settings.system
    header = blocks[0] if blocks else None
    if sys.transforms:
        blocks, decisions = transform_system(blocks, sys.transforms, transform_context(r))
        for d in decisions:
            warn = "warning" in d["result"]
            r.decide(
                "system",
                "transform",
                "system.transforms",
                d["inputs"],
                d["result"],
                "warning" if warn else "info",
            )
    elif len(blocks) <= 2:
        return blocks  # nothing a transform added, nothing Kilo's rule would collapse
    kept = "kept" if blocks[:1] == ([header] if header is not None else []) else "changed"
    collapsed = kilo_collapse(blocks, header, sys.separator) if sys.collapse == "kilo" else blocks
    # No wire sends a blank block (providers refuse it), and a transform may push one.
    sent = [b for b in collapsed if b.strip()]
    result: dict[str, Any] = {"blocks": len(sent)}
    if len(sent) < len(collapsed):
        result["dropped_blank"] = len(collapsed) - len(sent)
    r.decide(
        "system",
        "collapse",
        "system.collapse",
        {"rule": sys.collapse, "blocks": len(blocks), "header": kept},
        result,
    )
    return sent
