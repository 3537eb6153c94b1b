"""The gateway's ASGI app: :func:`create_gateway` over a PolicyStore.

Agents that cannot be changed point their base URL here (``ANTHROPIC_BASE_URL``,
``OPENAI_BASE_URL``). ``POST /v1/messages`` (and ``/v1/messages/count_tokens``),
``/v1/chat/completions`` and ``/v1/responses`` are managed: the body is routed by its model
to a policy revision of the store, the context is managed
(:class:`~kilo_rules.tools.serving.gateway.context.ContextManager`) and the result is
forwarded; every other path is relayed untouched. Replies, streamed or not, are relayed as
they arrive (server-sent events event for event), with the provider's usage read from them
on the way for the next request's compaction trigger.

Managing a request never stands between an agent and its provider: a model the catalog
does not know, a ledger that fails, an engine error or a time bound passed — the request is
passed through as sent, and the response and the decision log say why
(``x-kilo-rules-passthrough``).

Under ``kilo-rules gateway --workers N`` each worker process makes its own app (its own
ledger connection and upstream client, after the fork), and ``/metrics``, whichever worker
answers, sums every worker's values (``metrics_dir``: prometheus-client's multiprocess
files, as the sidecar's workers keep them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import httpx
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from kilo_rules.engine.base.errors import KiloRulesError
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.formats.catalog import ModelInfo
from kilo_rules.engine.summarizers.protocol import Summarizer
from kilo_rules.tools.serving.gateway.context import ContextManager, Prepared
from kilo_rules.tools.serving.gateway.jsonspan import JsonBodyError
from kilo_rules.tools.serving.gateway.ledger import LedgerError, SqliteLedger
from kilo_rules.tools.serving.gateway.protocols import (
    ANTHROPIC,
    PROTOCOLS,
    Protocol,
    SseUsage,
    Usage,
)
from kilo_rules.tools.serving.gateway.settings import GatewaySettings
from kilo_rules.tools.serving.sidecar.access import Access, Guard
from kilo_rules.tools.serving.sidecar.body import BodyLimit
from kilo_rules.tools.serving.sidecar.decisionlog import DecisionLog, cut

if TYPE_CHECKING:
    from kilo_rules.tools.serving.store import PolicyStore

__all__ = ["GATEWAY_HEADER", "create_gateway"]

log = logging.getLogger("kilo_rules.tools.serving.gateway")

#: The header the gateway's own token comes in (the provider's key is in Authorization or
#: x-api-key, and is forwarded, never read beyond hashing it into a tenant).
GATEWAY_HEADER = "proxy-authorization"
_HOP = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "accept-encoding",
    }
)
_COUNT_TOKENS = "/v1/messages/count_tokens"
#: Model ids a worker remembers having reported (``on_model``); one pushed out is told again.
_MODELS_TOLD = 1024
_PREFIX = "kilo_rules_gateway_"
_ANTHROPIC_PATHS = ("/v1/messages", "/v1/complete")


def _header_text(text: str, limit: int = 200) -> str:
    """``text`` as a header value: printable ASCII, bounded."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean[:limit]


@dataclass
class _Record:
    """One line of the gateway's decision log."""

    request_id: str
    api: str
    model: str | None
    status: int
    prepared: Prepared | None
    tenant: str
    usage: Usage | None = None
    upstream_ms: float = 0.0
    added_ms: float = 0.0
    retried: bool = False
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        when = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
        p = self.prepared
        out: dict[str, Any] = {
            "time": when.replace("+00:00", "Z"),
            "request_id": cut(self.request_id),
            "api": self.api,
            "model": cut(self.model),
            "tenant": self.tenant,
            "status": self.status,
            "revision": p.revision if p else None,
            "conversation": p.conversation if p else None,
            "rules": list(p.rules) if p else [],
            "passthrough": cut(p.passthrough) if p else None,
            "items": p.items if p else 0,
            "forwarded_items": p.forwarded_items if p else 0,
            "tokens_estimated": p.tokens if p else 0,
            "limit": p.limit if p else None,
            "upstream_ms": round(self.upstream_ms, 3),
            "added_ms": round(self.added_ms, 3),
            "retried": self.retried,
        }
        if self.usage is not None:
            u = self.usage
            out["usage"] = {
                "input": u.input,
                "cache_read": u.cache_read,
                "cache_write": u.cache_write,
                "output": u.output,
            }
        if self.error is not None:
            out["error"] = cut(self.error)
        return out


class _Metrics:
    """The gateway's metrics; ``shared``: the multiprocess directory every worker writes
    its values to (``/metrics`` then sums them, see :class:`_Summed`)."""

    def __init__(self, shared: Path | None = None) -> None:
        self.shared = shared
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "kilo_rules_gateway_requests",
            "Requests answered",
            ["api", "status"],
            registry=r,
        )
        self.upstream = Histogram(
            "kilo_rules_gateway_upstream_seconds", "Upstream time to headers", ["api"], registry=r
        )
        self.added = Histogram(
            "kilo_rules_gateway_added_seconds",
            "Time the gateway added before forwarding",
            ["api"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.compactions = Counter(
            "kilo_rules_gateway_compactions", "Compactions made", ["api"], registry=r
        )
        self.ledger_hits = Counter(
            "kilo_rules_gateway_ledger_hits",
            "Requests sent with a recorded compaction",
            ["api"],
            registry=r,
        )
        self.passthroughs = Counter(
            "kilo_rules_gateway_passthroughs",
            "Requests forwarded unmanaged",
            ["api", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "kilo_rules_gateway_overflow_retries",
            "Compact-and-retry after an overflow",
            ["api"],
            registry=r,
        )
        self.input_tokens = Counter(
            "kilo_rules_gateway_input_tokens",
            "Prompt tokens the upstream reported",
            ["api"],
            registry=r,
        )
        self.cache_read = Counter(
            "kilo_rules_gateway_cache_read_tokens",
            "Prompt tokens read from the provider cache",
            ["api"],
            registry=r,
        )
        self.cache_share = Gauge(
            "kilo_rules_gateway_cache_read_share",
            "Cache-read share of the prompt tokens reported so far",
            ["api"],
            registry=r,
        )
        self._totals: dict[str, list[int]] = {}

    def usage(self, api: str, usage: Usage) -> None:
        self.input_tokens.labels(api).inc(usage.input)
        self.cache_read.labels(api).inc(usage.cache_read)
        if self.shared is not None:
            return  # the share is computed from every worker's sums (_Summed)
        total = self._totals.setdefault(api, [0, 0])
        total[0] += usage.input
        total[1] += usage.cache_read
        if total[0]:
            self.cache_share.labels(api).set(total[1] / total[0])

    def render(self) -> bytes:
        """The exposition text: this app's values, or every worker's summed."""
        if self.shared is None:
            return generate_latest(self.registry)
        summed = CollectorRegistry()
        summed.register(_Summed(self.shared))
        return generate_latest(summed)


class _Summed(Collector):
    """The gateway's metrics of every process writing to ``shared`` (those exited too),
    summed by prometheus-client's multiprocess collector; the cache-read share is computed
    from the summed token counters (a ratio per worker does not add up)."""

    def __init__(self, shared: Path) -> None:
        self.shared = shared

    def collect(self) -> Iterator[Metric]:
        files = CollectorRegistry()
        multiprocess.MultiProcessCollector(files, path=str(self.shared))  # type: ignore[no-untyped-call]
        sums: dict[str, dict[str, float]] = {"input_tokens": {}, "cache_read_tokens": {}}
        for family in files.collect():
            # The pool's own (sidecar) counters live in the same files: not the gateway's.
            if not family.name.startswith(_PREFIX):
                continue
            kind = family.name.removeprefix(_PREFIX)
            if kind in sums:
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        sums[kind][sample.labels["api"]] = sample.value
            yield family
        share = GaugeMetricFamily(
            _PREFIX + "cache_read_share",
            "Cache-read share of the prompt tokens reported so far",
            labels=["api"],
        )
        for api, total in sorted(sums["input_tokens"].items()):
            if total:
                share.add_metric([api], sums["cache_read_tokens"].get(api, 0.0) / total)
        yield share


def _reason(text: str) -> str:
    """A bounded label for a passthrough reason (its first words)."""
    return text.split(":", 1)[0][:40]


class _Gateway:
    def __init__(
        self,
        store: PolicyStore,
        settings: GatewaySettings,
        summarizer: Summarizer,
        models: Mapping[str, ModelInfo],
        transport: httpx.AsyncBaseTransport | None,
        metrics_dir: Path | None = None,
        on_model: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.models = dict(models)
        self.on_model = on_model
        self._told: LRUCache[str, bool] = LRUCache(_MODELS_TOLD)
        ledger = None
        if settings.ledger is not None:
            ledger = SqliteLedger(
                settings.ledger,
                ttl_seconds=settings.ledger_ttl_seconds,
                max_entries=settings.ledger_max_entries,
            )
        self.ledger = ledger
        self.context = ContextManager(ledger, summarizer)
        self.metrics = _Metrics(metrics_dir)
        self.log = DecisionLog(settings.decision_log) if settings.decision_log else None
        self.transport = transport
        self.client: httpx.AsyncClient | None = None
        self.limiter = anyio.CapacityLimiter(8)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        s = self.settings
        timeout = httpx.Timeout(s.upstream_timeout, connect=s.connect_timeout)
        self.client = httpx.AsyncClient(
            transport=self.transport, timeout=timeout, follow_redirects=False, trust_env=False
        )
        try:
            yield
        finally:
            await self.client.aclose()
            if self.ledger is not None:
                self.ledger.close()

    # -- the pieces -----------------------------------------------------------------------
    def _upstream(self, protocol: Protocol | None, path: str, headers: Mapping[str, str]) -> str:
        if protocol is not None:
            provider = protocol.provider
        elif path.startswith(_ANTHROPIC_PATHS) or "anthropic-version" in headers:
            provider = "anthropic"
        else:
            provider = "openai"
        s = self.settings
        return s.anthropic_url if provider == "anthropic" else s.openai_url

    def _tenant(self, headers: Mapping[str, str]) -> str:
        name = self.settings.tenant_header
        if name:
            value = headers.get(name.lower())
            if value:
                return hashlib.sha256(value.encode()).hexdigest()[:16]
        key = headers.get("x-api-key") or headers.get("authorization") or ""
        return hashlib.sha256(key.encode()).hexdigest()[:16] if key else "-"

    def prepare(
        self,
        protocol: Protocol,
        raw: bytes,
        scope: str,
        *,
        overflow: bool = False,
        compact: bool = True,
    ) -> tuple[Prepared, str | None, bool]:
        """The body to forward, the model, whether the client asked for a stream. Raises
        :class:`_ClientError` for a body that is not a JSON object."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _ClientError(f"the body is not UTF-8 (byte {exc.start})") from None
        try:
            scanned = self.context.scan(protocol, text, raw)
        except JsonBodyError as exc:
            line = text.count("\n", 0, exc.offset) + 1
            col = exc.offset - (text.rfind("\n", 0, exc.offset) + 1) + 1
            raise _ClientError(f"the body is not valid JSON: {exc} (<body>:{line}:{col})") from None
        model = scanned.value.get("model")
        stream = scanned.value.get("stream") is True
        if not isinstance(model, str) or not model:
            return Prepared(raw, passthrough="no model named"), None, stream
        try:
            with self.store.snapshot() as snap:
                plan = self._plan(snap, protocol, model)
                revision = snap.revision
        except KiloRulesError as exc:
            why = exc.diagnostics[0].message if exc.diagnostics else str(exc)
            return Prepared(raw, passthrough=f"model: {why}"), model, stream
        try:
            prepared = self.context.prepare(
                protocol, scanned, raw, plan, scope, overflow=overflow, compact=compact
            )
        except (KiloRulesError, LedgerError) as exc:
            log.warning("passing %s through: %s", protocol.path, exc)
            prepared = Prepared(raw, passthrough=f"engine: {exc}")
        except RecursionError:
            prepared = Prepared(raw, passthrough="engine: the history nests too deeply")
        prepared.revision = revision
        return prepared, model, stream

    def _plan(self, snap: Any, protocol: Protocol, model: str) -> Any:
        """The plan of ``model`` as a client names it: the operator's descriptor, else the
        catalog by id or api id, else by ``<provider>/<model>`` (``claude-sonnet-4-5`` is
        the catalog's ``anthropic/claude-sonnet-4-5``)."""
        known = self.models.get(model)
        if known is not None:
            return snap.plan_for(known)
        try:
            plan = snap.plan_for(model)
        except KiloRulesError:
            if "/" in model:
                raise
            qualified = f"{protocol.provider}/{model}"
            try:
                plan = snap.plan_for(qualified)
            except KiloRulesError:
                pass
            else:
                self._tell(qualified)
                return plan
            raise
        self._tell(model)
        return plan

    def _tell(self, model: str) -> None:
        """Report a catalog model planned for to the supervisor (``--workers``), once: its
        store compiles it and checks every later revision for it, as one process does."""
        if self.on_model is None or self._told.get(model) is not None:
            return
        self._told.put(model, True)
        try:
            self.on_model(model)
        except Exception:  # the request stands; the next revision is checked without it
            log.warning("could not report model %s as in use", model, exc_info=True)

    def record_usage(self, prepared: Prepared, usage: Usage | None) -> None:
        if usage is None or prepared.usage_key is None or self.ledger is None:
            return
        key, items, boundary, root = prepared.usage_key
        try:
            self.ledger.record_usage(key, items, boundary, usage, root)
        except LedgerError as exc:
            log.warning("usage not recorded: %s", exc)

    def write(self, record: _Record) -> None:
        if self.log is None:
            return
        try:
            self.log.write(record)
        except OSError as exc:
            log.warning("decision log: %s", exc)

    def forward_headers(self, request: Request) -> dict[str, str]:
        out = {k: v for k, v in request.headers.items() if k not in _HOP}
        out["accept-encoding"] = "identity"  # relay bytes as sent, read usage from them
        return out


class _ClientError(Exception):
    """The client's body cannot be read: answered 400 in the API's error shape."""


def _relay_headers(resp: httpx.Response, ours: Mapping[str, str]) -> dict[str, str]:
    out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
    out.pop("content-length", None)
    out.update(ours)
    return out


async def _chunks(resp: httpx.Response, limit: int) -> AsyncIterator[bytes]:
    """The reply's bytes as they arrive (as sent: no content decoding); past ``limit``
    bytes, :class:`_ReplyTooLargeError`."""
    if resp.is_stream_consumed:  # a transport that read it already (in-memory ones do)
        if len(resp.content) > limit:
            raise _ReplyTooLargeError
        yield resp.content
        return
    size = 0
    async for chunk in resp.aiter_raw():
        size += len(chunk)
        if size > limit:
            raise _ReplyTooLargeError
        yield chunk


async def _read(resp: httpx.Response, limit: int) -> bytes:
    return b"".join([chunk async for chunk in _chunks(resp, limit)])


def _protocol_for(path: str) -> Protocol:
    """The API a path belongs to, for the shape of an error the gateway answers itself."""
    found = PROTOCOLS.get(path)
    if found is not None:
        return found
    return ANTHROPIC if path.startswith(_ANTHROPIC_PATHS) else PROTOCOLS["/v1/chat/completions"]


class _ReplyTooLargeError(Exception):
    pass


def _ours(request_id: str, prepared: Prepared | None) -> dict[str, str]:
    out = {"x-request-id": _header_text(request_id)}
    if prepared is not None:
        if prepared.revision:
            out["x-kilo-rules-revision"] = prepared.revision
        if prepared.rules:
            out["x-kilo-rules-rules"] = ",".join(prepared.rules)
        if prepared.passthrough:
            out["x-kilo-rules-passthrough"] = _header_text(prepared.passthrough)
    return out


async def _managed(gw: _Gateway, request: Request, protocol: Protocol, path: str) -> Response:
    started = time.perf_counter()
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    raw = await request.body()
    headers = request.headers
    upstream = gw._upstream(protocol, path, headers)
    tenant = gw._tenant(headers)
    scope = f"{tenant}\x00{upstream}\x00{protocol.name}"
    counting = path == _COUNT_TOKENS
    api = "anthropic-count-tokens" if counting else protocol.name
    metrics = gw.metrics

    async def prepare(overflow: bool) -> tuple[Prepared, str | None, bool]:
        try:
            with anyio.fail_after(gw.settings.prepare_timeout):
                return await anyio.to_thread.run_sync(
                    lambda: gw.prepare(
                        protocol, raw, scope, overflow=overflow, compact=not counting
                    ),
                    limiter=gw.limiter,
                    abandon_on_cancel=True,
                )
        except TimeoutError:
            return Prepared(raw, passthrough="prepare: time bound passed"), None, False

    try:
        prepared, model, stream = await prepare(False)
    except _ClientError as exc:
        metrics.requests.labels(api, "400").inc()
        gw.write(_Record(request_id, api, None, 400, None, tenant, error=str(exc)))
        return Response(
            protocol.error(400, str(exc)),
            400,
            {"x-request-id": _header_text(request_id)},
            media_type="application/json",
        )
    if prepared.passthrough:
        metrics.passthroughs.labels(api, _reason(prepared.passthrough)).inc()
    if "compaction" in prepared.rules:
        metrics.compactions.labels(api).inc()
    if "ledger.hit" in prepared.rules:
        metrics.ledger_hits.labels(api).inc()
    record = _Record(request_id, api, model, 0, prepared, tenant)
    url = upstream + path + (f"?{request.url.query}" if request.url.query else "")
    fwd = gw.forward_headers(request)
    fwd["x-request-id"] = request_id
    assert gw.client is not None
    client = gw.client
    retried = False
    while True:
        record.added_ms = (time.perf_counter() - started) * 1000
        metrics.added.labels(api).observe(record.added_ms / 1000)
        sent = time.perf_counter()
        try:
            resp = await client.send(
                client.build_request("POST", url, headers=fwd, content=prepared.body), stream=True
            )
        except httpx.HTTPError as exc:
            record.status, record.error = 502, f"upstream: {type(exc).__name__}"
            metrics.requests.labels(api, "502").inc()
            gw.write(record)
            return Response(
                protocol.error(502, f"the upstream could not be reached ({type(exc).__name__})"),
                502,
                _ours(request_id, prepared),
                media_type="application/json",
            )
        record.upstream_ms = (time.perf_counter() - sent) * 1000
        metrics.upstream.labels(api).observe(record.upstream_ms / 1000)
        if resp.status_code >= 400:
            try:
                body = await _read(resp, gw.settings.max_reply_bytes)
            except (_ReplyTooLargeError, httpx.HTTPError):
                body = protocol.error(502, "the upstream's error reply was too large or broke off")
            finally:
                await resp.aclose()
            if (
                not retried
                and not counting
                and gw.settings.retry_overflow
                and prepared.plan is not None
                and protocol.overflowed(resp.status_code, body)
            ):
                again, _, _ = await prepare(True)
                if again.changed and again.body != prepared.body:
                    metrics.retries.labels(api).inc()
                    metrics.compactions.labels(api).inc()
                    prepared, retried = again, True
                    record.prepared, record.retried = again, True
                    continue
            record.status = resp.status_code
            metrics.requests.labels(api, str(resp.status_code)).inc()
            gw.write(record)
            return Response(
                body, resp.status_code, _relay_headers(resp, _ours(request_id, prepared))
            )
        break

    ours = _ours(request_id, prepared)
    record.status = resp.status_code
    if stream and not counting:
        return StreamingResponse(
            _relay(gw, resp, protocol, prepared, record),
            resp.status_code,
            _relay_headers(resp, ours),
        )
    try:
        body = await _read(resp, gw.settings.max_reply_bytes)
    except (_ReplyTooLargeError, httpx.HTTPError) as exc:
        why = (
            "the upstream's reply was too large"
            if isinstance(exc, _ReplyTooLargeError)
            else f"the upstream's reply broke off ({type(exc).__name__})"
        )
        record.status, record.error = 502, why
        metrics.requests.labels(api, "502").inc()
        gw.write(record)
        return Response(protocol.error(502, why), 502, ours, media_type="application/json")
    finally:
        await resp.aclose()
    if not counting and "content-encoding" not in resp.headers:
        try:
            record.usage = protocol.usage(json.loads(body))
        except (ValueError, RecursionError):
            record.usage = None
        if record.usage is not None:
            metrics.usage(api, record.usage)
            usage = record.usage
            await anyio.to_thread.run_sync(lambda: gw.record_usage(prepared, usage))
    metrics.requests.labels(api, str(resp.status_code)).inc()
    gw.write(record)
    return Response(body, resp.status_code, _relay_headers(resp, ours))


async def _relay(
    gw: _Gateway, resp: httpx.Response, protocol: Protocol, prepared: Prepared, record: _Record
) -> AsyncIterator[bytes]:
    """The upstream's stream, chunk for chunk as it arrives; usage read on the way. A client
    that goes away cancels this, which closes the upstream request."""
    sse = SseUsage(protocol)
    try:
        async for chunk in _chunks(resp, gw.settings.max_reply_bytes):
            sse.feed(chunk)
            yield chunk
    except _ReplyTooLargeError:
        record.error = "the upstream's stream was too large: cut"
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
            record.usage = sse.usage()
            if record.usage is not None:
                gw.metrics.usage(protocol.name, record.usage)
                usage = record.usage
                await anyio.to_thread.run_sync(lambda: gw.record_usage(prepared, usage))
            gw.metrics.requests.labels(protocol.name, str(record.status)).inc()
            gw.write(record)


async def _passthrough(gw: _Gateway, request: Request) -> Response:
    """Any other path: relayed untouched, both ways."""
    path = request.url.path
    url = gw._upstream(None, path, request.headers) + path
    if request.url.query:
        url += "?" + request.url.query
    raw = await request.body()
    assert gw.client is not None
    try:
        resp = await gw.client.send(
            gw.client.build_request(
                request.method, url, headers=gw.forward_headers(request), content=raw
            ),
            stream=True,
        )
    except httpx.HTTPError as exc:
        why = f"the upstream could not be reached ({type(exc).__name__})"
        return Response(_protocol_for(path).error(502, why), 502, media_type="application/json")
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    ours = {"x-request-id": _header_text(request_id)}

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in _chunks(resp, gw.settings.max_reply_bytes):
                yield chunk
        except _ReplyTooLargeError:
            log.warning("relayed reply of %s cut at %d bytes", path, gw.settings.max_reply_bytes)
        finally:
            with anyio.CancelScope(shield=True):
                await resp.aclose()

    gw.metrics.requests.labels("passthrough", str(resp.status_code)).inc()
    return StreamingResponse(relay(), resp.status_code, _relay_headers(resp, ours))


def create_gateway(
    store: PolicyStore,
    settings: GatewaySettings | None = None,
    *,
    access: Access,
    summarizer: Summarizer | None = None,
    models: Mapping[str, ModelInfo] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics_dir: Path | None = None,
    on_model: Callable[[str], None] | None = None,
) -> Any:
    """The gateway app over ``store`` (an ASGI app: serve it with uvicorn).

    ``access``: who may call (tokens in ``Proxy-Authorization: Bearer …``, the Host
    allow-list). ``models``: descriptors by the model id clients send, consulted before the
    catalog. ``transport``: the httpx transport to the upstreams (tests). ``metrics_dir``
    and ``on_model`` are a worker's of ``--workers`` (:class:`~kilo_rules.tools.serving.
    sidecar.workers.WorkerPool`): the multiprocess directory ``/metrics`` sums, and where
    to report each catalog model planned for. The ledger connection is opened here: make
    the app in the process that serves it (a SQLite connection must not cross a fork)."""
    s = settings if settings is not None else GatewaySettings()
    if summarizer is None:
        from kilo_rules.engine.summarizers import ExtractiveSummarizer

        summarizer = ExtractiveSummarizer()
    gw = _Gateway(store, s, summarizer, models or {}, transport, metrics_dir, on_model)
    never = set(s.passthrough_paths)

    def managed(protocol: Protocol, path: str) -> Any:
        async def endpoint(request: Request) -> Response:
            if path in never:
                return await _passthrough(gw, request)
            return await _managed(gw, request, protocol, path)

        return endpoint

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def readyz(request: Request) -> Response:
        ready = bool(store.revision)
        body = json.dumps({"ready": ready, "revision": store.revision or None}).encode()
        return Response(body, 200 if ready else 503, media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")

    async def other(request: Request) -> Response:
        return await _passthrough(gw, request)

    routes = [Route(p.path, managed(p, p.path), methods=["POST"]) for p in PROTOCOLS.values()]
    routes.append(Route(_COUNT_TOKENS, managed(ANTHROPIC, _COUNT_TOKENS), methods=["POST"]))
    routes += [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route(
            "/{path:path}",
            other,
            methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
        ),
    ]
    app = Starlette(routes=routes, lifespan=gw.lifespan)
    app.state.gateway = gw
    limited = BodyLimit(app, max_bytes=s.max_body_bytes, timeout=s.body_timeout)
    managed_paths = frozenset({*PROTOCOLS, _COUNT_TOKENS})

    def refusal(path: str, status: int, code: str, message: str) -> bytes:
        # An SDK reads its own API's error shape (an AuthenticationError with the message).
        return _protocol_for(path).error(status, f"{message} ({code})")

    return Guard(
        limited,
        access=access,
        header=GATEWAY_HEADER,
        json_paths=managed_paths,
        error_body=refusal,
    )
