"""A fake LLM provider on 127.0.0.1 for the gateway's tests: Anthropic Messages, OpenAI Chat
Completions and OpenAI Responses, each answering in the provider's exact JSON and SSE shapes.

It is a real HTTP server (a Starlette app under uvicorn in a thread, on an ephemeral
port, started the way ``tests/serve/conftest.py`` starts the sidecar) so a gateway in front
of it is tested over real sockets: streaming, cancellation, headers, exact bytes.

What it does with a request, in order:

1. Records it (:class:`Received`: path, lower-cased headers, the raw bytes, the parsed
   JSON) before anything else, so a test sees even a refused or cancelled request.
2. Validates the body as the provider would: the official SDK's request type, made strict
   (unknown keys refused, iterables read eagerly; ``tests/providers/wire_checks.py``), and
   the project's acceptance rules (:func:`kilo_rules.engine.providers.acceptance.check_body`:
   turn order, tool call/result pairing, blank text, the breakpoint budget, ...). A failure
   is a 400 in the provider's error shape, ``refused="invalid_body"``.
3. Counts the input tokens (see :func:`Upstream.count`) and refuses a body above
   :attr:`Upstream.window` with the provider's own "too long" error,
   ``refused="context_length_exceeded"``.
4. Plays the provider's prompt cache with :class:`~kilo_rules.engine.providers.cachesim.
   CacheSimulator`, the model ``simulate`` uses: ``explicit`` (cache_control breakpoints)
   for ``/v1/messages``, ``automatic`` for the OpenAI endpoints, one simulator per
   (endpoint, model); the split is reported in the reply's usage and in
   :attr:`Received.usage`.
5. Answers with :attr:`Upstream.reply_text` (or, with :attr:`Upstream.tool_call` and tools
   in the body, a call of the first tool with :attr:`Upstream.tool_input`), as JSON or, when
   the body says ``"stream": true``, as SSE with :attr:`Upstream.stream_delay` seconds
   between events. A streaming client that goes away before the last event is counted in
   :attr:`Upstream.disconnects` (and its :attr:`Received.disconnected` set).

Token counting: the body is cut into the cache simulator's blocks
(:func:`~kilo_rules.engine.providers.cachesim.blocks`: each tool, system block and message
part, as canonical JSON with the cache marks taken out) and each block is counted with
tiktoken ``cl100k_base`` (shipped offline, through a count cache), falling back to Kilo's
characters/4 estimate if the encoding cannot be loaded. The input count is the sum of the
blocks, so ``read + write + uncached == input`` always holds. cl100k counts a 1.7 MB body in
well under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kilo_rules.engine.formats.catalog import bundled_catalog
from kilo_rules.engine.providers.acceptance import BodyContext, check_body
from kilo_rules.engine.providers.cachesim import CacheKind, CacheSimulator, CacheStep, blocks
from kilo_rules.engine.text.tokens import CountCache, counter_for

from ..providers.wire_checks import check, strict_validator
from ..threaded import serve_in_thread

__all__ = ["DEFAULT_CACHE_MIN_TOKENS", "Received", "Upstream", "running_upstream"]

#: The shortest cached prefix for a model the bundled catalog does not know.
DEFAULT_CACHE_MIN_TOKENS = 1024

ANTHROPIC = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MODELS = "/v1/models"

# The wire API (for check_body and the SDK types) and the cache kind of each endpoint.
_API = {ANTHROPIC: "anthropic", CHAT: "openai", RESPONSES: "openai-responses"}
_CACHE_KIND: dict[str, CacheKind] = {
    ANTHROPIC: "explicit",
    CHAT: "automatic",
    RESPONSES: "automatic",
}


@dataclass
class Received:
    """One request the upstream got.

    ``usage`` is what the upstream reported, in one vocabulary for every API:
    ``input_tokens`` (every prompt token: read + written + uncached), ``uncached``,
    ``cache_read``, ``cache_write`` and ``output_tokens``; for count_tokens only
    ``input_tokens``; None when refused. ``refused`` is the error code of a refusal
    (``invalid_body``, ``invalid_json``, ``context_length_exceeded``), ``status`` the HTTP
    status sent, ``disconnected`` whether the client left a stream before its end.
    """

    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    usage: dict[str, int] | None = None
    refused: str | None = None
    status: int = 200
    stream: bool = False
    disconnected: bool = False


class _RefusalError(Exception):
    def __init__(self, code: str, response: Response) -> None:
        super().__init__(code)
        self.code = code
        self.response = response


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _pieces(text: str) -> list[str]:
    """``text`` cut into a few deltas (words with their trailing space; a single word in
    two halves), so a stream always has several of them when the text has two characters."""
    parts = re.findall(r"\S+\s*|\s+", text)
    if len(parts) == 1 and len(text) > 1:
        half = len(text) // 2
        parts = [text[:half], text[half:]]
    return parts or [""]


def _anthropic_error(status: int, kind: str, message: str) -> Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status, headers={"request-id": _new_id("req_")})


def _openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> Response:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }
    return JSONResponse(body, status, headers={"x-request-id": _new_id("req_")})


def _sdk_error_text(exc: Exception) -> tuple[str, str | None]:
    """A message and a JSON path for a body the SDK type refuses."""
    if isinstance(exc, pydantic_core.ValidationError):
        # The deepest error of a union is the most telling; the union members' names
        # (UserMessageParam, str, list[...]) that pydantic puts in the location are left out.
        best = max(exc.errors(), key=lambda e: len(e["loc"]))
        where = ".".join(str(p) for p in best["loc"] if isinstance(p, int) or _is_key(p))
        return f"{where}: {best['msg']}", where or None
    return str(exc) or type(exc).__name__, None


def _is_key(part: str) -> bool:
    return bool(re.fullmatch(r"[a-z_][a-z0-9_]*", part)) and part not in _TYPE_NAMES


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "literal"})


def _tools(body: Mapping[str, Any]) -> list[Any]:
    tools = body.get("tools")
    return tools if isinstance(tools, list) else []


def _tool_name(path: str, tool: Any) -> str:
    if not isinstance(tool, Mapping):
        return "tool"
    if path == CHAT and isinstance(tool.get("function"), Mapping):
        return str(tool["function"].get("name", "tool"))
    return str(tool.get("name", "tool"))


def _sse(event: str | None, data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {text}\n\n".encode()


class _EventStream:
    """An SSE response that notices its client leaving: it listens for ``http.disconnect``
    while it sleeps between events, and a send that fails is a disconnect too."""

    def __init__(self, upstream: Upstream, received: Received, events: list[bytes]) -> None:
        self.upstream = upstream
        self.received = received
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        listener = asyncio.create_task(listen())
        finished = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            for i, event in enumerate(self.events):
                if i and self.upstream.stream_delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), self.upstream.stream_delay)
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": event, "more_body": True})
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                finished = True
        except OSError:  # uvicorn's ClientDisconnected: the socket closed under a send
            pass
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            if not finished:
                self.upstream._disconnected(self.received)


class Upstream:
    """The fake provider's state and knobs; start one with :func:`running_upstream`.

    Knobs (plain attributes, settable while it runs): ``window`` (tokens above which a
    request is refused as too long), ``reply_text``, ``stream_delay`` (seconds between SSE
    events), ``tool_call`` (answer with a call of the body's first tool, arguments
    ``tool_input``) and ``cache_min_tokens`` (the shortest cached prefix; None: the bundled
    catalog's value for the model, else :data:`DEFAULT_CACHE_MIN_TOKENS`).
    """

    def __init__(self, window: int = 200_000) -> None:
        self.url = ""
        self._initial_window = window
        self.window = window
        self.reply_text = "ok"
        self.stream_delay = 0.0
        self.tool_call = False
        self.tool_input: dict[str, Any] = {}
        self.cache_min_tokens: int | None = None
        self.received: list[Received] = []
        self.disconnects = 0
        self._lock = threading.Lock()
        self._caches: dict[tuple[str, str], CacheSimulator] = {}
        counter, _ = counter_for("tiktoken:cl100k_base")
        self._counter = CountCache(counter, maxsize=65536)
        self.app = Starlette(
            routes=[
                Route(COUNT_TOKENS, self._count_tokens, methods=["POST"]),
                Route(ANTHROPIC, self._generate, methods=["POST"]),
                Route(CHAT, self._generate, methods=["POST"]),
                Route(RESPONSES, self._generate, methods=["POST"]),
                Route(MODELS, self._models, methods=["GET"]),
            ]
        )

    # --- state ---------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the requests received, the disconnects and every cache; every knob
        (``window`` included: the one it was started with) goes back to its default."""
        with self._lock:
            self.received.clear()
            self._caches.clear()
            self.disconnects = 0
        self.window = self._initial_window
        self.reply_text = "ok"
        self.stream_delay = 0.0
        self.tool_call = False
        self.tool_input = {}
        self.cache_min_tokens = None

    def _disconnected(self, received: Received) -> None:
        with self._lock:
            received.disconnected = True
            self.disconnects += 1

    def count(self, body: Mapping[str, Any]) -> int:
        """The input tokens of a body: the sum of its cache blocks, each counted with
        cl100k_base (see the module docstring)."""
        return sum(b.tokens for b in blocks(self._prompt(body), self._counter.count))

    @staticmethod
    def _prompt(body: Mapping[str, Any]) -> Mapping[str, Any]:
        # A Responses body may give its input as one string: a user message.
        if isinstance(body.get("input"), str):
            return {**body, "input": [{"role": "user", "content": body["input"]}]}
        return body

    def _min_tokens(self, path: str, model: str) -> int:
        if self.cache_min_tokens is not None:
            return self.cache_min_tokens
        api = _API[path]
        for m in bundled_catalog().models:
            if m.api == api and model in (m.api_id, m.id):
                return m.cache.min_cacheable_tokens
        return DEFAULT_CACHE_MIN_TOKENS

    def _cache_step(self, path: str, body: Mapping[str, Any]) -> CacheStep:
        seq = blocks(self._prompt(body), self._counter.count)
        model = str(body.get("model", ""))
        with self._lock:
            sim = self._caches.get((path, model))
            if sim is None:
                kind = _CACHE_KIND[path]
                sim = CacheSimulator(kind, self._min_tokens(path, model))
                self._caches[(path, model)] = sim
            return sim.step(seq)

    # --- requests ------------------------------------------------------------------

    async def _record(self, request: Request) -> Received:
        raw = await request.body()
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        received = Received(
            request.url.path,
            {k.lower(): v for k, v in request.headers.items()},
            raw,
            parsed,
        )
        with self._lock:
            self.received.append(received)
        return received

    def _refuse_invalid(self, path: str, message: str, param: str | None) -> _RefusalError:
        if path == ANTHROPIC:
            return _RefusalError(
                "invalid_body", _anthropic_error(400, "invalid_request_error", message)
            )
        return _RefusalError("invalid_body", _openai_error(400, message, param))

    def _validate(self, path: str, body: Any) -> None:
        """Raise :class:`_RefusalError` for a body the provider would refuse as invalid."""
        if not isinstance(body, dict):
            raise self._refuse_invalid(path, "the request body is not a JSON object", None)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise self._refuse_invalid(path, "stream: Input should be a valid boolean", "stream")
        api = _API[path]
        try:
            # The strict validators are the non-streaming types; the streaming ones differ
            # only in ``stream``, checked above.
            bare = {k: v for k, v in body.items() if k != "stream"}
            if isinstance(bare.get("input"), str):  # check() reads input as a list of items
                strict_validator(api).validate_python(bare)
            else:
                check(bare, api)
        except (pydantic_core.ValidationError, AssertionError, TypeError, ValueError) as exc:
            message, param = _sdk_error_text(exc)
            raise self._refuse_invalid(path, message, param) from None
        model = body.get("model")
        problems = check_body(body, api, BodyContext(model if isinstance(model, str) else None))
        if problems:
            first = problems[0]
            message = "; ".join(f"{p.path}: {p.message}" for p in problems)
            raise self._refuse_invalid(path, message, first.path)

    def _check_window(self, path: str, tokens: int) -> None:
        if tokens <= self.window:
            return
        if path == ANTHROPIC:
            message = f"prompt is too long: {tokens} tokens > {self.window} maximum"
            response = _anthropic_error(400, "invalid_request_error", message)
        else:
            message = (
                f"This model's maximum context length is {self.window} tokens. However, your "
                f"messages resulted in {tokens} tokens. Please reduce the length of the messages."
            )
            response = _openai_error(400, message, "messages", "context_length_exceeded")
        raise _RefusalError("context_length_exceeded", response)

    def _admit(self, path: str, body: Any) -> CacheStep:
        """Validate, check the window and play the cache (run in a worker thread: a large
        body costs some CPU)."""
        self._validate(path, body)
        self._check_window(path, self.count(body))
        return self._cache_step(path, body)

    async def _generate(self, request: Request) -> Any:
        path = request.url.path
        received = await self._record(request)
        body = received.json
        try:
            if body is None and received.body:
                raise self._refuse_invalid(path, "the request body is not valid JSON", None)
            step = await asyncio.to_thread(self._admit, path, body)
        except _RefusalError as refusal:
            received.refused = refusal.code
            received.status = refusal.response.status_code
            return refusal.response
        tools = _tools(body)
        call = _tool_name(path, tools[0]) if self.tool_call and tools else None
        text = self.reply_text
        arguments = json.dumps(self.tool_input, separators=(",", ":"))
        output = self._counter.count(arguments if call is not None else text)
        if call is not None:
            output += 8  # the call's framing
        output = max(1, output)
        received.usage = {
            "input_tokens": step.input,
            "uncached": step.uncached,
            "cache_read": step.read,
            "cache_write": step.write,
            "output_tokens": output,
        }
        received.stream = bool(body.get("stream"))
        reply = _Reply(str(body.get("model", "")), text, call, arguments, step, output, body)
        if path == ANTHROPIC:
            if received.stream:
                return _EventStream(self, received, reply.anthropic_events())
            return JSONResponse(reply.anthropic_message(), headers={"request-id": _new_id("req_")})
        if path == CHAT:
            if received.stream:
                return _EventStream(self, received, reply.chat_events())
            return JSONResponse(reply.chat_completion(), headers={"x-request-id": _new_id("req_")})
        if received.stream:
            return _EventStream(self, received, reply.responses_events())
        return JSONResponse(reply.response("completed"), headers={"x-request-id": _new_id("req_")})

    async def _count_tokens(self, request: Request) -> Response:
        received = await self._record(request)
        body = received.json
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            received.refused = "invalid_body"
            received.status = 400
            return _anthropic_error(400, "invalid_request_error", "messages: Field required")
        tokens = await asyncio.to_thread(self.count, body)
        received.usage = {"input_tokens": tokens}
        return JSONResponse({"input_tokens": tokens})

    async def _models(self, request: Request) -> Response:
        received = await self._record(request)
        received.usage = None
        if "anthropic-version" in received.headers:
            data = [
                {
                    "type": "model",
                    "id": "claude-sonnet-4-5",
                    "display_name": "Claude Sonnet 4.5",
                    "created_at": "2025-09-29T00:00:00Z",
                }
            ]
            return JSONResponse(
                {
                    "data": data,
                    "has_more": False,
                    "first_id": data[0]["id"],
                    "last_id": data[0]["id"],
                }
            )
        models = [
            {"id": name, "object": "model", "created": 1715367049, "owned_by": "openai"}
            for name in ("gpt-4o", "gpt-5")
        ]
        return JSONResponse({"object": "list", "data": models})


@dataclass
class _Reply:
    """One answer, rendered in each API's shapes."""

    model: str
    text: str
    call: str | None  # the tool called, or None for a text answer
    arguments: str
    step: CacheStep
    output: int
    body: Mapping[str, Any]
    created: int = field(default_factory=lambda: int(time.time()))

    # --- Anthropic -------------------------------------------------------------------

    def _anthropic_usage(self, output: int) -> dict[str, Any]:
        return {
            "input_tokens": self.step.uncached,
            "cache_creation_input_tokens": self.step.write,
            "cache_read_input_tokens": self.step.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.step.write_5m,
                "ephemeral_1h_input_tokens": self.step.write_1h,
            },
            "output_tokens": output,
            "service_tier": "standard",
        }

    def _anthropic_stop(self) -> str:
        return "tool_use" if self.call is not None else "end_turn"

    def anthropic_message(self) -> dict[str, Any]:
        block: dict[str, Any]
        if self.call is not None:
            block = {
                "type": "tool_use",
                "id": _new_id("toolu_"),
                "name": self.call,
                "input": json.loads(self.arguments),
            }
        else:
            block = {"type": "text", "text": self.text}
        return {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [block],
            "stop_reason": self._anthropic_stop(),
            "stop_sequence": None,
            "usage": self._anthropic_usage(self.output),
        }

    def anthropic_events(self) -> list[bytes]:
        message = self.anthropic_message()
        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = self._anthropic_usage(1)
        events = [_sse("message_start", {"type": "message_start", "message": start})]
        block = message["content"][0]
        if self.call is not None:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": p} for p in _pieces(self.arguments)
            ]
        else:
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(self.text)]
        events.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": opened},
            )
        )
        events.append(_sse("ping", {"type": "ping"}))
        for delta in deltas:
            events.append(
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                )
            )
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        events.append(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._anthropic_stop(), "stop_sequence": None},
                    "usage": {"output_tokens": self.output},
                },
            )
        )
        events.append(_sse("message_stop", {"type": "message_stop"}))
        return events

    # --- OpenAI Chat Completions ------------------------------------------------------

    def _chat_usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.step.input,
            "completion_tokens": self.output,
            "total_tokens": self.step.input + self.output,
            "prompt_tokens_details": {"cached_tokens": self.step.read, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _finish(self) -> str:
        return "tool_calls" if self.call is not None else "stop"

    def chat_completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.call is not None else self.text,
            "refusal": None,
            "annotations": [],
        }
        if self.call is not None:
            message["tool_calls"] = [
                {
                    "id": _new_id("call_"),
                    "type": "function",
                    "function": {"name": self.call, "arguments": self.arguments},
                }
            ]
        return {
            "id": _new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish()}
            ],
            "usage": self._chat_usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_upstream",
        }

    def chat_events(self) -> list[bytes]:
        options = self.body.get("stream_options")
        with_usage = isinstance(options, Mapping) and options.get("include_usage") is True
        cid = _new_id("chatcmpl-")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "service_tier": "default",
                "system_fingerprint": "fp_upstream",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if with_usage:
                data["usage"] = None
            return _sse(None, data)

        if self.call is not None:
            head = {
                "index": 0,
                "id": _new_id("call_"),
                "type": "function",
                "function": {"name": self.call, "arguments": ""},
            }
            events = [
                chunk({"role": "assistant", "content": None, "tool_calls": [head], "refusal": None})
            ]
            for piece in _pieces(self.arguments):
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                )
        else:
            events = [chunk({"role": "assistant", "content": "", "refusal": None})]
            events += [chunk({"content": piece}) for piece in _pieces(self.text)]
        events.append(chunk({}, self._finish()))
        if with_usage:
            last = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "service_tier": "default",
                "system_fingerprint": "fp_upstream",
                "choices": [],
                "usage": self._chat_usage(),
            }
            events.append(_sse(None, last))
        events.append(_sse(None, "[DONE]"))
        return events

    # --- OpenAI Responses -----------------------------------------------------------

    def _responses_usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.step.input,
            "input_tokens_details": {"cached_tokens": self.step.read, "cache_write_tokens": 0},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.step.input + self.output,
        }

    def _item(self, status: str, item_id: str, call_id: str) -> dict[str, Any]:
        if self.call is not None:
            done = status == "completed"
            return {
                "type": "function_call",
                "id": item_id,
                "call_id": call_id,
                "name": self.call,
                "arguments": self.arguments if done else "",
                "status": status,
            }
        content = [self._part(self.text)] if status == "completed" else []
        return {
            "type": "message",
            "id": item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _echo_tools(self) -> list[Any]:
        out = []
        for tool in _tools(self.body):
            if isinstance(tool, Mapping) and tool.get("type") == "function":
                tool = {"parameters": None, "strict": None, **tool}
            out.append(tool)
        return out

    def response(
        self,
        status: str,
        rid: str | None = None,
        item_id: str | None = None,
        call_id: str | None = None,
    ) -> dict[str, Any]:
        done = status == "completed"
        body = self.body
        output = (
            [
                self._item(
                    "completed",
                    item_id or _new_id("fc_" if self.call else "msg_"),
                    call_id or _new_id("call_"),
                )
            ]
            if done
            else []
        )
        return {
            "id": rid or _new_id("resp_"),
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": self._echo_tools(),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": self._responses_usage() if done else None,
            "user": None,
            "metadata": body.get("metadata") or {},
        }

    def responses_events(self) -> list[bytes]:
        rid = _new_id("resp_")
        item_id = _new_id("fc_" if self.call else "msg_")
        call_id = _new_id("call_")
        seq = itertools.count()
        events: list[bytes] = []

        def emit(kind: str, **data: Any) -> None:
            events.append(_sse(kind, {"type": kind, "sequence_number": next(seq), **data}))

        where = {"item_id": item_id, "output_index": 0}
        emit("response.created", response=self.response("in_progress", rid))
        emit("response.in_progress", response=self.response("in_progress", rid))
        emit(
            "response.output_item.added",
            output_index=0,
            item=self._item("in_progress", item_id, call_id),
        )
        if self.call is not None:
            for piece in _pieces(self.arguments):
                emit("response.function_call_arguments.delta", **where, delta=piece)
            emit("response.function_call_arguments.done", **where, arguments=self.arguments)
        else:
            at = {**where, "content_index": 0}
            emit("response.content_part.added", **at, part=self._part(""))
            for piece in _pieces(self.text):
                emit("response.output_text.delta", **at, delta=piece, logprobs=[])
            emit("response.output_text.done", **at, text=self.text, logprobs=[])
            emit("response.content_part.done", **at, part=self._part(self.text))
        emit(
            "response.output_item.done",
            output_index=0,
            item=self._item("completed", item_id, call_id),
        )
        emit("response.completed", response=self.response("completed", rid, item_id, call_id))
        return events


@contextlib.contextmanager
def running_upstream(window: int = 200_000) -> Iterator[Upstream]:
    """Run an :class:`Upstream` under uvicorn on 127.0.0.1 (a free port) in a thread until the
    block ends; yields it with its ``url`` set."""
    import uvicorn

    upstream = Upstream(window)
    config = uvicorn.Config(
        upstream.app,
        log_level="warning",
        lifespan="off",
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=2,
    )
    with serve_in_thread(config, "the upstream") as (url, _):
        upstream.url = url
        yield upstream
