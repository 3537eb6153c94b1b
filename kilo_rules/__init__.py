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
:class:`StepResult`. A service handed the whole session as JSON every step reads it with
``SessionReader().read(text)`` (one reader kept for all steps): the messages it read
before are reused, and only the new ones are parsed and validated.
``docs/getting-started.md`` walks through the loop, CI, the sidecar and a fleet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.version import __version__

if TYPE_CHECKING:
    from kilo_rules.engine.base.errors import (
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
    from kilo_rules.engine.base.net import NetworkSettings, use_network
    from kilo_rules.engine.base.plugins import (
        SystemTransformContext,
        register_system_transform,
        unregister_system_transform,
    )
    from kilo_rules.engine.base.sandbox import allow_read
    from kilo_rules.engine.compiler.compile import Compiler, compile_policy
    from kilo_rules.engine.compiler.plan import Plan
    from kilo_rules.engine.formats.bundle import build_bundle, verify_bundle
    from kilo_rules.engine.formats.catalog import (
        Catalog,
        ModelInfo,
        bundled_catalog,
        model_from_data,
    )
    from kilo_rules.engine.formats.policy import PolicyBody
    from kilo_rules.engine.formats.session import Message, Session, SessionReader, dump_session
    from kilo_rules.engine.frontend.resolve import (
        ResolvedPolicy,
        bundled_policy_names,
        resolve_policy,
    )
    from kilo_rules.engine.frontend.routes import Routes, load_routes
    from kilo_rules.engine.importers import detect_format, read_session
    from kilo_rules.engine.providers.acceptance import BodyContext, Violation, check_body
    from kilo_rules.engine.runtime.apply import Decision, StepResult, apply_plan
    from kilo_rules.engine.runtime.compaction import CompactionResult, compact
    from kilo_rules.engine.runtime.context import Agent, Skill, StepInput, Workspace
    from kilo_rules.engine.runtime.facade import Runtime
    from kilo_rules.engine.runtime.mutations import MutationError, apply_mutations
    from kilo_rules.engine.runtime.prune import PruneResult, prune_session
    from kilo_rules.engine.summarizers import ExtractiveSummarizer, HttpSummarizer
    from kilo_rules.engine.summarizers.protocol import Summarizer, SummarizerError, SummaryRequest
    from kilo_rules.engine.text.truncate import cleanup_spill_dir, truncate_output
    from kilo_rules.tools.checking.check import CheckReport, check_paths
    from kilo_rules.tools.serving.store import PolicyStore, ReloadResult, StoreSettings
    from kilo_rules.tools.simulation.documents import CorpusDocument, SessionDocument, TuneReport
    from kilo_rules.tools.simulation.simulate import SimulationReport, simulate

#: Where each public name lives. The package imports a module only when one of its names
#: is first used, so that ``kilo-rules check`` does not pay for the runtime, the sidecar
#: and the HTTP client it never touches. (The block above tells type checkers the same.)
_EXPORTS: dict[str, tuple[str, ...]] = {
    "kilo_rules.engine.formats.bundle": ("build_bundle", "verify_bundle"),
    "kilo_rules.engine.formats.catalog": (
        "Catalog",
        "ModelInfo",
        "bundled_catalog",
        "model_from_data",
    ),
    "kilo_rules.tools.checking.check": ("CheckReport", "check_paths"),
    "kilo_rules.engine.compiler.compile": ("Compiler", "compile_policy"),
    "kilo_rules.engine.base.errors": (
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
    "kilo_rules.engine.importers": ("detect_format", "read_session"),
    "kilo_rules.engine.base.net": ("NetworkSettings", "use_network"),
    "kilo_rules.engine.compiler.plan": ("Plan",),
    "kilo_rules.engine.base.plugins": (
        "SystemTransformContext",
        "register_system_transform",
        "unregister_system_transform",
    ),
    "kilo_rules.engine.formats.policy": ("PolicyBody",),
    "kilo_rules.engine.providers.acceptance": ("BodyContext", "Violation", "check_body"),
    "kilo_rules.engine.frontend.resolve": (
        "ResolvedPolicy",
        "bundled_policy_names",
        "resolve_policy",
    ),
    "kilo_rules.engine.frontend.routes": ("Routes", "load_routes"),
    "kilo_rules.engine.runtime.apply": ("Decision", "StepResult", "apply_plan"),
    "kilo_rules.engine.runtime.compaction": ("CompactionResult", "compact"),
    "kilo_rules.engine.runtime.context": ("Agent", "Skill", "StepInput", "Workspace"),
    "kilo_rules.engine.runtime.facade": ("Runtime",),
    "kilo_rules.engine.runtime.mutations": ("MutationError", "apply_mutations"),
    "kilo_rules.engine.runtime.prune": ("PruneResult", "prune_session"),
    "kilo_rules.engine.base.sandbox": ("allow_read",),
    "kilo_rules.engine.formats.session": ("Message", "Session", "SessionReader", "dump_session"),
    "kilo_rules.tools.simulation.documents": ("CorpusDocument", "SessionDocument", "TuneReport"),
    "kilo_rules.tools.simulation.simulate": ("SimulationReport", "simulate"),
    "kilo_rules.tools.serving.store": ("PolicyStore", "ReloadResult", "StoreSettings"),
    "kilo_rules.engine.summarizers.protocol": ("Summarizer", "SummarizerError", "SummaryRequest"),
    "kilo_rules.engine.summarizers": ("ExtractiveSummarizer", "HttpSummarizer"),
    "kilo_rules.engine.text.truncate": ("cleanup_spill_dir", "truncate_output"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

#: Names that still work but have a replacement: name → (module, attribute, what to use).
#: They are left out of ``__all__`` and warn on every use, so that each caller hears of it.
_DEPRECATED: dict[str, tuple[str, str, str]] = {
    "TurnResult": ("kilo_rules.engine.runtime.apply", "StepResult", "kilo_rules.StepResult"),
    "import_file": (
        "kilo_rules.engine.importers",
        "import_file",
        "kilo_rules.read_session(path, fmt=...)",
    ),
    "load_session": (
        "kilo_rules.engine.formats.session",
        "load_session",
        "kilo_rules.read_session(path)",
    ),
    "session_from_data": (
        "kilo_rules.engine.formats.session",
        "session_from_data",
        "kilo_rules.read_session(data=..., name=...)",
    ),
    "session_from_json": (
        "kilo_rules.engine.formats.session",
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
        return getattr(import_module(home), attr)
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
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
    "CorpusDocument",
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
    "SessionDocument",
    "SessionError",
    "SessionReader",
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
    "TuneReport",
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
