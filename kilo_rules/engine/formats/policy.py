"""Policy v1: the typed model of a policy file, the single source of ``schemas/policy.v1.json``.

Every knob Kilo Code hard-codes is a field here. Values that depend on the model or the
session are *expressions* (strings in the YAML, see ``docs/expressions.md``); a field that
takes one is marked with :class:`ExprOf` so the checker knows the type it must produce.

The model is also the one place a knob's default lives: compile validates the merged policy
into a :class:`PolicyBody` (``Plan.settings``) and the engine reads its typed fields, never
a string path with a fallback. A numeric or switch default is Kilo's constant, so a knob a
policy leaves out behaves as in Kilo; texts default to none (the engine writes no prose a
policy did not), except the placeholders that stand for removed content. Caching is off
unless a policy asks for it. The bundled ``kilo-default`` still states every value, with
its upstream origin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from kilo_rules.engine.base.frozen import FrozenDict
from kilo_rules.engine.formats import wireapi


@dataclass(frozen=True, slots=True)
class ExprOf:
    """Marks a field whose string value is an expression producing ``type``."""

    type: Literal["int", "number", "number?", "bool", "str"]


def _expr_schema(kind: str) -> dict[str, Any]:
    return {"x-expression": kind}


IntExpr = Annotated[
    int | str,
    ExprOf("int"),
    Field(json_schema_extra=_expr_schema("int")),
]
NumberExpr = Annotated[
    float | int | str,
    ExprOf("number"),
    Field(json_schema_extra=_expr_schema("number")),
]
NullableNumberExpr = Annotated[
    float | int | str,
    ExprOf("number?"),
    Field(json_schema_extra=_expr_schema("number?")),
]
BoolExpr = Annotated[
    bool | str,
    ExprOf("bool"),
    Field(json_schema_extra=_expr_schema("bool")),
]
StrExpr = Annotated[str, ExprOf("str"), Field(json_schema_extra=_expr_schema("str"))]
Condition = Annotated[str | bool, ExprOf("bool"), Field(json_schema_extra=_expr_schema("bool"))]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


# --------------------------------------------------------------------------------- tokens


class Tokens(_Section):
    """How tokens are counted (spec §1)."""

    counter: str = Field(
        "estimate",
        description="Token counter: 'estimate' (characters / chars_per_token of the "
        "request's JSON, as Kilo measures), 'tiktoken:<encoding>' (loaded offline; counts "
        "the text the model reads — texts, tool names, inputs and outputs — plus 3 tokens "
        "per message), or 'model' to use the model's catalog tokenizer.",
        pattern=r"^(estimate|model|tiktoken:[A-Za-z0-9_]+)$",
    )
    chars_per_token: float = Field(
        4.0, gt=0, description="Characters per token of the estimate (Kilo: 4, rounded half-up)."
    )
    safety_factor: float = Field(
        1.0, ge=1, description="Multiplier applied to every count, to err on the safe side."
    )
    preflight_factor: float = Field(
        1.3,
        ge=1,
        description="Correction applied to the preflight estimate and the chunked-compaction "
        "'needed' test (Kilo: 1.3). Not applied to provider-reported usage.",
    )


# --------------------------------------------------------------------------------- output


class OutputCap(_Section):
    """Lowering the output cap so input + output fit the window (spec §5, capOutputTokens)."""

    enabled: bool = Field(True, description="Apply the cap decision table.")
    safety: int = Field(2048, ge=0, description="Tokens kept free (Kilo SAFETY: 2048).")
    minimum: int = Field(1024, ge=0, description="Never cap below this (Kilo MIN_OUTPUT: 1024).")
    media_reserve: int = Field(
        2048, ge=0, description="Tokens added per media part to the estimate (Kilo: 2048)."
    )


class Output(_Section):
    """Output-token maximum (spec §2)."""

    max_tokens: IntExpr | None = Field(
        None,
        description="Policy maximum of output tokens (Kilo OUTPUT_TOKEN_MAX: 32000). "
        "`config.output_token_max` lets the agent override it per run.",
    )
    configured: IntExpr | None = Field(
        None,
        description="The configured cap for this model (Kilo maxOutputTokens: "
        "min(model limit, max) or max when the model limit is 0).",
    )
    send: BoolExpr | None = Field(
        None,
        description="Whether a cap is sent at all (Kilo omits it for openai-compatible gpt-5).",
    )
    cap: OutputCap = Field(default_factory=OutputCap, description="capOutputTokens decision table.")


# --------------------------------------------------------------------------------- budget


class Budget(_Section):
    """The usable input window (spec §3). Later expressions read these as budget.*."""

    reserved: IntExpr | None = Field(
        None, description="Tokens reserved for the answer (Kilo: min(20000, configured output))."
    )
    usable: IntExpr | None = Field(
        None,
        description="Usable input tokens (Kilo: input limit − reserved when the model has "
        "an input limit, else context − configured output).",
    )


class Preflight(_Section):
    """Estimate the request before sending it and compact early (spec §4)."""

    enabled: BoolExpr | None = Field(
        None, description="Run the preflight estimate (Kilo: only with threshold_percent set)."
    )
    skip_mid_tool_loop: bool = Field(
        True, description="Never compact while a tool round-trip is open (Kilo: true)."
    )


class Overflow(_Section):
    """When the context counts as overflowing (spec §3)."""

    auto: bool = Field(True, description="Detect overflow and compact automatically.")
    count: tuple[Literal["input", "output", "reasoning", "cache_read", "cache_write"], ...] = Field(
        ("input", "output", "reasoning", "cache_read", "cache_write"),
        description="Usage fields summed into the overflow count (Kilo: all five; the "
        "provider total is used only when they sum to 0).",
    )
    comparison: Literal[">=", ">"] = Field(
        ">=", description="count >= limit (Kilo) or count > limit (old opencode)."
    )
    threshold_percent: NullableNumberExpr | None = Field(
        None,
        description="Compact at this percentage of the window (Kilo-only; null = at usable).",
    )
    threshold_window: IntExpr | None = Field(
        None, description="The window the percentage applies to (Kilo: input limit or context)."
    )
    limit: IntExpr | None = Field(
        None, description="The overflow limit (Kilo: min(usable, floor(window × pct / 100)))."
    )
    preflight: Preflight = Field(
        default_factory=Preflight, description="Preflight estimate (spec §4)."
    )
    unfit: Literal["compact", "send"] = Field(
        "compact",
        description="A request whose input plus output cap exceed the context window: "
        "compact first, in overflow mode, as the provider's refusal would make Kilo do "
        "(compact), or send it and let the provider refuse it (send, Kilo's round trip).",
    )


class Payload(_Section):
    """Guard on the byte size of the message JSON (spec §8 step 6)."""

    max_bytes: IntExpr | None = Field(
        None, description="Byte limit of the serialised messages (Kilo REQUEST_PRUNE_BYTES)."
    )
    on_exceed: Literal["prune-once", "warn", "error"] = Field(
        "prune-once",
        description="prune-once: prune with reason payload-limit, rebuild, then send with a "
        "warning (Kilo); warn: only warn; error: refuse to build the request.",
    )


# --------------------------------------------------------------------------------- prune


def _decided_per_model(value: str | bool) -> str | bool:
    # Compile puts a condition's value in place of its expression when it reads only
    # model.* and config.*, as Kilo's gate reads only its config. Text still here reads
    # per-step names, which the normal prune (before the step is built) and the
    # post-compaction prune (between steps) do not have: refused when the plan compiles
    # rather than failing the first step that prunes.
    if isinstance(value, str):
        raise ValueError(
            "a prune gate is decided once per model: its condition may read only "
            "model.* and config.*"
        )
    return value


#: A prune gate: true, false, or a condition on ``model.*`` and ``config.*``.
PruneGate = Annotated[Condition, AfterValidator(_decided_per_model)]


class PruneReasons(_Section):
    """Which triggers may prune (spec §6 gate). Each is a condition decided once per model
    (on model.* and config.*); config.compaction.prune: false closes all of them."""

    normal: PruneGate = Field(
        False,
        description="Prune before every step (Kilo: only when config.compaction.prune is "
        "true; kilo-default: config.compaction.prune == true).",
    )
    post_compaction: PruneGate = Field(True, description="Prune after a summary (Kilo: true).")
    payload_limit: PruneGate = Field(
        True, description="Prune when the payload is too big (Kilo: true)."
    )


class Prune(_Section):
    """Mark old tool outputs as compacted (spec §6). Nothing is deleted."""

    enabled: PruneGate = Field(
        True,
        description="Master switch, a condition decided once per model (kilo-default: "
        "config.compaction.prune != false). config.compaction.prune: false "
        "(KILO_DISABLE_PRUNE) switches pruning off whatever this says.",
    )
    reasons: PruneReasons = Field(
        default_factory=PruneReasons, description="Per-trigger enablement."
    )
    protect_turns: int = Field(
        2, ge=0, description="Most recent user turns never pruned (Kilo: 2)."
    )
    protect_tokens: IntExpr = Field(
        40_000, description="Newest tool-output tokens kept (Kilo PRUNE_PROTECT: 40000)."
    )
    minimum_tokens: IntExpr = Field(
        20_000,
        description="Prune only if more than this many tokens would go (Kilo PRUNE_MINIMUM: "
        "20000); all or nothing.",
    )
    protected_tools: tuple[str, ...] = Field(
        ("skill",), description="Tools whose output is never pruned (Kilo: [skill])."
    )
    placeholder: str = Field(
        "[Old tool result content cleared]",
        description="Text the model sees instead of a pruned output.",
    )


# --------------------------------------------------------------------------------- compaction


class Summary(_Section):
    """The summary request (spec §7.5)."""

    template: str | None = Field(
        None, description="File (relative to the policy) with the summary template."
    )
    new_instruction: str = Field("", description="Instruction when no summary exists.")
    update_instruction: str = Field(
        "",
        description="Instruction to update the previous summary; {previous} is replaced by "
        "it, wrapped in <previous-summary> tags.",
    )
    tool_output_max_chars: int | None = Field(
        2000, ge=0, description="Tool outputs in the summary input are cut here (Kilo: 2000)."
    )
    strip_media: bool = Field(True, description="Replace media in the summary input.")
    request_text: str = Field(
        "What did we do so far?",
        description="Text of the compaction user message (Kilo: 'What did we do so far?').",
    )


class Chunking(_Section):
    """Chunked fallback when the head is too big to summarise at once."""

    enabled: bool = Field(False, description="Use the chunked fallback.")
    output_max: int = Field(2048, ge=1, description="Summary output cap (Kilo: 2048).")
    budget_ratio: float = Field(
        0.6, gt=0, le=1, description="Chunk budget = usable × ratio (Kilo: 0.6)."
    )
    min_budget: int = Field(1000, ge=1, description="Smallest chunk budget (Kilo: 1000).")
    parallel: int = Field(3, ge=1, description="Chunks summarised at once (Kilo: 3).")
    max_reduce_depth: int = Field(3, ge=1, description="Merge depth (Kilo: 3).")
    clip_text_chars: int = Field(16_000, ge=1, description="Text clip (Kilo: 16000).")
    clip_tool_chars: int = Field(2000, ge=1, description="Tool I/O clip (Kilo: 2000).")


class Pin(_Section):
    """Something that must survive compaction verbatim (beyond Kilo)."""

    messages_matching: str | None = Field(
        None, description="Regex: user messages whose text matches are kept verbatim."
    )
    layer: str | None = Field(None, description="A system layer id re-sent after compaction.")
    task: bool = Field(
        False,
        description="The task: the session's first user message, kept verbatim however "
        "many compactions follow (an autonomous run states its task once, at the start).",
    )


class Compaction(_Section):
    """Summary + verbatim tail (spec §7)."""

    auto: bool = Field(True, description="Compact automatically (KILO_DISABLE_AUTOCOMPACT).")
    tail_turns: int = Field(
        2, ge=0, description="Recent turns kept verbatim (Kilo: 2; 0 = no tail)."
    )
    preserve_recent_tokens: IntExpr | None = Field(
        None,
        description="Token budget of the tail (Kilo: clamp(floor(usable × 0.25), 2000, 8000)).",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        description="Compactions the attempt rule allows before the step fails (Kilo: 3).",
    )
    attempt_rule: Literal["turn", "no-progress"] = Field(
        "turn",
        description="What max_attempts counts. turn: compactions in one user turn (Kilo; a "
        "single-prompt autonomous run is one turn, so it stops after max_attempts). "
        "no-progress: consecutive compactions that freed less than min_progress of the "
        "request; a compaction that frees enough starts the count again.",
    )
    min_progress: float = Field(
        0.1,
        gt=0,
        le=1,
        description="Share of the request's input tokens a compaction must free to count "
        "as progress (attempt_rule: no-progress).",
    )
    replay: bool = Field(
        True, description="Re-post the last user message after an overflow compaction."
    )
    continue_text: str = Field(
        "", description="Synthetic user message after an automatic compaction."
    )
    overflow_preamble: str | None = Field(
        None, description="Prefix of the continue text when media overflowed the window."
    )
    summary: Summary = Field(default_factory=Summary, description="The summary request.")
    chunking: Chunking = Field(default_factory=Chunking, description="Chunked fallback.")
    pin: tuple[Pin, ...] = Field((), description="Kept verbatim across compactions.")


# --------------------------------------------------------------------------------- tool output


class ToolOutput(_Section):
    """Truncation when a tool returns (spec §11.1)."""

    max_lines: int = Field(2000, ge=1, description="Line limit (Kilo: 2000).")
    max_bytes: int = Field(51_200, ge=1, description="UTF-8 byte limit (Kilo: 51200).")
    direction: Literal["head", "tail"] = Field("head", description="Which end is kept.")
    spill_dir: str = Field(
        "~/.local/share/kilo-rules/tool-output",
        description="Directory the full output is written to (~ is expanded).",
    )
    retention: int | str | None = Field(
        "7d", description="How long spilled files are kept: seconds or a duration like 7d."
    )


# --------------------------------------------------------------------------------- system


LayerSource = Literal[
    "file", "text", "soul", "agent", "family", "environment", "instructions", "skills", "user"
]


class Instructions(_Section):
    """Instruction-file discovery (AGENTS.md and friends)."""

    global_files: tuple[str, ...] = Field(
        (), description="Global candidates; the first that exists is used."
    )
    project_files: tuple[str, ...] = Field(
        (),
        description="Names searched upward from the working directory; the first name found "
        "wins and ancestors are not stacked.",
    )
    globs: tuple[str, ...] = Field((), description="Extra files (globs) from configuration.")
    urls: tuple[str, ...] = Field((), description="http(s) URLs fetched at build time.")
    url_timeout_seconds: float = Field(5.0, gt=0, description="Fetch timeout (5 s).")
    url_max_bytes: int = Field(262_144, ge=1, description="Size cap of a fetched file.")
    url_ttl_seconds: float = Field(
        300.0,
        ge=0,
        description="How long a fetched URL (a failure: at most 30 s) is reused before it is "
        "fetched again; 0 fetches on every step.",
    )
    glob_max_entries: int = Field(
        20_000,
        ge=1,
        description="Directory entries one glob may look at; a glob cut short keeps what it "
        "found and records a warning.",
    )
    glob_timeout_seconds: float = Field(
        2.0, gt=0, description="Time one glob may walk the workspace (2 s)."
    )
    on_demand: bool = Field(
        False,
        description="When a read tool opens a file under a directory with its own AGENTS.md, "
        "inject it once per assistant message.",
    )


class Layer(_Section):
    """One part of the system prompt."""

    id: str = Field(
        description="Layer id, unique within the policy.", pattern=r"^[a-z][a-z0-9_-]*$"
    )
    source: LayerSource | None = Field(
        None,
        description="file: a prompt file; text: inline text; soul: the soul file; agent: the "
        "agent's own prompt; family: the prompt chosen by prompts.rules; environment: the "
        "static environment block; instructions: discovered instruction files; skills: the "
        "skills list; user: the per-message system override. Required for a new layer; a "
        "layer that changes an inherited one (same id, in a policy that extends another) "
        "may leave it out, and every field it leaves out keeps the inherited value.",
    )
    when: Condition | None = Field(None, description="Include the layer only when true.")
    path: str | None = Field(None, description="Prompt file (source file/soul), policy-relative.")
    text: str | None = Field(None, description="Inline text (source text).")
    replaces: str | None = Field(
        None, description="Id of a layer this one replaces when it is non-empty."
    )


class System(_Section):
    """System prompt assembly (spec §9)."""

    layers: tuple[Layer, ...] = Field((), description="Layers in order (most stable first).")
    blocks: int = Field(
        1,
        ge=1,
        le=4,
        description="Blocks the layers are assembled into (Kilo: 1): the first blocks-1 "
        "non-empty layers get a block each and the rest share the last. More than 2 "
        "survive only with collapse: none.",
    )
    transforms: tuple[Annotated[str, Field(min_length=1, pattern=r"^\S+$")], ...] = Field(
        (),
        description="System transforms run in order on the assembled blocks, as Kilo's "
        "plugin hook experimental.chat.system.transform: names registered with "
        "kilo_rules.register_system_transform or entry points of the group "
        "kilo_rules.system_transforms (docs/plugins.md). Kilo: none.",
    )
    collapse: Literal["kilo", "none"] = Field(
        "kilo",
        description="After the transforms. kilo: more than 2 blocks whose first is still "
        "the original header become [header, the rest joined with the separator]; a "
        "changed header collapses nothing (Kilo). none: the blocks are sent as they are.",
    )
    separator: str = Field("\n", description="Joiner between layers (Kilo: newline).")
    instructions: Instructions = Field(
        default_factory=Instructions, description="Instruction discovery."
    )


# --------------------------------------------------------------------------------- environment


EnvField = Literal[
    "working_directory",
    "workspace_root",
    "platform",
    "is_git_repo",
    "date",
    "time",
    "model",
    "mode",
    "open_files",
    "visible_files",
    "shell",
]


class Environment(_Section):
    """Environment facts: static ones in the system prompt, dynamic ones per user message."""

    static: tuple[EnvField, ...] = Field((), description="Fields of the system block.")
    dynamic: tuple[EnvField, ...] = Field(
        (),
        description="Fields of the per-user-message block, built once per user message and "
        "byte-identical afterwards.",
    )
    tag: str = Field("environment_details", description="Tag wrapping the dynamic block.")


class Reminders(_Section):
    """Per-step texts injected at the tail."""

    plan_mode: str | None = Field(None, description="Reminder while in plan mode.")
    build_switch: str | None = Field(
        None, description="Reminder when switching from plan to code/build."
    )
    interjection: str | None = Field(
        None,
        description="Wraps a user message sent mid tool loop; {message} is the text. Null = "
        "no wrapping.",
    )
    max_steps: str | None = Field(None, description="Prompt on the last allowed step.")
    max_steps_role: Literal["user", "assistant"] = Field(
        "assistant", description="Role of the max-steps prompt (a trailing message)."
    )


# --------------------------------------------------------------------------------- prompts


class PromptRule(_Section):
    """One rule of the family-prompt ladder."""

    when: Condition = Field(description="Condition on the model.")
    prompt: str = Field(description="Prompt file, relative to the policy.")
    name: str | None = Field(None, description="Label shown in the plan and decisions.")
    replace: Annotated[dict[str, StrExpr], AfterValidator(FrozenDict)] | None = Field(
        None, description="Placeholders ({{KEY}}) to replace in the prompt text."
    )


class Prompts(_Section):
    """Model-family prompt selection (spec §9.2): first matching rule wins."""

    soul: str | None = Field(None, description="Soul file, sent first (Kilo soul.txt).")
    rules: tuple[PromptRule, ...] = Field((), description="Ordered rules.")
    default: str | None = Field(None, description="Prompt when no rule matches.")


# --------------------------------------------------------------------------------- cache


class Breakpoints(_Section):
    """Which messages get a cache breakpoint. Each rule reads its own fields, so a policy
    that switches rule does not inherit the other rule's selection: ``kilo`` reads
    ``system_first`` and ``non_system_last``; ``auto`` reads the rest, and with the
    defaults is Kilo's native AUTO (last tool, last system, latest user message)."""

    system_first: int = Field(2, ge=0, description="kilo rule: first N system messages (Kilo: 2).")
    non_system_last: int = Field(
        2, ge=0, description="kilo rule: last N non-system messages (Kilo: 2)."
    )
    last_tool: bool = Field(True, description="auto rule: the last tool definition.")
    last_system: bool = Field(True, description="auto rule: the last system block.")
    latest_user_message: bool = Field(True, description="auto rule: the latest user message.")
    latest_assistant: bool = Field(
        False, description="auto rule: the latest assistant message (native 'latest-assistant')."
    )
    rolling: int = Field(
        0,
        ge=0,
        description="auto rule: also the last N non-system messages, a breakpoint that moves "
        "with the conversation (upstream opencode's newer AUTO keeps 2).",
    )


def _marker_shapes(value: dict[str, str]) -> FrozenDict[str, str]:
    """``cache.shapes`` checked against the facts: each key a wire API with a marker-shape
    choice, each value one of its choices."""
    for api, shape in value.items():
        choices = wireapi.facts(api).marker_shapes if wireapi.known(api) else ()
        if not choices:
            named = [n for n in wireapi.names() if wireapi.facts(n).marker_shapes]
            raise PydanticCustomError(
                "shape_api",
                "{api!r} has no marker-shape choice (wire APIs with one: {named})",
                {"api": api, "named": ", ".join(named)},
            )
        if shape not in choices:
            raise PydanticCustomError(
                "shape_value",
                "{api}: {shape!r} is not a marker shape it takes (use {choices})",
                {"api": api, "shape": shape, "choices": " or ".join(map(repr, choices))},
            )
    return FrozenDict(value)


def _marker_shapes_schema() -> dict[str, Any]:
    """The JSON Schema of ``cache.shapes``, written from the built-in APIs' facts."""
    return {
        "type": "object",
        "properties": {
            f.name: {
                "description": f"Marker shape on {f.name}.",
                "enum": list(f.marker_shapes),
                "type": "string",
            }
            for f in wireapi.BUILTIN
            if f.marker_shapes
        },
        "additionalProperties": False,
    }


class Cache(_Section):
    """Prompt-cache markers (spec §10)."""

    rule: Literal["kilo", "auto", "none"] = Field(
        "none",
        description="kilo: first system + last non-system messages; auto: last tool, last "
        "system, latest user message; none: no markers.",
    )
    when: Condition = Field(True, description="Gate (Kilo: Anthropic/Claude models).")
    placement: StrExpr = Field(
        "last-part",
        description="'message' or 'last-part'; an expression may choose by provider "
        "(Kilo: message for anthropic and bedrock).",
    )
    breakpoints: Breakpoints = Field(
        default_factory=Breakpoints, description="Breakpoint selection."
    )
    budget: IntExpr | None = Field(
        None, description="Most markers per request (never above the provider's limit)."
    )
    ttl: Literal["5m", "1h"] | None = Field(None, description="Marker TTL (null = default).")
    message_ttl: Literal["5m", "1h"] | None = Field(
        None,
        description="TTL of marks on conversation messages when it differs from ttl (which "
        "then applies to tools and system); a 1h message mark needs a 1h ttl.",
    )
    skip_trailing_environment: bool = Field(
        False, description="Place part-level markers before a trailing environment block."
    )
    respect_automatic: bool = Field(
        False, description="No explicit breakpoints when automatic caching is enabled."
    )
    # Which wire APIs have a marker-shape choice, and their choices, are their facts'
    # marker_shapes (kilo_rules.engine.formats.wireapi): read here, not written twice.
    shapes: Annotated[
        dict[str, str],
        AfterValidator(_marker_shapes),
        WithJsonSchema(_marker_shapes_schema()),
    ] = Field(
        default_factory=FrozenDict,
        description="Marker shape per wire format where it is a choice: openai and "
        "openai-responses 'explicit' (prompt_cache_breakpoint, GPT-5.6 and later) or 'none'; "
        "openai-compatible 'cache_control' (forwarded to Anthropic by OpenRouter) or 'none'.",
    )


# ----------------------------------------------------------------------------------- server


class ClearToolUses(_Section):
    """Anthropic context editing: the API clears old tool results (``clear_tool_uses``)."""

    enabled: bool = Field(False, description="Ask the provider to clear old tool results.")
    trigger_tokens: int = Field(
        100_000, ge=1, description="Input tokens above which clearing starts (API default)."
    )
    keep_tool_uses: int = Field(3, ge=0, description="Most recent tool uses kept whole.")
    clear_at_least_tokens: int | None = Field(
        None, ge=1, description="Clear only when at least this many tokens go (cache-friendly)."
    )
    exclude_tools: list[str] = Field(
        default_factory=list, description="Tools whose uses are never cleared."
    )
    clear_tool_inputs: bool = Field(
        False, description="Also clear the tool calls' inputs, not only their results."
    )


class ClearThinking(_Section):
    """Anthropic context editing: the API drops thinking of older turns (``clear_thinking``)."""

    enabled: bool = Field(False, description="Ask the provider to clear old thinking blocks.")
    keep_turns: int | Literal["all"] = Field(
        1, description="Assistant turns whose thinking is kept (or 'all')."
    )


class ServerCompaction(_Section):
    """Compaction run by the provider: Anthropic's ``compact`` edit, or the OpenAI
    Responses API's ``context_management`` compaction, by the model's wire format."""

    enabled: bool = Field(False, description="Ask the provider to compact the context.")
    trigger_tokens: int = Field(
        150_000, ge=1, description="Input tokens at which the provider compacts."
    )
    instructions: str | None = Field(
        None, description="Extra summarisation instructions (Anthropic only)."
    )


class Server(_Section):
    """Context management the provider runs on its side, asked for in each request. Sent
    only to models whose catalog entry lists the capability (``server_edits``); an edit
    rewrites the context from where it clears, so the cached prefix is written again from
    there (the plan's decisions say so)."""

    clear_tool_uses: ClearToolUses = Field(
        default_factory=ClearToolUses, description="Clear old tool results."
    )
    clear_thinking: ClearThinking = Field(
        default_factory=ClearThinking, description="Clear old thinking blocks."
    )
    compaction: ServerCompaction = Field(
        default_factory=ServerCompaction, description="Provider-side compaction."
    )


# --------------------------------------------------------------------------------- lowering


class Lowering(_Section):
    """How parts become provider messages (spec §7.6, §8)."""

    strip_media_after_summary: bool = Field(
        False, description="Replace historical media once a summary exists."
    )
    drop_errored_assistant: bool = Field(
        True, description="Drop errored assistant messages unless interrupted with content."
    )
    media_in_tool_results: Annotated[dict[str, bool], AfterValidator(FrozenDict)] = Field(
        default_factory=FrozenDict,
        description="Per provider: may tool results carry media? If not, media move into a "
        "following user message.",
    )
    media_placeholder: str = Field(
        "[Attached {mime}: {name}]",
        description="Text for stripped media; {mime} and {name} are replaced.",
    )


# --------------------------------------------------------------------------------- policy


class PolicyBody(_Section):
    """Everything a policy can set; also the shape of one override's ``set``."""

    tokens: Tokens = Field(default_factory=Tokens, description="Token counting (§1).")
    output: Output = Field(default_factory=Output, description="Output tokens (§2, §5).")
    budget: Budget = Field(default_factory=Budget, description="Usable window (§3).")
    overflow: Overflow = Field(default_factory=Overflow, description="Overflow detection (§3, §4).")
    payload: Payload = Field(default_factory=Payload, description="Payload byte guard (§8).")
    prune: Prune = Field(default_factory=Prune, description="Tool-output pruning (§6).")
    compaction: Compaction = Field(default_factory=Compaction, description="Summary + tail (§7).")
    tool_output: ToolOutput = Field(
        default_factory=ToolOutput, description="Tool-output truncation (§11)."
    )
    system: System = Field(default_factory=System, description="System prompt (§9).")
    environment: Environment = Field(default_factory=Environment, description="Environment facts.")
    reminders: Reminders = Field(default_factory=Reminders, description="Per-step reminders.")
    prompts: Prompts = Field(default_factory=Prompts, description="Family prompt selection (§9.2).")
    cache: Cache = Field(default_factory=Cache, description="Prompt-cache markers (§10).")
    lowering: Lowering = Field(default_factory=Lowering, description="Parts to messages.")
    server: Server = Field(
        default_factory=Server, description="Context management the provider runs."
    )


class Override(_Section):
    """Per-model changes: when ``when`` holds for the model, ``set`` is merged in."""

    when: Condition = Field(description="Condition on model.* (and config.*).")
    name: str | None = Field(None, description="Label shown in the plan.")
    set: PolicyBody = Field(description="Partial policy merged over the base.")


class Policy(PolicyBody):
    """A policy file (Policy v1)."""

    version: Literal[1] = Field(description="Policy format version.")
    name: str = Field(description="Policy name.", pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str | None = Field(None, description="What this policy is for.")
    extends: str | None = Field(
        None,
        description="A bundled policy name (e.g. kilo-default) or a path relative to this file.",
    )
    overrides: list[Override] | None = Field(None, description="Per-model changes, in order.")


SCHEMA_ID = "https://kilo-rules.dev/schemas/policy.v1.json"


def default(section: type[BaseModel], name: str) -> Any:
    """The model's default of one knob, for the runtime's value types that carry it
    (so that a default is written once, here)."""
    return section.model_fields[name].get_default(call_default_factory=True)


# ----------------------------------------------------------------- expression fields

JsonPath = tuple[str | int, ...]


def expression_fields(data: Any) -> list[tuple[JsonPath, str]]:
    """(path, type) of every string value of policy ``data`` that the model marks as an
    expression (:class:`ExprOf`), read from the fields' own type annotations."""
    out: dict[JsonPath, str] = {}
    _walk(Policy, None, data, (), out)
    return list(out.items())


def expression_kind(path: JsonPath) -> str | None:
    """The expression type the field at ``path`` takes (None: not an expression field)."""
    tp: Any = Policy
    meta: tuple[Any, ...] = ()
    for step in path:
        found = _child(tp, step)
        if found is None:
            return None
        tp, meta = found
    return _kind(tp, meta)


def _kind(tp: Any, meta: Sequence[Any]) -> str | None:
    """The ExprOf type of an annotation (through Optional and Annotated), if any."""
    for m in meta:
        if isinstance(m, ExprOf):
            return m.type
    if get_origin(tp) is Annotated:
        base, *extra = get_args(tp)
        return _kind(base, extra)
    if get_origin(tp) in (Union, UnionType):
        kinds = [_kind(arg, meta) for arg in get_args(tp) if arg is not type(None)]
        return next((k for k in kinds if k), None)
    return None


def _branches(tp: Any) -> list[Any]:
    """The alternatives of an annotation, Annotated and Optional unwrapped."""
    if get_origin(tp) is Annotated:
        return _branches(get_args(tp)[0])
    if get_origin(tp) in (Union, UnionType):
        return [b for arg in get_args(tp) if arg is not type(None) for b in _branches(arg)]
    return [tp]


def _child(tp: Any, step: str | int) -> tuple[Any, tuple[Any, ...]] | None:
    """The annotation (and its field metadata) one step below ``tp``."""
    for branch in _branches(tp):
        if isinstance(branch, type) and issubclass(branch, BaseModel) and isinstance(step, str):
            field = branch.model_fields.get(step)
            if field is not None:
                return field.annotation, tuple(field.metadata)
        elif get_origin(branch) in (list, tuple) and isinstance(step, int):
            return get_args(branch)[0], ()
        elif get_origin(branch) is dict and isinstance(step, str):
            return get_args(branch)[1], ()
    return None


@dataclass(frozen=True, slots=True)
class _Shape:
    """What lies one step below an annotation, as :func:`_child` finds it, with each
    child's expression kind: the policy model is fixed, so a walk looks it up once."""

    fields: dict[str, tuple[Any, str | None]]
    items: tuple[Any, str | None] | None
    values: tuple[Any, str | None] | None


_SHAPES: dict[Any, _Shape] = {}


def _shape(tp: Any) -> _Shape:
    shape = _SHAPES.get(tp)
    if shape is not None:
        return shape
    fields: dict[str, tuple[Any, str | None]] = {}
    items = values = None
    for branch in _branches(tp):
        if isinstance(branch, type) and issubclass(branch, BaseModel):
            if values is None:  # a dict branch before it takes every name
                for name, f in branch.model_fields.items():
                    fields.setdefault(name, (f.annotation, _kind(f.annotation, f.metadata)))
        elif get_origin(branch) in (list, tuple):
            items = items or (get_args(branch)[0], _kind(get_args(branch)[0], ()))
        elif get_origin(branch) is dict:
            values = values or (get_args(branch)[1], _kind(get_args(branch)[1], ()))
    shape = _SHAPES[tp] = _Shape(fields, items, values)
    return shape


def _walk(tp: Any, kind: str | None, value: Any, path: JsonPath, out: dict[JsonPath, str]) -> None:
    if isinstance(value, str):
        if kind is not None:
            out[path] = kind
        return
    if isinstance(value, dict):
        items: Iterable[tuple[str | int, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    shape = _shape(tp)
    for key, item in items:
        found = shape.items if isinstance(key, int) else shape.fields.get(key, shape.values)
        if found is not None:
            _walk(found[0], found[1], item, (*path, key), out)
