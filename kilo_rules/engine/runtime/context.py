"""What the agent tells the runtime about one step: who answers, where, which step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Skill:
    """A skill the agent can load; listed in the system prompt when it has a description."""

    name: str
    description: str | None = None


@dataclass(frozen=True, slots=True)
class Agent:
    """The agent (mode) answering this step."""

    name: str = "code"
    prompt: str | None = None  # replaces the family prompt when set
    skills_enabled: bool = True
    task_enabled: bool = True
    skills: tuple[Skill, ...] = ()


@dataclass(frozen=True, slots=True)
class Workspace:
    """Where the agent runs. Paths are strings so that a plan can be applied for a remote
    workspace too; instruction discovery reads the local filesystem."""

    cwd: str = "."
    root: str | None = None  # the worktree root; find-up stops there
    platform: str = "linux"
    is_git_repo: bool = False
    shell: str | None = None
    open_files: tuple[str, ...] = ()
    visible_files: tuple[str, ...] = ()
    home: str | None = None  # for ~ in global instruction paths (default: the user's home)


#: Fetches an instruction URL: returns the text, or raises to record a warning.
Fetcher = Callable[[str, float, int], str]


@dataclass(frozen=True, slots=True)
class StepInput:
    """Per-step inputs of ``apply_plan``."""

    agent: Agent = field(default_factory=Agent)
    workspace: Workspace = field(default_factory=Workspace)
    step: int = 1
    max_steps: int | None = None
    previous_agent: str | None = None  # agent of the previous assistant message
    # Provider-side automatic caching (Anthropic's top-level cache_control): sent, and no
    # explicit breakpoints added under respect_automatic; options["automatic_cache"] = "1h"
    # does the same with the one-hour bucket.
    automatic_caching: bool = False
    provider: str | None = None  # wire format to render; default: the model's api
    fetch: Fetcher | None = None  # instruction URLs; default: httpx with the policy's limits
    options: dict[str, Any] = field(default_factory=dict)  # passed through to the request
