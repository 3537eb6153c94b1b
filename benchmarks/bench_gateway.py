"""What ``kilo-rules gateway`` costs a client: added latency, streaming, tokens and cost.

Run with ``python benchmarks/bench_gateway.py [--session NAME] [--reps N] [--sessions A,B]
[--every K] [--duration S] [--part latency,tokens,growth,throughput] [--workers N]
[--quick]`` (every part by default, about four minutes on two cores; ``--quick`` in about
one). The sessions
are the recorded trajectories of ``../shared/data/trajectories``, made into client bodies by
``tests/gateway/gateway_server.py`` (``step_bodies``: each step the whole history so far,
as the agent sends it).

Method. The latency parts run the gateway as an operator does — ``create_gateway`` under
uvicorn (``running_gateway``, every model on the bundled ``gateway`` policy) — in a
process of its own, in front of a *trivial fast upstream* (:func:`fast_app`, a Starlette app
under uvicorn, in a third process) that answers a fixed small Anthropic / OpenAI JSON reply,
or a fixed SSE stream when the body says ``"stream": true``, with ``input_tokens`` set to a
quarter of the body's bytes. So the difference between a request sent through the gateway
and the same bytes sent straight to that upstream is the gateway's own cost: one more HTTP
hop on 127.0.0.1 (the body crosses it twice), its scan of the body, a hash of every item,
the ledger lookups, the decision log. The client is an ``httpx.Client`` per target (a
keep-alive connection each) posting the client's raw bytes with the gateway's
``Proxy-Authorization``; the gateway and direct requests alternate pairwise (gateway,
direct, gateway, direct, ...) and the added latency is the difference within each pair,
whose p50 and p99 are reported. The conversation is warmed first (its items cached by the
gateway); the first request a fresh gateway sees is reported apart as *cold*. Every managed
answer is checked for ``x-kilo-rules-revision`` and for no ``x-kilo-rules-passthrough``, and
the gateway's own prepare time is read from its decision log (``added_ms``).

1. Added latency on the session's last step body (default: the largest, the Claude Code
   opus session), at a window with room for everything (nothing compacted: the pure proxy
   cost) and at the window that forces compaction (the steady state is a ledger hit: the
   recorded summary spliced over the head).
2. Time to the first streamed byte, through the gateway and direct.
3. The in-process baseline: what the gateway saves a client from doing itself — ``json.loads``
   of the same body, importing it into Session v1 (the ``anthropic_messages`` importer, as
   ``context.py`` does), ``apply_plan`` on a warm ``gateway`` plan (its ``wire`` is the
   serialised request). Target: p50 added <= 2x its p50.
4. Tokens and cost: each session replayed step by step through the realistic test upstream
   (``running_upstream``: strict validation, tiktoken counts, a prompt-cache simulation),
   through the gateway at the window that forces compaction and direct at an unlimited one;
   input tokens, cache reads and writes as the upstream reported them, priced like
   Anthropic (input $3/M, cache write $3.75/M, cache read $0.30/M) for every session.
5. Growth: the session's messages repeated 1x, 2x, 4x, 10x (roles still alternating,
   tool_use ids suffixed per copy, cache marks only in the last copy), each sent twice to
   warm, then measured pairwise; the exponent of the added p50 against the body's size by
   log-log least squares. Target <= 0.3.
6. Throughput: warm requests from 8 client threads against 1, for ``--duration`` seconds
   each (the same for the upstream alone, as a yardstick). Target >= 1.5x. With
   ``--workers N`` the gateway measured is the real command, ``kilo-rules gateway
   --workers N`` (:func:`cli_gateway`), in front of the same upstream: compare N against
   ``--workers 1``, the same command in one process.

Timings are of one run on a shared machine: the ratios (measured against baselines of the
same run) are what carry; the load average is printed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from kilo_rules.engine.compiler.compile import compile_policy  # noqa: E402
from kilo_rules.engine.formats.catalog import ModelInfo  # noqa: E402
from kilo_rules.engine.importers import anthropic_messages, openai_chat, openai_responses  # noqa: E402
from kilo_rules.engine.importers._source import Record, Source  # noqa: E402
from kilo_rules.engine.runtime.apply import apply_plan  # noqa: E402
from tests.gateway.gateway_server import (  # noqa: E402
    AUTH,
    SESSIONS,
    TOKEN,
    TRAJECTORIES,
    WINDOWS,  # the replay test's: each forces compaction
    running_gateway,
    small_model,
    step_bodies,
)
from tests.threaded import serve_in_thread  # noqa: E402

DEFAULT_SESSION = "claude-code-opus46-spotter-8463c716.jsonl"
DEFAULT_SESSIONS = (
    "claude-code-opus46-spotter-8463c716.jsonl",
    "claude-code-sonnet45-subagent-a2898e3.jsonl",
    "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json",
)
UNLIMITED = 100_000_000
MODEL_OF = {"anthropic": "claude-bench", "openai": "gpt-bench", "openai-responses": "codex-bench"}
PATH_OF = {
    "anthropic": "/v1/messages",
    "openai": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
}
ITEMS_OF = {"anthropic": "messages", "openai": "messages", "openai-responses": "input"}
IMPORTER_OF: dict[str, Callable[[Source, int], Any]] = {
    "anthropic": anthropic_messages.convert,
    "openai": openai_chat.convert,
    "openai-responses": openai_responses.convert,
}
#: $ per million tokens, Anthropic-like.
PRICE_INPUT, PRICE_WRITE, PRICE_READ = 3.0, 3.75, 0.30
TARGET_RATIO = 2.0
TARGET_EXPONENT = 0.3
TARGET_THROUGHPUT = 1.5
COPIES = (1, 2, 4, 10)


# -- the trivial fast upstream ------------------------------------------------------------

_STREAM = re.compile(rb'"stream"\s*:\s*true')


def _sse(event: str | None, data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def _anthropic_reply(tokens: int) -> dict[str, Any]:
    return {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-bench",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 1,
        },
    }


def _anthropic_events(tokens: int) -> bytes:
    start = _anthropic_reply(tokens)
    start["content"], start["stop_reason"] = [], None
    return b"".join(
        (
            _sse("message_start", {"type": "message_start", "message": start}),
            _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "ok"},
                },
            ),
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 1},
                },
            ),
            _sse("message_stop", {"type": "message_stop"}),
        )
    )


def _chat_usage(tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": tokens,
        "completion_tokens": 1,
        "total_tokens": tokens + 1,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _chat_reply(tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": _chat_usage(tokens),
    }


def _chat_events(tokens: int) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    last = chunk({}, "stop")
    last["usage"] = _chat_usage(tokens)
    return b"".join(
        (
            _sse(None, chunk({"role": "assistant", "content": ""}, None)),
            _sse(None, chunk({"content": "ok"}, None)),
            _sse(None, last),
            _sse(None, "[DONE]"),
        )
    )


def _response_reply(tokens: int) -> dict[str, Any]:
    return {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "codex-bench",
        "output": [
            {
                "type": "message",
                "id": "msg_bench",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens + 1,
        },
    }


def _response_events(tokens: int) -> bytes:
    done = _response_reply(tokens)
    return b"".join(
        (
            _sse(
                "response.created",
                {
                    "type": "response.created",
                    "response": {**done, "status": "in_progress", "output": [], "usage": None},
                },
            ),
            _sse(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": "msg_bench",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "ok",
                },
            ),
            _sse("response.completed", {"type": "response.completed", "response": done}),
        )
    )


def fast_app() -> Starlette:
    """The trivial upstream: a fixed small reply (JSON, or SSE when the body streams), its
    ``input_tokens`` a quarter of the body's bytes. Nothing is parsed or validated."""

    def endpoint(
        reply: Callable[[int], dict[str, Any]], events: Callable[[int], bytes]
    ) -> Callable[[Request], Any]:
        async def answer(request: Request) -> Response:
            raw = await request.body()
            tokens = len(raw) // 4
            if _STREAM.search(raw):
                return Response(events(tokens), media_type="text/event-stream")
            body = json.dumps(reply(tokens), separators=(",", ":")).encode()
            return Response(body, media_type="application/json")

        return answer

    return Starlette(
        routes=[
            Route(
                PATH_OF["anthropic"],
                endpoint(_anthropic_reply, _anthropic_events),
                methods=["POST"],
            ),
            Route(PATH_OF["openai"], endpoint(_chat_reply, _chat_events), methods=["POST"]),
            Route(
                PATH_OF["openai-responses"],
                endpoint(_response_reply, _response_events),
                methods=["POST"],
            ),
        ]
    )


@contextlib.contextmanager
def serving(app: Any, *, lifespan: Literal["on", "off"] = "off") -> Iterator[str]:
    """``app`` under uvicorn on 127.0.0.1 (a free port) in a thread of this process."""
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan=lifespan,
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=2,
    )
    with serve_in_thread(config) as (url, _):
        yield url


@contextlib.contextmanager
def fast_gateway(upstream: str, tmp: Path, api: str, window: int) -> Iterator[str]:
    """The tests' gateway (every model on ``gateway``, the test token) with a decision log
    in ``tmp``."""
    models = gateway_models(api, window)
    with running_gateway(upstream, tmp, models=models, decision_log=tmp / "decisions.jsonl") as gw:
        yield gw.url


def gateway_models(api: str, window: int) -> dict[str, ModelInfo]:
    """The model the bench's bodies name, with ``window`` as its context."""
    model = MODEL_OF[api]
    return {model: small_model(model, api, window, output=4096)}


# -- servers in processes of their own -----------------------------------------------------


def _serve_child(argv: Sequence[str]) -> int:
    """``--serve upstream`` or ``--serve gateway UPSTREAM API WINDOW``: print the URL (and,
    for the gateway, its decision log), serve until stdin closes."""
    kind = argv[0]
    with contextlib.ExitStack() as stack:
        if kind == "upstream":
            url = stack.enter_context(serving(fast_app()))
            print(url, flush=True)
        else:
            upstream, api, window = argv[1], argv[2], int(argv[3])
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-gw-")))
            url = stack.enter_context(fast_gateway(upstream, tmp, api, window))
            print(url, tmp / "decisions.jsonl", flush=True)
        sys.stdin.read()
    return 0


@dataclass
class Server:
    """A server in a child process: its URL, its decision log (a gateway's)."""

    url: str
    log: Path | None
    proc: subprocess.Popen[str]

    def decisions(self) -> list[dict[str, Any]]:
        if self.log is None or not self.log.exists():
            return []
        lines = self.log.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@contextlib.contextmanager
def child(*args: str) -> Iterator[Server]:
    """Run ``--serve ARGS`` of this script in a process of its own until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line:
            raise RuntimeError(f"the --serve {args[0]} process did not start")
        yield Server(line[0], Path(line[1]) if len(line) > 1 else None, proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def cli_gateway(upstream: str, api: str, window: int, workers: int) -> Iterator[Server]:
    """``kilo-rules gateway --workers N --port 0`` as an operator runs it, configured as
    :func:`fast_gateway` is (every model on ``gateway``, the bench's model at ``window``,
    the test token, a ledger and a decision log in a temporary directory), until the block
    ends (SIGTERM)."""
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as d:
        tmp = Path(d)
        policies = tmp / "policies"
        policies.mkdir()
        (policies / "routes.yaml").write_text("version: 1\nroutes: []\ndefault: gateway\n")
        (tmp / "tokens").write_text(TOKEN + "\n")
        models = [m.model_dump(mode="json") for m in gateway_models(api, window).values()]
        (tmp / "models.json").write_text(json.dumps(models))
        log = tmp / "decisions.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILO_RULES_")}
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "kilo_rules", "gateway", "--port", "0"),
                *("--workers", str(workers), "--dir", str(policies)),
                *("--models", str(tmp / "models.json"), "--token-file", str(tmp / "tokens")),
                *("--anthropic-url", upstream, "--openai-url", upstream),
                *("--ledger", str(tmp / "ledger.sqlite3"), "--decision-log", str(log)),
                *("--log-level", "warning"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        assert proc.stderr is not None
        err: list[str] = []
        url = ""
        for line in proc.stderr:
            err.append(line)
            found = re.search(r"ANTHROPIC_BASE_URL=(http://\S+)", line)
            if found:
                url = found.group(1)
                break
        # The rest of stderr, read so that the pipe never fills.
        drain = threading.Thread(target=lambda: err.extend(proc.stderr or ()), daemon=True)
        drain.start()
        try:
            if not url:
                raise RuntimeError("kilo-rules gateway did not start:\n" + "".join(err))
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(url + "/healthz", headers=AUTH).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("kilo-rules gateway did not start:\n" + "".join(err))
                time.sleep(0.05)
            yield Server(url, log, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            drain.join(5)
            proc.stderr.close()


# -- bodies -------------------------------------------------------------------------------


def last_step(name: str) -> tuple[str, dict[str, Any]]:
    """The API and the last step body of session ``name`` (its history ends on the user's
    turn), for the bench's model."""
    api = SESSIONS[name]
    bodies = list(step_bodies(name, MODEL_OF[api]))
    assert bodies, name
    return api, bodies[-1]


def encode(body: dict[str, Any]) -> bytes:
    """A body as its SDK sends it (``json.dumps``, UTF-8)."""
    return json.dumps(body, ensure_ascii=False).encode()


def streaming(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["stream"] = True
    return out


def _suffixed(value: Any, suffix: str, marks: bool) -> Any:
    """``value`` with every tool call id suffixed (and its cache marks dropped unless
    ``marks``)."""
    if isinstance(value, list):
        return [_suffixed(v, suffix, marks) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k == "cache_control" and not marks:
            continue
        if (k in ("tool_use_id", "tool_call_id", "call_id") and isinstance(v, str)) or (
            k == "id"
            and isinstance(v, str)
            and value.get("type") in ("tool_use", "function", "function_call")
        ):
            out[k] = v + suffix
        elif k == "tool_calls" and isinstance(v, list):
            out[k] = [
                {**c, "id": c["id"] + suffix}
                if isinstance(c, dict) and isinstance(c.get("id"), str)
                else c
                for c in v
            ]
        else:
            out[k] = _suffixed(v, suffix, marks)
    return out


def repeated(body: dict[str, Any], copies: int, api: str = "anthropic") -> dict[str, Any]:
    """``body`` with its history repeated ``copies`` times and still valid: each copy but
    the last cut after its last assistant turn (so the roles alternate across copies), its
    tool call ids suffixed ``_cN`` and its cache marks dropped; the last copy as sent."""
    key = ITEMS_OF[api]
    items: list[Any] = body[key]
    lead = 0
    if api != "anthropic":
        while (
            lead < len(items)
            and isinstance(items[lead], dict)
            and items[lead].get("role") in ("system", "developer")
        ):
            lead += 1
    head, rest = items[:lead], items[lead:]
    ends = [i for i, m in enumerate(rest) if isinstance(m, dict) and m.get("role") == "assistant"]
    block = rest[: ends[-1] + 1] if ends else rest
    out = list(head)
    for n in range(copies - 1):
        out += _suffixed(block, f"_c{n + 1}", marks=False)
    out += rest
    return {**body, key: out}


# -- timing -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation."""
    if not values:
        return math.nan
    s = sorted(values)
    at = q * (len(s) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


def headers_for(api: str) -> dict[str, str]:
    """What the agent's SDK sends beside the body, and the gateway's token."""
    out = {"content-type": "application/json", **AUTH}
    if api == "anthropic":
        out |= {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"}
    else:
        out["authorization"] = "Bearer sk-bench"
    return out


@dataclass
class Target:
    """One place to send a body: a client on its own keep-alive connection."""

    url: str
    api: str
    managed: bool  # the gateway: its answers are checked for being managed
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(timeout=120, headers=headers_for(self.api))

    def _check(self, r: httpx.Response) -> None:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{self.url}: {r.status_code} {r.content[:300]!r}")
        if self.managed:
            why = r.headers.get("x-kilo-rules-passthrough")
            if why or "x-kilo-rules-revision" not in r.headers:
                raise RuntimeError(f"the gateway did not manage the request: {why}")

    def post(self, raw: bytes) -> float:
        """Seconds to the whole answer."""
        t = time.perf_counter()
        r = self.client.post(self.url + PATH_OF[self.api], content=raw)
        elapsed = time.perf_counter() - t
        self._check(r)
        return elapsed

    def first_byte(self, raw: bytes) -> tuple[float, float]:
        """Seconds to the first byte of a streamed answer, and to its end."""
        t = time.perf_counter()
        with self.client.stream("POST", self.url + PATH_OF[self.api], content=raw) as r:
            self._check(r)
            first = math.nan
            for chunk in r.iter_raw():
                if chunk and math.isnan(first):
                    first = time.perf_counter() - t
        return first, time.perf_counter() - t

    def close(self) -> None:
        self.client.close()


@dataclass
class Pairs:
    """Interleaved timings of the same request through the gateway and direct."""

    gateway: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)

    @property
    def added(self) -> list[float]:
        return [g - d for g, d in zip(self.gateway, self.direct, strict=True)]


def paired(
    gateway: Target, direct: Target, raw: bytes, reps: int, *, stream: bool = False
) -> Pairs:
    """``reps`` pairs, gateway then direct; for ``stream`` the time to the first byte."""
    out = Pairs()
    for _ in range(reps):
        if stream:
            out.gateway.append(gateway.first_byte(raw)[0])
            out.direct.append(direct.first_byte(raw)[0])
        else:
            out.gateway.append(gateway.post(raw))
            out.direct.append(direct.post(raw))
    return out


def in_process(body_raw: bytes, api: str, window: int, reps: int) -> list[float]:
    """Seconds of ``json.loads`` + import into Session v1 + ``apply_plan`` (a warm
    ``gateway`` plan; its ``wire`` is the serialised request), ``reps`` times."""
    model = gateway_models(api, window)[MODEL_OF[api]]
    plan = compile_policy("gateway", model)
    convert = IMPORTER_OF[api]
    text = body_raw.decode()
    times: list[float] = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        doc = json.loads(text)
        session = convert(Source("<request>", "json", [Record("<request>", 1, text, doc)]), 0)
        wire = apply_plan(plan, session).wire
        times.append(time.perf_counter() - t)
        assert isinstance(wire, bytes) and wire
    return times[1:]  # the first compiles the plan's caches


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of log(y) against log(x) (NaN with fewer than two points or
    a y that is not positive)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2 or len(pts) < len(xs):
        return math.nan
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else math.nan


def throughput(
    target_url: str, api: str, raw: bytes, clients: int, seconds: float, managed: bool
) -> float:
    """Answers a second from ``clients`` threads, each on its own connection, each sending
    ``raw`` in a loop for ``seconds``."""
    counts = [0] * clients
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def work(i: int) -> None:
        t = Target(target_url, api, managed)
        try:
            t.post(raw)  # its connection open before the clock starts
            start.wait()
            while time.perf_counter() < stop_at[0]:
                t.post(raw)
                counts[i] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)
            with contextlib.suppress(threading.BrokenBarrierError):
                start.abort()
        finally:
            t.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
    for th in threads:
        th.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + 3600
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"throughput client failed: {errors[0]!r}")
    return sum(counts) / (time.perf_counter() - t0)


# -- tokens and cost ----------------------------------------------------------------------


@dataclass
class Tokens:
    steps: int = 0
    input: int = 0
    uncached: int = 0
    read: int = 0
    write: int = 0
    refused: int = 0
    compacted: int = 0
    why: list[str] = field(default_factory=list)  # each refusal: step, code, message

    @property
    def cost(self) -> float:
        return (
            self.uncached * PRICE_INPUT + self.write * PRICE_WRITE + self.read * PRICE_READ
        ) / 1e6


def replay(name: str, url: str, every: int, upstream: Any, managed: bool) -> Tokens:
    """Every sampled step of ``name`` posted to ``url``; the upstream's reported usage."""
    api = SESSIONS[name]
    key = ITEMS_OF[api]
    out = Tokens()
    with httpx.Client(timeout=300, headers=headers_for(api)) as http:
        for body in step_bodies(name, MODEL_OF[api], every):
            before = len(upstream.received)
            r = http.post(url + PATH_OF[api], content=encode(body))
            got = upstream.received[before:]
            out.steps += 1
            if r.status_code != 200 or not got or got[-1].usage is None:
                out.refused += 1
                code = got[-1].refused if got else None
                out.why.append(f"step {out.steps} ({len(body[key])} items): {code} {r.text[:300]}")
                continue
            u = got[-1].usage
            out.input += u["input_tokens"]
            out.uncached += u["uncached"]
            out.read += u["cache_read"]
            out.write += u["cache_write"]
            if managed and len(got[-1].json[key]) < len(body[key]):
                out.compacted += 1
    return out


def tokens_part(names: Sequence[str], every: int) -> list[tuple[str, Tokens, Tokens]]:
    from tests.gateway.upstream import running_upstream

    rows: list[tuple[str, Tokens, Tokens]] = []
    with running_upstream() as upstream:
        for name in names:
            api = SESSIONS[name]
            window = WINDOWS.get(name, 60_000)
            upstream.reset()
            upstream.window = 10**9
            direct = replay(name, upstream.url, every, upstream, managed=False)
            upstream.reset()
            upstream.window = window
            with (
                tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp,
                running_gateway(upstream.url, Path(tmp), models=gateway_models(api, window)) as gw,
            ):
                through = replay(name, gw.url, every, upstream, managed=True)
            rows.append((name, through, direct))
            print(tokens_row(name, window, through, direct), flush=True)
            for why in through.why:
                print(f"    refused through the gateway: {why}", flush=True)
    return rows


def tokens_row(name: str, window: int, g: Tokens, d: Tokens) -> str:
    ratio = g.cost / d.cost if d.cost else math.nan
    return (
        f"{name[:40]:<40} {window:>7} {g.steps:>5} {g.compacted:>4} {g.refused}/{d.refused:<3} "
        f"{g.input:>10,} {d.input:>11,}  {g.read:>10,} {d.read:>11,}  {g.write:>9,} {d.write:>9,}  "
        f"${g.cost:>6.2f} ${d.cost:>6.2f} {ratio:>5.2f}x"
    )


TOKENS_HEADER = (
    f"{'session':<40} {'window':>7} {'steps':>5} {'cmp':>4} {'refd':<5} "
    f"{'input gw':>10} {'input dir':>11}  {'read gw':>10} {'read dir':>11}  {'write gw':>9} "
    f"{'write dir':>9}  {'$ gw':>7} {'$ dir':>7} {'gw/dir':>6}"
)


# -- the report ---------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f}"


@dataclass
class Verdict:
    name: str
    value: str
    target: str
    met: bool | None  # None: not measured


def _prepare_ms(server: Server, skip: int) -> list[float]:
    """The gateway's own time before forwarding (decision log ``added_ms``), in seconds,
    past the first ``skip`` requests."""
    return [d["added_ms"] / 1e3 for d in server.decisions()[skip:]]


def latency_part(name: str, reps: int, verdicts: list[Verdict], upstream: Server) -> None:
    api, body = last_step(name)
    raw = encode(body)
    raw_stream = encode(streaming(body))
    window = WINDOWS.get(name, 60_000)
    print(
        f"\n== 1-2. added latency: {name}, last step, {len(body[ITEMS_OF[api]])} items, "
        f"{len(raw) / 1e3:.0f} KB, {reps} interleaved pairs after 3 warm-ups"
    )
    header = (
        f"{'window':<22} {'':<14} {'gw p50':>8} {'gw p99':>8} {'dir p50':>8} {'dir p99':>8} "
        f"{'add p50':>8} {'add p99':>8}  ms"
    )
    print(header)
    added_p50 = ttfb_p50 = math.nan
    for label, win in (
        (f"unlimited ({UNLIMITED:.0e})", UNLIMITED),
        (f"{window:,} (compacts)", window),
    ):
        with child("gateway", upstream.url, api, str(win)) as gw_server:
            gw = Target(gw_server.url, api, managed=True)
            direct = Target(upstream.url, api, managed=False)
            try:
                for _ in range(2):
                    direct.post(raw)
                cold = gw.post(raw)
                cold_direct = direct.post(raw)
                for _ in range(2):
                    gw.post(raw)
                warm = paired(gw, direct, raw, reps)
                for _ in range(2):
                    gw.first_byte(raw_stream)
                    direct.first_byte(raw_stream)
                first = paired(gw, direct, raw_stream, reps, stream=True)
            finally:
                gw.close()
                direct.close()
            decisions = gw_server.decisions()
            prepare = [d["added_ms"] / 1e3 for d in decisions[3 : 3 + reps]]
            rules = sorted({r for d in decisions[1:] for r in d["rules"]})
        for what, p in (("request", warm), ("first byte", first)):
            print(
                f"{label:<22} {what:<14} {ms(percentile(p.gateway, 0.5))} "
                f"{ms(percentile(p.gateway, 0.99))} "
                f"{ms(percentile(p.direct, 0.5))} {ms(percentile(p.direct, 0.99))} "
                f"{ms(percentile(p.added, 0.5))} {ms(percentile(p.added, 0.99))}"
            )
        print(
            f"{'':<22} {'cold (1st)':<14} {ms(cold)} {'':>8} {ms(cold_direct)} {'':>8} "
            f"{ms(cold - cold_direct)}"
        )
        print(
            f"{'':<22} {'gw prepare':<14} {ms(percentile(prepare, 0.5))} "
            f"{ms(percentile(prepare, 0.99))}"
            f"   (decision log added_ms; cold {decisions[0]['added_ms']:.2f} ms, rules "
            f"first {decisions[0]['rules']}, then {rules})"
        )
        if win == UNLIMITED:
            added_p50 = percentile(warm.added, 0.5)
            ttfb_p50 = percentile(first.added, 0.5)
    verdicts.append(
        Verdict("added latency p50 (no compaction)", f"{added_p50 * 1e3:.2f} ms", "-", None)
    )
    verdicts.append(Verdict("first streamed byte added p50", f"{ttfb_p50 * 1e3:.2f} ms", "-", None))

    local = in_process(raw, api, UNLIMITED, reps)
    local_p50 = percentile(local, 0.5)
    ratio = added_p50 / local_p50
    print(
        f"\n== 3. in process: json.loads + {IMPORTER_OF[api].__module__.rsplit('.', 1)[-1]} "
        f"import + apply_plan(gateway) (wire bytes), {reps} runs"
    )
    print(
        f"p50 {local_p50 * 1e3:.2f} ms, p99 {percentile(local, 0.99) * 1e3:.2f} ms; "
        f"p50 added / in-process p50 = {ratio:.2f}x (target <= {TARGET_RATIO:g}x: "
        f"{'met' if ratio <= TARGET_RATIO else 'MISSED'})"
    )
    verdicts.append(
        Verdict(
            "p50 added / in-process p50",
            f"{ratio:.2f}x",
            f"<= {TARGET_RATIO:g}x",
            ratio <= TARGET_RATIO,
        )
    )


def growth_part(name: str, reps: int, verdicts: list[Verdict], upstream: Server) -> None:
    api, body = last_step(name)
    print(
        f"\n== 5. growth: {name} history repeated {', '.join(f'{c}x' for c in COPIES)}; "
        f"warm (2 sends), then {reps} pairs each"
    )
    print(
        f"{'copies':>6} {'items':>6} {'KB':>8} {'gw p50':>8} {'dir p50':>8} {'add p50':>8} "
        f"{'add p99':>8} {'prep p50':>8}  ms"
    )
    sizes: list[float] = []
    added: list[float] = []
    with child("gateway", upstream.url, api, str(UNLIMITED)) as gw_server:
        gw = Target(gw_server.url, api, managed=True)
        direct = Target(upstream.url, api, managed=False)
        try:
            for copies in COPIES:
                b = repeated(body, copies, api)
                raw = encode(b)
                for _ in range(2):
                    gw.post(raw)
                    direct.post(raw)
                skip = len(gw_server.decisions())
                p = paired(gw, direct, raw, reps)
                prepare = _prepare_ms(gw_server, skip)
                sizes.append(len(raw))
                added.append(percentile(p.added, 0.5))
                print(
                    f"{copies:>6} {len(b[ITEMS_OF[api]]):>6} {len(raw) / 1e3:>8.0f} "
                    f"{ms(percentile(p.gateway, 0.5))} {ms(percentile(p.direct, 0.5))} "
                    f"{ms(added[-1])} {ms(percentile(p.added, 0.99))} "
                    f"{ms(percentile(prepare, 0.5))}"
                )
        finally:
            gw.close()
            direct.close()
    slope = loglog_slope(sizes, added)
    met = slope <= TARGET_EXPONENT
    print(
        f"exponent of added p50 vs body size (log-log least squares): {slope:.2f} "
        f"(target <= {TARGET_EXPONENT}: {'met' if met else 'MISSED'})"
    )
    verdicts.append(
        Verdict("growth exponent of added latency", f"{slope:.2f}", f"<= {TARGET_EXPONENT}", met)
    )


def throughput_part(
    name: str,
    seconds: float,
    verdicts: list[Verdict],
    upstream: Server,
    workers: int | None = None,
) -> None:
    api, body = last_step(name)
    raw = encode(body)
    how = f"kilo-rules gateway --workers {workers}" if workers else "in process"
    print(
        f"\n== 6. throughput: {name} last step ({len(raw) / 1e3:.0f} KB), "
        f"{seconds:g} s per point, warm; the gateway: {how}"
    )
    print(f"{'':<22} {'1 client':>10} {'8 clients':>10} {'ratio':>7}  requests/s")
    gateway = (
        cli_gateway(upstream.url, api, UNLIMITED, workers)
        if workers
        else child("gateway", upstream.url, api, str(UNLIMITED))
    )
    with gateway as gw_server:
        for _ in range(3 * (workers or 1)):  # each worker warm (a new connection each)
            t = Target(gw_server.url, api, managed=True)
            t.post(raw)
            t.close()
        results = {}
        for label, url, managed in (
            ("through the gateway", gw_server.url, True),
            ("upstream alone", upstream.url, False),
        ):
            one = throughput(url, api, raw, 1, seconds, managed)
            eight = throughput(url, api, raw, 8, seconds, managed)
            results[label] = eight / one
            print(f"{label:<22} {one:>10.1f} {eight:>10.1f} {eight / one:>6.2f}x")
    ratio = results["through the gateway"]
    met = ratio >= TARGET_THROUGHPUT
    print(
        f"8 clients / 1 through the gateway: {ratio:.2f}x "
        f"(target >= {TARGET_THROUGHPUT}x: {'met' if met else 'MISSED'})"
    )
    verdicts.append(
        Verdict("throughput 8 clients / 1", f"{ratio:.2f}x", f">= {TARGET_THROUGHPUT}x", met)
    )


def main(argv: Sequence[str]) -> int:
    """Print the tables and the summary; 0 when every target measured is met, 1 otherwise."""
    if argv[:1] == ["--serve"]:
        return _serve_child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument(
        "--session",
        default=DEFAULT_SESSION,
        choices=sorted(SESSIONS),
        help="for latency, growth, throughput",
    )
    ap.add_argument(
        "--reps", type=int, default=None, help="interleaved pairs per point (50; 15 with --quick)"
    )
    ap.add_argument(
        "--sessions",
        default=",".join(DEFAULT_SESSIONS),
        help="sessions replayed for tokens and cost",
    )
    ap.add_argument(
        "--every", type=int, default=None, help="replay every K-th step (1; 4 with --quick)"
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per throughput point (5; 2 with --quick)",
    )
    ap.add_argument(
        "--part", default="latency,tokens,growth,throughput", help="which parts, comma-separated"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="throughput through `kilo-rules gateway --workers N` (default: the gateway "
        "in a process of the bench's own)",
    )
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, sampled steps")
    args = ap.parse_args(list(argv))
    reps = args.reps or (15 if args.quick else 50)
    every = args.every or (4 if args.quick else 1)
    seconds = args.duration or (2.0 if args.quick else 5.0)
    parts = {p.strip() for p in args.part.split(",") if p.strip()}
    names = [n.strip() for n in args.sessions.split(",") if n.strip()]
    unknown = [n for n in names if n not in SESSIONS]
    if unknown or not TRAJECTORIES.is_dir():
        print(f"unknown sessions or no {TRAJECTORIES}: {unknown}")
        return 2
    started = time.perf_counter()
    verdicts: list[Verdict] = []
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, gateway policy 'gateway'")
    if parts & {"latency", "growth", "throughput"}:
        with child("upstream") as upstream:
            if "latency" in parts:
                latency_part(args.session, reps, verdicts, upstream)
            if "growth" in parts:
                growth_part(args.session, max(5, reps // 3), verdicts, upstream)
            if "throughput" in parts:
                throughput_part(args.session, seconds, verdicts, upstream, args.workers)
    if "tokens" in parts:
        print(
            f"\n== 4. tokens and cost: replayed step by step (every {every}), realistic upstream; "
            "gateway at the window, direct unlimited; $3/M input, $3.75/M cache write, "
            "$0.30/M cache read; a refused step counts no tokens"
        )
        print(TOKENS_HEADER)
        rows = tokens_part(names, every)
        g = sum(r[1].cost for r in rows)
        d = sum(r[2].cost for r in rows)
        refused = sum(r[1].refused for r in rows)
        print(
            f"total: ${g:.2f} through the gateway, ${d:.2f} direct ({g / d:.2f}x); "
            f"{refused} refused through the gateway"
        )
        verdicts.append(Verdict("cost through the gateway / direct", f"{g / d:.2f}x", "-", None))
        verdicts.append(
            Verdict("bodies refused through the gateway", str(refused), "0", refused == 0)
        )

    print("\n== summary")
    for v in verdicts:
        state = "" if v.met is None else ("met" if v.met else "MISSED")
        print(f"{v.name:<38} {v.value:>12}  target {v.target:<8} {state}")
    load = os.getloadavg()
    print(
        f"elapsed {time.perf_counter() - started:.0f} s; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"command: python benchmarks/bench_gateway.py {' '.join(argv)}".rstrip())
    return 0 if all(v.met is not False for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
