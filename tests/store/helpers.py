"""Policy trees, bundles and a bundle server for the policy store tests.

A tree is ``routes.yaml`` (every model to ``team.yaml``), ``team.yaml`` (a visible
``compaction.tail_turns``) and ``prompts/marker.txt``, a system layer whose text shows in
every request as ``MARKER<...>``, so a request tells which revision built it.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import Compiler, default_compiler
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.catalog import bundled_catalog

from ..runtime.helpers import assistant, session, text, user

ROUTES = """\
version: 1
routes:
  - name: claude
    match: {family: claude}
    policy: ./team.yaml
default: ./team.yaml
"""

POLICY = """\
version: 1
name: team
compaction:
  tail_turns: {tail}
system:
  layers:
    - id: marker
      source: file
      path: prompts/marker.txt
"""

#: Ways a rewrite can leave a tree that must be refused: a schema error, a layer file that
#: is missing, a routes file naming a policy that is not there, and a policy that checks
#: clean but does not compile for any model (a per-model value reading the session).
BROKEN = {
    "schema": "version: 1\nname: team\nbogus: 1\n",
    "missing-file": POLICY.format(tail=2).replace("prompts/marker.txt", "prompts/gone.txt"),
    "compile": 'version: 1\nname: team\ncache:\n  when: "session.turns > 3"\n',
}

MARKER = re.compile(r"MARKER<([^>]*)>")

#: The catalog model every revision of a tree is compiled for before anyone asks: the first
#: catalog model its one routed policy serves (PolicyStore checks each routed policy so).
FIRST = bundled_catalog().models[0].id
#: Revision numbers for the bundles the tests build, one above the other in build order
#: (the default, the Unix time in seconds, repeats within a second).
RELEASES = itertools.count(1)
#: A catalog model of the tree's claude route other than :data:`FIRST`.
SONNET = "anthropic/claude-sonnet-4-5"

SESSION = session(
    user("u1", "hello"),
    assistant("a1", text("a1-t", "hi")),
    user("u2", "go on", created=1_700_000_001_000),
)


def write_tree(root: Path, marker: str, tail: int = 2) -> None:
    """A valid tree whose requests carry ``MARKER<marker>`` and whose policy keeps
    ``tail`` turns."""
    (root / "prompts").mkdir(parents=True, exist_ok=True)
    (root / "routes.yaml").write_text(ROUTES, encoding="utf-8")
    (root / "team.yaml").write_text(POLICY.format(tail=tail), encoding="utf-8")
    (root / "prompts" / "marker.txt").write_text(f"MARKER<{marker}>\n", encoding="utf-8")


def break_tree(root: Path, how: str) -> None:
    """Rewrite ``root`` so that it must be rejected (see :data:`BROKEN`)."""
    if how == "routes":
        (root / "routes.yaml").write_text(ROUTES.replace("./team.yaml", "./nope.yaml"))
        return
    (root / "team.yaml").write_text(BROKEN[how], encoding="utf-8")


def marker_of(body: str) -> str:
    """The marker a request carries."""
    found = MARKER.findall(body)
    assert len(found) == 1, body[:300]
    return found[0]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``cond()`` holds (checked every 10 ms), failing after ``timeout``."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


class Compiles:
    """Counts the compiles a store makes (through its own compiler, not the default one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        real = Compiler.compile

        def counted(compiler: Compiler, policy: Any, model: Any, **kw: Any) -> Plan:
            # A compile stopped early (compaction's own, for a capped output) is part of one.
            if compiler is not default_compiler() and kw.get("until") is None:
                self.calls.append(getattr(model, "id", str(model)))
            return real(compiler, policy, model, **kw)

        monkeypatch.setattr(Compiler, "compile", counted)

    @property
    def count(self) -> int:
        return len(self.calls)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Compiles:
    """A :class:`Compiles` counter installed for the test."""
    return Compiles(monkeypatch)


class BundleServer(ThreadingHTTPServer):
    """Serves one bundle at any path, with an ETag; answers 304 to a matching
    ``If-None-Match`` and 500 to the next ``fail`` requests. Every request's
    ``If-None-Match`` (or None) is kept in ``seen``, every status in ``statuses``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _BundleHandler)
        self.body = b""
        self.etag = '"none"'
        self.fail = 0
        self.seen: list[str | None] = []
        self.statuses: list[int] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/bundles/team.tar.gz"

    def publish(self, data: bytes) -> None:
        """Serve ``data`` from now on, under a new ETag."""
        with self.lock:
            self.body = data
            self.etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up is not a test failure


class _BundleHandler(BaseHTTPRequestHandler):
    server: BundleServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            sent = self.headers.get("if-none-match")
            srv.seen.append(sent)
            if srv.fail > 0:
                srv.fail -= 1
                status, body, etag = 500, b"down", None
            elif sent is not None and sent == srv.etag:
                status, body, etag = 304, b"", srv.etag
            else:
                status, body, etag = 200, srv.body, srv.etag
            srv.statuses.append(status)
        self.send_response(status)
        if etag is not None:
            self.send_header("etag", etag)
        if status != 304:
            self.send_header("content-type", "application/gzip")
            self.send_header("content-length", str(len(body)))
        self.end_headers()
        if status != 304:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass
