"""``kilo-rules gateway``: the drop-in gateway agents point their base URL at.

Like ``serve`` it needs the ``serve`` extra, imported in :func:`run` only.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
from pathlib import Path
from typing import Any

from kilo_rules.tools.cli._options import Subcommands, add_command
from kilo_rules.tools.cli._runner import EXIT_OK, EXIT_USAGE
from kilo_rules.tools.cli.serve import (
    INSTALL_HINT,
    SERVE_MODULES,
    _bind,
    _logging_to_stderr,
    _pick,
    _remove,
    access_tokens,
    add_access_options,
    add_store_options,
    default_hosts,
    open_store,
    run_server,
    serving_line,
)


def register(sub: Subcommands) -> None:
    """Add ``gateway`` to the subcommands."""
    p = add_command(
        sub,
        "gateway",
        summary="run the drop-in gateway agents point their base URL at (serve extra)",
        description="Proxy the Anthropic Messages API (POST /v1/messages, "
        "/v1/messages/count_tokens) and the OpenAI Chat Completions and Responses APIs "
        "(POST /v1/chat/completions, /v1/responses) to their upstreams, managing the "
        "context under the policy routed to each request's model (docs/gateway.md); every "
        "other path is relayed untouched. The policies come from a directory, a bundle or a "
        "bundle URL, else KILO_RULES_STORE_*, else the bundled policies with every model on "
        "the `gateway` policy. Settings: KILO_RULES_GATEWAY_*. Needs " + INSTALL_HINT + ".",
    )
    add_store_options(p)
    up = p.add_argument_group("the upstreams and what is kept (default: KILO_RULES_GATEWAY_*)")
    up.add_argument("--anthropic-url", metavar="URL", help="default: https://api.anthropic.com")
    up.add_argument("--openai-url", metavar="URL", help="default: https://api.openai.com")
    up.add_argument(
        "--ledger", metavar="FILE", help="the SQLite compaction ledger (default: in the cache dir)"
    )
    up.add_argument(
        "--no-ledger",
        action="store_true",
        help="keep no ledger: every request is compacted on its own (the prefix is then "
        "not byte-stable across turns)",
    )
    up.add_argument("--tenant-header", metavar="NAME", help="the request header naming a tenant")
    up.add_argument(
        "--models",
        metavar="FILE",
        help="a YAML/JSON list of model descriptors for ids the catalog lacks (or overrides)",
    )
    net = p.add_argument_group("the server (default: KILO_RULES_GATEWAY_*)")
    net.add_argument("--host", default=None, help="address to listen on (default: 127.0.0.1)")
    net.add_argument("--port", type=int, default=None, help="port (default: 8787; 0: any free)")
    net.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes answering on the one socket, each preparing requests on a "
        "core of its own and sharing the ledger; a policy change is checked once and "
        "reaches every worker (default: 1, this process; about one per core)",
    )
    net.add_argument(
        "--decision-log", metavar="FILE", default=None, help="append one JSON line per request"
    )
    net.add_argument(
        "--max-body-bytes", type=int, metavar="N", help="request body cap (default: 32 MiB)"
    )
    net.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="info",
        help="server log level (default: info)",
    )
    add_access_options(p, "GATEWAY", cors=False)
    p.set_defaults(handler=run)


def load_models(path: Path) -> dict[str, Any]:
    """Model descriptors by the ids clients send (each descriptor's ``api_id`` and ``id``)."""
    from kilo_rules.engine.base.errors import CatalogError, Diagnostic, Location
    from kilo_rules.engine.formats.catalog import model_from_data
    from kilo_rules.engine.formats.load import parse_yaml, read_text_limited

    data = parse_yaml(read_text_limited(path), str(path)).data
    entries = data.get("models") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise CatalogError(
            Diagnostic(
                "gateway.models",
                "a models file is a list of model descriptors (or {models: [...]})",
                Location(str(path), 1, 1),
            )
        )
    out: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        info = model_from_data(entry, f"{path}[{i}]")
        out[info.id] = info
        if info.api_id:
            out[info.api_id] = info
    return out


#: Seconds the requests in flight at SIGTERM (or, under ``--workers``, a worker retired at
#: a policy swap) have to finish: a stream still going past this is cut.
_GRACE = 30


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then close the store."""
    try:
        import uvicorn  # noqa: F401 - a missing extra is reported before anything starts

        from kilo_rules.tools.serving.gateway import (
            GATEWAY_HEADER,
            GatewaySettings,
            LedgerError,
            SqliteLedger,
            create_gateway,
        )
        from kilo_rules.tools.serving.sidecar.access import Access
        from kilo_rules.tools.serving.sidecar.protocol import uvicorn_config
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVE_MODULES:
            raise
        print(
            f"kilo-rules gateway: needs the serve extra ({exc.name} is not installed): "
            f"{INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    given: dict[str, Any] = {}
    for option, key in (
        ("anthropic_url", "anthropic_url"),
        ("openai_url", "openai_url"),
        ("tenant_header", "tenant_header"),
        ("max_body_bytes", "max_body_bytes"),
    ):
        if getattr(args, option) is not None:
            given[key] = getattr(args, option)
    for option in ("ledger", "models", "decision_log"):
        if getattr(args, option):
            given[option] = Path(getattr(args, option))
    if args.no_ledger:
        given["ledger"] = None
    if args.workers is not None:
        given["workers"] = args.workers
    settings = GatewaySettings(**given)
    models = load_models(settings.models) if settings.models else {}
    host = _pick(args.host, settings.host)
    sock = _bind(host, _pick(args.port, settings.port))
    port = sock.getsockname()[1]
    try:
        tokens, generated, no_auth = access_tokens(
            args, settings, host, port, "gateway", header="Proxy-Authorization"
        )
    except BaseException:
        sock.close()
        raise
    hosts = [*args.allowed_host, *settings.allowed_hosts] or default_hosts(host, port)
    open_probes = bool(_pick(args.open_probes, settings.open_probes))
    with _logging_to_stderr(args.log_level):
        try:
            store = open_store(args, default="gateway")
        except BaseException:
            sock.close()
            _remove(generated)
            raise
        why = "requests pass through unmanaged until one does; the log above says why"
        print(serving_line(store, "gateway", "gateway", why), file=sys.stderr)
        print(
            f"kilo-rules gateway: ANTHROPIC_BASE_URL=http://{host}:{port} "
            f"OPENAI_BASE_URL=http://{host}:{port}/v1 (callers' own token: "
            f"{GATEWAY_HEADER.title()}: Bearer …)",
            file=sys.stderr,
        )
        try:
            access = (
                Access.without_auth(allowed_hosts=hosts, open_probes=open_probes)
                if no_auth and not tokens
                else Access.with_tokens(tokens, allowed_hosts=hosts, open_probes=open_probes)
            )
            make_app = functools.partial(
                create_gateway, store, settings, access=access, models=models
            )
            make_config = functools.partial(
                uvicorn_config,
                head_timeout=settings.head_timeout,
                keep_alive_timeout=settings.keep_alive_timeout,
                max_connections=settings.max_connections,
                log_level=args.log_level,
                access_log=False,
                server_header=False,
                timeout_graceful_shutdown=_GRACE,
            )
            try:
                if settings.workers > 1:
                    # Each worker makes its app (its ledger connection, its upstream
                    # client) after the fork; this one is opened and closed at once, so
                    # that a ledger that cannot open is one line, not one per worker.
                    if settings.ledger is not None:
                        SqliteLedger(settings.ledger).close()
                    app = None
                else:
                    app = make_app()
            except LedgerError as exc:
                print(f"kilo-rules gateway: {exc} (--ledger FILE, or --no-ledger)", file=sys.stderr)
                return EXIT_USAGE
            gc.collect()
            gc.freeze()
            if app is None:
                from kilo_rules.tools.serving.sidecar.workers import WorkerPool

                pool = WorkerPool(
                    store,
                    sock,
                    settings.workers,
                    lambda metrics, tell: make_app(metrics_dir=metrics.shared, on_model=tell),
                    make_config,
                    grace=_GRACE,
                    command="gateway",
                )
                return pool.run()
            return run_server(make_config(app), sock, host, "gateway")
        finally:
            store.close()
            sock.close()
            _remove(generated)
    return EXIT_OK
