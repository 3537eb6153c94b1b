"""kilo-rules: context policies as code.

Compile a YAML policy for a model, then apply the plan to a session at every step::

    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    result = plan.apply(session, StepInput(step=1))
    result.request      # the provider's wire JSON
    result.decisions    # why, rule by rule, with policy locations
    result.mutations    # what to persist
"""

from __future__ import annotations

from .catalog import Catalog, ModelInfo, bundled_catalog, model_from_data
from .check import CheckReport, check_paths
from .compile import compile_policy
from .errors import (
    CatalogError,
    ContextOverflowError,
    Diagnostic,
    EvalError,
    ExprError,
    ImportFormatError,
    KiloRulesError,
    Location,
    PolicyError,
    SessionError,
)
from .importers import detect_format, import_file, read_session
from .plan import Plan
from .providers.acceptance import BodyContext, Violation, check_body
from .resolve import ResolvedPolicy, bundled_policy_names, resolve_policy
from .runtime.apply import Decision, TurnResult
from .runtime.compaction import CompactionResult, compact
from .runtime.context import Agent, Skill, StepInput, Workspace
from .runtime.facade import Runtime, StepResult
from .runtime.mutations import MutationError, apply_mutations
from .session import (
    Message,
    Session,
    dump_session,
    load_session,
    session_from_data,
    session_from_json,
)
from .simulate import SimulationReport, simulate
from .summarize import Summarizer, SummarizerError, SummaryRequest
from .summarizers import ExtractiveSummarizer, HttpSummarizer
from .truncate import cleanup_spill_dir, truncate_output

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "BodyContext",
    "Catalog",
    "CatalogError",
    "CheckReport",
    "CompactionResult",
    "ContextOverflowError",
    "Decision",
    "Diagnostic",
    "EvalError",
    "ExprError",
    "ExtractiveSummarizer",
    "HttpSummarizer",
    "ImportFormatError",
    "KiloRulesError",
    "Location",
    "Message",
    "ModelInfo",
    "MutationError",
    "Plan",
    "PolicyError",
    "ResolvedPolicy",
    "Runtime",
    "Session",
    "SessionError",
    "SimulationReport",
    "Skill",
    "StepInput",
    "StepResult",
    "Summarizer",
    "SummarizerError",
    "SummaryRequest",
    "TurnResult",
    "Violation",
    "Workspace",
    "__version__",
    "apply_mutations",
    "bundled_catalog",
    "bundled_policy_names",
    "check_body",
    "check_paths",
    "cleanup_spill_dir",
    "compact",
    "compile_policy",
    "detect_format",
    "dump_session",
    "import_file",
    "load_session",
    "model_from_data",
    "read_session",
    "resolve_policy",
    "session_from_data",
    "session_from_json",
    "simulate",
    "truncate_output",
]
