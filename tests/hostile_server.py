"""A hostile HTTP server on 127.0.0.1 for the network-policy tests.

The first path segment picks the behaviour, so a summarizer whose base URL is
``{base}/drip`` posts to ``/drip/v1/chat/completions`` and gets the drip:

- ``text``: a short text reply (``server.text``);
- ``summary``: an OpenAI-style chat completion whose content is ``server.text``;
- ``drip``: promises 1000 bytes and sends one every 0.2 s;
- ``bomb``: ~200 KB of gzip that decodes to 200 MB of spaces;
- ``big``: a 50 MB reply, streamed, with its content-length;
- ``flood``: the same 50 MB without a content-length (the body ends when the server
  closes the connection), so only the bytes read can stop it;
- ``redirect``: 302 to ``server.redirect_to``.

Every request is counted per segment in ``server.hits``; ``server.host_headers`` keeps the
``Host`` header of each.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import pytest

BOMB_DECODED = 200 * 1024 * 1024
BIG = 50 * 1024 * 1024


@cache
def bomb() -> bytes:
    """Gzip of BOMB_DECODED spaces, made once (about 200 KB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1024 * 1024)
    out = [z.compress(block) for _ in range(BOMB_DECODED // len(block))]
    out.append(z.flush())
    return b"".join(out)


class HostileServer(ThreadingHTTPServer):
    """See the module docstring."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.text = "Use tabs."
        self.redirect_to = "http://169.254.169.254/latest/meta-data/"
        self.hits: Counter[str] = Counter()
        self.host_headers: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hang up on the drip, the bomb and the big reply on purpose.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: HostileServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self._answer()

    def _answer(self) -> None:
        route = self.path.strip("/").split("/", 1)[0]
        with self.server.lock:
            self.server.hits[route] += 1
            self.server.host_headers.append(self.headers.get("host", ""))
        if route == "text":
            self._send(200, self.server.text.encode(), "text/plain; charset=utf-8")
        elif route == "summary":
            reply = {"choices": [{"message": {"role": "assistant", "content": self.server.text}}]}
            self._send(200, json.dumps(reply).encode(), "application/json")
        elif route == "drip":
            self._head(200, 1000, "text/plain")
            for _ in range(1000):
                if self.server.stop.wait(0.2):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
        elif route == "stall":
            # Headers and one byte just before a 1 s deadline, then nothing: a per-read
            # timeout set when the request went out would wait ~1 s more.
            if self.server.stop.wait(0.8):
                return
            self._head(200, 1000, "text/plain")
            self.wfile.write(b"x")
            self.wfile.flush()
            self.server.stop.wait(10)
        elif route == "bomb":
            data = bomb()
            self._head(200, len(data), "application/json", {"content-encoding": "gzip"})
            self.wfile.write(data)
        elif route == "big":
            self._head(200, BIG, "application/json")
            chunk = b"x" * 65536
            for _ in range(BIG // len(chunk)):
                if self.server.stop.is_set():
                    return
                self.wfile.write(chunk)
        elif route == "flood":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            chunk = b"x" * 65536
            for _ in range(BIG // len(chunk)):
                if self.server.stop.is_set():
                    return
                self.wfile.write(chunk)
        elif route == "redirect":
            self._head(302, 0, "text/plain", {"location": self.server.redirect_to})
        else:
            self._send(404, b"not found", "text/plain")

    def _head(
        self, status: int, length: int, ctype: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(length))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self._head(status, len(body), ctype)
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


S = TypeVar("S", bound=ThreadingHTTPServer)


@contextlib.contextmanager
def running(srv: S) -> Iterator[S]:
    """Serve ``srv`` on a thread; on the way out wake its handlers (``srv.stop``, an
    Event), then shut it down and close it."""
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield srv
    finally:
        srv.stop.set()  # type: ignore[attr-defined]
        srv.shutdown()
        srv.server_close()
        thread.join(5)


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    """A running :class:`HostileServer`, stopped after the test."""
    with running(HostileServer()) as srv:
        yield srv


def elapsed(start: float) -> float:
    """Seconds since ``start`` (time.monotonic)."""
    return time.monotonic() - start
