"""The acceptance rules of a wire API, as data: what the endpoints refuse beyond the
request types, one :class:`ApiRules` in each API's record (``SPEC.rules`` in its provider
module; the checks that read these parameters are in :mod:`.acceptance`). Each parameter
carries, in a comment, the reason or the upstream error text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CALL_ID", "TOOL_NAME", "ApiRules", "Pairing"]


Pairing = Literal["next-turn", "tool-messages", "function-turns", "by-id"]


@dataclass(frozen=True, slots=True)
class ApiRules:
    """The acceptance rules of one wire API, as parameters of the shared checks.

    ``shape`` names the reader that turns the body into the common view. ``pairing``
    says where a call's results go: in the next turn (Anthropic, Bedrock), in the
    ``role: tool`` messages right after (Chat Completions), in the next content with
    as many responses as there were calls (Gemini), or anywhere after the call, matched
    by id (the Responses API's ``function_call_output`` items). Patterns are matched in
    full. ``marker_key`` and ``marker_budget`` are left unset in a record's rules: the
    record fills them in from its own marker key and budget.
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
CALL_ID = r"[a-zA-Z0-9_-]+"
# Anthropic, OpenAI and Bedrock tool names: "tools.0.name: String should match pattern
# '^[a-zA-Z0-9_-]{1,64}$'" (OpenAI: "Invalid 'tools[0].function.name': string does not
# match pattern"; Bedrock ToolSpecification.name: 1..64 of [a-zA-Z0-9_-]).
TOOL_NAME = r"[a-zA-Z0-9_-]{1,64}"
