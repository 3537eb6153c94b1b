"""``kilo-rules serve``: the HTTP sidecar over a policy directory, bundle or bundle URL.

The sidecar's packages (FastAPI, uvicorn, prometheus-client) are the ``serve`` extra: they
are imported in :func:`run` only, so that every other command works without them, and
without them this command exits 2 naming the install line.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ._options import Subcommands, add_allow_read, add_command
from ._runner import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from ..store import PolicyStore

#: What the sidecar needs beyond the core package, by the top-level module imported.
SERVE_MODULES = frozenset({"fastapi", "starlette", "uvicorn", "prometheus_client", "anyio"})
INSTALL_HINT = "pip install 'kilo-rules[serve]'"


class ServeSettings(BaseSettings):
    """``KILO_RULES_SERVE_*``: the sidecar's own settings (its options win over them)."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_SERVE_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0: any free).")
    decision_log: Path | None = Field(None, description="File to append one line per build to.")
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="Largest request body accepted, in bytes."
    )
    build_timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="Seconds a build may take."
    )
    max_concurrent_builds: int = Field(8, ge=1, description="Builds run at once.")
    workspace_roots: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Directories a request's workspace may name (os.pathsep-separated).",
    )

    @field_validator("workspace_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(p for p in value.split(os.pathsep) if p)
        return value


def register(sub: Subcommands) -> None:
    """Add ``serve`` to the subcommands."""
    p = add_command(
        sub,
        "serve",
        summary="run the HTTP sidecar (needs the serve extra)",
        description="Serve builds over HTTP (docs/serve.md): POST /v1/build, POST /v1/check, "
        "GET /v1/plan, /healthz, /readyz, /metrics. The policies come from a directory, a "
        "signed bundle or a bundle URL (else the KILO_RULES_STORE_* settings); a revision "
        "that fails its checks is never served. Needs " + INSTALL_HINT + ".",
    )
    source = p.add_argument_group("the policies (one of; default: KILO_RULES_STORE_*)")
    one = source.add_mutually_exclusive_group()
    one.add_argument("--dir", metavar="DIR", help="a policy directory (routes.yaml + policies)")
    one.add_argument("--bundle", metavar="FILE", help="a policy bundle (.tar.gz)")
    one.add_argument("--url", metavar="URL", help="a bundle URL, fetched and cached")
    source.add_argument(
        "--public-key", metavar="PEM", help="Ed25519 public key the bundle must be signed with"
    )
    source.add_argument(
        "--cache-dir", metavar="DIR", help="where a fetched bundle is kept (with --url)"
    )
    reload = source.add_mutually_exclusive_group()
    reload.add_argument(
        "--watch", action="store_true", help="reload the directory when it changes (with --dir)"
    )
    reload.add_argument(
        "--poll", action="store_true", help="fetch the URL again periodically (with --url)"
    )
    add_allow_read(p)
    net = p.add_argument_group("the server (default: KILO_RULES_SERVE_*)")
    net.add_argument("--host", default=None, help="address to listen on (default: 127.0.0.1)")
    net.add_argument("--port", type=int, default=None, help="port (default: 8080; 0: any free)")
    net.add_argument(
        "--decision-log", metavar="FILE", default=None, help="append one JSON line per build"
    )
    net.add_argument(
        "--workspace-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory a request's workspace may name; instruction files are read there "
        "(repeatable; default: none, requests build in the sidecar's directory)",
    )
    net.add_argument(
        "--max-body-bytes", type=int, metavar="N", help="request body cap (default: 16 MiB)"
    )
    net.add_argument(
        "--build-timeout",
        type=float,
        metavar="SECONDS",
        help="time bound of a build, check or plan (default: 30)",
    )
    net.add_argument(
        "--max-concurrent-builds", type=int, metavar="N", help="builds run at once (default: 8)"
    )
    net.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="info",
        help="server log level (default: info)",
    )
    p.add_argument(
        "--openapi",
        action="store_true",
        help="print the OpenAPI document (schemas/openapi.json) and exit",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then close the store."""
    try:
        import uvicorn

        from ..serve import create_app, openapi_document
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVE_MODULES:
            raise
        print(
            f"kilo-rules serve: the sidecar needs the serve extra ({exc.name} is not "
            f"installed): {INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.openapi:
        print(json.dumps(openapi_document(), indent=2, ensure_ascii=False))
        return EXIT_OK
    settings = ServeSettings()
    roots = [*settings.workspace_roots, *args.workspace_root]
    for raw in roots:
        if not Path(raw).expanduser().is_dir():
            raise ValueError(
                f"--workspace-root / KILO_RULES_SERVE_WORKSPACE_ROOTS: {raw!r} is not a directory"
            )
    store = open_store(args)
    try:
        decision_log = args.decision_log or settings.decision_log
        build_timeout = _pick(args.build_timeout, settings.build_timeout)
        app = create_app(
            store,
            decision_log=Path(decision_log) if decision_log else None,
            max_body_bytes=_pick(args.max_body_bytes, settings.max_body_bytes),
            build_timeout=build_timeout,
            max_concurrent_builds=_pick(args.max_concurrent_builds, settings.max_concurrent_builds),
            workspace_roots=tuple(Path(r).expanduser() for r in roots),
        )
        config = uvicorn.Config(
            app,
            host=_pick(args.host, settings.host),
            port=_pick(args.port, settings.port),
            log_level=args.log_level,
            # The sidecar answers its own errors as JSON; uvicorn's access log repeats the
            # decision log's facts without the revision.
            access_log=False,
            server_header=False,
            # A request in flight at SIGTERM is answered within its own time bound.
            timeout_graceful_shutdown=int(build_timeout) + 5,
        )
        # uvicorn handles SIGTERM and SIGINT itself (it stops accepting and finishes the
        # requests in flight), then raises the signal again for the handler it found. For
        # SIGTERM that would be the default, dying on the spot with the store open; this
        # one lets the run return, so the store is closed and the exit is 0.
        # What is loaded by now (the catalog, the revision's plans, the app) lives as long
        # as the process: frozen, it is no longer walked by every full collection, which
        # shortens the pauses that make the tail of the build latency.
        gc.collect()
        gc.freeze()
        with _surviving_sigterm():
            uvicorn.Server(config).run()
    finally:
        store.close()
    return EXIT_OK


@contextlib.contextmanager
def _surviving_sigterm() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


T = TypeVar("T")


def _pick(given: T | None, default: T) -> T:
    return default if given is None else given


def open_store(args: argparse.Namespace) -> PolicyStore:
    """The store the options name (else the one ``KILO_RULES_STORE_*`` describes), its
    first revision loaded; with ``--watch`` or ``--poll`` its background reloading started."""
    from ..store import PolicyStore, StoreSettings

    settings = StoreSettings()
    given: dict[str, Any] = {}
    if args.public_key:
        given["public_key"] = Path(args.public_key)
    if args.cache_dir:
        given["cache_dir"] = Path(args.cache_dir)
    settings = settings.model_copy(update=given)
    if args.dir:
        store = PolicyStore.from_directory(Path(args.dir), settings=settings)
    elif args.bundle:
        store = PolicyStore.from_bundle(Path(args.bundle), settings=settings)
    elif args.url:
        store = PolicyStore.from_url(args.url, cache_dir=settings.cache_dir, settings=settings)
    elif settings.source() is None:
        raise ValueError(
            "no policies to serve: give --dir, --bundle or --url (or set "
            "KILO_RULES_STORE_DIRECTORY, KILO_RULES_STORE_BUNDLE or KILO_RULES_STORE_URL)"
        )
    else:
        store = PolicyStore.from_settings(settings)
    kind = store.settings.source()
    problem = None
    if args.watch and kind != "directory":
        problem = "--watch goes with a policy directory (--dir)"
    elif args.poll and kind not in ("url", "bundle"):
        problem = "--poll goes with a bundle URL or file (--url, --bundle)"
    if problem is not None:
        store.close()
        raise ValueError(problem)
    if args.watch or args.poll:
        store.start()
    return store
