"""Request bodies from the network: bounded, parsed, validated, every problem located.

A body is untrusted. The :class:`BodyLimit` middleware reads it whole before any route sees
it, refusing one over the size cap (``413``, from its ``Content-Length`` when it declares
one, else as soon as the count passes the cap) and one that arrives too slowly (``408``).
The routes then parse it off the event loop with :func:`parse_json` and validate its parts;
each problem becomes a :class:`~kilo_rules.engine.base.errors.Diagnostic` located
``<request>:line:col`` in the body, raised as an :class:`ApiError`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ValidationError

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.engine.base.source import JsonPath, JsonText, json_problem, nearest
from kilo_rules.engine.formats.session import MAX_DEPTH, problem_diagnostic

#: The file name diagnostics give the request body.
REQUEST = "<request>"

#: The most digits an integer in a body may have: far past any count, size or time (a
#: 64-bit integer has 20), and short of the cost of converting a huge one.
MAX_DIGITS = 64

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ApiError(Exception):
    """A request the sidecar refuses: the HTTP status, a stable code, a message, and the
    located diagnostics behind it."""

    def __init__(
        self, status: int, code: str, message: str, diagnostics: Sequence[Diagnostic] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.diagnostics = tuple(diagnostics)

    def to_json(self) -> dict[str, Any]:
        """The error body every endpoint answers with (``ErrorResponse``)."""
        return error_json(self.code, self.message, self.diagnostics)


def error_json(code: str, message: str, diagnostics: Iterable[Diagnostic] = ()) -> dict[str, Any]:
    """``{"error": {"code", "message", "diagnostics"}}``."""
    return {
        "error": {
            "code": code,
            "message": message,
            "diagnostics": [d.to_json() for d in diagnostics],
        }
    }


def error_bytes(code: str, message: str, diagnostics: Iterable[Diagnostic] = ()) -> bytes:
    """:func:`error_json` encoded."""
    return dumps(error_json(code, message, diagnostics))


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON, as every response is sent. A lone surrogate (an error message
    may quote one the body held) is written as its JSON escape, ``\\ud800``: only strings
    can hold one, so the text stays valid JSON and UTF-8."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


@dataclass(frozen=True, slots=True)
class Body:
    """A parsed JSON body and its text, to locate problems in; ``spans`` gives, for each
    member of the object, where its value's JSON text starts and ends in ``text`` (empty
    when the body is not laid out plainly, e.g. repeats a key), so that a member can be
    read again from its own text (the session, by a reader that reuses what it met)."""

    data: dict[str, Any]
    text: str
    spans: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def locate(self, paths: Iterable[JsonPath]) -> dict[JsonPath, Location]:
        """Where each of ``paths`` (or its nearest ancestor) starts in the body."""
        wanted = list(paths)
        found = JsonText(REQUEST, self.text).locations(wanted)
        out = {}
        for path in wanted:
            hit = nearest(found, path)
            out[path] = hit[0] if hit is not None else Location(REQUEST, 1, 1)
        return out

    def relocate(self, diagnostics: Iterable[Diagnostic], under: JsonPath) -> list[Diagnostic]:
        """``diagnostics`` about the value at ``under``, located in the body: each at the
        JSON path its details name (relative to that value), else at the value itself; the
        details' ``path`` becomes the path in the body."""
        diags = list(diagnostics)
        paths = [(*under, *_path_of(d)) for d in diags]
        where = self.locate(paths)
        return [
            replace(
                d,
                location=where[p],
                details={**d.details, "path": list(p)},
            )
            for d, p in zip(diags, paths, strict=True)
        ]


def lazy_text(body: Body, key: str) -> str | None:
    """The JSON text of ``body``'s member ``key`` when :func:`parse_json` left it lazy;
    else None. It may not be JSON, or hold NaN, an infinity, a lone surrogate: its reader
    must refuse those (a body that spells an integer as long as one refused leaves
    nothing lazy)."""
    span = body.spans.get(key)
    if span is None or key in body.data:
        return None
    return body.text[span[0] : span[1]]


def is_lazy(body: Body, key: str) -> bool:
    """Whether :func:`parse_json` left ``key`` lazy (located, not decoded)."""
    return key in body.spans and key not in body.data


def _path_of(diagnostic: Diagnostic) -> JsonPath:
    path = diagnostic.details.get("path")
    if isinstance(path, list) and all(isinstance(p, str | int) for p in path):
        return tuple(path)
    return ()


def parse_json(raw: bytes, *, check: Sequence[str] = (), lazy: str | None = None) -> Body:
    """Decode and parse a JSON object body; refuse (422) one that is not UTF-8, not JSON,
    not an object, or whose members named in ``check`` nest too deeply or hold a lone
    surrogate or a non-finite number (the session is checked by Session v1 itself).

    The member named ``lazy`` is, where the body is laid out plainly, only located: it is
    missing from ``data``, its span is in ``spans`` and nothing in it has been checked
    (:func:`lazy_text` hands it out). A caller that cannot read that text whole as what
    it should be parses the body again without ``lazy``, for the errors of the body."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = raw[: exc.start]
        col = len(head[head.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        at = Location(REQUEST, head.count(b"\n") + 1, col)
        message = f"not UTF-8: invalid byte 0x{raw[exc.start]:02x}"
        raise _invalid("request.encoding", message, at) from None
    if lazy is not None and _LONG_DIGITS in raw.translate(_DIGITS_ONLY):
        lazy = None  # an integer it may refuse is found by decoding, where it is
    scanned = _members(text, lazy)
    spans: Mapping[str, tuple[int, int]] = {}
    try:
        if scanned is not None:
            data, spans = scanned
        else:
            data = json.loads(
                text, parse_int=_bounded_int, parse_float=_finite, parse_constant=_not_a_number
            )
    except json.JSONDecodeError as exc:
        at = Location(REQUEST, exc.lineno, exc.colno)
        raise _invalid("request.json", f"not valid JSON: {exc.msg}", at) from None
    except _NumberError as exc:
        at = _offset_location(text, text.find(exc.digits))
        raise _invalid("request.number", exc.why, at) from None
    except RecursionError:
        deep = JsonText(REQUEST, text).too_deep(MAX_DEPTH)
        path, at = deep if deep is not None else ((), Location(REQUEST, 1, 1))
        raise ApiError(
            422,
            "request.depth",
            "the body nests too deeply",
            [problem_diagnostic("request", "depth", path, at, MAX_DEPTH)],
        ) from None
    if not isinstance(data, dict):
        raise _invalid("request.invalid", "the body must be a JSON object", Location(REQUEST, 1, 1))
    body = Body(data, text, spans)
    for key in check:
        if key not in data:
            continue  # nothing to check (and the body's text need not be scanned for it)
        span = spans.get(key)
        # The member's own text, when known, says as well what cannot fail in it.
        own = text if span is None else text[span[0] : span[1]]
        problem = json_problem(data[key], MAX_DEPTH - 1, own)
        if problem is not None:
            rest, kind = problem
            path = (key, *rest)
            diag = problem_diagnostic("request", kind, path, body.locate([path])[path], MAX_DEPTH)
            raise ApiError(422, diag.code, diag.message, [diag])
    return body


_WS = re.compile(r"[ \t\n\r]*")
#: Each digit made 0 and every other byte a space: a body that then holds no run of 65
#: zeros holds no integer it refuses (a sign and 64 digits is one). ``re`` would take 30
#: times as long to look for the run.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGITS = b"0" * (MAX_DIGITS + 1)


def _decode_value(text: str, at: int) -> tuple[Any, int]:
    return _DECODER.raw_decode(text, at)


def _members(
    text: str, lazy: str | None = None, inside: int | None = None
) -> tuple[dict[str, Any], dict[str, tuple[int, int]]] | None:
    """The object in ``text`` decoded member by member, as ``json.loads`` with the same
    hooks decodes it, and where each member's value lies; None when the text is anything
    but a plain object (bad JSON, a repeated key, a number refused): ``json.loads`` then
    says what is wrong, and where, as it always has.

    The member named ``lazy`` is located, not decoded (it is left out of the data): its
    value is taken to end at the first comma, of those near the end, from which the rest of
    the text decodes as the object's remaining members (else at the closing brace). That
    guess is only sound once the value's own text is read whole as one JSON value: JSON
    parses one way, so a value read whole and the members after it make the one parse of
    the body; a caller that cannot read it so decodes the body in full. ``inside``: decode
    the members from there on, as if an object were open (where a member's key starts)."""
    ws = _WS.match
    data: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    try:
        if inside is not None:
            at = inside
        else:
            at = ws(text, 0).end()  # type: ignore[union-attr]  # [...]* always matches
            if text[at : at + 1] != "{":
                return None
            at = ws(text, at + 1).end()  # type: ignore[union-attr]
        if text[at : at + 1] == "}" and inside is None:
            return (data, spans) if ws(text, at + 1).end() == len(text) else None  # type: ignore[union-attr]
        while True:
            if text[at : at + 1] != '"':
                return None
            key, at = _decode_value(text, at)
            at = ws(text, at).end()  # type: ignore[union-attr]
            if text[at : at + 1] != ":" or key in data or key in spans:
                return None  # json keeps a repeated key's last value: leave it to json
            start = ws(text, at + 1).end()  # type: ignore[union-attr]
            if key == lazy:
                return _after_lazy(text, start, key, data, spans)
            data[key], at = _decode_value(text, start)
            spans[key] = (start, at)
            at = ws(text, at).end()  # type: ignore[union-attr]
            sep = text[at : at + 1]
            at = ws(text, at + 1).end()  # type: ignore[union-attr]
            if sep == "}":
                return (data, spans) if at == len(text) else None
            if sep != ",":
                return None
    except (ValueError, RecursionError):  # JSONDecodeError and _NumberError among them
        return None


#: How far from the end of the body a lazy member's end is looked for: the members after it
#: are a model id or description and the step options.
_TAIL_CHARS = 256 * 1024
#: Commas tried past the leftmost one found so far (inside a member after the lazy one, an
#: inline model's fields, or already inside the lazy value) before it is taken.
_TAIL_MISSES = 64


def _after_lazy(
    text: str,
    start: int,
    key: str,
    data: dict[str, Any],
    spans: dict[str, tuple[int, int]],
) -> tuple[dict[str, Any], dict[str, tuple[int, int]]] | None:
    close = _back(text, len(text), start) - 1
    if close <= start or text[close] != "}":
        return None
    ws = _WS.match
    limit = max(start, close - _TAIL_CHARS)
    # The leftmost comma from which the rest decodes as the remaining members: the commas
    # between those members decode too, a comma inside the lazy value (nested deeper) not.
    found: tuple[int, dict[str, Any], dict[str, tuple[int, int]]] | None = None
    misses = 0
    comma = close
    while misses < _TAIL_MISSES and (comma := text.rfind(",", limit, comma)) >= 0:
        after = ws(text, comma + 1).end()  # type: ignore[union-attr]
        if text[after : after + 1] != '"':
            continue
        if found is None:
            rest = _members(text, inside=after)
            if rest is not None and rest[0] and not (rest[0].keys() & {*data, key}):
                found = (comma, *rest)
            continue
        # One more member to the left must end where the members found begin: decoding
        # just it keeps a comma inside the lazy value (or a member's value) cheap to refuse.
        member = _member(text, after, found[0])
        if member is None or member[0] in found[1] or member[0] in data or member[0] == key:
            misses += 1
            continue
        name, value, span = member
        found = (comma, {name: value, **found[1]}, {name: span, **found[2]})
        misses = 0
    end = found[0] if found is not None else close
    spans[key] = (start, _back(text, end, start))
    if found is not None:
        data.update(found[1])
        spans.update(found[2])
    return data, spans


def _member(text: str, at: int, end: int) -> tuple[str, Any, tuple[int, int]] | None:
    """The member ``"key": value`` at ``text[at]`` if it ends (whitespace aside) at
    ``end``: its key, value and the value's span; else None."""
    ws = _WS.match
    try:
        name, at = _decode_value(text, at)
        at = ws(text, at).end()  # type: ignore[union-attr]
        if text[at : at + 1] != ":":
            return None
        start = ws(text, at + 1).end()  # type: ignore[union-attr]
        value, stop = _decode_value(text, start)
    except (ValueError, RecursionError):
        return None
    if ws(text, stop).end() != end:  # type: ignore[union-attr]
        return None
    return name, value, (start, stop)


def _back(text: str, end: int, start: int) -> int:
    """``end`` moved back over the whitespace before it (not past ``start``)."""
    while end > start and text[end - 1] in " \t\n\r":
        end -= 1
    return end


class _NumberError(ValueError):
    """A number JSON readers disagree on, raised from inside ``json.loads``."""

    def __init__(self, digits: str, why: str) -> None:
        super().__init__(why)
        self.digits = digits
        self.why = why


def _bounded_int(digits: str) -> int:
    if len(digits) > MAX_DIGITS + 1:  # a sign is not a digit
        count = len(digits.lstrip("-"))
        raise _NumberError(digits, f"an integer of {count} digits (at most {MAX_DIGITS})")
    return int(digits)


def _finite(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):  # 1e999: past the largest float
        raise _NumberError(digits, f"the number {digits[:40]} is too large to be represented")
    return value


def _not_a_number(word: str) -> float:
    raise _NumberError(word, f"{word} is not a JSON number")


_DECODER = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_finite, parse_constant=_not_a_number
)


def _offset_location(text: str, offset: int) -> Location:
    offset = max(offset, 0)
    line = text.count("\n", 0, offset) + 1
    return Location(REQUEST, line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


def _invalid(code: str, message: str, at: Location) -> ApiError:
    return ApiError(422, code, message, [Diagnostic(code, message, at)])


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], value: Any, body: Body, under: JsonPath) -> M:
    """``value`` (found at ``under`` in ``body``) validated as ``model``; every problem
    located (422 ``request.invalid``)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid_request(exc, body, under) from None


def invalid_request(exc: ValidationError, body: Body, under: JsonPath) -> ApiError:
    """The 422 for a validation error of the value at ``under``."""
    errors = exc.errors(include_url=False)[:50]
    paths = [(*under, *(p for p in e["loc"] if isinstance(p, str | int))) for e in errors]
    where = body.locate(paths)
    diags = [
        Diagnostic(
            "request.invalid",
            f"{dotted(path)}: {e['msg']}",
            where[path],
            details={"path": list(path), "type": e["type"]},
        )
        for e, path in zip(errors, paths, strict=True)
    ]
    return ApiError(422, "request.invalid", diags[0].message, diags)


def dotted(path: JsonPath) -> str:
    """``session.messages[3].role``."""
    out = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return out.lstrip(".") or "body"


class BodyLimit:
    """ASGI middleware: read each request body whole, at most ``max_bytes`` of it within
    ``timeout`` seconds, before the app sees it.

    Over the cap, the answer is ``413`` without reading further (at once when
    ``Content-Length`` declares more); a body that has not arrived in time is ``408``. Both
    are typed JSON errors. ``on_refused(path, status)`` is told of each refusal (metrics)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        timeout: float,
        on_refused: Callable[[str, int], None] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, 413)
            return
        chunks: list[bytes] = []
        size = 0
        try:
            with anyio.fail_after(self.timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # nobody is left to answer
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_bytes:
                        await self._refuse(scope, send, 413)
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._refuse(scope, send, 408)
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only the client's disconnect

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, status: int) -> None:
        if status == 413:
            code, message = (
                "request.too-large",
                f"the body is larger than the limit of {self.max_bytes:,} bytes",
            )
        else:
            code, message = (
                "request.timeout",
                f"the body did not arrive within {self.timeout:g} seconds",
            )
        payload = error_bytes(code, message, [Diagnostic(code, message, Location(REQUEST, 1, 1))])
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            # The rest of the body is not read: the connection cannot carry another request.
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        if self.on_refused is not None:
            self.on_refused(str(scope.get("path", "")), status)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
