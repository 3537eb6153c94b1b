"""The HTTP/1.1 protocol the sidecar runs on: uvicorn's h11 protocol with a deadline for
the request head.

uvicorn bounds how long an idle connection is kept between requests
(``timeout_keep_alive``), but not how long a client may take to send a request's head: a
connection that sends nothing, or drips one header byte at a time, is held for as long as
the client likes, and a few hundred of them hold the server. :func:`protocol_class` makes
a protocol that closes a connection whose request head is not complete within
``head_timeout`` seconds of the connection being made, or of the previous response
(answering 408 first). The body has its own deadline (``BodyLimit``), and the number of
connections uvicorn's ``limit_concurrency``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kilo_rules.engine.base.errors import Diagnostic, Location
from kilo_rules.tools.serving.sidecar.body import REQUEST, error_bytes

__all__ = [
    "DEFAULT_HEAD_TIMEOUT",
    "DEFAULT_KEEP_ALIVE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "protocol_class",
    "uvicorn_config",
]

#: Seconds a client may take to send a request's head (request line and headers).
DEFAULT_HEAD_TIMEOUT = 10.0
#: Seconds an idle connection is kept open between requests.
DEFAULT_KEEP_ALIVE_TIMEOUT = 5
#: Connections (and requests in flight) past which a new request is answered 503.
DEFAULT_MAX_CONNECTIONS = 1000


def _timeout_response(seconds: float) -> bytes:
    code = "request.head-timeout"
    message = f"the request head did not arrive within {seconds:g} seconds"
    body = error_bytes(code, message, [Diagnostic(code, message, Location(REQUEST, 1, 1))])
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def protocol_class(head_timeout: float = DEFAULT_HEAD_TIMEOUT) -> type[asyncio.Protocol]:
    """An h11 protocol class (uvicorn's ``http=``) whose connections must send each
    request head within ``head_timeout`` seconds."""
    if head_timeout <= 0:
        raise ValueError("head_timeout must be > 0")
    refusal = _timeout_response(head_timeout)

    class HeadTimeoutProtocol(H11Protocol):
        """uvicorn's h11 protocol, closing a connection whose request head is late."""

        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the head is in: the body's turn
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._arm()  # the next request's head starts its own clock

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(head_timeout, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(refusal)
            self.transport.close()

    return HeadTimeoutProtocol


def uvicorn_config(
    app: Any,
    *,
    head_timeout: float = DEFAULT_HEAD_TIMEOUT,
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    **options: Any,
) -> uvicorn.Config:
    """The uvicorn configuration of a sidecar: the h11 protocol with the head deadline, the
    keep-alive bound and the connection limit (``options`` go to ``uvicorn.Config``)."""
    if keep_alive_timeout < 1 or max_connections < 1:
        raise ValueError("keep_alive_timeout and max_connections must be >= 1")
    return uvicorn.Config(
        app,
        http=protocol_class(head_timeout),
        ws="none",
        timeout_keep_alive=keep_alive_timeout,
        limit_concurrency=max_connections,
        **options,
    )
