"""The format of policy test files (``*.test.yaml``, version 1), as typed models.

``schemas/policytest.v1.json`` is generated from these models (``kilo-rules schema
--write``); :mod:`kilo_rules.tools.checking.policytest` validates test files against that schema,
with located errors, then reads them through these models and runs them. The models sit low in
the layers so that the schema generator can import them without the engine.
docs/testing-policies.md describes the format with examples.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kilo_rules.engine.formats.catalog import ModelInfo, WireApiName
from kilo_rules.engine.formats.session import Message, ToolDefinition

__all__ = [
    "MAX_CASES",
    "AgentSpec",
    "CaseSpec",
    "DecisionMatch",
    "Expect",
    "InlineSession",
    "Mode",
    "PolicyTestFile",
    "ReplayExpect",
    "RequestCheck",
    "SkillSpec",
    "StepSpec",
    "WorkspaceSpec",
]

#: Most cases one file may hold.
MAX_CASES = 1_000

Mode = Literal["apply", "runtime", "replay"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SkillSpec(_Strict):
    """A skill the agent can load."""

    name: str = Field(description="Skill name.")
    description: str | None = Field(None, description="Listed in the system prompt when set.")


class AgentSpec(_Strict):
    """The agent (mode) answering the step."""

    name: str = Field("code", description="Agent (mode) name, e.g. code, plan.")
    prompt: str | None = Field(None, description="Agent prompt; replaces the family prompt.")
    skills_enabled: bool = Field(True, description="The skill permission is on.")
    task_enabled: bool = Field(True, description="The task tool is on.")
    skills: list[SkillSpec] = Field(default_factory=list, description="Skills offered.")


class WorkspaceSpec(_Strict):
    """Where the agent runs; relative paths start at the test file's directory, and every
    path must stay in the test file's tree (or a directory the operator allows)."""

    cwd: str = Field(
        ".", description="Working directory, in the test file's tree (default: its directory)."
    )
    root: str | None = Field(
        None, description="Worktree root; instruction files are looked up to it (default: cwd)."
    )
    home: str | None = Field(
        None,
        description="Home directory for ~ in global instruction paths, in the test file's "
        "tree (default: .kilo-rules-test-home beside the test file, which normally does not "
        "exist: the real home is never read).",
    )
    platform: str = Field("linux", description="Platform shown in the environment block.")
    is_git_repo: bool = Field(False, description="The workspace is a git repository.")
    open_files: list[str] = Field(default_factory=list, description="Files open in the editor.")
    visible_files: list[str] = Field(default_factory=list, description="Files visible.")


class StepSpec(_Strict):
    """What the agent is doing at the step built (``StepInput``)."""

    step: int = Field(1, ge=1, description="Step number in the turn.")
    max_steps: int | None = Field(None, ge=1, description="The agent's step limit.")
    agent: AgentSpec = Field(default_factory=AgentSpec, description="The agent answering.")
    previous_agent: str | None = Field(None, description="Agent of the previous answer.")
    automatic_caching: bool = Field(False, description="Provider-side automatic caching on.")
    provider: WireApiName | None = Field(None, description="Wire format (default: the model's).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Passed through to the request options."
    )
    workspace: WorkspaceSpec = Field(
        default_factory=WorkspaceSpec, description="Where the agent runs."
    )


class InlineSession(_Strict):
    """A session written in the test file, in Session v1 shape."""

    id: str = Field("policytest", description="Session id.")
    tools: list[ToolDefinition] = Field(default_factory=list, description="Tools offered.")
    messages: list[Message] = Field(description="Messages, oldest first (Session v1).")


class DecisionMatch(_Strict):
    """A decision of the trace: every key given must match (``result``: a mapping matches
    when it holds the keys given with those values)."""

    rule: str = Field(description="The decision's rule, e.g. cap.fits, overflow, kilo.mark.")
    stage: str | None = Field(None, description="The stage, e.g. output, guards, cache.")
    result: Any = Field(None, description="The result, or part of a mapping result.")
    severity: Literal["info", "warning"] | None = Field(None, description="info or warning.")


class RequestCheck(_Strict):
    """A value of the request body, by path, and what it must be (at least one check)."""

    path: str = Field(
        description="Where in the wire JSON: keys by dots, list items by [n] or [-1], "
        "e.g. messages[0].content[-1].text."
    )
    equals: Any = Field(None, description="The value, exactly.")
    contains: Any = Field(
        None,
        description="A substring of a string, an item of a list, or a key/value subset "
        "of a mapping.",
    )
    matches: str | None = Field(None, description="An RE2 pattern the string value matches.")
    exists: bool | None = Field(None, description="Whether the path is there at all.")
    count: int | None = Field(
        None, ge=0, description="Length of the list, mapping or string at the path."
    )


class ReplayExpect(_Strict):
    """What a replay of the whole session did."""

    compactions: int | None = Field(None, ge=0, description="Compactions in the replay.")
    at_steps: list[int] | None = Field(
        None, description="The requests (1-based) before which a compaction ran."
    )
    steps: int | None = Field(None, ge=0, description="Requests built.")


class Expect(_Strict):
    """What the case checks."""

    plan: dict[str, Any] = Field(
        default_factory=dict,
        description="Plan value name (or a setting of the effective policy, or a field of "
        "the plan's JSON) → expected value.",
    )
    decisions: list[DecisionMatch] = Field(
        default_factory=list, description="Decisions that must be in the trace."
    )
    absent: list[DecisionMatch] = Field(
        default_factory=list, description="Decisions that must not be in the trace."
    )
    request: list[RequestCheck] = Field(
        default_factory=list, description="Checks on the request body (wire JSON)."
    )
    compaction_needed: Literal["overflow", "preflight", "window"] | None = Field(
        None, description="What apply says about compaction (null: none needed)."
    )
    replay: ReplayExpect | None = Field(
        None, description="Counts of a replay of the session (implies mode: replay)."
    )
    error: str | None = Field(
        None, description="The diagnostic code the compile or the run must fail with."
    )


class CaseSpec(_Strict):
    """One case: a policy, a model, a session and a step, and what must come out."""

    name: str = Field(min_length=1, description="Case name, unique within the file.")
    policy: str | None = Field(
        None, description="Bundled policy name or a path relative to the test file."
    )
    model: str | ModelInfo | None = Field(
        None, description="Catalog id or an inline model entry (default: the file's)."
    )
    session: str | InlineSession | None = Field(
        None,
        description="A Session v1 file or an agent log (path relative to the test file), "
        "or inline messages; default: one user message.",
    )
    run: int | None = Field(None, ge=0, description="Which run of a multi-run log.")
    step: StepSpec = Field(default_factory=StepSpec, description="The step built.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="config.* values (with or without the prefix)."
    )
    mode: Mode | None = Field(
        None,
        description="apply: one request; runtime: one agent-loop step (prune, compaction); "
        "replay: a step before each assistant message of the session. Default: replay "
        "when expect.replay is given, else apply.",
    )
    expect: Expect = Field(description="What must come out.")


class PolicyTestFile(_Strict):
    """A policy test file (``*.test.yaml``), version 1."""

    version: Literal[1] = Field(description="Format version.")
    policy: str | None = Field(
        None, description="Default policy of the cases: bundled name or path."
    )
    model: str | ModelInfo | None = Field(
        None, description="Default model of the cases: catalog id or an inline entry."
    )
    cases: list[CaseSpec] = Field(
        min_length=1, max_length=MAX_CASES, description="The cases, run in order."
    )
