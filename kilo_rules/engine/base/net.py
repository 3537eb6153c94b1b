"""The one network policy: every fetch kilo-rules makes goes through :class:`NetClient`.

Instruction URLs and the HTTP summarizer talk to peers that are not trusted (a URL in a
policy that arrived by pull request, a summarizer endpoint, whatever those redirect to), so
each call is held to the same rules, typed once in :class:`NetworkSettings`:

- the scheme must be allowed (``https`` and ``http`` by default: never ``file:`` or ``ftp:``);
- the host must be allowed (any host by default; otherwise exact names or ``*.suffix``);
- every address the host resolves to (and an IP literal itself) must be public: private,
  loopback, link-local, multicast, reserved and unspecified addresses are refused unless
  ``allow_private`` is set or the host is one of the ``private_hosts``. The connection is
  then made to the address that was checked, so a second DNS answer cannot swap it;
- redirects are followed by hand, at most ``max_redirects`` hops, each target checked again
  (and never from https down to http); caller headers do not follow a redirect elsewhere;
- one total deadline per call, across resolution, connect, every redirect and every chunk
  of the body: httpx is given only the time that is left, and a watchdog shuts the socket
  down when the deadline passes, so not even a read already waiting can outlast it;
- one size cap, enforced on the bytes on the wire and, separately, on the bytes after
  ``gzip``/``deflate`` decoding, while streaming: a decompression bomb stops at the cap.

Every refusal and failure is a :class:`~kilo_rules.engine.base.errors.NetworkError` whose code says
which rule (``net.scheme``, ``net.host``, ``net.address``, ``net.redirect``,
``net.deadline``, ``net.too-large``, ``net.status``, ``net.encoding``, ``net.transport``,
``net.url``).

:class:`UrlCache` keeps fetched texts (and failures, for a shorter while) for a TTL, so
that a URL is not fetched again on every step.

These rules are written here, over httpx, rather than taken from a library: httpx has no
address policy of its own, and the guard must connect to the very address it checked and
hold redirects, decoded bytes and time to one cap each, which a wrapper would have to do
in the same way and be trusted as much.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kilo_rules.engine.base.errors import Diagnostic, Location, NetworkError
from kilo_rules.engine.base.lru import LRUCache

if TYPE_CHECKING:
    # Imported where a request is made: most commands never make one, and httpx is a
    # fifth of the start-up time of `kilo-rules check`.
    import httpx

__all__ = [
    "HttpReply",
    "NetClient",
    "NetworkSettings",
    "Resolver",
    "UrlCache",
    "is_public_address",
    "network_settings",
    "resolve_host",
    "use_network",
]

_WHERE = Location("<network>", 1, 1)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

#: Resolves a host name to its addresses within a timeout (seconds); raises OSError.
Resolver = Callable[[str, float], Sequence[str]]


def _split(value: Any) -> Any:
    # From the environment a list is written "a.example, *.b.example" (or as JSON).
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            return json.loads(text)
        return [v.strip() for v in text.split(",") if v.strip()]
    return value


class NetworkSettings(BaseSettings):
    """The network policy (``KILO_RULES_NET_*`` environment variables).

    Lists are written comma-separated (``KILO_RULES_NET_ALLOWED_HOSTS=a.example,*.b.example``)
    or as a JSON array."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_NET_", extra="ignore", frozen=True)

    schemes: Annotated[tuple[str, ...], NoDecode] = Field(
        ("https", "http"), description="URL schemes that may be fetched."
    )
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Hosts that may be fetched: exact names or '*.suffix' (any subdomain). "
        "Empty: any host whose addresses are public.",
    )
    private_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Hosts (exact or '*.suffix') that may resolve to private or loopback "
        "addresses, such as a local model server.",
    )
    allow_private: bool = Field(
        False,
        description="Accept private, loopback, link-local, multicast, reserved and unspecified "
        "addresses for every host.",
    )
    max_redirects: int = Field(5, ge=0, le=30, description="Redirect hops followed at most.")
    deadline_seconds: float = Field(
        30.0, gt=0, description="Total time of one call (resolve, connect, redirects, body)."
    )
    max_bytes: int = Field(
        8 * 1024 * 1024, ge=1, description="Size cap of a reply, on the wire and decoded."
    )

    @field_validator("schemes", "allowed_hosts", "private_hosts", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("schemes", "allowed_hosts", "private_hosts")
    @classmethod
    def _lower(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower().rstrip(".") for v in value)


_IN_FORCE: contextvars.ContextVar[NetworkSettings | None] = contextvars.ContextVar(
    "kilo_rules_network", default=None
)


def network_settings() -> NetworkSettings:
    """The network policy in force: the one set by :func:`use_network` around the current
    call (the CLI sets ``NetworkSettings()``, read from ``KILO_RULES_NET_*``), else the
    defaults. The library itself never reads the environment."""
    settings = _IN_FORCE.get()
    return settings if settings is not None else NetworkSettings.model_construct()


@contextlib.contextmanager
def use_network(settings: NetworkSettings) -> Iterator[NetworkSettings]:
    """Within the ``with`` block, every fetch that is not given its own policy (instruction
    URLs, a summarizer built without ``network=``) follows ``settings``."""
    token = _IN_FORCE.set(settings)
    try:
        yield settings
    finally:
        _IN_FORCE.reset(token)


def _fail(code: str, message: str, url: str, **details: Any) -> NetworkError:
    return NetworkError(Diagnostic(code, message, _WHERE, details={"url": url, **details}))


def _host_matches(host: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern:
            return True
    return False


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None


def is_public_address(address: str) -> bool:
    """Whether ``address`` is a public unicast address (IPv4-mapped IPv6 judged as IPv4)."""
    ip = _ip(address)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def resolve_host(host: str, timeout: float) -> list[str]:
    """The addresses of ``host`` (getaddrinfo), or OSError; a resolver that hangs is cut at
    ``timeout`` seconds (the lookup runs in a daemon thread, which cannot be cancelled)."""
    result: list[list[str] | BaseException] = []

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            result.append(list(dict.fromkeys(str(info[4][0]) for info in infos)))
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    worker = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise TimeoutError(f"resolving {host} took longer than {timeout:.3g} s")
    found = result[0]
    if isinstance(found, BaseException):
        raise found
    return found


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A reply read within the limits: final URL, status, headers and the decoded body."""

    url: str
    status_code: int
    headers: httpx.Headers
    content: bytes

    @property
    def is_success(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        """The body as text (UTF-8 unless the reply names another charset)."""
        import httpx

        charset = httpx.Response(200, headers=self.headers).charset_encoding or "utf-8"
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:
            return self.content.decode("utf-8", errors="replace")


class _Clock:
    """The time left of one call's total deadline."""

    def __init__(self, deadline: float, url: str, now: Callable[[], float]) -> None:
        self.deadline = deadline
        self.url = url
        self._now = now
        self._start = now()

    def left(self) -> float:
        """Seconds left; a NetworkError (``net.deadline``) when none are."""
        left = self.deadline - (self._now() - self._start)
        if left <= 0:
            raise self.expired()
        return left

    def expired(self) -> NetworkError:
        return _fail(
            "net.deadline",
            f"{self.url}: no complete answer within {self.deadline:g} s (total deadline)",
            self.url,
            deadline_seconds=self.deadline,
        )


class _Decoder:
    """``gzip``/``deflate`` decoding that never yields more than it is asked for."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        # 47: zlib or gzip header detected; deflate may also come raw, tried on failure.
        self._z = zlib.decompressobj(47 if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS)
        self._started = False

    def feed(self, data: bytes, room: int) -> Iterator[bytes]:
        """Decoded pieces of ``data``, each at most ``room`` bytes (``room`` ≥ 1)."""
        while data:
            try:
                piece = self._z.decompress(data, room)
            except zlib.error:
                if self.coding != "deflate" or self._started:
                    raise
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                piece = self._z.decompress(data, room)
            self._started = True
            yield piece
            data = self._z.unconsumed_tail
            if not piece and data:  # pragma: no cover - zlib always progresses with room ≥ 1
                break

    def flush(self, room: int) -> bytes:
        return self._z.flush(room)


class NetClient:
    """Fetches URLs under one :class:`NetworkSettings` policy.

    ``private_hosts`` adds hosts that may resolve to private addresses for this client only
    (the summarizer allows its own configured endpoint this way). Seams: ``transport`` or
    ``client`` (a caller-owned ``httpx.Client``; redirects are still followed here, never by
    it), ``resolve`` (host → addresses) and ``clock`` (monotonic seconds). With the default
    transport the connection goes to the address that was checked; an injected transport or
    client connects as it likes, after the same checks.
    """

    def __init__(
        self,
        settings: NetworkSettings | None = None,
        *,
        private_hosts: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        transport: httpx.BaseTransport | None = None,
        client: httpx.Client | None = None,
        resolve: Resolver = resolve_host,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        base = settings if settings is not None else network_settings()
        extra_private = tuple(h.lower().rstrip(".") for h in private_hosts)
        extra_allowed = tuple(h.lower().rstrip(".") for h in allowed_hosts)
        self.settings = base.model_copy(
            update={
                "private_hosts": base.private_hosts + extra_private,
                # An empty list means any host, so extra hosts only widen a non-empty one.
                "allowed_hosts": base.allowed_hosts + extra_allowed if base.allowed_hosts else (),
            }
        )
        self._transport = transport
        self._client = client
        self._resolve = resolve
        self._now = clock

    def check(self, url: str, clock: _Clock | None = None) -> list[str]:
        """The checked addresses of ``url``'s host, or a NetworkError naming the rule."""
        import httpx

        s = self.settings
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise _fail("net.url", f"{url}: not a valid URL ({exc})", url) from None
        scheme = parsed.scheme.lower()
        if scheme not in s.schemes:
            allowed = ", ".join(s.schemes) or "none"
            raise _fail(
                "net.scheme",
                f"{url}: the scheme {scheme or '(none)'!r} is not allowed (allowed: {allowed})",
                url,
                scheme=scheme,
            )
        host = parsed.raw_host.decode("ascii", "replace").lower().rstrip(".")
        if not host:
            raise _fail("net.url", f"{url}: the URL has no host", url)
        if s.allowed_hosts and not _host_matches(host, s.allowed_hosts):
            raise _fail(
                "net.host",
                f"{url}: the host {host!r} is not among the allowed hosts",
                url,
                host=host,
            )
        literal = _ip(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            timeout = clock.left() if clock else s.deadline_seconds
            try:
                addresses = list(self._resolve(host, timeout))
            except TimeoutError:
                if clock is not None:
                    clock.left()  # the deadline is what ran out
                raise _fail("net.deadline", f"{url}: resolving {host} timed out", url) from None
            except OSError as exc:
                raise _fail(
                    "net.host", f"{url}: cannot resolve {host!r} ({exc})", url, host=host
                ) from None
            if not addresses:
                raise _fail("net.host", f"{url}: {host!r} has no address", url, host=host)
        if not (s.allow_private or _host_matches(host, s.private_hosts)):
            bad = [a for a in addresses if not is_public_address(a)]
            if bad:
                raise _fail(
                    "net.address",
                    f"{url}: {host} resolves to a non-public address ({bad[0]}); private, "
                    "loopback, link-local, multicast and reserved addresses are refused "
                    "unless allowed",
                    url,
                    host=host,
                    address=bad[0],
                )
        return addresses

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        deadline: float | None = None,
        max_bytes: int | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
    ) -> HttpReply:
        """Send one request and read its reply within the policy, following redirects.

        ``deadline`` (seconds, total) and ``max_bytes`` default to the settings'.
        ``connect_timeout`` and ``read_timeout`` may only shorten the phases further. The
        reply is returned whatever its status; :meth:`get_text` wants a 2xx.
        """
        import httpx

        s = self.settings
        clock = _Clock(deadline or s.deadline_seconds, url, self._now)
        limit = max_bytes or s.max_bytes
        sent = dict(headers or {})
        sent.setdefault("accept-encoding", "gzip, deflate")
        current = url
        origin = httpx.URL(url).copy_with(path="/", query=None, fragment=None)
        body = content
        for hop in range(s.max_redirects + 1):
            if hop:
                try:
                    addresses = self.check(current, clock)
                except NetworkError as exc:
                    d = exc.diagnostic
                    raise _fail(
                        "net.redirect",
                        f"{url}: redirect refused: {d.message}",
                        url,
                        refused=d.code,
                        target=current,
                    ) from None
            else:
                addresses = self.check(current, clock)
            reply = self._send(
                method, current, addresses, sent, body, clock, limit, connect_timeout, read_timeout
            )
            if isinstance(reply, HttpReply):
                return reply
            status, location = reply
            try:
                target = httpx.URL(current).join(location)
            except httpx.InvalidURL as exc:
                raise _fail("net.redirect", f"{url}: bad redirect location ({exc})", url) from None
            if httpx.URL(current).scheme == "https" and target.scheme == "http":
                raise _fail(
                    "net.redirect",
                    f"{url}: redirect from https to http refused ({target})",
                    url,
                    target=str(target),
                )
            if target.copy_with(path="/", query=None, fragment=None) != origin:
                # Credentials and caller headers stay with the origin they were meant for.
                sent = {"accept-encoding": sent["accept-encoding"]}
            if status == 303 or (status in (301, 302) and method != "GET"):
                method, body = "GET", None
                sent.pop("content-type", None)
            current = str(target)
        raise _fail(
            "net.redirect",
            f"{url}: more than {s.max_redirects} redirects",
            url,
            max_redirects=s.max_redirects,
        )

    def get_text(
        self, url: str, *, deadline: float | None = None, max_bytes: int | None = None
    ) -> str:
        """GET ``url`` and return its text; a status other than 2xx is ``net.status``."""
        reply = self.request("GET", url, deadline=deadline, max_bytes=max_bytes)
        if not reply.is_success:
            raise _fail(
                "net.status",
                f"{url}: HTTP {reply.status_code}",
                url,
                status=reply.status_code,
            )
        return reply.text

    def _send(
        self,
        method: str,
        url: str,
        addresses: Sequence[str],
        headers: dict[str, str],
        content: bytes | None,
        clock: _Clock,
        limit: int,
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> HttpReply | tuple[int, str]:
        """One hop: the reply, or (status, location) of a redirect to follow."""
        import httpx

        parsed = httpx.URL(url)
        pin = self._client is None and self._transport is None
        targets: Sequence[str | None] = addresses if pin else [None]
        last: Exception | None = None
        for address in targets:
            left = clock.left()
            timeout = httpx.Timeout(
                left,
                connect=min(left, connect_timeout or left),
                read=min(left, read_timeout or left),
            )
            hop_headers = dict(headers)
            extensions: dict[str, Any] = {}
            target = parsed
            if address is not None and _ip(parsed.host) is None:
                # Connect to the address that was checked, naming the host for HTTP and TLS.
                target = parsed.copy_with(host=address)
                hop_headers["host"] = parsed.netloc.decode("ascii")
                extensions["sni_hostname"] = parsed.host
            try:
                return self._exchange(
                    method, target, url, hop_headers, content, extensions, timeout, clock, limit
                )
            except httpx.ConnectError as exc:
                last = exc  # another address of the host may answer
        raise _fail(
            "net.transport", f"{url}: cannot connect ({last})", url, error=type(last).__name__
        )

    def _exchange(
        self,
        method: str,
        target: httpx.URL,
        url: str,
        headers: dict[str, str],
        content: bytes | None,
        extensions: dict[str, Any],
        timeout: httpx.Timeout,
        clock: _Clock,
        limit: int,
    ) -> HttpReply | tuple[int, str]:
        import httpx

        owned = self._client is None
        client = self._client or httpx.Client(
            transport=self._transport, follow_redirects=False, trust_env=False
        )
        watchdog = _Watchdog(clock.left())
        try:
            request = client.build_request(
                method, target, headers=headers, content=content, timeout=timeout
            )
            request.extensions.update(extensions)
            request.extensions["trace"] = watchdog.trace
            response = client.send(request, stream=True, follow_redirects=False)
            try:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location:
                    return response.status_code, location
                return HttpReply(
                    url, response.status_code, response.headers, _read(response, url, clock, limit)
                )
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            clock.left()  # the total deadline ran out, or else a shorter phase timeout did
            raise _fail("net.deadline", f"{url}: timed out ({type(exc).__name__})", url) from None
        except (httpx.ConnectError, NetworkError):
            raise
        except httpx.HTTPError as exc:
            if watchdog.fired:
                raise clock.expired() from None
            raise _fail(
                "net.transport", f"{url}: {type(exc).__name__}: {exc}", url, error=str(exc)
            ) from None
        finally:
            watchdog.cancel()
            if owned:
                client.close()


class _Watchdog:
    """Shuts the call's socket down when its total deadline passes.

    httpx applies one read timeout to every read, fixed when the request goes out, so a
    read that starts just before the deadline could wait that long again. The watchdog
    learns the connection from httpcore's trace events and, at the deadline, shuts the
    socket down from a timer thread, which ends a blocked read at once."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event.endswith(("connect_tcp.complete", "start_tls.complete")):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                with self._lock:
                    self._sockets.append(sock)
                    late = self.fired
                if late:
                    self._shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # already closed: nothing left to stop
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _too_large(url: str, limit: int, what: str) -> NetworkError:
    return _fail(
        "net.too-large",
        f"{url}: the reply is larger than {limit} bytes ({what})",
        url,
        max_bytes=limit,
        measured=what,
    )


def _read(response: httpx.Response, url: str, clock: _Clock, limit: int) -> bytes:
    """The decoded body, read chunk by chunk under the deadline and both size caps."""
    if response.is_stream_consumed:
        # A reply built in memory (an httpx.MockTransport double) arrives already read.
        if len(response.content) > limit:
            raise _too_large(url, limit, "decoded")
        return response.content
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(url, limit, "content-length")
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        decoder = None
    elif coding in ("gzip", "x-gzip", "deflate"):
        decoder = _Decoder(coding)
    else:
        raise _fail(
            "net.encoding", f"{url}: unsupported content-encoding {coding!r}", url, coding=coding
        )
    wire = 0
    out = bytearray()
    try:
        # No chunk size: every read is handed over as it arrives, so a server that drips
        # bytes meets the deadline check between reads rather than never filling a chunk.
        for chunk in response.iter_raw():
            clock.left()
            wire += len(chunk)
            if wire > limit:
                raise _too_large(url, limit, "on the wire")
            if decoder is None:
                out += chunk
                continue
            for piece in decoder.feed(chunk, limit + 1 - len(out)):
                out += piece
                if len(out) > limit:
                    raise _too_large(url, limit, "decoded")
        if decoder is not None:
            out += decoder.flush(limit + 1 - len(out))
            if len(out) > limit:
                raise _too_large(url, limit, "decoded")
    except zlib.error as exc:
        raise _fail(
            "net.encoding", f"{url}: bad {coding} body ({exc})", url, coding=coding
        ) from None
    return bytes(out)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    at: float
    value: T | None
    error: Exception | None


class UrlCache(Generic[T]):
    """Fetched values by key for a TTL, failures for a shorter one; bounded, thread-safe.

    One fetch runs per key at a time: a thread that finds another fetching the same key
    waits for it instead of fetching again (a hanging URL costs one deadline, not one per
    thread). ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        maxsize: int = 256,
        *,
        negative_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries: LRUCache[object, _Entry[T]] = LRUCache(maxsize)
        self._locks: LRUCache[object, threading.Lock] = LRUCache(maxsize)
        self._guard = threading.Lock()
        self.negative_ttl = negative_ttl
        self._now = clock

    def get(self, key: object, ttl: float, fetch: Callable[[], T]) -> T:
        """The value of ``key`` fetched at most ``ttl`` seconds ago (a failure at most
        ``min(ttl, negative_ttl)`` ago is raised again), else ``fetch()`` remembered."""
        if ttl <= 0:
            return fetch()
        hit = self._fresh(key, ttl)
        if hit is not None:
            return self._unwrap(hit)
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = threading.Lock()
                self._locks.put(key, lock)
        with lock:
            hit = self._fresh(key, ttl)
            if hit is not None:
                return self._unwrap(hit)
            try:
                value = fetch()
            except Exception as exc:
                self._entries.put(key, _Entry(self._now(), None, exc))
                raise
            self._entries.put(key, _Entry(self._now(), value, None))
            return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def _fresh(self, key: object, ttl: float) -> _Entry[T] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        age = self._now() - entry.at
        keep = ttl if entry.error is None else min(ttl, self.negative_ttl)
        return entry if age < keep else None

    @staticmethod
    def _unwrap(entry: _Entry[T]) -> T:
        if entry.error is not None:
            raise entry.error
        return entry.value  # type: ignore[return-value]  # a success holds a T
