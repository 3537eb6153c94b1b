"""A real server for tests and benchmarks: uvicorn on 127.0.0.1 (a free port) in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serve_in_thread(config: Any, what: str = "the server") -> Iterator[tuple[str, Any]]:
    """Run the ``uvicorn.Config`` ``config`` on a fresh 127.0.0.1 socket until the block
    ends; yields the base URL and the ``uvicorn.Server``. The socket is made with the TCP
    protocol named, so that asyncio sets ``TCP_NODELAY`` on its connections (with protocol
    0 every keep-alive request waits out a delayed ACK, about 40 ms)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
