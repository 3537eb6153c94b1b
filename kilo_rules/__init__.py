"""kilo-rules: context policies as code.

Compile a YAML policy for a model once, then ask a :class:`Runtime` for the request of
every step of the agent loop; it compacts when the policy says so::

    from kilo_rules import Runtime, compile_policy, read_session

    runtime = Runtime(compile_policy("kilo-default", "anthropic/claude-sonnet-4-5"))
    session = read_session("session.json")   # Session v1, or any recorded agent log
    result = runtime.step(session)
    result.request      # the provider's wire JSON, to send
    result.decisions    # why, rule by rule, with policy locations
    result.session      # the session with the step's mutations applied, to keep

``apply_plan(plan, session)`` builds one request without compacting and returns the same
:class:`StepResult`. ``docs/getting-started.md`` walks through the loop, CI, the sidecar
and a fleet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .bundle import build_bundle, verify_bundle
    from .catalog import Catalog, ModelInfo, bundled_catalog, model_from_data
    from .check import CheckReport, check_paths
    from .compile import Compiler, compile_policy
    from .errors import (
        BundleError,
        CatalogError,
        ContextOverflowError,
        Diagnostic,
        EvalError,
        ExprError,
        ImportFormatError,
        KiloRulesError,
        Location,
        MultipleRunsWarning,
        NetworkError,
        PolicyError,
        SessionError,
        StoreError,
    )
    from .importers import detect_format, read_session
    from .net import NetworkSettings, use_network
    from .plan import Plan
    from .plugins import (
        SystemTransformContext,
        register_system_transform,
        unregister_system_transform,
    )
    from .policy import PolicyBody
    from .providers.acceptance import BodyContext, Violation, check_body
    from .resolve import ResolvedPolicy, bundled_policy_names, resolve_policy
    from .routes import Routes, load_routes
    from .runtime.apply import Decision, StepResult, apply_plan
    from .runtime.compaction import CompactionResult, compact
    from .runtime.context import Agent, Skill, StepInput, Workspace
    from .runtime.facade import Runtime
    from .runtime.mutations import MutationError, apply_mutations
    from .runtime.prune import PruneResult, prune_session
    from .sandbox import allow_read
    from .session import Message, Session, dump_session
    from .simulate import SimulationReport, simulate
    from .store import PolicyStore, ReloadResult, StoreSettings
    from .summarize import Summarizer, SummarizerError, SummaryRequest
    from .summarizers import ExtractiveSummarizer, HttpSummarizer
    from .truncate import cleanup_spill_dir, truncate_output

#: Where each public name lives. The package imports a module only when one of its names
#: is first used, so that ``kilo-rules check`` does not pay for the runtime, the sidecar
#: and the HTTP client it never touches. (The block above tells type checkers the same.)
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".bundle": ("build_bundle", "verify_bundle"),
    ".catalog": ("Catalog", "ModelInfo", "bundled_catalog", "model_from_data"),
    ".check": ("CheckReport", "check_paths"),
    ".compile": ("Compiler", "compile_policy"),
    ".errors": (
        "BundleError",
        "CatalogError",
        "ContextOverflowError",
        "Diagnostic",
        "EvalError",
        "ExprError",
        "ImportFormatError",
        "KiloRulesError",
        "Location",
        "MultipleRunsWarning",
        "NetworkError",
        "PolicyError",
        "SessionError",
        "StoreError",
    ),
    ".importers": ("detect_format", "read_session"),
    ".net": ("NetworkSettings", "use_network"),
    ".plan": ("Plan",),
    ".plugins": (
        "SystemTransformContext",
        "register_system_transform",
        "unregister_system_transform",
    ),
    ".policy": ("PolicyBody",),
    ".providers.acceptance": ("BodyContext", "Violation", "check_body"),
    ".resolve": ("ResolvedPolicy", "bundled_policy_names", "resolve_policy"),
    ".routes": ("Routes", "load_routes"),
    ".runtime.apply": ("Decision", "StepResult", "apply_plan"),
    ".runtime.compaction": ("CompactionResult", "compact"),
    ".runtime.context": ("Agent", "Skill", "StepInput", "Workspace"),
    ".runtime.facade": ("Runtime",),
    ".runtime.mutations": ("MutationError", "apply_mutations"),
    ".runtime.prune": ("PruneResult", "prune_session"),
    ".sandbox": ("allow_read",),
    ".session": ("Message", "Session", "dump_session"),
    ".simulate": ("SimulationReport", "simulate"),
    ".store": ("PolicyStore", "ReloadResult", "StoreSettings"),
    ".summarize": ("Summarizer", "SummarizerError", "SummaryRequest"),
    ".summarizers": ("ExtractiveSummarizer", "HttpSummarizer"),
    ".truncate": ("cleanup_spill_dir", "truncate_output"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

#: Names that still work but have a replacement: name → (module, attribute, what to use).
#: They are left out of ``__all__`` and warn on every use, so that each caller hears of it.
_DEPRECATED: dict[str, tuple[str, str, str]] = {
    "TurnResult": (".runtime.apply", "StepResult", "kilo_rules.StepResult"),
    "import_file": (".importers", "import_file", "kilo_rules.read_session(path, fmt=...)"),
    "load_session": (".session", "load_session", "kilo_rules.read_session(path)"),
    "session_from_data": (
        ".session",
        "session_from_data",
        "kilo_rules.read_session(data=..., name=...)",
    ),
    "session_from_json": (
        ".session",
        "session_from_json",
        "kilo_rules.read_session(text=..., name=...)",
    ),
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    old = _DEPRECATED.get(name)
    if old is not None:
        import warnings

        home, attr, use = old
        warnings.warn(
            f"kilo_rules.{name} is deprecated: use {use}", DeprecationWarning, stacklevel=2
        )
        return getattr(import_module(home, __name__), attr)
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


__all__ = [
    "Agent",
    "BodyContext",
    "BundleError",
    "Catalog",
    "CatalogError",
    "CheckReport",
    "CompactionResult",
    "Compiler",
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
    "MultipleRunsWarning",
    "MutationError",
    "NetworkError",
    "NetworkSettings",
    "Plan",
    "PolicyBody",
    "PolicyError",
    "PolicyStore",
    "PruneResult",
    "ReloadResult",
    "ResolvedPolicy",
    "Routes",
    "Runtime",
    "Session",
    "SessionError",
    "SimulationReport",
    "Skill",
    "StepInput",
    "StepResult",
    "StoreError",
    "StoreSettings",
    "Summarizer",
    "SummarizerError",
    "SummaryRequest",
    "SystemTransformContext",
    "Violation",
    "Workspace",
    "__version__",
    "allow_read",
    "apply_mutations",
    "apply_plan",
    "build_bundle",
    "bundled_catalog",
    "bundled_policy_names",
    "check_body",
    "check_paths",
    "cleanup_spill_dir",
    "compact",
    "compile_policy",
    "detect_format",
    "dump_session",
    "load_routes",
    "model_from_data",
    "prune_session",
    "read_session",
    "register_system_transform",
    "resolve_policy",
    "simulate",
    "truncate_output",
    "unregister_system_transform",
    "use_network",
    "verify_bundle",
]
