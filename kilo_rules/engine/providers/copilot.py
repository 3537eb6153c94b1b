"""GitHub Copilot chat (``POST /chat/completions`` on ``api.githubcopilot.com``): the body.

Copilot speaks OpenAI's Chat Completions shape (see :mod:`.openai` and
:mod:`.openai_compatible`), with its own cache field:

* cache marks → ``copilot_cache_control: {"type": "ephemeral"}``, the key Kilo writes in its
  ``copilot`` provider-options namespace. It goes on the **message object** (one per
  message, however many of the message's parts were marked) and on a marked tool
  definition, where GitHub's own client puts it (vscode-copilot-chat's
  ``rawMessageToCAPI`` sets it on the message that holds a cache breakpoint; Copilot CLI
  logs show it on the last tool). Content parts never carry it. The field has no ttl, so
  an hour mark is sent as the default one. Copilot serves Claude behind it, so Anthropic's
  budget of 4 breakpoints applies;
* tool-call ids are cleaned to ``^[a-zA-Z0-9_-]+$`` (the same way for a call and its
  result): Claude refuses other characters, and Kilo scrubs ids for Claude models before
  they reach the Copilot SDK;
* a PDF becomes a text placeholder: Copilot's chat endpoint takes text and images only
  (Kilo's Copilot SDK refuses any other file part);
* the output limit is sent as ``max_tokens``;
* reasoning is not sent back: Copilot takes it only as ``reasoning_text`` with the
  ``reasoning_opaque`` state Copilot itself issued, which a session does not tell apart
  from a signature Anthropic issued;
* everything else (system messages, text, images, tool results) is rendered as for
  :mod:`.openai_compatible`.
"""

from __future__ import annotations

from typing import Any

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.request import CacheMark, ModelRequest
from kilo_rules.engine.providers._api_rules import CALL_ID, TOOL_NAME, ApiRules
from kilo_rules.engine.providers._shared import FragmentStore
from kilo_rules.engine.providers.openai import Dialect, render_chat, render_chat_json
from kilo_rules.engine.providers.registry import WireApiSpec

ENDPOINT = "/chat/completions"  # relative to the Copilot API base URL

#: The key a cache mark is written under.
MARK_KEY = "copilot_cache_control"


def copilot_cache_control(_: CacheMark) -> dict[str, Any]:
    """The wire form of a mark; Copilot's field has no ttl."""
    return {"type": "ephemeral"}


DIALECT = Dialect(
    part_mark=copilot_cache_control,
    mark_key=MARK_KEY,
    message_mark=True,
    max_tokens_key="max_tokens",
    marks_on_message=True,
    tool_marks=True,
    clean_ids=True,
    files=False,
)


def render(request: ModelRequest) -> dict[str, Any]:
    """The Copilot request body for ``request`` (JSON-serialisable, deterministic)."""
    return render_chat(request, DIALECT)


def render_json(request: ModelRequest, fragments: FragmentStore | None = None) -> bytes:
    """``render(request)`` as compact JSON in UTF-8, from per-message fragments."""
    return render_chat_json(request, DIALECT, fragments, "copilot")


#: This wire API's record (:mod:`kilo_rules.engine.providers.registry`).
SPEC = WireApiSpec(
    facts=wireapi.facts("copilot"),
    render=render,
    render_json=render_json,
    endpoint=ENDPOINT,
    marker_key=MARK_KEY,
    rules=ApiRules(
        shape="chat",
        pairing="tool-messages",
        unique_call_ids=True,
        # Claude behind it: "cache_control cannot be set for empty text blocks".
        marked_text_not_blank=True,
        assistant_needs_content=True,
        # Claude behind it: "tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'".
        call_id_pattern=CALL_ID,
        tool_name_pattern=TOOL_NAME,
        output_cap=("max_tokens",),
    ),
)
