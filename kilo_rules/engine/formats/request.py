"""The provider-neutral request the runtime builds before a provider renders its wire JSON.

Lowering turns Session v1 parts into these messages (Kilo's ``toModelMessages``): a user
message, an assistant message with text/reasoning/tool calls, and a ``tool`` message with
the results of those calls. Cache marks are placed on this structure by the cache stage;
a provider module then maps it, marks included, onto its own wire format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class CacheMark:
    """A prompt-cache breakpoint. ``client`` marks came with the session and are kept."""

    ttl: Literal["5m", "1h"] | None = None
    client: bool = False


@dataclass(frozen=True, slots=True)
class Text:
    """Plain text. ``synthetic`` text was injected by the runtime (environment, reminders)."""

    text: str
    synthetic: bool = False
    cache: CacheMark | None = None
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class Media:
    """An image or document: ``data`` is base64 (no data: prefix) unless ``url`` is set."""

    mime: str
    data: str | None = None
    url: str | None = None
    filename: str | None = None
    cache: CacheMark | None = None
    kind: Literal["media"] = "media"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Model reasoning; signed or encrypted reasoning is passed back untouched.

    ``origin`` is the vendor whose model issued the signature or encrypted state
    (``"anthropic"``, ``"google"``, ``"openai"``; None when unknown): a renderer sends them
    back only to that vendor (see :func:`~kilo_rules.engine.formats.catalog.signature_issuer`)."""

    text: str
    signature: str | None = None
    encrypted: str | None = None
    cache: CacheMark | None = None
    kind: Literal["reasoning"] = "reasoning"
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call made by the assistant."""

    call_id: str
    name: str
    input: dict[str, Any]
    cache: CacheMark | None = None
    kind: Literal["tool-call"] = "tool-call"
    # Gemini signs function calls made while thinking; the signature must come back,
    # but only to the vendor named by ``origin`` (None: unknown, trusted).
    signature: str | None = None
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The result of one tool call. ``content`` is text and, where allowed, media."""

    call_id: str
    name: str
    content: tuple[Text | Media, ...]
    is_error: bool = False
    cache: CacheMark | None = None
    kind: Literal["tool-result"] = "tool-result"


@dataclass(frozen=True, slots=True)
class Approval:
    """A tool-approval request (on an assistant message) or response (on a tool message).
    No wire API takes it: :func:`~kilo_rules.engine.providers.render` drops it; until then it
    keeps a cache breakpoint off the message's last part, as Kilo's placement does."""

    approval_id: str
    call_id: str
    approved: bool | None = None  # None on the request
    reason: str | None = None
    cache: CacheMark | None = None
    kind: Literal["approval-request", "approval-response"] = "approval-request"


Part = Text | Media | Reasoning | ToolCall | ToolResult | Approval


@dataclass(frozen=True, slots=True)
class ModelMessage:
    """One message. ``system`` messages hold a single Text; ``tool`` messages ToolResults.

    ``cache`` is a message-level mark (Kilo places it there for Anthropic and Bedrock);
    providers put it on the message's last block. ``source_id`` is the Session v1 message
    it came from (None for messages the runtime made)."""

    role: Role
    parts: tuple[Part, ...]
    cache: CacheMark | None = None
    source_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool definition offered to the model."""

    name: str
    description: str
    input_schema: dict[str, Any]
    cache: CacheMark | None = None


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything a provider needs to render one request."""

    model: str  # the API model id
    messages: tuple[ModelMessage, ...]  # system messages first
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def system(self) -> tuple[ModelMessage, ...]:
        """The leading system messages."""
        out = []
        for m in self.messages:
            if m.role != "system":
                break
            out.append(m)
        return tuple(out)

    @property
    def conversation(self) -> tuple[ModelMessage, ...]:
        """Every message after the leading system messages."""
        return self.messages[len(self.system) :]
