"""Who may call the sidecar: bearer tokens, the ``Host`` allow-list, JSON bodies, CORS.

:class:`Guard` is the outermost middleware of the app (below CORS, when the operator
configured origins), so every request is checked here before its body is read or parsed,
in this order:

1. **authentication**: ``Authorization: Bearer <token>``, one of the configured tokens
   (401 ``auth.missing`` / ``auth.invalid`` with ``WWW-Authenticate: Bearer``). Tokens are
   kept as sha256 digests only, and the digest of the presented token is compared with
   each of them by :func:`hmac.compare_digest`, all of them every time, so neither the
   time taken nor memory says which token came close;
2. **the Host header**: one of the allowed hosts (421 ``request.host``), so that a page
   whose domain was rebound to 127.0.0.1 (DNS rebinding) cannot talk to the sidecar from
   a browser even when authentication is off;
3. **the body's type**: a ``POST`` must declare ``application/json`` (415
   ``request.content-type``): a browser sends ``text/plain`` cross-origin without a
   preflight, never ``application/json``.

``/healthz``, ``/readyz`` and ``/metrics`` skip all three when the operator opens them
(``open_probes``): an orchestrator's probes carry no token and name the pod's address.
Neither a token nor an ``Authorization`` header is ever logged or counted.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.tools.serving.sidecar.body import (
    REQUEST,
    ASGIApp,
    Receive,
    Scope,
    Send,
    error_bytes,
)

__all__ = [
    "LOOPBACK_HOSTS",
    "MIN_TOKEN_CHARS",
    "PROBES",
    "Access",
    "Guard",
    "check_token",
    "host_entry",
]

#: The shortest token accepted: 16 characters of the RFC 6750 alphabet are > 90 bits.
MIN_TOKEN_CHARS = 16
#: The names of this machine a local client may use (any port unless one is given).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
#: The endpoints ``open_probes`` opens.
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})

# RFC 6750 b64token: what may follow "Bearer " in the header.
#: Makes a refusal's JSON body from (path, status, code, message).
ErrorBody = Callable[[str, int, str, str], bytes]

_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_REALM = 'Bearer realm="kilo-rules"'


def check_token(token: str) -> str:
    """``token`` if it can be a bearer token: RFC 6750 characters, at least
    :data:`MIN_TOKEN_CHARS` of them; else ``ValueError`` (which never quotes it)."""
    if not _TOKEN.fullmatch(token):
        raise ValueError(
            "a token may hold only letters, digits and -._~+/ (then = padding); "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"a token must be at least {MIN_TOKEN_CHARS} characters long")
    return token


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def host_entry(entry: str) -> tuple[str, int | None]:
    """An allowed-host entry as ``(name, port)``: ``example.com``, ``example.com:8443``,
    ``10.0.0.7``, ``[::1]:8080`` or ``*``; the port is None when any port goes. A bare
    IPv6 address is bracketed. ``ValueError`` for what cannot be a Host header."""
    text = entry.strip().lower().rstrip(".")
    if text == "*":
        return "*", None
    try:
        if ipaddress.ip_address(text).version == 6:
            return f"[{text}]", None
    except ValueError:
        pass
    parsed = _split_host(text)
    if parsed is None:
        raise ValueError(f"{entry!r} is not a host name, an address or host:port")
    return parsed


_NAME = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_\-.]+)")


def _split_host(text: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a Host header value (lower-cased), or None when malformed."""
    name, colon, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not colon:
        name, port = text, ""
    if not _NAME.fullmatch(name):
        return None
    if not colon:
        return name.rstrip("."), None
    if not port.isdigit() or len(port) > 5 or int(port) > 65535:
        return None
    return name.rstrip("."), int(port)


@dataclass(frozen=True)
class Access:
    """Who may call one app. Build it with :meth:`with_tokens` or :meth:`without_auth`."""

    #: sha256 digests of the accepted tokens; empty only when ``auth`` is off.
    digests: tuple[bytes, ...]
    #: Allowed Host values as (name, port or None for any port).
    hosts: tuple[tuple[str, int | None], ...]
    auth: bool = True
    open_probes: bool = False
    cors_origins: tuple[str, ...] = ()

    @classmethod
    def with_tokens(
        cls,
        tokens: Iterable[str],
        *,
        allowed_hosts: Sequence[str] | None = None,
        open_probes: bool = False,
        cors_origins: Sequence[str] = (),
    ) -> Access:
        """Callers must present one of ``tokens``. ``allowed_hosts``: the Host values
        accepted (default: :data:`LOOPBACK_HOSTS`, any port)."""
        digests = tuple(dict.fromkeys(_digest(check_token(t).encode()) for t in tokens))
        if not digests:
            raise ValueError("no token given: give at least one, or turn authentication off")
        return cls(digests, _hosts(allowed_hosts), True, open_probes, tuple(cors_origins))

    @classmethod
    def without_auth(
        cls,
        *,
        allowed_hosts: Sequence[str] | None = None,
        open_probes: bool = False,
        cors_origins: Sequence[str] = (),
    ) -> Access:
        """Anyone who can reach the socket may call; the Host and body checks remain."""
        return cls((), _hosts(allowed_hosts), False, open_probes, tuple(cors_origins))

    def authenticated(self, header: bytes | None) -> bool | None:
        """True when ``header`` (the ``Authorization`` value) carries an accepted token,
        False when it carries another, None when it carries none."""
        if header is None:
            return None
        scheme, _, token = header.strip().partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return None
        presented = _digest(token)
        found = False
        for digest in self.digests:  # every one, so the time does not say which matched
            found |= hmac.compare_digest(digest, presented)
        return found

    def host_allowed(self, header: bytes | None) -> bool:
        """Whether ``header`` (the ``Host`` value) names this server."""
        if header is None:
            return False
        try:
            parsed = _split_host(header.decode("ascii").strip().lower())
        except UnicodeDecodeError:
            return False
        if parsed is None:
            return False
        name, port = parsed
        return any(
            allowed == "*" or (allowed == name and (want is None or want == port))
            for allowed, want in self.hosts
        )


def _hosts(entries: Sequence[str] | None) -> tuple[tuple[str, int | None], ...]:
    parsed = tuple(host_entry(e) for e in (LOOPBACK_HOSTS if entries is None else entries))
    if not parsed:
        raise ValueError("the allowed-host list is empty: no request could be answered")
    return parsed


class Guard:
    """ASGI middleware: authenticate, check the Host and the body's type, before the app
    (and before the body is read). Refusals are the sidecar's typed JSON errors."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access: Access,
        header: str = "authorization",
        json_paths: frozenset[str] | None = None,
        error_body: ErrorBody | None = None,
    ) -> None:
        self.app = app
        self.access = access
        # How a refusal reads (path, status, code, message → JSON bytes): the sidecar's
        # typed error by default; the gateway answers in the shape of the API called.
        self.error_body = error_body
        # The gateway's callers send their provider's key in Authorization; its own token
        # comes in Proxy-Authorization.
        self.header = header.lower().encode("latin-1")
        # The paths whose bodies must be JSON (None: every path). The gateway relays other
        # paths (file uploads among them) with whatever body they carry.
        self.json_paths = json_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access = self.access
        path = str(scope.get("path", ""))
        if access.open_probes and path in PROBES and scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope, self.header)
        if access.auth:
            seen = access.authenticated(headers.get(self.header))
            if not seen:
                invalid = seen is False
                code = "auth.invalid" if invalid else "auth.missing"
                message = (
                    "the bearer token is not one this server accepts"
                    if invalid
                    else "authentication required: send "
                    f"{self.header.decode().title()}: Bearer <token>"
                )
                challenge = _REALM + (', error="invalid_token"' if invalid else "")
                await self._refuse(
                    scope, send, 401, code, message, [(b"www-authenticate", challenge)]
                )
                return
        if not access.host_allowed(headers.get(b"host")):
            await self._refuse(
                scope,
                send,
                421,
                "request.host",
                "the Host header does not name this server (see --allowed-host)",
            )
            return
        if (
            scope.get("method") in ("POST", "PUT", "PATCH")
            and (self.json_paths is None or path in self.json_paths)
            and not _is_json(headers.get(b"content-type"))
        ):
            await self._refuse(
                scope,
                send,
                415,
                "request.content-type",
                "the body must be sent as Content-Type: application/json",
            )
            return
        await self.app(scope, receive, send)

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        status: int,
        code: str,
        message: str,
        extra: Sequence[tuple[bytes, str]] = (),
    ) -> None:
        body = None
        if self.error_body is not None:
            body = self.error_body(str(scope.get("path", "")), status, code, message)
        await _refuse(scope, send, status, code, message, extra, body)


def _headers(scope: Scope, token: bytes = b"authorization") -> dict[bytes, bytes | None]:
    """The headers the guard reads; one sent twice counts as not sent (None), so that no
    proxy and server can disagree about which of the two was meant."""
    out: dict[bytes, bytes | None] = {}
    for name, value in scope.get("headers", ()):
        if name in (token, b"host", b"content-type"):
            out[name] = None if name in out else value
    return out


def _is_json(value: bytes | None) -> bool:
    if value is None:
        return False
    media, _, params = value.decode("latin-1").partition(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


async def _refuse(
    scope: Scope,
    send: Send,
    status: int,
    code: str,
    message: str,
    extra: Sequence[tuple[bytes, str]] = (),
    payload: bytes | None = None,
) -> None:
    if payload is None:
        payload = error_bytes(code, message, [Diagnostic(code, message, Location(REQUEST, 1, 1))])
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *((name, value.encode()) for name, value in extra),
    ]
    if _has_body(scope):
        # The body is not read: the connection cannot carry another request after it.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False
