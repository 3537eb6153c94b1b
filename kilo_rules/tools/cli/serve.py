"""``kilo-rules serve``: the HTTP sidecar over a policy directory, bundle or bundle URL.

The sidecar's packages (FastAPI, uvicorn, prometheus-client) are the ``serve`` extra: they
are imported in :func:`run` only, so that every other command works without them, and
without them this command exits 2 naming the install line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from kilo_rules.tools.cli._options import Subcommands, add_allow_read, add_command
from kilo_rules.tools.cli._runner import EXIT_OK, EXIT_USAGE
from kilo_rules.tools.serving.listen import ListenSettings

if TYPE_CHECKING:
    from kilo_rules.tools.serving.store import PolicyStore

#: What the sidecar needs beyond the core package, by the top-level module imported.
SERVE_MODULES = frozenset({"fastapi", "starlette", "uvicorn", "h11", "prometheus_client", "anyio"})
INSTALL_HINT = "pip install 'kilo-rules[serve]'"


class ServeSettings(ListenSettings):
    """``KILO_RULES_SERVE_*``: the sidecar's own settings (its options win over them)."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_SERVE_", extra="ignore")

    decision_log: Path | None = Field(None, description="File to append one line per build to.")
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="Largest request body accepted, in bytes."
    )
    build_timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="Seconds a build may take."
    )
    max_concurrent_builds: int = Field(8, ge=1, description="Builds run at once (per worker).")
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Worker processes answering on the one socket (1: the server is this "
        "process; more need os.fork).",
    )
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
        "GET /v1/plan, /v1/status, /healthz, /readyz, /metrics. The policies come from a "
        "directory, a signed bundle or a bundle URL (else the KILO_RULES_STORE_* settings, "
        "else the bundled policies, every model on kilo-default); a revision that fails its "
        "checks is never served, and its diagnostics are printed on stderr and kept at "
        "/v1/status. Needs " + INSTALL_HINT + ".",
    )
    add_store_options(p)
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
        "--max-concurrent-builds",
        type=int,
        metavar="N",
        help="builds run at once, per worker (default: 8)",
    )
    net.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes answering on the one socket, each building on a core of its "
        "own; a policy change is checked once and reaches every worker (default: 1, this "
        "process; about one per core)",
    )
    net.add_argument(
        "--head-timeout",
        type=float,
        metavar="SECONDS",
        help="a request's line and headers must arrive within this (default: 10)",
    )
    net.add_argument(
        "--body-timeout",
        type=float,
        metavar="SECONDS",
        help="a request's body must arrive within this (default: 30)",
    )
    net.add_argument(
        "--keep-alive-timeout",
        type=int,
        metavar="SECONDS",
        help="an idle connection is closed after this (default: 5)",
    )
    net.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="past this many connections new requests are answered 503 (default: 1000)",
    )
    add_access_options(p, "SERVE")
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


def add_store_options(p: argparse.ArgumentParser) -> None:
    """The options that name the policies served (``serve`` and ``gateway``)."""
    source = p.add_argument_group(
        "the policies (one of; default: KILO_RULES_STORE_*, else the bundled policies)"
    )
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
    source.add_argument(
        "--allow-rollback",
        action="store_true",
        help="accept a bundle whose revision number is not above the one served "
        "(KILO_RULES_STORE_ALLOW_ROLLBACK)",
    )
    reload = source.add_mutually_exclusive_group()
    reload.add_argument(
        "--watch", action="store_true", help="reload the directory when it changes (with --dir)"
    )
    reload.add_argument(
        "--poll", action="store_true", help="fetch the URL again periodically (with --url)"
    )


def add_access_options(p: argparse.ArgumentParser, what: str, *, cors: bool = True) -> None:
    """The options that say who may call (``serve`` and ``gateway``); ``what`` names the
    settings they default to (``KILO_RULES_<what>_*``)."""
    auth = p.add_argument_group(
        f"who may call (default: KILO_RULES_{what}_*; without a token on a loopback address, "
        "one is made and written to a file only you can read)"
    )
    auth.add_argument(
        "--token-file",
        metavar="FILE",
        help="bearer tokens callers must present, one a line (# comments; also "
        f"KILO_RULES_{what}_TOKENS, comma-separated)",
    )
    auth.add_argument(
        "--no-auth",
        action="store_true",
        default=None,
        help="let anyone who can reach the socket call (needed to listen on a non-loopback "
        "address without a token)",
    )
    auth.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a Host header value answered (repeatable; '*': any; default: the listen "
        "address, localhost, 127.0.0.1 and [::1], with the port)",
    )
    auth.add_argument(
        "--open-probes",
        action="store_true",
        default=None,
        help="answer /healthz, /readyz and /metrics without a token, whatever the Host",
    )
    if not cors:
        return
    auth.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call, e.g. https://app.example.com (repeatable; "
        "default: none)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then close the store."""
    try:
        import uvicorn  # noqa: F401 - a missing extra is reported before anything starts

        from kilo_rules.tools.serving.sidecar import openapi_document
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
    host = _pick(args.host, settings.host)
    sock = _bind(host, _pick(args.port, settings.port))
    port = sock.getsockname()[1]
    try:
        tokens, generated, no_auth = access_tokens(args, settings, host, port, "serve")
    except BaseException:
        sock.close()
        raise
    with _logging_to_stderr(args.log_level):
        return _serve(args, settings, sock, host, generated, tokens, no_auth, roots)


def access_tokens(
    args: argparse.Namespace,
    settings: ListenSettings,
    host: str,
    port: int,
    command: str,
    header: str = "Authorization",
) -> tuple[list[str], Path | None, bool]:
    """The tokens callers must present, the file of a generated one, and whether
    authentication is off — from the options, else the settings. Without a token on a
    loopback address one is made, as Jupyter does, in a file only this user can read."""
    no_auth = bool(_pick(args.no_auth, settings.no_auth))
    tokens = list(settings.tokens)
    token_file = args.token_file or settings.token_file
    if token_file:
        tokens += read_tokens(Path(token_file))
    generated: Path | None = None
    prefix = f"KILO_RULES_{'SERVE' if command == 'serve' else command.upper()}_"
    if not tokens and not no_auth:
        if not _is_loopback(host):
            raise ValueError(
                f"--host {host} is reachable from other machines and no token is configured: "
                f"give --token-file FILE (or {prefix}TOKENS), or pass --no-auth to let "
                "anyone who can reach it call"
            )
        generated = token_path(port, command)
        tokens = [write_token(generated)]
        print(
            f"kilo-rules {command}: no token configured; callers send the one in {generated} "
            f"({header}: Bearer $(cat {generated}))",
            file=sys.stderr,
        )
    return tokens, generated, no_auth


def _serve(
    args: argparse.Namespace,
    settings: ServeSettings,
    sock: socket.socket,
    host: str,
    generated: Path | None,
    tokens: list[str],
    no_auth: bool,
    roots: list[str],
) -> int:
    """Open the store, then serve on ``sock`` until stopped; the store, the socket and a
    generated token file are gone when it returns."""

    from kilo_rules.tools.serving.sidecar import create_app
    from kilo_rules.tools.serving.sidecar.protocol import uvicorn_config

    port = sock.getsockname()[1]
    hosts = [*args.allowed_host, *settings.allowed_hosts] or default_hosts(host, port)
    try:
        store = open_store(args)
    except BaseException:
        sock.close()
        _remove(generated)
        raise
    print(serving_line(store), file=sys.stderr)
    try:
        decision_log = args.decision_log or settings.decision_log
        build_timeout = _pick(args.build_timeout, settings.build_timeout)
        workers = _pick(args.workers, settings.workers)
        if workers < 1:
            raise ValueError(f"--workers {workers}: at least 1")
        make_app = functools.partial(
            create_app,
            store,
            decision_log=Path(decision_log) if decision_log else None,
            max_body_bytes=_pick(args.max_body_bytes, settings.max_body_bytes),
            build_timeout=build_timeout,
            max_concurrent_builds=_pick(args.max_concurrent_builds, settings.max_concurrent_builds),
            workspace_roots=tuple(Path(r).expanduser() for r in roots),
            tokens=tokens,
            no_auth=no_auth and not tokens,
            allowed_hosts=hosts,
            open_probes=bool(_pick(args.open_probes, settings.open_probes)),
            cors_origins=[*args.cors_origin, *settings.cors_origins],
            body_timeout=_pick(args.body_timeout, settings.body_timeout),
        )
        make_config = functools.partial(
            uvicorn_config,
            head_timeout=_pick(args.head_timeout, settings.head_timeout),
            keep_alive_timeout=_pick(args.keep_alive_timeout, settings.keep_alive_timeout),
            max_connections=_pick(args.max_connections, settings.max_connections),
            log_level=args.log_level,
            # The sidecar answers its own errors as JSON; uvicorn's access log repeats the
            # decision log's facts without the revision.
            access_log=False,
            server_header=False,
            # A request in flight at SIGTERM is answered within its own time bound.
            timeout_graceful_shutdown=int(build_timeout) + 5,
        )
        # What is loaded by now (the catalog, the revision's plans, the app) lives as long
        # as the process: frozen, it is no longer walked by every full collection, which
        # shortens the pauses that make the tail of the build latency.
        gc.collect()
        gc.freeze()
        if workers > 1:
            from kilo_rules.tools.serving.sidecar.metrics import Metrics
            from kilo_rules.tools.serving.sidecar.workers import WorkerPool

            # Made once here, and dropped: an option the app refuses is one error, not
            # one per worker forked.
            make_app(metrics=Metrics())
            pool = WorkerPool(
                store,
                sock,
                workers,
                lambda metrics, tell: make_app(metrics=metrics, on_model=tell),
                make_config,
                grace=int(build_timeout) + 5,
            )
            return pool.run()
        return run_server(make_config(make_app()), sock, host, "serve")
    finally:
        store.close()
        sock.close()
        _remove(generated)
    return EXIT_OK


def run_server(config: Any, sock: socket.socket, host: str, command: str) -> int:
    """Serve ``config`` (a ``uvicorn.Config``) on ``sock`` until SIGTERM or Ctrl-C; the exit
    code (2, with one line on stderr, when the server cannot listen or start)."""
    import uvicorn

    port = sock.getsockname()[1]
    # uvicorn handles SIGTERM and SIGINT itself (it stops accepting and finishes the
    # requests in flight), then raises the signal again for the handler it found. For
    # SIGTERM that would be the default, dying on the spot with the store open; this
    # one lets the run return, so the store is closed and the exit is 0.
    with _surviving_sigterm():
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except OSError as exc:  # the socket's listen, should another take the port
            why = exc.strerror or str(exc)
            print(
                f"kilo-rules {command}: cannot listen on {host}:{port}: {why[:1].lower()}{why[1:]}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        except SystemExit as exc:
            # uvicorn exits 3 when it cannot start (its reason is logged above): the
            # environment's problem, not a build over the window, which 3 means here.
            if exc.code in (0, None):
                raise
            print(
                f"kilo-rules {command}: the server could not start on {host}:{port}",
                file=sys.stderr,
            )
            return EXIT_USAGE
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


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (so that the port is known before serving, port 0
    included: the allowed hosts and the token file name it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        # Listening at once, not when uvicorn starts after the store has loaded: a port
        # another process takes meanwhile (another sidecar bound with SO_REUSEADDR too)
        # is refused here, with this message, not by uvicorn on its way out.
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        raise ValueError(f"cannot listen on {host}:{port}: {why[:1].lower()}{why[1:]}") from None
    return sock


#: Connections the kernel queues before the server accepts them (uvicorn's default).
_BACKLOG = 2048


@contextlib.contextmanager
def _logging_to_stderr(level: str) -> Iterator[None]:
    """The package's own log lines (a refused revision's diagnostics, a failed build) on
    stderr, one line each, at ``level`` and above, while the block runs: uvicorn
    configures only its own loggers."""
    logger = logging.getLogger("kilo_rules")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:  %(name)s: %(message)s"))
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_hosts(host: str, port: int) -> list[str]:
    """The Host values answered by default: the listen address (unless it is every
    address) and this machine's loopback names, each with the port."""
    names = ["localhost", "127.0.0.1", "[::1]"]
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        names.insert(0, host)
    else:
        if not address.is_unspecified:
            names.insert(0, f"[{address}]" if address.version == 6 else str(address))
    return [f"{name}:{port}" for name in dict.fromkeys(names)]


def read_tokens(path: Path) -> list[str]:
    """The tokens in ``path``: one a line, blank lines and ``#`` comments skipped. An
    error names the file and the line, never the token."""
    from kilo_rules.engine.base import safefs

    try:
        # A regular file of at most 64 KiB: a FIFO or a huge file must not hang the start.
        text = safefs.read_regular(path.expanduser(), max_bytes=65_536).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--token-file {path}: cannot be read ({exc})") from None
    from kilo_rules.tools.serving.sidecar.access import check_token

    tokens = []
    for n, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        try:
            tokens.append(check_token(token))
        except ValueError as exc:
            raise ValueError(f"--token-file {path}:{n}: {exc}") from None
    if not tokens:
        raise ValueError(f"--token-file {path}: holds no token")
    return tokens


def token_path(port: int, command: str = "serve") -> Path:
    """Where a generated token is written: ``$XDG_RUNTIME_DIR/kilo-rules/`` (a directory
    only this user may enter), else ``~/.cache/kilo-rules/``, named by the port."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "kilo-rules" / f"{command}-{port}.token"


def write_token(path: Path) -> str:
    """A new random token, written to ``path`` readable by this user only."""
    token = secrets.token_urlsafe(32)
    from kilo_rules.engine.base import safefs

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Whole or not at all, and 0600 from its first byte: a client never reads half a token.
    safefs.write_atomic(path, token + "\n", mode=0o600)
    return token


def _remove(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


T = TypeVar("T")


def _pick(given: T | None, default: T) -> T:
    return default if given is None else given


def open_store(args: argparse.Namespace, default: str = "kilo-default") -> PolicyStore:
    """The store the options name (else the one ``KILO_RULES_STORE_*`` describes), its
    first revision loaded; with ``--watch`` or ``--poll`` its background reloading started."""
    from kilo_rules.tools.serving.store import PolicyStore, StoreSettings

    settings = StoreSettings()
    given: dict[str, Any] = {}
    if args.public_key:
        given["public_key"] = Path(args.public_key)
    if args.cache_dir:
        given["cache_dir"] = Path(args.cache_dir)
    if args.allow_rollback:
        given["allow_rollback"] = True
    settings = settings.model_copy(update=given)
    if args.dir:
        store = PolicyStore.from_directory(Path(args.dir), settings=settings)
    elif args.bundle:
        store = PolicyStore.from_bundle(Path(args.bundle), settings=settings)
    elif args.url:
        store = PolicyStore.from_url(args.url, cache_dir=settings.cache_dir, settings=settings)
    elif settings.source() is None:
        # Nothing named: the policies shipped with kilo-rules, as `kilo-rules demo` runs.
        store = PolicyStore.from_bundled(settings=settings, default=default)
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


def serving_line(
    store: PolicyStore,
    command: str = "serve",
    default: str = "kilo-default",
    why: str = "GET /v1/status says why",
) -> str:
    """The line ``serve`` (or ``gateway``) prints on start: what it serves, from where."""
    revision = (
        f"revision {store.revision}"
        if store.revision
        else f"no revision has passed its checks yet ({why})"
    )
    if store.settings.source() is None:
        return (
            f"kilo-rules {command}: no --dir, --bundle or --url (nor KILO_RULES_STORE_*): "
            f"serving the bundled policies, every model on {default}; {revision}"
        )
    return f"kilo-rules {command}: serving {store.source}; {revision}"
