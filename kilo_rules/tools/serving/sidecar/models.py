"""The sidecar's wire types: what each endpoint takes and returns.

These models are the contract of the HTTP API: the OpenAPI document
(``schemas/openapi.json``) is generated from them, and a test keeps the committed document
in step. Requests are validated against them with every problem reported as a located
:class:`~kilo_rules.engine.base.errors.Diagnostic`; responses are built to match them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kilo_rules.engine.formats.catalog import ModelInfo, WireApiName
from kilo_rules.engine.formats.session import Session

#: The most models one ``/v1/check`` compiles a policy for.
MAX_CHECK_MODELS = 8


class _In(BaseModel):
    """A request object: unknown keys are refused, so that a misspelt field is an error
    rather than silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class SkillIn(_In):
    """A skill the agent can load."""

    name: str = Field(max_length=256, description="Skill name.")
    description: str | None = Field(
        None, description="What the skill does; listed in the system prompt when set."
    )


class AgentIn(_In):
    """The agent (mode) answering the step."""

    name: str = Field("code", max_length=256, description="Agent (mode) name.")
    prompt: str | None = Field(
        None, description="The agent's own prompt; replaces the family prompt when set."
    )
    skills_enabled: bool = Field(True, description="The agent may load skills.")
    task_enabled: bool = Field(True, description="The agent may start sub-tasks.")
    skills: list[SkillIn] = Field(
        default_factory=list, max_length=1000, description="Skills the agent can load."
    )


class WorkspaceIn(_In):
    """Where the agent runs. ``cwd``, ``root`` and ``home`` name directories on the
    sidecar's host, where instruction files (AGENTS.md and friends) are discovered, so they
    are accepted only under a workspace root the operator allows (``--workspace-root``); the
    search for instruction files never goes above that root."""

    cwd: str = Field(".", max_length=4096, description="Working directory of the agent.")
    root: str | None = Field(
        None, max_length=4096, description="Worktree root; instruction find-up stops there."
    )
    platform: str = Field("linux", max_length=64, description="Platform named to the model.")
    is_git_repo: bool = Field(False, description="The workspace is a git repository.")
    shell: str | None = Field(None, max_length=256, description="The agent's shell.")
    open_files: list[str] = Field(
        default_factory=list, max_length=10_000, description="Files open in the editor."
    )
    visible_files: list[str] = Field(
        default_factory=list, max_length=10_000, description="Files visible in the editor."
    )
    home: str | None = Field(
        None, max_length=4096, description="Home directory for ~ in global instruction paths."
    )


class StepIn(_In):
    """What the agent tells the engine about the step built (all optional)."""

    step: int = Field(1, ge=1, description="Step number in the turn (1 = first).")
    max_steps: int | None = Field(None, ge=1, description="The agent's step limit.")
    agent: AgentIn = Field(default_factory=AgentIn, description="The agent answering.")
    previous_agent: str | None = Field(
        None, max_length=256, description="Agent of the previous assistant message."
    )
    workspace: WorkspaceIn | None = Field(
        None,
        description="Where the agent runs; left out, the sidecar's own working directory "
        "(as `kilo-rules build` without --cwd).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Provider options passed through to the request."
    )
    automatic_caching: bool = Field(
        False, description="Ask for the provider's automatic prompt caching (Anthropic)."
    )
    provider: WireApiName | None = Field(
        None, description="Wire format to render (default: the model's)."
    )


class BuildRequest(_In):
    """``POST /v1/build``: the next step of a session, for a model."""

    session: Session = Field(description="The session so far (Session v1).")
    model: str | ModelInfo = Field(
        description="A catalog id (``kilo-rules models``) or a model described inline."
    )
    step: StepIn | None = Field(None, description="The step built (default: step 1).")


class LocationOut(_Out):
    """A position in a source: 1-based line and column."""

    file: str = Field(description="The file, or ``<request>`` for the request body.")
    line: int = Field(description="1-based line.")
    col: int = Field(description="1-based column.")
    end_line: int | None = Field(None, description="Line where the span ends, if known.")
    end_col: int | None = Field(None, description="Column where the span ends, if known.")


class DiagnosticOut(_Out):
    """A located problem: what went wrong, where, and what to do about it."""

    code: str = Field(description="Stable code, e.g. session.invalid, model.unknown.")
    severity: Literal["error", "warning"] = Field(description="error or warning.")
    message: str = Field(description="What is wrong.")
    location: LocationOut = Field(description="Where it is.")
    details: dict[str, Any] | None = Field(
        None, description="Machine-readable facts (the JSON path of the value, a limit, ...)."
    )
    hint: str | None = Field(None, description="What to do about it.")


class ErrorBody(_Out):
    """What went wrong with a request."""

    code: str = Field(
        description="Stable code: request.too-large, request.invalid, session.invalid, "
        "session.empty, acceptance.<rule>, model.unknown, store.not-ready, build.timeout, "
        "internal, ... (docs/serve.md lists them all)"
    )
    message: str = Field(description="One line for people.")
    diagnostics: list[DiagnosticOut] = Field(
        default_factory=list, description="Every located problem found."
    )


class ErrorResponse(_Out):
    """Every error response: a typed body, never a stack trace."""

    error: ErrorBody = Field(description="The error.")


class DecisionOut(_Out):
    """One entry of the decisions trace."""

    stage: str = Field(description="The runtime stage that decided.")
    rule: str = Field(description="The rule that fired, e.g. cap.capped, marker.")
    at: str | None = Field(
        description="file:line:col of the policy setting behind the rule (null for engine steps)."
    )
    inputs: dict[str, Any] | None = Field(None, description="The values the rule read.")
    result: Any = Field(description="What the rule decided.")
    severity: Literal["warning"] | None = Field(
        None, description="Present when the decision is a warning."
    )


class BuildResponse(_Out):
    """The request of the step, the decisions that shaped it, and the revision that built
    it."""

    version: Literal[1] = Field(description="Format version.")
    revision: str = Field(
        description="The policy revision the whole step ran on (one snapshot per step)."
    )
    provider: str = Field(description="Wire format the request is rendered in.")
    request: dict[str, Any] = Field(description="The request body exactly as sent over HTTP.")
    headers: dict[str, str] = Field(
        description="HTTP headers the body needs besides the usual ones (anthropic-beta for "
        "the context edits it asks for); empty for most requests."
    )
    decisions: list[DecisionOut] = Field(description="The decisions, in the order they ran.")
    mutations: list[dict[str, Any]] = Field(
        description="Changes the agent should persist in its session."
    )
    compaction_needed: Literal["overflow", "preflight", "window"] | None = Field(
        description="Set when the policy says this step should compact first."
    )
    input_tokens: int = Field(description="The request's input as the policy's counter counts it.")
    context: int = Field(description="The model's context window in tokens (0: unknown).")
    fits: bool = Field(description="Input plus the output cap sent fit the context window.")
    counter: str = Field(description="The token counter that measured the input.")


class CheckRequest(_In):
    """``POST /v1/check``: a policy and/or a routes file to validate."""

    policy: str | None = Field(
        None, description="A policy file's YAML text (it may extend a bundled policy)."
    )
    routes: str | None = Field(
        None,
        description="A routes.yaml text (model ids to policies); the policy above, if "
        "given, is beside it as policy.yaml.",
    )
    models: list[str] = Field(
        default_factory=list,
        max_length=MAX_CHECK_MODELS,
        description="Catalog ids to also compile the policy for, reporting what would not "
        "work for each (as `kilo-rules check --model`).",
    )


class CheckResponse(_Out):
    """What ``check`` found."""

    ok: bool = Field(description="No error was found (warnings may remain).")
    errors: int = Field(description="Number of diagnostics of severity error.")
    warnings: int = Field(description="Number of diagnostics of severity warning.")
    diagnostics: list[DiagnosticOut] = Field(
        description="Every problem, located in policy.yaml or routes.yaml."
    )


class PlanResponse(_Out):
    """The compiled plan of a model under the current revision."""

    revision: str = Field(description="The policy revision the plan was compiled from.")
    model: str = Field(description="The model's catalog id.")
    plan: dict[str, Any] = Field(
        description="The plan as data (``kilo-rules plan --format json``)."
    )


class HealthResponse(_Out):
    """The process is up."""

    status: Literal["ok"] = Field(description="Always ok.")


class ReadyResponse(_Out):
    """A good revision is loaded and served."""

    status: Literal["ready"] = Field(description="Always ready (else the status is 503).")
    revision: str = Field(description="The revision served.")


class SourceOut(_Out):
    """Where the policy revisions come from."""

    kind: Literal["directory", "bundle", "url", "bundled"] = Field(
        description="A watched directory, a bundle file, a bundle URL, or the policies "
        "shipped with kilo-rules (every model on kilo-default)."
    )
    location: str = Field(
        description="The directory, the bundle file or the URL as configured (<bundled> "
        "for the shipped policies)."
    )


class RejectionOut(_Out):
    """The last revision the store refused."""

    candidate: str | None = Field(
        description="The revision offered (sha256:...), or null when it was refused before "
        "it had one (a bundle whose signature does not verify)."
    )
    reason: str = Field(description="rejected: and the first error, file:line:col: message.")
    first_at: str = Field(description="When it was first refused (ISO 8601, UTC).")
    last_at: str = Field(description="When it was last refused (ISO 8601, UTC).")
    attempts: int = Field(
        description="Reloads that refused it: a watched directory is re-checked and a "
        "bundle may be downloaded again until the files change; it counts as one rejection."
    )
    diagnostics: list[DiagnosticOut] = Field(
        description="Every diagnostic, located in the source: the watched directory's files, "
        "or bundle.tar.gz!/path inside a bundle."
    )


class StoreCountersOut(_Out):
    """The store's counters since the sidecar started."""

    revision: str = Field(description="The revision served (empty while none is).")
    swaps: int = Field(description="Revisions swapped in, the first included.")
    rejected: int = Field(description="Revisions refused, each counted once.")
    reloads: int = Field(description="Reload attempts.")
    last_error: str | None = Field(
        description="The reason of the last attempt when it failed; null once one succeeds."
    )
    unavailable: int = Field(description="Attempts the source could not answer.")


class StatusResponse(_Out):
    """``GET /v1/status``: what the sidecar serves and why it refused what it refused."""

    status: Literal["ready", "not-ready"] = Field(
        description="ready while a revision is served (as /readyz answers 200)."
    )
    ready: bool = Field(description="A revision is served.")
    source: SourceOut = Field(description="Where revisions come from.")
    revision: str | None = Field(description="The revision served, or null.")
    swapped_at: str | None = Field(
        description="When the revision served went in (ISO 8601, UTC), or null."
    )
    checked_at: str | None = Field(
        description="When the source was last reloaded (ISO 8601, UTC), or null."
    )
    reason: str | None = Field(
        description="What the last reload found: new revision, unchanged, not modified (304), "
        "rejected: ..., source unavailable: ..."
    )
    rejection: RejectionOut | None = Field(
        description="The last revision refused, kept after a good one replaced it; null "
        "when none was."
    )
    rejection_pending: bool = Field(
        description="The source still offers a refused revision (no good one since)."
    )
    problems: list[DiagnosticOut] = Field(
        description="While nothing is served, why: the refused revision's diagnostics, or "
        "store.unavailable for a source that cannot be read; empty once a revision serves."
    )
    stats: StoreCountersOut = Field(description="The store's counters.")
