"""The acceptance rules of each wire API, as data: what the endpoints refuse beyond the
request types, one :class:`ApiRules` per API in :data:`RULES` (the checks that read these
parameters are in :mod:`.acceptance`). Each parameter carries, in a comment, the reason or
the upstream error text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from ..catalog import EXPLICIT_BREAKPOINTS, WIRE_BREAKPOINTS

__all__ = ["RULES", "ApiRules", "Pairing"]


Pairing = Literal["next-turn", "tool-messages", "function-turns", "by-id"]


@dataclass(frozen=True, slots=True)
class ApiRules:
    """The acceptance rules of one wire API, as parameters of the shared checks.

    ``shape`` names the reader that turns the body into the common view. ``pairing``
    says where a call's results go: in the next turn (Anthropic, Bedrock), in the
    ``role: tool`` messages right after (Chat Completions), in the next content with
    as many responses as there were calls (Gemini), or anywhere after the call, matched
    by id (the Responses API's ``function_call_output`` items). Patterns are matched in
    full.
    """

    shape: Literal["messages", "converse", "chat", "responses", "contents"]
    marker_key: str | None = None
    roles: tuple[str, ...] = ()  # the conversation roles, which must alternate
    first_role: str | None = None
    assistant_role: str = "assistant"
    pairing: Pairing = "next-turn"
    results_first: bool = False
    call_after_user: bool = False
    calls_answered_at_end: bool = True
    unique_call_ids: bool = False
    non_blank_text: bool = False
    blank_signed_text: bool = False  # blank text allowed on a part that carries a signature
    non_empty_content: bool = False
    empty_final_assistant: bool = False
    result_content_required: bool = False
    marker_budget: int | None = None
    marker_not_on_thinking: bool = False
    marker_not_first: bool = False
    ttl_order: bool = False
    marked_text_not_blank: bool = False
    assistant_needs_content: bool = False
    signature_issuer: str | None = None
    signature_sentinels: frozenset[str] = frozenset()
    signature_required: str | None = None  # regex over the model id
    call_id_pattern: str | None = None
    call_id_max: int | None = None
    tool_name_pattern: str | None = None
    call_names: bool = False  # names in calls and responses are checked too
    output_cap: tuple[str, ...] = ()  # key path of the output limit


# Anthropic: "tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'".
_ID = r"[a-zA-Z0-9_-]+"
# Anthropic, OpenAI and Bedrock tool names: "tools.0.name: String should match pattern
# '^[a-zA-Z0-9_-]{1,64}$'" (OpenAI: "Invalid 'tools[0].function.name': string does not
# match pattern"; Bedrock ToolSpecification.name: 1..64 of [a-zA-Z0-9_-]).
_NAME = r"[a-zA-Z0-9_-]{1,64}"

#: The acceptance rules per wire API.
RULES: Mapping[str, ApiRules] = MappingProxyType(
    {
        "anthropic": ApiRules(
            shape="messages",
            marker_key="cache_control",
            roles=("user", "assistant"),
            first_role="user",
            results_first=True,
            unique_call_ids=True,
            non_blank_text=True,
            non_empty_content=True,
            # "all messages must have non-empty content except for the optional final
            # assistant message"
            empty_final_assistant=True,
            marker_budget=WIRE_BREAKPOINTS["anthropic"],
            marker_not_on_thinking=True,
            ttl_order=True,
            signature_issuer="anthropic",
            call_id_pattern=_ID,
            tool_name_pattern=_NAME,
            output_cap=("max_tokens",),
        ),
        "bedrock": ApiRules(
            shape="converse",
            marker_key="cachePoint",
            roles=("user", "assistant"),
            first_role="user",
            results_first=True,
            unique_call_ids=True,
            non_blank_text=True,
            non_empty_content=True,
            result_content_required=True,
            marker_budget=WIRE_BREAKPOINTS["bedrock"],
            marker_not_on_thinking=True,
            marker_not_first=True,
            ttl_order=True,
            signature_issuer="anthropic",
            # ToolUseBlock / ToolResultBlock.toolUseId: length 1..64, [a-zA-Z0-9_-]+ (newer
            # references also allow ".:" in toolUse ids; Claude behind Bedrock does not).
            call_id_pattern=r"[a-zA-Z0-9_-]{1,64}",
            tool_name_pattern=_NAME,
            call_names=True,  # ToolUseBlock.name has the same constraint as the spec's
            output_cap=("inferenceConfig", "maxTokens"),
        ),
        "gemini": ApiRules(
            shape="contents",
            roles=("user", "model"),
            first_role="user",
            assistant_role="model",
            pairing="function-turns",
            call_after_user=True,
            # A trailing call with no response is not a documented refusal.
            calls_answered_at_end=False,
            non_blank_text=True,
            # The API returns signatures on empty text parts and takes them back verbatim.
            blank_signed_text=True,
            non_empty_content=True,
            signature_issuer="google",
            # "skip_thought_signature_validator": the documented stand-in for a call whose
            # signature was lost (history from another model, compacted history).
            signature_sentinels=frozenset({"skip_thought_signature_validator"}),
            signature_required=r"gemini-3",
            # "Invalid function name. Must start with a letter or an underscore. Must be
            # a-z, A-Z, 0-9, or contain underscores (_), dots (.), colons (:), or dashes
            # (-), with a maximum length of 64."
            tool_name_pattern=r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}",
            call_names=True,
            output_cap=("generationConfig", "maxOutputTokens"),
        ),
        "openai": ApiRules(
            shape="chat",
            marker_key="prompt_cache_breakpoint",
            pairing="tool-messages",
            unique_call_ids=True,
            marker_budget=EXPLICIT_BREAKPOINTS["openai"],  # explicit breakpoints per request
            marked_text_not_blank=True,
            assistant_needs_content=True,
            # "Invalid 'messages[2].tool_calls[0].id': string too long. Expected a string
            # with maximum length 40"
            call_id_max=40,
            tool_name_pattern=_NAME,
            output_cap=("max_completion_tokens",),
        ),
        "openai-compatible": ApiRules(
            shape="chat",
            marker_key="cache_control",
            pairing="tool-messages",
            unique_call_ids=True,
            # forwarded to Anthropic (OpenRouter), whose budget applies
            marker_budget=WIRE_BREAKPOINTS["openai-compatible"],
            marked_text_not_blank=True,
            assistant_needs_content=True,
            tool_name_pattern=_NAME,
            output_cap=("max_tokens",),
        ),
        "openai-responses": ApiRules(
            shape="responses",
            marker_key="prompt_cache_breakpoint",
            # "No tool output found for function call call_…" and "No tool call found for
            # function call output with call_id call_…": pairs are matched by call_id over
            # the whole input, not by position.
            pairing="by-id",
            unique_call_ids=True,
            marker_budget=EXPLICIT_BREAKPOINTS["openai-responses"],  # as on Chat Completions
            # A reasoning item's encrypted_content is decrypted by OpenAI only ("The
            # encrypted content for item … could not be verified").
            signature_issuer="openai",
            # "Invalid 'input[5].call_id': string too long. Expected a string with maximum
            # length 64"
            call_id_max=64,
            # "The Responses API requires that all tool names conform to
            # '^[a-zA-Z0-9_-]+$'" (openai/codex#8694), at most 64 characters.
            tool_name_pattern=_NAME,
            output_cap=("max_output_tokens",),
        ),
        "copilot": ApiRules(
            shape="chat",
            marker_key="copilot_cache_control",
            pairing="tool-messages",
            unique_call_ids=True,
            # Copilot forwards the marks to Claude, whose budget of 4 applies.
            marker_budget=WIRE_BREAKPOINTS["copilot"],
            # Claude behind it: "cache_control cannot be set for empty text blocks".
            marked_text_not_blank=True,
            assistant_needs_content=True,
            # Claude behind it: "tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'".
            call_id_pattern=_ID,
            tool_name_pattern=_NAME,
            output_cap=("max_tokens",),
        ),
    }
)
