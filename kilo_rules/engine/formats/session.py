"""Session v1: a conversation as messages of typed parts (the parts model of Kilo Code).

A session is what an agent has recorded so far. ``apply_plan`` reads it and never changes it;
what should be persisted comes back as mutations. Importers (``kilo_rules.engine.importers``) turn
foreign logs into this shape. The JSON Schema ``schemas/session.v1.json`` is generated from
these models (``kilo-rules schema --write``) and a test keeps the two in step.

Times are integer milliseconds since the Unix epoch.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.cancel import checkpoint
from kilo_rules.engine.base.errors import Diagnostic, Location, SessionError
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.base.source import JsonPath, JsonText, json_problem, nearest

MAX_BYTES = 64 * 1024 * 1024
"""The largest session or agent log read from a file, in bytes (long sessions with many
screenshots reach tens of megabytes; a parsed document costs several times its size)."""

MAX_DEPTH = 100
"""How deeply objects and arrays may nest in a session (the outermost value is level 1).
Real sessions stay under 20; the bound keeps recursive code downstream (validation,
serialisation, copies) from running out of stack."""


MAX_INT_DIGITS = 1_000
"""The most digits an integer of a session or agent log may spell. Python refuses to
convert integers past 4,300 digits (a bare ``ValueError`` from deep inside ``json``), and no
count, time or id needs more than a few dozen."""


class NumberTooLongError(ValueError):
    """A JSON number that cannot be held: an integer longer than :data:`MAX_INT_DIGITS`
    digits, or a decimal so large it would be infinite; and where its text starts
    (``offset`` into the text parsed)."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class _UnfitError(Exception):
    def __init__(self, text: str, message: str) -> None:
        super().__init__(message)
        self.text = text


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _UnfitError(
            text, f"an integer of {digits:,} digits; at most {MAX_INT_DIGITS:,} are allowed"
        )
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e999 parses as infinity, which no JSON output can write back.
        raise _UnfitError(
            text, f"{text[:24]}{'…' if len(text) > 24 else ''} is too large for a number"
        )
    return value


def parse_json(text: str) -> Any:
    """``json.loads(text)``, refusing numbers that cannot be held — integers of more than
    :data:`MAX_INT_DIGITS` digits (before Python's own conversion limit raises an untyped
    ``ValueError``) and decimals that overflow to infinity — with
    :class:`NumberTooLongError`; raises :class:`json.JSONDecodeError` and
    :class:`RecursionError` as ``json.loads`` does."""
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float)
    except _UnfitError as exc:
        raise NumberTooLongError(str(exc), _number_offset(text, exc.text)) from None


def _number_offset(text: str, number: str) -> int:
    # parse_int is not told where the number is: the first run of exactly these digits that
    # stands alone (not inside a longer run of digits) is where it most likely starts.
    at = text.find(number)
    while at > 0 and text[at - 1].isdigit():
        at = text.find(number, at + 1)
    return max(at, 0)


def number_location(text: str, file: str, offset: int, line: int = 1) -> Location:
    """The ``file:line:col`` of ``offset`` into ``text`` (whose first line is ``line``)."""
    return Location(file, line + text.count("\n", 0, offset), offset - text.rfind("\n", 0, offset))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(_Model):
    """Plain text. ``synthetic`` marks text the runtime injected (environment blocks,
    reminders); ``ignored`` text is kept in the record but never sent to the model.
    ``metadata.cache_control`` asks for a cache breakpoint on this text."""

    type: Literal["text"] = Field("text", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")
    text: str = Field(description="The text.")
    synthetic: bool = Field(False, description="Injected by the runtime, not typed by a person.")
    ignored: bool = Field(False, description="Kept in the record but never sent to the model.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")


class ReasoningPart(_Model):
    """Model reasoning. A ``signature`` (or opaque ``encrypted`` state) must be sent back
    byte-for-byte, so signed reasoning is never edited."""

    type: Literal["reasoning"] = Field("reasoning", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")
    text: str = Field(description="The reasoning text (may be empty when only encrypted).")
    signature: str | None = Field(None, description="Provider signature over the reasoning.")
    encrypted: str | None = Field(
        None, description="Opaque encrypted reasoning state (redacted thinking)."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")


class FilePart(_Model):
    """A file or media attachment: an image, a PDF, or any document."""

    type: Literal["file"] = Field("file", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")
    mime: str = Field(description="MIME type, e.g. image/png or application/pdf.")
    url: str = Field(description="A data: URL with the content, or an http(s)/file URL.")
    filename: str | None = Field(None, description="Original file name, if known.")
    synthetic: bool = Field(False, description="Injected by the runtime.")


class ToolTime(_Model):
    """When a tool ran, and when its output was pruned (``compacted``)."""

    start: int | None = Field(None, description="Start of execution (ms).")
    end: int | None = Field(None, description="End of execution (ms).")
    compacted: int | None = Field(
        None,
        description="When the output was pruned. A compacted output is still stored, "
        "but the model sees a placeholder instead.",
    )


class ToolPart(_Model):
    """A tool call and, once it ran, its result. Recognised metadata: ``cache_control``
    (a client cache breakpoint on the result) and ``thought_signature`` (Gemini's
    signature of a call made while thinking, sent back with the call)."""

    type: Literal["tool"] = Field("tool", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")
    call_id: str = Field(description="The provider's tool-call id; pairs call and result.")
    tool: str = Field(description="Tool name.")
    input: dict[str, Any] = Field(default_factory=dict, description="Arguments of the call.")
    status: Literal["pending", "running", "completed", "error"] = Field(
        "completed", description="Execution state."
    )
    output: str = Field("", description="Result text (completed).")
    error: str | None = Field(None, description="Error text (status error).")
    title: str | None = Field(None, description="Short human title of the call.")
    attachments: list[FilePart] = Field(
        default_factory=list, description="Media the tool returned (screenshots, PDFs)."
    )
    time: ToolTime = Field(default_factory=ToolTime, description="Execution and prune times.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")


class StepStartPart(_Model):
    """Marks the start of one model step inside an assistant message."""

    type: Literal["step-start"] = Field("step-start", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")


class CompactionPart(_Model):
    """On a user message: asks for (and records) a compaction of everything before it."""

    type: Literal["compaction"] = Field("compaction", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")
    auto: bool = Field(True, description="Started automatically (overflow) rather than asked.")
    overflow: bool | None = Field(
        None,
        description="True when a provider overflow error started it, false for the "
        "preflight estimate, null when requested by a person.",
    )
    tail_start_id: str | None = Field(
        None, description="First message of the verbatim tail kept after the summary."
    )


class ApprovalPart(_Model):
    """A tool call that waits for the user's approval, and the answer once given (the AI
    SDK's ``tool-approval-request`` and ``tool-approval-response``). Kept in the record
    and in the model messages, where it decides where a cache breakpoint can go; no
    provider's wire carries it, so it is never sent."""

    type: Literal["approval"] = Field("approval", description="Part kind.")
    id: str = Field(description="Part id, unique within the session.")
    approval_id: str = Field(description="The approval's id; pairs request and response.")
    call_id: str = Field(description="The tool call that needs approval.")
    approved: bool | None = Field(
        None, description="The answer: true or false; null while it is still asked."
    )
    reason: str | None = Field(None, description="Why it was approved or denied, if given.")


Part = Annotated[
    TextPart | ReasoningPart | FilePart | ToolPart | StepStartPart | CompactionPart | ApprovalPart,
    Field(discriminator="type"),
]


class CacheTokens(_Model):
    """Prompt-cache token counts reported by the provider."""

    read: int = Field(0, ge=0, description="Input tokens read from the prompt cache.")
    write: int = Field(0, ge=0, description="Input tokens written to the prompt cache.")


class TokenUsage(_Model):
    """Token usage of one assistant message, as the provider reported it."""

    input: int = Field(0, ge=0, description="Uncached input tokens.")
    output: int = Field(0, ge=0, description="Output tokens (without reasoning).")
    reasoning: int = Field(0, ge=0, description="Reasoning tokens.")
    cache: CacheTokens = Field(default_factory=CacheTokens, description="Cache reads/writes.")
    total: int | None = Field(None, ge=0, description="Provider total, used only as fallback.")


class MessageError(_Model):
    """Why an assistant message failed."""

    name: str = Field(description="Error class, e.g. MessageAbortedError, APIError.")
    message: str = Field("", description="Error text.")


class Message(_Model):
    """One user or assistant message made of parts."""

    id: str = Field(description="Message id, unique within the session; sorts by time.")
    role: Literal["user", "assistant"] = Field(description="Who wrote it.")
    created: int = Field(0, ge=0, description="Creation time (ms).")
    parts: list[Part] = Field(default_factory=list, description="The content, in order.")
    agent: str | None = Field(None, description="Agent (mode) name, e.g. code, plan.")
    model: str | None = Field(None, description="Model id that produced or will answer it.")
    system: str | None = Field(None, description="Per-message system prompt override (user).")
    parent_id: str | None = Field(None, description="The user message an assistant answers.")
    summary: bool = Field(False, description="An assistant message that is a compaction summary.")
    finish: str | None = Field(None, description="Finish reason; set once the step ended.")
    error: MessageError | None = Field(None, description="Set when the message failed.")
    tokens: TokenUsage | None = Field(None, description="Provider token usage (assistant).")
    cost: float | None = Field(None, ge=0, description="Cost in USD (assistant).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")


class ToolDefinition(_Model):
    """A tool the agent offers the model."""

    name: str = Field(description="Tool name.")
    description: str = Field("", description="What the tool does.")
    input_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON Schema of the arguments.",
    )


class Session(_Model):
    """A recorded or live agent session (Session v1)."""

    version: Literal[1] = Field(1, description="Format version.")
    id: str = Field(description="Session id.")
    title: str | None = Field(None, description="Human title.")
    directory: str | None = Field(None, description="Working directory of the session.")
    agent: str | None = Field(None, description="Default agent (mode) name.")
    model: str | None = Field(None, description="Model id the session ran with.")
    tools: list[ToolDefinition] = Field(default_factory=list, description="Tools offered.")
    messages: list[Message] = Field(default_factory=list, description="Messages, oldest first.")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free-form metadata (origin, license, importer)."
    )

    @field_validator("directory")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        # A path with a NUL names no file: every os call on it raises an untyped ValueError.
        if value is not None and "\x00" in value:
            raise ValueError("a working directory may not hold a NUL character")
        return value


def is_session_v1(data: Any) -> bool:
    """Whether parsed JSON is a Session v1 document: an object with ``"version": 1`` and a
    ``"messages"`` array, wherever the keys sit. This is the one test of the format: readers
    that accept either Session v1 or a foreign log decide with it, on the parsed value, and
    validate what it accepts as Session v1 (so a bad session is an error, never a log)."""
    if not isinstance(data, dict):
        return False
    version = data.get("version")
    # JSON true would compare equal to 1; it is not a version number.
    return version == 1 and not isinstance(version, bool) and isinstance(data.get("messages"), list)


def session_from_json(text: str, file: str = "<session>") -> Session:
    """Parse and validate a Session v1 JSON document; errors are located ``file:line:col``.

    Besides the schema, a session must nest at most :data:`MAX_DEPTH` levels, hold no lone
    UTF-16 surrogate (``"\\ud800"`` parses, but no output can encode it) and use each
    message id, part id and tool call id once, and spell no number it cannot hold (an
    integer longer than :data:`MAX_INT_DIGITS` digits, a decimal that overflows:
    ``session.number``).

    Messages parsed before (by content) are reused from :data:`DEFAULT_READER`, so a session
    resent with one more message costs little more than reading that message; see
    :class:`SessionReader`."""
    return DEFAULT_READER.read(text, file)


def _session_from_json_cold(text: str, file: str) -> Session:
    # Every message parsed and validated afresh: the reference the reuse must agree with,
    # and the one path that reports errors.
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        raise SessionError(
            Diagnostic(
                "session.json", f"not valid JSON: {exc.msg}", Location(file, exc.lineno, exc.colno)
            )
        ) from None
    except NumberTooLongError as exc:
        raise SessionError(
            Diagnostic("session.number", str(exc), number_location(text, file, exc.offset))
        ) from None
    except RecursionError:
        deep = JsonText(file, text).too_deep(MAX_DEPTH)
        path, location = deep if deep is not None else ((), Location(file, 1, 1))
        raise SessionError(_depth_diagnostic(path, location)) from None
    return session_from_data(data, file=file, text=text)


def session_from_data(data: Any, file: str = "<session>", text: str | None = None) -> Session:
    """Validate already-parsed Session v1 data (``text``, when given, is the JSON it was
    parsed from, to locate errors; see :func:`session_from_json` for what is checked)."""
    locator = JsonText(file, text) if text is not None else None

    def locate(path: JsonPath) -> Location:
        return locator.locate(path) if locator is not None else Location(file, 1, 1)

    problem = json_problem(data, MAX_DEPTH, text)
    if problem is not None:
        path, kind = problem
        raise SessionError(problem_diagnostic("session", kind, path, locate(path), MAX_DEPTH))
    checkpoint()  # a caller that gave up on a large document stops before and after
    try:
        session = Session.model_validate(data)
    except ValidationError as exc:
        errors = [(err, _document_path(err["loc"])) for err in exc.errors()[:50]]
        where = locator.locations(p for _, p in errors) if locator is not None else {}
        diags = []
        for err, path in errors:
            hit = nearest(where, path)
            location = hit[0] if hit is not None else Location(file, 1, 1)
            diags.append(
                Diagnostic(
                    "session.invalid",
                    f"{_dotted(path)}: {err['msg']}",
                    location,
                    details={"path": list(path), "type": err["type"]},
                )
            )
        raise SessionError(diags) from None
    checkpoint()
    duplicate = first_duplicate_id(session)
    if duplicate is not None:
        path, message = duplicate
        raise SessionError(
            Diagnostic(
                "session.duplicate-id",
                f"{_dotted(path)}: {message}",
                locate(path),
                details={"path": list(path)},
                hint="ids pair calls with results and name parts in mutations; "
                "each must be unique within the session",
            )
        )
    return session


def first_duplicate_id(session: Session) -> tuple[JsonPath, str] | None:
    """The first id, in document order, that an earlier message, part or tool call already
    uses, as its path in the session and a message naming the first use; None when every
    message id, part id (attachments included) and tool call id is unique. A repeated
    ``call_id`` would pair one result with two calls, and providers refuse a request that
    repeats one."""
    messages: dict[str, int] = {}
    parts: dict[str, JsonPath] = {}
    calls: dict[str, JsonPath] = {}
    for i, msg in enumerate(session.messages):
        checkpoint()
        if msg.id in messages:
            return ("messages", i, "id"), (
                f"message id {msg.id!r} is already used by messages[{messages[msg.id]}]"
            )
        messages[msg.id] = i
        for j, part in enumerate(msg.parts):
            here: JsonPath = ("messages", i, "parts", j)
            named = [(here, part.id)]
            if isinstance(part, ToolPart):
                named += [
                    ((*here, "attachments", k), att.id) for k, att in enumerate(part.attachments)
                ]
            for at, pid in named:
                if pid in parts:
                    return (*at, "id"), f"part id {pid!r} is already used by {_dotted(parts[pid])}"
                parts[pid] = at
            if isinstance(part, ToolPart):
                if part.call_id in calls:
                    return (*here, "call_id"), (
                        f"tool call id {part.call_id!r} is already used by "
                        f"{_dotted(calls[part.call_id])}"
                    )
                calls[part.call_id] = here
    return None


class _Known:
    """A message met before: its exact JSON text (the content key), the validated message
    and the ids it claims (for the session-wide uniqueness test)."""

    __slots__ = ("calls", "message", "parts", "text")

    def __init__(self, text: str, message: Message) -> None:
        self.text = text
        self.message = message
        parts: list[str] = []
        calls: list[str] = []
        for part in message.parts:
            parts.append(part.id)
            if isinstance(part, ToolPart):
                parts.extend(att.id for att in part.attachments)
                calls.append(part.call_id)
        self.parts = tuple(parts)
        self.calls = tuple(calls)


class _ReadColdError(Exception):
    """The text is not the plain case the reader handles (or not valid): read it cold."""


_WS = re.compile(r"[ \t\n\r]*")
_DECODE = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float).raw_decode


@dataclass(frozen=True, slots=True)
class ReaderStats:
    """What a :class:`SessionReader` holds and how often it helped: messages found where a
    document held their text (``hits``), messages read afresh (``misses``), the messages
    kept and the characters of JSON text they were read from, and the bound on those."""

    hits: int
    misses: int
    messages: int
    chars: int
    max_chars: int


def _chars(versions: tuple[_Known, ...]) -> int:
    return sum(len(k.text) for k in versions)


class _KnownMessages:
    """Messages by the beginning of their text (versions of one beginning kept together),
    at most ``max_chars`` characters of text in all, the least recently used dropped first
    (a :class:`~kilo_rules.engine.base.lru.LRUCache` weighed by characters; ``max_chars``
    0 keeps nothing). Thread-safe; two threads adding versions of one beginning at once
    may keep one of them only, which costs a later read, never a wrong one."""

    def __init__(self, max_chars: int, versions: int) -> None:
        self.max_chars = max_chars
        self.versions = versions
        self._store: LRUCache[str, tuple[_Known, ...]] | None = (
            LRUCache(max_chars, weigh=_chars) if max_chars else None
        )
        self._lock = threading.Lock()  # the counters only
        self._hits = 0
        self._misses = 0

    def find(self, text: str, at: int, prefix: str) -> _Known | None:
        """The message whose whole text ``text`` holds at ``at``, among those whose text
        begins with ``prefix``."""
        versions = self._store.get(prefix) if self._store is not None else None
        for known in versions or ():
            # A JSON object ends where its text says: a document that holds a known
            # message's whole text at this place holds exactly that message here.
            if text.startswith(known.text, at):
                with self._lock:
                    self._hits += 1
                return known
        with self._lock:
            self._misses += 1
        return None

    def add(self, prefix: str, known: _Known) -> None:
        """Keep ``known``, the newest version of its beginning."""
        store = self._store
        if store is None or len(known.text) > self.max_chars:
            return
        old = store.get(prefix) or ()
        store.put(prefix, (known, *(k for k in old if k.text != known.text))[: self.versions])

    def stats(self) -> ReaderStats:
        store = self._store
        held = store.items() if store is not None else []
        chars = store.weight() if store is not None else 0
        with self._lock:
            hits, misses = self._hits, self._misses
        return ReaderStats(hits, misses, sum(len(v) for _, v in held), chars, self.max_chars)

    def clear(self) -> None:
        if self._store is not None:
            self._store.clear()
        with self._lock:
            self._hits = self._misses = 0


class SessionReader:
    """Reads Session v1 JSON, reusing the messages it validated before.

    A caller that resends the whole session every step (the sidecar, a stateless service)
    would otherwise parse and validate every message every step. The reader remembers each
    message it accepted by its exact JSON text: where a new document holds the same text at
    a message's place, the message is taken as it is, without parsing it again, and only
    the messages not seen before are parsed and validated. What is read is always what a
    reading from scratch would give (an equal session, and for bad input the same typed,
    located errors: any problem sends the whole document down that path).

    Messages are found by content, never by their ids: two different messages with one id
    are two entries. Reused messages are the same objects in every session read; a
    :class:`Message` is frozen, and like everything read from a session they must not be
    changed in place (no code of kilo-rules does: the runtime returns mutations). Each
    session gets its own ``messages`` list.

    A reader keeps messages read from at most ``max_chars`` characters of JSON (the
    messages hold about as much again), the least recently used dropped first; a message
    longer than that is read afresh each time. It is thread-safe.
    """

    PREFIX = 128
    """How many characters of a message's JSON find its entry; shorter messages are read
    afresh every time (they cost next to nothing)."""

    VERSIONS = 4
    """How many messages that begin alike (versions of one message) are kept together."""

    def __init__(self, max_chars: int = 64 * 1024 * 1024) -> None:
        if max_chars < 0:
            raise ValueError("max_chars may not be negative")
        self._known = _KnownMessages(max_chars, self.VERSIONS)

    def read(self, text: str, file: str = "<session>") -> Session:
        """The session in ``text``, as :func:`session_from_json` reads it."""
        checkpoint()
        try:
            return self._read(text)
        except _ReadColdError:
            return _session_from_json_cold(text, file)

    def stats(self) -> ReaderStats:
        """Messages found and read afresh, and what is held."""
        return self._known.stats()

    def clear(self) -> None:
        """Forget every message read."""
        self._known.clear()

    def _read(self, text: str) -> Session:
        # The outer object by hand (the one place the layout matters), so that each message's
        # extent in the text is known; any value but the messages is decoded as json would.
        ws = _WS.match
        at = ws(text, 0).end()  # type: ignore[union-attr]  # [...]* always matches
        if text[at : at + 1] != "{":
            raise _ReadColdError
        at = ws(text, at + 1).end()  # type: ignore[union-attr]
        data: dict[str, Any] = {}
        known: list[_Known] | None = None
        others: list[str] = []  # the text of every member but the messages
        if text[at : at + 1] == "}":
            at = ws(text, at + 1).end()  # type: ignore[union-attr]
        else:
            while True:
                if text[at : at + 1] != '"':
                    raise _ReadColdError
                start = at
                key, at = _scan(_DECODE, text, at)
                at = ws(text, at).end()  # type: ignore[union-attr]
                if text[at : at + 1] != ":" or key in data:
                    raise _ReadColdError  # a repeated key: json keeps the last; leave that to json
                at = ws(text, at + 1).end()  # type: ignore[union-attr]
                if key == "messages" and text[at : at + 1] == "[":
                    known = []
                    at = self._messages(text, at, known)
                    data[key] = [k.message for k in known]
                else:
                    data[key], at = _scan(_DECODE, text, at)
                    others.append(text[start:at])
                at = ws(text, at).end()  # type: ignore[union-attr]
                sep = text[at : at + 1]
                at = ws(text, at + 1).end()  # type: ignore[union-attr]
                if sep == "}":
                    break
                if sep != ",":
                    raise _ReadColdError
        if at != len(text):
            raise _ReadColdError
        rest = {k: v for k, v in data.items() if k != "messages" or known is None}
        if json_problem(rest, MAX_DEPTH, "\n".join(others)) is not None or (
            known is not None and _repeats_an_id(known)
        ):
            raise _ReadColdError
        checkpoint()
        try:
            # Message objects are taken as they are (pydantic does not validate an instance
            # of the model again); the rest of the document is validated as usual.
            return Session.model_validate(data)
        except ValidationError:
            raise _ReadColdError from None

    def _messages(self, text: str, at: int, out: list[_Known]) -> int:
        """Read the array of messages at ``text[at] == "["`` into ``out``; where it ends."""
        ws = _WS.match
        at = ws(text, at + 1).end()  # type: ignore[union-attr]
        if text[at : at + 1] == "]":
            return at + 1
        find = self._known.find
        prefix_len = self.PREFIX
        while True:
            prefix = text[at : at + prefix_len]
            hit = find(text, at, prefix) or self._learn(text, at, prefix)
            out.append(hit)
            at = ws(text, at + len(hit.text)).end()  # type: ignore[union-attr]
            sep = text[at : at + 1]
            at = ws(text, at + 1).end()  # type: ignore[union-attr]
            if sep == "]":
                return at
            if sep != ",":
                raise _ReadColdError

    def _learn(self, text: str, at: int, prefix: str) -> _Known:
        checkpoint()
        value, end = _scan(_DECODE, text, at)
        own = text[at:end]
        # A message sits two levels down (session, messages): the same depth limit applies.
        if json_problem(value, MAX_DEPTH - 2, own) is not None:
            raise _ReadColdError
        try:
            message = Message.model_validate(value)
        except ValidationError:
            raise _ReadColdError from None
        known = _Known(own, message)
        if len(own) >= self.PREFIX:
            self._known.add(prefix, known)
        return known


def _scan(decode: Callable[[str, int], tuple[Any, int]], text: str, at: int) -> tuple[Any, int]:
    try:
        return decode(text, at)
    except (ValueError, _UnfitError, RecursionError):
        # Bad JSON, a number that cannot be held, too deep: the cold read says where.
        raise _ReadColdError from None


def _repeats_an_id(known: list[_Known]) -> bool:
    """Whether two of the messages share a message, part or tool call id (the cold read
    then finds the first and says so)."""
    messages = {k.message.id for k in known}
    parts: set[str] = set()
    calls: set[str] = set()
    n_parts = n_calls = 0
    for k in known:
        parts.update(k.parts)
        calls.update(k.calls)
        n_parts += len(k.parts)
        n_calls += len(k.calls)
    return len(messages) != len(known) or len(parts) != n_parts or len(calls) != n_calls


DEFAULT_READER = SessionReader()
"""The reader :func:`session_from_json` uses. A caller that wants messages of its own (or
a bound of its own) makes its own :class:`SessionReader`."""


def _dotted(path: JsonPath) -> str:
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return dotted.lstrip(".") or "session"


def _depth_diagnostic(path: JsonPath, location: Location) -> Diagnostic:
    return problem_diagnostic("session", "depth", path, location, MAX_DEPTH)


_PROBLEMS = {
    "depth": ("nested deeper than {limit} levels", None),
    "surrogate": (
        "holds a lone UTF-16 surrogate, which is not a character",
        "a \\uD800-\\uDFFF escape must be one half of a pair; "
        "the text was probably cut in the middle of a character",
    ),
    "number": ("NaN and infinities are not JSON numbers", None),
}


def problem_diagnostic(
    prefix: str, kind: str, path: JsonPath, location: Location, limit: int
) -> Diagnostic:
    """The diagnostic ``<prefix>.<kind>`` of a problem
    :func:`~kilo_rules.engine.base.source.json_problem` found at ``path`` (``limit`` is the depth it
    was checked against)."""
    message, hint = _PROBLEMS[kind]
    # A path hundreds of steps long says nothing more than its head; the location is exact.
    shown = _dotted(path[:8]) + ("…" if len(path) > 8 else "")
    return Diagnostic(
        f"{prefix}.{kind}",
        f"{shown + ': ' if path else ''}{message.format(limit=limit)}",
        location,
        details={"path": list(path), **({"limit": limit} if kind == "depth" else {})},
        hint=hint,
    )


_PART_TAGS = {"text", "reasoning", "file", "tool", "step-start", "compaction"}


def _document_path(loc: tuple[str | int, ...]) -> JsonPath:
    """A pydantic error location as a path in the document: pydantic names the part type it
    tried right after a part's index (``parts, 0, "tool", "call_id"``), and that tag is no
    key of the document. Only there: ``tool`` and ``text`` are also field names."""
    return tuple(
        p
        for i, p in enumerate(loc)
        if not (
            p in _PART_TAGS and i >= 2 and loc[i - 2] == "parts" and isinstance(loc[i - 1], int)
        )
    )


def load_session(path: str | Path, *, max_bytes: int = MAX_BYTES) -> Session:
    """Read a Session v1 JSON file of at most ``max_bytes`` bytes (UTF-8)."""
    p = Path(path)
    try:
        data = read_bounded(p, max_bytes)
    except OSError as exc:
        fifo = isinstance(exc, safefs.ReadRefused) and exc.reason == "not-regular"
        raise SessionError(
            Diagnostic(
                "io.not-regular-file" if fifo else "io.read",
                f"cannot read session: {exc if fifo else exc.strerror or exc}",
                Location(str(p), 1, 1),
            )
        ) from None
    if data is None:
        raise SessionError(_size_diagnostic(p, max_bytes))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[: exc.start]
        col = len(head[head.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        raise SessionError(
            Diagnostic(
                "session.encoding",
                f"not UTF-8: invalid byte 0x{data[exc.start]:02x}",
                Location(str(p), head.count(b"\n") + 1, col),
            )
        ) from None
    return session_from_json(text.removeprefix("\ufeff"), file=str(p))


def read_bounded(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of the regular file at ``path``, or None when it holds more than
    ``max_bytes``; never reads more than one byte past the limit. A FIFO, device or
    directory is refused without blocking (:func:`kilo_rules.engine.base.safefs.read_regular`): a
    session named ``/dev/stdin`` or a named pipe must not hang the reader. Raises
    :class:`~kilo_rules.engine.base.safefs.ReadRefused` (an :class:`OSError`) with the reason."""
    try:
        return safefs.read_regular(path, max_bytes=max_bytes)
    except safefs.ReadRefused as exc:
        if exc.reason == "too-large":
            return None
        raise


def _size_diagnostic(path: Path, max_bytes: int) -> Diagnostic:
    return Diagnostic(
        "session.size",
        f"the file is larger than the limit of {max_bytes:,} bytes",
        Location(str(path), 1, 1),
        details={"limit": max_bytes},
    )


def dump_session(session: Session) -> str:
    """Serialise a session as Session v1 JSON (nulls omitted, stable key order)."""
    return session.model_dump_json(indent=2, exclude_none=True)
