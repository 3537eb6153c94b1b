"""A scripted HTTP server on 127.0.0.1 that records what it receives."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.hostile_server import running


@dataclass
class Reply:
    """One scripted answer: status, body (dict → JSON, str → raw), headers, delay first."""

    status: int = 200
    body: dict[str, Any] | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedServer(ThreadingHTTPServer):
    """Answers each request with the next :class:`Reply`; the last one repeats."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        self.replies = list(replies)

    def next_reply(self) -> Reply:
        with self.lock:
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out has hung up; writing to it fails, which is expected here.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        with self.server.lock:
            self.server.received.append(
                Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
        reply = self.server.next_reply()
        if reply.delay and self.server.stop.wait(reply.delay):
            return
        data = (json.dumps(reply.body) if isinstance(reply.body, dict) else reply.body).encode()
        self.send_response(reply.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A running :class:`ScriptedServer`, shut down and closed after the test."""
    with running(ScriptedServer()) as srv:
        yield srv
