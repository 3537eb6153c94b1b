"""The sidecar's FastAPI app: :func:`create_app` over a
:class:`~kilo_rules.tools.serving.store.PolicyStore`.

Every build runs on one snapshot of the store (``store.apply``), off the event loop, in a
bounded pool, within a time bound; the body is capped before it is parsed and validated as
Session v1 with located diagnostics. Every answer that is not a success is a typed JSON
error (``ErrorResponse``), never a stack trace.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from kilo_rules.engine.base.cancel import CancelToken
from kilo_rules.engine.base.errors import (
    CancellationError,
    CatalogError,
    Diagnostic,
    KiloRulesError,
    Location,
    SessionError,
    StoreError,
)
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog, model_from_data
from kilo_rules.engine.formats.session import Session, SessionReader, session_from_data
from kilo_rules.engine.frontend.resolve import bundled_root
from kilo_rules.engine.providers.acceptance import BodyContext, check_body
from kilo_rules.engine.runtime.context import Agent, Skill, StepInput, Workspace
from kilo_rules.tools.serving.sidecar.access import Access, Guard
from kilo_rules.tools.serving.sidecar.body import (
    REQUEST,
    ApiError,
    Body,
    BodyLimit,
    dotted,
    dumps,
    error_bytes,
    is_lazy,
    lazy_text,
    parse_json,
    validate,
)
from kilo_rules.tools.serving.sidecar.decisionlog import BuildRecord, DecisionLog
from kilo_rules.tools.serving.sidecar.metrics import CONTENT_TYPE, Metrics
from kilo_rules.tools.serving.sidecar.models import (
    BuildRequest,
    BuildResponse,
    CheckRequest,
    CheckResponse,
    ErrorResponse,
    HealthResponse,
    PlanResponse,
    ReadyResponse,
    StatusResponse,
    StepIn,
    WorkspaceIn,
)
from kilo_rules.tools.serving.sidecar.slots import Slots

if TYPE_CHECKING:
    from kilo_rules.engine.runtime.apply import StepResult
    from kilo_rules.tools.serving.store import PolicyStore, ReloadResult

__all__ = [
    "DEFAULT_BUILD_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT_BUILDS",
    "create_app",
    "openapi_document",
]

log = logging.getLogger("kilo_rules.tools.serving.sidecar")

#: The largest request body accepted, in bytes (the largest recorded sessions are a few
#: megabytes as JSON; Session v1 files may reach 64 MiB, which a sidecar should not take).
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: Seconds a build (or a check) may take, queueing for a worker included, before the answer
#: is 504. A worker thread that overruns cannot be stopped; its result is discarded.
DEFAULT_BUILD_TIMEOUT = 30.0
#: Builds run at once; more wait for a worker (within their time bound).
DEFAULT_MAX_CONCURRENT_BUILDS = 8
#: Seconds the whole body may take to arrive.
DEFAULT_BODY_TIMEOUT = 30.0
#: Characters of session JSON whose messages an app keeps for the next build of the same
#: session (the reader's bound; the messages take about as much again): a few of the
#: largest bodies accepted, so that several agents' sessions stay warm at once.
_READER_CHARS = 4 * DEFAULT_MAX_BODY_BYTES
#: Model ids an app remembers having reported (``on_model``); one pushed out is reported again.
_MODELS_TOLD = 1024

_JSON = "application/json"
_API_VERSION = "1"
_DESCRIPTION = (
    "The kilo-rules sidecar: the exact request an LLM coding agent sends, built from a "
    "Session v1 document under the policy revision the sidecar serves. Every response of a "
    "build names that revision. Errors are typed JSON (`ErrorResponse`)."
)


def _responses(ok: str, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented answers of an operation: 200 (``ok`` describes it) and the errors."""
    what = {
        401: "No bearer token, or not one this sidecar accepts (auth.missing, auth.invalid).",
        404: "Unknown model id (with a did-you-mean when one is close).",
        408: "The body did not arrive in time.",
        413: "The body is over the size cap.",
        415: "The body is not sent as application/json.",
        421: "The Host header does not name this sidecar.",
        422: "The body is not valid: each problem located <request>:line:col. For a build, "
        "also a session with no message (session.empty), and a session whose request the "
        "provider would refuse (acceptance.<rule>, one diagnostic per rule broken, the path "
        "in the built body in details.body_path).",
        500: "The policy served failed while building (policy.apply-failed) or compiling "
        "(policy.failed), or an internal error.",
        503: "No policy revision is loaded yet (store.not-ready, with the diagnostics of "
        "why: the refused revision's, located in the source), or every build slot is taken "
        "(server.busy, with Retry-After).",
        504: "The work took longer than the time bound.",
    }
    out: dict[int | str, dict[str, Any]] = {200: {"description": ok}}
    out.update({s: {"model": ErrorResponse, "description": what[s]} for s in statuses})
    return out


def _json_body(model: type[BaseModel], description: str) -> dict[str, Any]:
    """An operation's request body, documented as ``model`` (the routes read and validate
    the body themselves: bounded, off the event loop, with located diagnostics)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {_JSON: {"schema": ref}},
        }
    }


@dataclass
class _Outcome:
    """What one build answered, for the response, the metrics and the decision log."""

    status: int
    body: bytes
    revision: str | None = None
    model: str | None = None
    provider: str | None = None
    rules: tuple[str, ...] = ()
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def failed(cls, exc: ApiError, model: str | None = None) -> _Outcome:
        return cls(
            exc.status,
            error_bytes(exc.code, exc.message, exc.diagnostics),
            model=model,
            error=exc.code,
        )


@dataclass
class _Sidecar:
    """The state behind one app: the store, the limits, the metrics and the log."""

    store: PolicyStore | None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    max_concurrent_builds: int = DEFAULT_MAX_CONCURRENT_BUILDS
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    workspace_roots: tuple[Path, ...] = ()
    decision_log: DecisionLog | None = None
    #: Who may call (None: the document-only app of :func:`openapi_document`).
    access: Access | None = None
    metrics: Metrics = field(default_factory=Metrics)
    #: Told the catalog id of each model this app builds for, once (a worker of
    #: ``serve --workers`` tells its supervisor, whose store then checks every later
    #: revision for it too).
    on_model: Callable[[str], None] | None = None
    _told: LRUCache[str, bool] = field(default_factory=lambda: LRUCache(_MODELS_TOLD))
    #: Reads each request's session, reusing the messages of the sessions read before: an
    #: agent resends its whole session every step, and only the new messages are parsed.
    reader: SessionReader = field(default_factory=lambda: SessionReader(_READER_CHARS))
    cwd: str = field(default_factory=lambda: str(Path.cwd().resolve()))
    _slots: Slots | None = None

    # -- the store ----------------------------------------------------------------------

    def revision(self) -> str | None:
        """The revision served, or None while none is loaded."""
        if self.store is None:
            return None
        try:
            return self.store.revision or None
        except KiloRulesError:
            return None

    def _ready_store(self) -> PolicyStore:
        if self.store is None or self.revision() is None:
            raise self.not_ready()
        return self.store

    def not_ready(self) -> ApiError:
        """The 503 of a sidecar serving no revision, with the diagnostics of why (the
        refused revision's, located in the source, or the source's own problem)."""
        problems = self.store.status().problems if self.store is not None else ()
        message = "no policy revision is loaded yet"
        first = next((d for d in problems if d.severity == "error"), None)
        if first is not None:
            message += f": {first.location}: {first.message}"
        return ApiError(503, "store.not-ready", message, problems)

    def on_reload(self, result: ReloadResult) -> None:
        """Count swaps and rejected revisions (a store listener: any thread). A revision
        refused again (the same files re-checked) is the rejection already counted."""
        if result.swapped:
            self.metrics.swaps.inc()
        elif result.rejected and not result.repeated:
            self.metrics.rejected.inc()

    def shows_details(self, request: Request) -> bool:
        """Whether ``request`` may read why the store refused a revision: any caller the
        guard let in, but an open probe (``open_probes``) only with an accepted token, for
        the diagnostics quote the policy files and the probes answer whoever asks."""
        access = self.access
        if access is None or not access.auth or not access.open_probes:
            return True
        sent = request.headers.getlist("authorization")
        return len(sent) == 1 and access.authenticated(sent[0].encode("latin-1")) is True

    def status(self) -> _Outcome:
        """What the sidecar serves and why it serves nothing else (``GET /v1/status``)."""
        if self.store is None:
            return _Outcome.failed(ApiError(503, "store.not-ready", "no policy store"))
        status = self.store.status()
        payload = {"status": "ready" if status.ready else "not-ready", **status.to_json()}
        return _Outcome(200, dumps(payload), revision=status.revision or None)

    def slots(self) -> Slots:
        """The build slots (made on first use)."""
        if self._slots is None:
            self._slots = Slots(self.max_concurrent_builds, self.metrics.running.set)
        return self._slots

    async def off_loop(self, fn: Callable[[], _Outcome], what: str) -> _Outcome:
        """``fn()`` on a worker thread, within the time bound: 503 when no build slot comes
        free in time, 504 past the bound, when the work is also told to stop (it ends at
        its next checkpoint and only then gives its slot back)."""
        token = CancelToken.after(self.build_timeout)
        try:
            outcome = await self.slots().run(fn, token, self.build_timeout)
        except TimeoutError:
            exc = ApiError(
                504, f"{what}.timeout", f"the {what} took longer than {self.build_timeout:g} s"
            )
            return _Outcome.failed(exc)
        if outcome is None:
            exc = ApiError(
                503,
                "server.busy",
                f"every build slot ({self.max_concurrent_builds}) is taken; retry shortly",
            )
            busy = _Outcome.failed(exc)
            busy.headers = {"retry-after": "1"}
            return busy
        return outcome

    # -- build ----------------------------------------------------------------------------

    def build(self, raw: bytes) -> _Outcome:
        """Parse, validate and build one step (on a worker thread)."""
        model_ref: str | None = None
        try:
            body = parse_json(raw, check=("model", "step"), lazy="session")
            # The session first: read whole from its own text, or not at all (the body is
            # then parsed in full, and every check below runs as it always has).
            read = self._read_session(body)
            if read is None and is_lazy(body, "session"):
                body = parse_json(raw, check=("model", "step"))
            data = body.data
            _known_keys(body, {"session", "model", "step"})
            for key in ("session", "model"):
                if key not in data and not is_lazy(body, key):
                    raise _missing(body, key)
            model = self._model(body)
            model_ref = model if isinstance(model, str) else model.id
            step = self._step(body)
            session = read if read is not None else self._session(body)
            if not session.messages:
                # No provider takes a conversation without a turn (acceptance first-role).
                raise _at(
                    body,
                    ("session", "messages"),
                    "session.empty",
                    "session.messages: the session has no message; a request needs at "
                    "least one user message",
                )
            store = self._ready_store()
            try:
                result = store.apply(session, model, step)
            except CancellationError:
                raise
            except CatalogError as exc:
                raise _catalog_error(exc, body) from None
            except KiloRulesError as exc:
                raise _engine_error(exc, "build") from None
            refused = _unacceptable(result, body)
            if refused:
                first = refused[0]
                raise ApiError(422, first.code, first.message, refused)
            if self.on_model is not None and isinstance(model, str):
                self._tell(model)
            return self._built(result, model_ref)
        except ApiError as exc:
            return _Outcome.failed(exc, model_ref)
        except CancellationError:
            return _cancelled("build")
        except Exception:
            log.exception("build failed")
            return _Outcome.failed(ApiError(500, "internal", "internal error"), model_ref)

    def _tell(self, model: str) -> None:
        if self._told.get(model) is None and self.on_model is not None:
            self._told.put(model, True)
            try:
                self.on_model(model)
            except Exception:  # the build stands; the next revision is checked without it
                log.warning("could not report model %s as in use", model, exc_info=True)

    def _built(self, result: StepResult, model: str) -> _Outcome:
        revision = result.revision or ""
        return _Outcome(
            200,
            build_response(result),
            revision=revision,
            model=model,
            provider=result.provider,
            rules=tuple(d.rule for d in result.decisions),
        )

    def _model(self, body: Body) -> str | ModelInfo:
        value = body.data["model"]
        if isinstance(value, str):
            if not 0 < len(value) <= 256:
                raise _at(
                    body,
                    ("model",),
                    "request.invalid",
                    "model: a catalog id of 1 to 256 characters",
                )
            return value
        if isinstance(value, dict):
            try:
                return model_from_data(value, file=REQUEST)
            except CatalogError as exc:
                diags = body.relocate(exc.diagnostics, ("model",))
                raise ApiError(422, "model.invalid", diags[0].message, diags) from None
        raise _at(
            body,
            ("model",),
            "request.invalid",
            "model: a catalog id (a string) or a model described inline (an object)",
        )

    def _step(self, body: Body) -> StepInput:
        value = body.data.get("step")
        wire = StepIn() if value is None else validate(StepIn, value, body, ("step",))
        agent = Agent(
            name=wire.agent.name,
            prompt=wire.agent.prompt,
            skills_enabled=wire.agent.skills_enabled,
            task_enabled=wire.agent.task_enabled,
            skills=tuple(Skill(s.name, s.description) for s in wire.agent.skills),
        )
        return StepInput(
            agent=agent,
            workspace=self._workspace(wire.workspace, body),
            step=wire.step,
            max_steps=wire.max_steps,
            previous_agent=wire.previous_agent,
            automatic_caching=wire.automatic_caching,
            provider=wire.provider,
            options=dict(wire.options),
        )

    def _workspace(self, wire: WorkspaceIn | None, body: Body) -> Workspace:
        if wire is None:
            return Workspace(cwd=self.cwd)
        named: list[tuple[tuple[str | int, ...], str | None]] = [
            (("step", "workspace", key), getattr(wire, key)) for key in ("cwd", "root", "home")
        ]
        for key in ("open_files", "visible_files"):
            named += [(("step", "workspace", key, i), f) for i, f in enumerate(getattr(wire, key))]
        for where, value in named:
            if value is not None and "\x00" in value:
                # No file name holds one, and the OS refuses it in a path.
                message = f"{dotted(where)}: holds a NUL character, which no path can hold"
                raise _at(body, where, "request.workspace", message)
        cwd, allowed = self._under_root(wire.cwd, body, "cwd")
        root = self._under_root(wire.root, body, "root", allowed)[0] if wire.root else allowed
        home = self._under_root(wire.home, body, "home")[0] if wire.home else allowed
        if not Path(cwd).is_relative_to(root):
            raise _at(
                body,
                ("step", "workspace", "root"),
                "request.workspace",
                "step.workspace.root: the working directory is not under the root",
            )
        return Workspace(
            cwd=cwd,
            root=root,
            platform=wire.platform,
            is_git_repo=wire.is_git_repo,
            shell=wire.shell,
            open_files=tuple(wire.open_files),
            visible_files=tuple(wire.visible_files),
            home=home,
        )

    def _under_root(
        self, raw: str, body: Body, key: str, within: str | None = None
    ) -> tuple[str, str]:
        """(``raw`` resolved, the workspace root it lies under); 422 when it lies under none
        (or not under ``within``)."""
        path = ("step", "workspace", key)
        p = Path(raw)
        if not p.is_absolute():
            raise _at(body, path, "request.workspace", f"{dotted(path)}: not an absolute path")
        try:
            real = p.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
            message = f"{dotted(path)}: cannot be resolved ({exc})"
            raise _at(body, path, "request.workspace", message) from None
        roots = [Path(within)] if within else self.workspace_roots
        for root in roots:
            if real.is_relative_to(root):
                return str(real), str(root)
        raise ApiError(
            422,
            "request.workspace",
            f"{dotted(path)}: {raw!r} is outside the workspace roots this sidecar reads",
            [
                Diagnostic(
                    "request.workspace",
                    f"{dotted(path)}: {raw!r} is outside the workspace roots this sidecar reads",
                    body.locate([path])[path],
                    details={"path": list(path)},
                    hint="instruction files are read only under the directories the sidecar "
                    "was started with (kilo-rules serve --workspace-root DIR); leave "
                    "workspace out to build in the sidecar's own directory",
                )
            ],
        )

    def _read_session(self, body: Body) -> Session | None:
        """The session of a body that left it lazy, read from its own text by the app's
        reader (only messages not met before are parsed); None when it cannot be read so.
        Read whole, the text is one JSON value, so the body is the JSON its members say
        (see :func:`~kilo_rules.tools.serving.sidecar.body.parse_json`); the reader refuses
        NaN, infinities and lone surrogates, and ``lazy_text`` integers the body refuses."""
        text = lazy_text(body, "session")
        if text is None:
            return None
        try:
            return self.reader.read(text, file=REQUEST)
        except SessionError:
            return None  # located in the session's text: the full path locates it in the body

    def _session(self, body: Body) -> Session:
        try:
            return session_from_data(body.data["session"], file=REQUEST)
        except SessionError as exc:
            diags = body.relocate(exc.diagnostics, ("session",))
            raise ApiError(422, diags[0].code, diags[0].message, diags) from None

    # -- check ------------------------------------------------------------------------------

    def check(self, raw: bytes) -> _Outcome:
        """Check a policy and/or routes text in a fresh temporary directory."""
        from kilo_rules.tools.checking.check import check_paths

        try:
            body = parse_json(raw, check=("models", "policy", "routes"))
            req = validate(CheckRequest, body.data, body, ())
            if req.policy is None and req.routes is None:
                raise _at(body, (), "request.invalid", "give a policy, a routes file, or both")
            models = []
            for i, ref in enumerate(req.models):
                try:
                    models.append(bundled_catalog().get(ref))
                except CatalogError as exc:
                    raise _catalog_error(exc, body, ("models", i)) from None
            with tempfile.TemporaryDirectory(prefix="kilo-rules-check-") as tmp:
                root = Path(tmp)
                names = []
                for name, text in (("policy.yaml", req.policy), ("routes.yaml", req.routes)):
                    if text is not None:
                        (root / name).write_text(text, encoding="utf-8")
                        names.append(str(root / name))
                report = check_paths(names, models=models)
                diags = [_sent_only(_within(d, root)) for d in report.diagnostics]
            errors = sum(d.severity == "error" for d in diags)
            payload = {
                "ok": errors == 0,
                "errors": errors,
                "warnings": len(diags) - errors,
                "diagnostics": [d.to_json() for d in diags],
            }
            return _Outcome(200, dumps(payload))
        except ApiError as exc:
            return _Outcome.failed(exc)
        except CancellationError:
            return _cancelled("check")
        except Exception:
            log.exception("check failed")
            return _Outcome.failed(ApiError(500, "internal", "internal error"))

    # -- plan -------------------------------------------------------------------------------

    def plan(self, model: str) -> _Outcome:
        """The plan of ``model`` under the current revision."""
        try:
            store = self._ready_store()
            try:
                with store.snapshot() as snap:
                    plan, revision = snap.plan_for(model), snap.revision
            except CancellationError:
                raise
            except CatalogError as exc:
                raise _catalog_error(exc) from None
            except KiloRulesError as exc:
                raise _engine_error(exc, "compile") from None
            payload = {"revision": revision, "model": plan.model.id, "plan": plan.to_json()}
            return _Outcome(200, dumps(payload), revision=revision, model=model)
        except ApiError as exc:
            return _Outcome.failed(exc, model)
        except CancellationError:
            return _cancelled("plan")
        except Exception:
            log.exception("plan failed")
            return _Outcome.failed(ApiError(500, "internal", "internal error"), model)

    # -- recording ----------------------------------------------------------------------------

    async def record(self, outcome: _Outcome, seconds: float) -> None:
        """Count the build and write its decision-log line."""
        self.metrics.build(outcome.status, outcome.provider, seconds)
        if self.decision_log is None:
            return
        record = BuildRecord(
            revision=outcome.revision,
            model=outcome.model,
            provider=outcome.provider,
            rules=outcome.rules,
            decisions=len(outcome.rules),
            duration_ms=seconds * 1000,
            status=outcome.status,
            error=outcome.error,
        )
        try:
            await anyio.to_thread.run_sync(self.decision_log.write, record)
        except OSError as exc:
            # A log that cannot be written must not fail the builds it describes.
            log.warning("decision log %s: %s", self.decision_log.path, exc)

    def refused(self, path: str, status: int) -> None:
        """A body the size or time limit refused: a build answered, for the metrics."""
        if path == "/v1/build":
            self.metrics.build(status, None, 0.0)
            if self.decision_log is not None:
                record = BuildRecord(
                    None,
                    None,
                    None,
                    (),
                    0,
                    0.0,
                    status,
                    "request.too-large" if status == 413 else "request.timeout",
                )
                try:
                    self.decision_log.write(record)
                except OSError as exc:
                    log.warning("decision log %s: %s", self.decision_log.path, exc)


def _response_json(result: StepResult) -> dict[str, Any]:
    """The ``BuildResponse`` of ``result`` as JSON data."""
    return {
        **result.to_json(),
        "headers": result.headers,
        "revision": result.revision or "",
        "input_tokens": result.input_tokens,
        "context": result.context,
        "fits": result.fits,
        "counter": result.counter,
    }


#: A lone UTF-16 surrogate as ``surrogatepass`` writes it (0xED, then 0xA0 to 0xBF).
_SURROGATE = re.compile(b"\xed[\xa0-\xbf]")


def build_response(result: StepResult) -> bytes:
    """The body of a build's 200: :func:`dumps` of the response with ``result.wire``, the
    compact UTF-8 bytes of the request, placed as they are where ``request`` goes (the
    request is neither decoded nor encoded again for it). A wire that holds a lone
    surrogate goes through :func:`dumps`, which writes it as its escape."""
    wire = result.wire
    if b"\xed" in wire and _SURROGATE.search(wire) is not None:  # the byte first: memchr
        return dumps(_response_json(result))
    payload = _response_json(result)
    keys = list(payload)
    at = keys.index("request")
    head = {k: payload[k] for k in keys[:at]}
    tail = {k: payload[k] for k in keys[at + 1 :]}
    if not head or not tail:
        return dumps(payload)
    return b"".join((dumps(head)[:-1], b',"request":', wire, b",", dumps(tail)[1:]))


def _cancelled(what: str) -> _Outcome:
    """What a build stopped at a checkpoint answers (nobody reads it: the caller was
    answered 504 when the time bound passed)."""
    return _Outcome.failed(ApiError(504, f"{what}.timeout", f"the {what} was stopped"))


def _engine_error(exc: KiloRulesError, what: str) -> ApiError:
    """The answer to an error of the store or the engine: 503 while no revision is served,
    422 for a session the request holds that the engine cannot read, and 500 for anything
    else: the policy served failed while it was applied (``policy.apply-failed``: an
    expression of the compiled plan raised, a rule contradicted itself) or could not be
    compiled for the model (``policy.failed``). Those are the operator's to fix; a 4xx would
    tell the caller to change a request that is not at fault."""
    first = exc.diagnostic
    if isinstance(exc, StoreError) and first.code in ("store.not-ready", "store.closed"):
        return ApiError(503, first.code, first.message, exc.diagnostics)
    if isinstance(exc, SessionError):
        return ApiError(422, first.code, first.message, exc.diagnostics)
    if what == "build":
        log.warning("the policy failed while building a request: %s", first)
        return ApiError(
            500,
            "policy.apply-failed",
            f"the policy failed while building this request: {first.message}",
            exc.diagnostics,
        )
    return ApiError(
        500, "policy.failed", f"the policy could not {what}: {first.message}", exc.diagnostics
    )


def _unacceptable(result: StepResult, body: Body) -> list[Diagnostic]:
    """The acceptance rules (``kilo_rules.engine.providers.acceptance``) the built request breaks,
    as diagnostics located at the request's session: a body the provider would refuse is
    not an answer to give as 200. The window rule is left to ``fits``."""
    try:
        found = check_body(result.request, result.provider, BodyContext(result.model_request.model))
    except CatalogError:  # a wire API without acceptance rules has nothing to break
        return []
    if not found:
        return []
    where = body.locate([("session",)])[("session",)]
    return [
        Diagnostic(
            f"acceptance.{v.rule}",
            f"the {result.provider} request built from this session breaks the rule "
            f"{v.rule} at {v.path}: {v.message}",
            where,
            details={"path": ["session"], "rule": v.rule, "body_path": v.path},
            hint="the provider would refuse this request; fix the session (its turns, "
            "its tool calls and results), or the policy if it made the body so",
        )
        for v in found
    ]


def _known_keys(body: Body, known: set[str]) -> None:
    extra = [k for k in body.data if k not in known]
    if extra:
        path = (extra[0],)
        raise _at(
            body,
            path,
            "request.invalid",
            f"{extra[0]}: unknown field (the body holds {', '.join(sorted(known))})",
        )


def _missing(body: Body, key: str) -> ApiError:
    return _at(body, (), "request.invalid", f"{key}: field required")


def _at(body: Body, path: tuple[str | int, ...], code: str, message: str) -> ApiError:
    where = body.locate([path])[path]
    return ApiError(
        422, code, message, [Diagnostic(code, message, where, details={"path": list(path)})]
    )


def _catalog_error(
    exc: CatalogError, body: Body | None = None, at: tuple[str | int, ...] = ("model",)
) -> ApiError:
    diags = body.relocate(exc.diagnostics, at) if body is not None else list(exc.diagnostics)
    first = diags[0]
    status = 404 if first.code == "model.unknown" else 422
    message = first.message + (f"; {first.hint}" if first.hint and status == 404 else "")
    return ApiError(status, first.code, message, diags)


def _within(diagnostic: Diagnostic, root: Path) -> Diagnostic:
    """``diagnostic`` with the temporary directory taken out of its file, message and hint
    (the client sent texts, not files: it knows them as policy.yaml and routes.yaml)."""
    prefix = str(root) + "/"
    resolved = str(root.resolve()) + "/"

    def clean(text: str) -> str:
        return text.replace(resolved, "").replace(prefix, "")

    loc = diagnostic.location
    return Diagnostic(
        diagnostic.code,
        clean(diagnostic.message),
        Location(clean(loc.file), loc.line, loc.col, loc.end_line, loc.end_col),
        details={k: clean(v) if isinstance(v, str) else v for k, v in diagnostic.details.items()},
        hint=clean(diagnostic.hint) if diagnostic.hint else None,
        severity=diagnostic.severity,
    )


#: The files a check request sends (its texts, as written to the temporary directory).
_SENT = frozenset({"policy.yaml", "routes.yaml"})
#: Where a diagnostic about a file the request did not send is said to be.
NOT_SENT = "<not sent>"


def _sent_only(diagnostic: Diagnostic) -> Diagnostic:
    """``diagnostic`` if it is about a text the caller sent (or a bundled policy, which
    ships with kilo-rules); else its code alone, at :data:`NOT_SENT`. A policy may extend
    or read files under the operator's read roots, and a diagnostic about such a file
    quotes it (a key, a value, a line, the allowed keys next to it, its path): a caller
    learns that the file has a problem, never what the file holds."""
    file = diagnostic.location.file
    if file in _SENT or _is_bundled(file):
        return diagnostic
    message = (
        "a file the request did not send (one the policy extends or reads on the "
        "sidecar's host) has a problem; its text is not shown to callers"
    )
    return Diagnostic(
        diagnostic.code,
        message,
        Location(NOT_SENT, 1, 1),
        hint="run kilo-rules check on the sidecar's host to see it",
        severity=diagnostic.severity,
    )


def _is_bundled(file: str) -> bool:
    try:
        return Path(file).resolve().is_relative_to(bundled_root().resolve())
    except (OSError, ValueError):
        return False


# -- the app ----------------------------------------------------------------------------------


def create_app(
    store: PolicyStore,
    *,
    decision_log: Path | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    build_timeout: float = DEFAULT_BUILD_TIMEOUT,
    max_concurrent_builds: int = DEFAULT_MAX_CONCURRENT_BUILDS,
    workspace_roots: tuple[Path, ...] = (),
    tokens: Iterable[str] = (),
    no_auth: bool = False,
    allowed_hosts: Sequence[str] | None = None,
    open_probes: bool = False,
    cors_origins: Sequence[str] = (),
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    metrics: Metrics | None = None,
    on_model: Callable[[str], None] | None = None,
) -> FastAPI:
    """The sidecar over ``store``.

    ``decision_log``: a file to append one JSON line per build to. ``max_body_bytes``: the
    largest body accepted (413 above it). ``build_timeout``: seconds a build or check may
    take, waiting for a worker included (504 past it). ``max_concurrent_builds``: worker
    threads building at once. ``workspace_roots``: directories a request's workspace may
    name, where instruction files are discovered (none: a request naming a workspace is
    refused, and steps run in the sidecar's working directory).

    ``tokens``: the bearer tokens callers must present (kept as sha256 digests only); with
    none, ``no_auth=True`` must say that anyone who reaches the socket may call.
    ``allowed_hosts``: the ``Host`` values answered (default: localhost, 127.0.0.1 and
    [::1], any port; ``"*"``: any). ``open_probes``: /healthz, /readyz and /metrics answer
    without a token. ``cors_origins``: browser origins allowed to call (default: none).
    ``body_timeout``: seconds the whole body may take to arrive (408 past it).

    ``metrics``: where the app counts (default: a registry of its own); given, swaps and
    rejected revisions are the caller's to count, as ``serve --workers`` counts them in
    its supervisor. ``on_model``: told the catalog id of each model built for, once.

    The app counts swaps and rejected revisions through ``store.add_listener``; starting
    and closing the store is left to the caller."""
    if min(max_body_bytes, build_timeout, max_concurrent_builds, body_timeout) <= 0:
        raise ValueError(
            "max_body_bytes, build_timeout, max_concurrent_builds and body_timeout must be > 0"
        )
    tokens = tuple(tokens)
    if tokens and no_auth:
        raise ValueError("tokens and no_auth=True contradict each other")
    if not tokens and not no_auth:
        raise ValueError(
            "no token given: pass tokens=, or no_auth=True to let anyone who reaches the "
            "socket call the sidecar"
        )
    options: dict[str, Any] = {
        "allowed_hosts": allowed_hosts,
        "open_probes": open_probes,
        "cors_origins": cors_origins,
    }
    access = Access.without_auth(**options) if no_auth else Access.with_tokens(tokens, **options)
    state = _Sidecar(
        store,
        max_body_bytes=max_body_bytes,
        build_timeout=build_timeout,
        max_concurrent_builds=max_concurrent_builds,
        body_timeout=body_timeout,
        workspace_roots=tuple(Path(r).resolve() for r in workspace_roots),
        decision_log=DecisionLog(decision_log) if decision_log is not None else None,
        access=access,
        metrics=metrics if metrics is not None else Metrics(),
        on_model=on_model,
    )
    if metrics is None:
        # A revision refused while the store first loaded (before this app) counts too: a
        # sidecar that started on a bad revision must not show none.
        state.metrics.rejected.inc(store.stats().rejected)
        store.add_listener(state.on_reload)
    return _app(state)


def _app(state: _Sidecar) -> FastAPI:
    app = FastAPI(
        title="kilo-rules sidecar",
        version=_API_VERSION,
        description=_DESCRIPTION,
        docs_url=None,  # the interactive pages load scripts from a CDN; the document is enough
        redoc_url=None,
    )
    app.state.sidecar = state
    app.add_middleware(
        BodyLimit,
        max_bytes=state.max_body_bytes,
        timeout=state.body_timeout,
        on_refused=state.refused,
    )
    if state.access is not None:
        # Added last, so it runs first: nothing is read before the caller is known.
        app.add_middleware(Guard, access=state.access)
        if state.access.cors_origins:
            app.add_middleware(
                CORSMiddleware,
                allow_origins=list(state.access.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type"],
                expose_headers=["server-timing"],
                max_age=600,
            )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "http.not-found", 405: "http.method-not-allowed"}.get(
            exc.status_code, f"http.{exc.status_code}"
        )
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid_query(request: Request, exc: RequestValidationError) -> Response:
        diags = []
        for e in list(exc.errors())[:20]:
            where = [p for p in e.get("loc", ()) if isinstance(p, str | int)]
            message = f"{'.'.join(str(p) for p in where)}: {e.get('msg', 'invalid')}"
            diags.append(
                Diagnostic(
                    "request.invalid", message, Location(REQUEST, 1, 1), details={"path": where}
                )
            )
        first = diags[0].message if diags else "invalid request"
        return _error(422, "request.invalid", first, diags)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return _error(500, "internal", "internal error")

    @app.post(
        "/v1/build",
        operation_id="build",
        summary="Build the request of the next step of a session",
        description="The provider's wire JSON for the next step of `session` with `model`, "
        "the decisions that shaped it and the mutations to persist, all from one policy "
        "revision, which the response names.",
        response_model=BuildResponse,
        responses=_responses(
            "The request, the decisions and the revision.",
            *(401, 404, 408, 413, 415, 421, 422, 500, 503, 504),
        ),
        openapi_extra=_json_body(BuildRequest, "A Session v1 document, a model, a step."),
    )
    async def build(request: Request) -> Response:
        started = time.perf_counter()
        raw = await request.body()
        outcome = await state.off_loop(lambda: state.build(raw), "build")
        seconds = time.perf_counter() - started
        await state.record(outcome, seconds)
        # What the build cost here, apart from the network (Server-Timing, in ms).
        timing = {**outcome.headers, "server-timing": f"build;dur={seconds * 1000:.1f}"}
        return Response(outcome.body, status_code=outcome.status, media_type=_JSON, headers=timing)

    @app.post(
        "/v1/check",
        operation_id="check",
        summary="Check a policy and/or a routes file",
        description="Every diagnostic `kilo-rules check` reports for the texts given "
        "(written to a fresh temporary directory as policy.yaml and routes.yaml). The "
        "answer is 200 whatever the texts hold; `ok` says whether they are free of errors.",
        response_model=CheckResponse,
        responses=_responses(
            "The diagnostics found.", *(401, 404, 408, 413, 415, 421, 422, 500, 503, 504)
        ),
        openapi_extra=_json_body(CheckRequest, "The texts to check."),
    )
    async def check(request: Request) -> Response:
        raw = await request.body()
        outcome = await state.off_loop(lambda: state.check(raw), "check")
        return Response(
            outcome.body, status_code=outcome.status, media_type=_JSON, headers=outcome.headers
        )

    @app.get(
        "/v1/plan",
        operation_id="plan",
        summary="The compiled plan of a model",
        description="The plan the current revision compiles for `model` (what "
        "`kilo-rules plan --format json` prints), and the revision.",
        response_model=PlanResponse,
        responses=_responses("The plan and its revision.", 401, 404, 421, 422, 500, 503, 504),
    )
    async def plan(
        model: Annotated[str, Query(min_length=1, max_length=256, description="Catalog id.")],
    ) -> Response:
        outcome = await state.off_loop(lambda: state.plan(model), "plan")
        return Response(
            outcome.body, status_code=outcome.status, media_type=_JSON, headers=outcome.headers
        )

    @app.get(
        "/healthz",
        operation_id="health",
        summary="The process is up",
        response_model=HealthResponse,
        responses=_responses("The process is up."),
    )
    async def healthz() -> Response:
        return Response(dumps({"status": "ok"}), media_type=_JSON)

    @app.get(
        "/readyz",
        operation_id="ready",
        summary="A good policy revision is loaded",
        description="200 with the revision served; 503 while none is loaded, with the "
        "diagnostics of why (the refused revision's, located in the source; left out for "
        "a probe opened with --open-probes that sends no token).",
        response_model=ReadyResponse,
        responses=_responses("The revision served.", 503),
    )
    async def readyz(request: Request) -> Response:
        revision = state.revision()
        if revision is None:
            refused = state.not_ready()
            if not state.shows_details(request):
                message = "no policy revision is loaded yet (GET /v1/status with a token says why)"
                return _error(503, refused.code, message)
            return _error(503, refused.code, refused.message, list(refused.diagnostics))
        return Response(dumps({"status": "ready", "revision": revision}), media_type=_JSON)

    @app.get(
        "/v1/status",
        operation_id="status",
        summary="What the sidecar serves, and why it refused a revision",
        description="The policy source, the revision served and since when, the last "
        "reload, the last revision refused (with every diagnostic, located in the source, "
        "when it was first and last refused, and how many reloads refused it), and while "
        "nothing is served the diagnostics of why. 200 whether or not a revision is served.",
        response_model=StatusResponse,
        responses=_responses("The store's status.", 401, 421),
    )
    async def status() -> Response:
        outcome = state.status()
        return Response(outcome.body, status_code=outcome.status, media_type=_JSON)

    @app.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics",
        description="Builds by status and provider, build latency, revision swaps and "
        "rejections, and the revision served, in the Prometheus text format.",
        response_class=Response,
        responses={
            200: {
                "content": {"text/plain": {"schema": {"type": "string"}}},
                "description": "The Prometheus text exposition format.",
            }
        },
    )
    async def metrics() -> Response:
        state.metrics.serving(state.revision())
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _error(status: int, code: str, message: str, diags: list[Diagnostic] | None = None) -> Response:
    return Response(error_bytes(code, message, diags or ()), status_code=status, media_type=_JSON)


def _document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, with the request bodies the routes read themselves."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    _, extra = models_json_schema(
        [(BuildRequest, "validation"), (CheckRequest, "validation")],
        ref_template="#/components/schemas/{model}",
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in extra.get("$defs", {}).items():
        if name in schemas and schemas[name] != schema:
            raise RuntimeError(f"two OpenAPI schemas named {name}")
        schemas[name] = schema
    doc["components"]["schemas"] = dict(sorted(schemas.items()))
    # Every operation takes a bearer token (the probes may be opened by the operator).
    doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    doc["security"] = [{"bearer": []}]
    return doc


def openapi_document() -> dict[str, Any]:
    """The sidecar's OpenAPI document (``schemas/openapi.json``), without a store."""
    return _app(_Sidecar(None)).openapi()
