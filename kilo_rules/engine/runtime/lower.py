"""Session parts → provider-neutral model messages (Kilo's ``toModelMessages``).

Rules, as Kilo applies them (spec §6, §7.5–§7.6, §8):
* a pruned (compacted) tool output is sent as the policy's placeholder, attachments dropped;
* a tool call that never finished gets an error result, so calls and results always pair;
* an errored assistant message is dropped unless it was interrupted with content;
* each ``step-start`` opens a new assistant/tool message pair;
* after a completed summary, media before the newest real user message become a short
  ``[Attached <mime>: <name>]`` text (historical media stripping);
* media returned by a tool move into a following user message when the provider cannot
  take them inside a tool result.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import urllib.parse
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kilo_rules.engine.base.cancel import checkpoint
from kilo_rules.engine.formats.catalog import signature_issuer
from kilo_rules.engine.formats.policy import Lowering, Prune, Summary, default
from kilo_rules.engine.formats.request import (
    Approval,
    CacheMark,
    Media,
    ModelMessage,
    Part,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.formats.session import (
    ApprovalPart,
    CompactionPart,
    FilePart,
    Message,
    ReasoningPart,
    StepStartPart,
    TextPart,
    ToolPart,
)
from kilo_rules.engine.runtime.history import has_non_synthetic_part
from kilo_rules.engine.runtime.memo import (
    ContentKey,
    ContentMemo,
    PrefixMemo,
    UnkeyableError,
    data_key,
)

if TYPE_CHECKING:
    from kilo_rules.engine.compiler.plan import Plan

INTERRUPTED = "[Tool execution was interrupted]"
MEDIA_MIME_PREFIXES = ("image/", "application/pdf")


@dataclass(frozen=True, slots=True)
class LowerSettings:
    """What lowering needs from the plan."""

    placeholder: str = default(Prune, "placeholder")
    compaction_request: str = default(Summary, "request_text")
    media_in_tool_results: bool = True
    strip_historical_media: bool = False
    media_placeholder: str = default(Lowering, "media_placeholder")
    drop_errored_assistant: bool = default(Lowering, "drop_errored_assistant")
    tool_output_max_chars: int | None = None  # set for the summary input only
    strip_all_media: bool = False  # the summary input drops every media payload


def lower_settings(plan: Plan, *, has_summary: bool = False, **changes: Any) -> LowerSettings:
    """Lowering as the plan's policy asks for it (``changes`` adjust it, e.g. for the
    summary input); historical media are stripped only once a summary exists."""
    s = plan.settings
    media_ok = s.lowering.media_in_tool_results.get(
        plan.model.provider, plan.model.media_in_tool_results
    )
    base = LowerSettings(
        placeholder=s.prune.placeholder,
        compaction_request=s.compaction.summary.request_text,
        media_in_tool_results=bool(media_ok),
        strip_historical_media=has_summary and s.lowering.strip_media_after_summary,
        media_placeholder=s.lowering.media_placeholder,
        drop_errored_assistant=s.lowering.drop_errored_assistant,
    )
    return dataclasses.replace(base, **changes) if changes else base


def client_mark(metadata: dict[str, object]) -> CacheMark | None:
    """A cache breakpoint the client put on a part or message (``metadata.cache_control``,
    Anthropic's shape); kept by the cache stage and counted in its budget."""
    raw = metadata.get("cache_control")
    if not raw:
        return None
    ttl = raw.get("ttl") if isinstance(raw, dict) else None
    return CacheMark(ttl=ttl if ttl in ("5m", "1h") else None, client=True)


def is_media(mime: str) -> bool:
    """Images and PDFs travel as media; everything else as text."""
    return mime.startswith(MEDIA_MIME_PREFIXES)


def media_text(settings: LowerSettings, part: FilePart) -> str:
    """The placeholder that stands for a stripped attachment."""
    return settings.media_placeholder.format(mime=part.mime, name=part.filename or "file")


def _file(part: FilePart, settings: LowerSettings, strip: bool) -> Text | Media:
    if strip and is_media(part.mime):
        return Text(media_text(settings, part))
    url = part.url
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        is_b64 = header.endswith(";base64")
        if is_media(part.mime):
            data = (
                payload
                if is_b64
                else base64.b64encode(urllib.parse.unquote_to_bytes(payload)).decode()
            )
            return Media(mime=part.mime, data=data, filename=part.filename)
        try:
            raw = base64.b64decode(payload, validate=True) if is_b64 else None
            text = raw.decode("utf-8") if raw is not None else urllib.parse.unquote(payload)
        except (binascii.Error, UnicodeDecodeError):
            return Text(media_text(settings, part))
        return Text(text)
    if url.startswith(("http://", "https://")) and is_media(part.mime):
        return Media(mime=part.mime, url=url, filename=part.filename)
    return Text(media_text(settings, part))


def _cut(text: str, limit: int | None) -> str:
    if limit is None:
        return text
    from kilo_rules.engine.text.truncate import truncate_for_summary

    return truncate_for_summary(text, limit)


def _tool(
    part: ToolPart, settings: LowerSettings, strip: bool, origin: str | None = None
) -> tuple[ToolCall, ToolResult, list[Media]]:
    signature = part.metadata.get("thought_signature")
    call = ToolCall(
        call_id=part.call_id,
        name=part.tool,
        input=dict(part.input),
        signature=signature if isinstance(signature, str) else None,
        origin=origin,
    )
    moved: list[Media] = []
    if part.status == "completed":
        if part.time.compacted is not None:
            content: tuple[Text | Media, ...] = (Text(settings.placeholder),)
        else:
            items: list[Text | Media] = [Text(_cut(part.output, settings.tool_output_max_chars))]
            if not (strip or settings.strip_all_media):
                for att in part.attachments:
                    lowered = _file(att, settings, strip=False)
                    if isinstance(lowered, Media) and not settings.media_in_tool_results:
                        moved.append(lowered)
                    else:
                        items.append(lowered)
            content = tuple(items)
        mark = client_mark(part.metadata)
        return call, ToolResult(part.call_id, part.tool, content, cache=mark), moved
    if part.status == "error":
        text = _cut(part.error or "error", settings.tool_output_max_chars)
        return call, ToolResult(part.call_id, part.tool, (Text(text),), is_error=True), moved
    return call, ToolResult(part.call_id, part.tool, (Text(INTERRUPTED),), is_error=True), moved


def _keep_assistant(msg: Message, settings: LowerSettings) -> bool:
    if msg.error is None or not settings.drop_errored_assistant:
        return True
    interrupted = msg.error.name == "MessageAbortedError"
    has_content = any(not isinstance(p, StepStartPart | ReasoningPart) for p in msg.parts)
    return interrupted and has_content


def _assistant(msg: Message, settings: LowerSettings, strip: bool) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    parts: list[Part] = []
    results: list[ToolResult | Approval] = []
    moved: list[Media] = []
    # Signatures belong to the vendor of the model that wrote this message.
    origin = signature_issuer(msg.model)

    def flush() -> None:
        if parts:
            out.append(ModelMessage("assistant", tuple(parts), source_id=msg.id))
        if results:
            out.append(ModelMessage("tool", tuple(results), source_id=msg.id))
        if moved:
            note = Text("Attached media from the tool results above.", synthetic=True)
            out.append(ModelMessage("user", (note, *moved), source_id=msg.id))
        parts.clear()
        results.clear()
        moved.clear()

    for p in msg.parts:
        if isinstance(p, StepStartPart):
            flush()
        elif isinstance(p, TextPart):
            if not p.ignored:
                parts.append(Text(p.text, synthetic=p.synthetic, cache=client_mark(p.metadata)))
        elif isinstance(p, ReasoningPart):
            parts.append(
                Reasoning(p.text, signature=p.signature, encrypted=p.encrypted, origin=origin)
            )
        elif isinstance(p, ToolPart):
            call, result, media = _tool(p, settings, strip, origin)
            parts.append(call)
            results.append(result)
            moved.extend(media)
        elif isinstance(p, FilePart):
            parts.append(_file(p, settings, strip or settings.strip_all_media))
        elif isinstance(p, ApprovalPart):
            # The AI SDK's shape: the request in the assistant turn, the answer beside the
            # tool results.
            parts.append(Approval(p.approval_id, p.call_id))
            if p.approved is not None:
                results.append(
                    Approval(
                        p.approval_id, p.call_id, p.approved, p.reason, kind="approval-response"
                    )
                )
    flush()
    return out


def _user(msg: Message, settings: LowerSettings, strip: bool) -> ModelMessage | None:
    parts: list[Part] = []
    for p in msg.parts:
        if isinstance(p, TextPart):
            if not p.ignored:
                parts.append(Text(p.text, synthetic=p.synthetic, cache=client_mark(p.metadata)))
        elif isinstance(p, FilePart):
            parts.append(_file(p, settings, strip or settings.strip_all_media))
        elif isinstance(p, CompactionPart):
            parts.append(Text(settings.compaction_request))
    if not parts:
        return None
    return ModelMessage("user", tuple(parts), client_mark(msg.metadata), source_id=msg.id)


def _file_key(p: FilePart) -> Hashable:
    return ("file", p.mime, p.url, p.filename)


def _part_key(p: object) -> Hashable:
    if isinstance(p, TextPart):
        return ("text", p.text, p.synthetic, p.ignored, data_key(p.metadata.get("cache_control")))
    if isinstance(p, ToolPart):
        meta = p.metadata
        return (
            "tool",
            p.call_id,
            p.tool,
            data_key(p.input),
            p.status,
            p.output,
            p.error,
            p.time.compacted,
            data_key(meta.get("cache_control")),
            data_key(meta.get("thought_signature")),
            *[_file_key(a) for a in p.attachments],
        )
    if isinstance(p, ReasoningPart):
        return ("reasoning", p.text, p.signature, p.encrypted)
    if isinstance(p, FilePart):
        return _file_key(p)
    if isinstance(p, ApprovalPart):
        return ("approval", p.approval_id, p.call_id, p.approved, p.reason)
    if isinstance(p, StepStartPart | CompactionPart):
        return p.type
    raise UnkeyableError(type(p).__name__)  # pragma: no cover - every part kind is keyed


def lowering_key(msg: Message) -> ContentKey | None:
    """Everything lowering reads from ``msg`` (and nothing else: tool metadata such as a
    recorded diff stays out), so messages with equal keys lower to equal messages; None
    when a value in it is not JSON-like data. Hashed by the message and part ids."""
    try:
        content = (
            msg.id,
            msg.role,
            msg.model,
            msg.error.name if msg.error is not None else None,
            data_key(msg.metadata.get("cache_control")),
            *[_part_key(p) for p in msg.parts],
        )
    except UnkeyableError:
        return None
    return ContentKey(content, (msg.id, *[p.id for p in msg.parts]))


def lower(
    messages: Sequence[Message],
    settings: LowerSettings,
    cache: ContentMemo[Message, dict[tuple[LowerSettings, bool], list[ModelMessage]]] | None = None,
    prefix: PrefixMemo[Message, list[ModelMessage]] | None = None,
    key: Hashable = None,
) -> list[ModelMessage]:
    """Model messages for the (already projected) ``messages``.

    With ``cache``, a message lowered before with the same settings (the same object, or
    one of equal content) is not lowered again, and its lowered messages are the same
    objects, so their JSON and counts are cached too. With ``prefix`` as well, the
    messages the list shares with the one lowered last under ``key`` (the session's id:
    the first message of a view may be made anew each step, by the environment block)
    are not even looked up."""
    cutoff = -1
    if settings.strip_historical_media:
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if m.role == "user" and has_non_synthetic_part(m):
                cutoff = i
                break
    if cache is None:
        out: list[ModelMessage] = []
        for i, msg in enumerate(messages):
            checkpoint()
            out.extend(_one(msg, settings, i < cutoff))
        return out

    def one(i: int, msg: Message) -> list[ModelMessage]:
        checkpoint()
        strip = i < cutoff
        by_settings = cache.get_or(msg, dict)
        key = (settings, strip)
        lowered = by_settings.get(key)
        if lowered is None:
            lowered = by_settings[key] = _one(msg, settings, strip)
        return lowered

    if prefix is None:
        per_message = [one(i, m) for i, m in enumerate(messages)]
    else:
        per_message = prefix.values(messages, one, (settings, cutoff), key)
    return list(itertools.chain.from_iterable(per_message))


def _one(msg: Message, settings: LowerSettings, strip: bool) -> list[ModelMessage]:
    if msg.role == "user":
        lowered = _user(msg, settings, strip)
        return [lowered] if lowered is not None else []
    return _assistant(msg, settings, strip) if _keep_assistant(msg, settings) else []
