"""PolicyStore: the policies a long-running process serves, swapped whole when they change.

A store serves one *revision* at a time: a policy tree (``routes.yaml`` at its root, the
policies it routes to and every file beside them) named by its content hash, the revision a
bundle's manifest carries (``sha256:...``,
:func:`kilo_rules.engine.formats.bundle.directory_revision`). The tree comes from one source: a
directory (watched for changes), a bundle file, or a bundle on an HTTP server (polled with
``If-None-Match``, the last good one kept on disk).

A reload builds the next revision completely before anyone can see it:

1. the source's files are copied, or the bundle verified and extracted, into a directory of
   the store's own that nothing else writes, so a source rewritten mid-reload cannot change
   what is checked or compiled; that directory is what the sandbox lets policies read;
2. the routes file and every policy it names pass the checks ``kilo-rules check`` runs;
3. the routed policy of every model in use (those asked for so far, and the preloaded ones)
   compiles.

Only then is it swapped in, by replacing one reference. A revision that fails anywhere is
rejected with its diagnostics and the one before keeps serving; an unchanged hash is not
compiled again. A step takes one revision for its whole length, so a step in flight during
a swap finishes on the plan it started with; a revision's directory is removed once it is
neither current nor held by a step.

This is OPA's bundle service, applied to context policies: a content-addressed revision,
activated only once it compiles, polled with ETags and exponential backoff, the last good
bundle persisted for a cold start while the server is down (docs/store.md).

Libraries where they serve: the poller's backoff and a directory re-read while it changes
go through the project's one retry policy (:mod:`kilo_rules.engine.base.retry`, on
tenacity), so a reload run under a cancelled token stops between attempts. A watched
directory is watched by watchfiles' file events. Its polling mode is not used: it compares
modification times to the second, so a file rewritten within a second of the write before,
at the same size, would go unseen; where events fail (or ``WATCHFILES_FORCE_POLLING`` is
set), the store's own poller compares times to the nanosecond, with sizes, inodes and link
targets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
import random
import re
import shutil
import stat
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Literal

import httpx
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kilo_rules.engine.base import safefs, sandbox
from kilo_rules.engine.base.cancel import CancelToken, cancellable
from kilo_rules.engine.base.errors import (
    CancellationError,
    CatalogError,
    Diagnostic,
    KiloRulesError,
    Location,
    ModelUnservableError,
    NetworkError,
    PathAliases,
    StoreError,
)
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.base.net import NetClient, NetworkSettings, network_settings
from kilo_rules.engine.base.retry import Backoff, RetryState, retrying
from kilo_rules.engine.compiler.compile import CACHE_SIZE, Compiler
from kilo_rules.engine.compiler.plan import Plan
from kilo_rules.engine.formats.bundle import (
    MAX_BUNDLE_BYTES,
    MAX_FILE_BYTES,
    Manifest,
    directory_revision,
    extract_bundle,
)
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog
from kilo_rules.engine.formats.session import Message, Session, TextPart, ToolDefinition, ToolPart
from kilo_rules.engine.frontend.resolve import ResolvedPolicy, bundled_root
from kilo_rules.engine.frontend.routes import ROUTES_FILE, RouteChoice, Routes, load_routes
from kilo_rules.engine.runtime.apply import StepResult, apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.tools.checking.check import check_paths

__all__ = [
    "PolicyStore",
    "Rejection",
    "ReloadResult",
    "StoreError",
    "StoreSettings",
    "StoreSnapshot",
    "StoreStats",
    "StoreStatus",
    "backoff_delay",
    "default_cache_dir",
]

_log = logging.getLogger(__name__)

SourceKind = Literal["directory", "bundle", "url", "bundled"]

#: Times a directory is read when it changes between being hashed and being copied.
COPY_ATTEMPTS = 3
#: Waits between those reads (seconds: the first step and the cap), for the writer to
#: finish; drawn with equal jitter by the shared retry policy.
_COPY_BACKOFF = Backoff(0.02, 0.2, "equal")
#: Rounds of compiling models that were first asked for while a reload was compiling.
_MODEL_ROUNDS = 3
#: Seconds one model's canary request may take before the revision is refused: a policy
#: that makes a short session's request that slow would time its clients out.
CANARY_SECONDS = 10.0
#: Compile diagnostics kept in the details of a ``model.unservable`` error.
_MAX_CAUSES = 20
#: Largest public key file read (an Ed25519 PEM is about 113 bytes).
_MAX_KEY_BYTES = 64 * 1024
#: Largest ``.json`` note kept beside a cached bundle.
_MAX_META_BYTES = 64 * 1024
#: Refused revisions remembered until the source serves a good one again: one offered again
#: (a watched directory re-checked, a bundle downloaded again) is not a new rejection.
_MAX_REFUSED = 64
# An entity tag as RFC 9110 writes it (optionally weak), or the bare token some servers
# send, within a sane length: it goes back in a header, so only visible ASCII is kept.
_ETAG = re.compile(r'(W/)?"[\x21\x23-\x7e]{0,1000}"|[\x21\x23-\x2b\x2d-\x7e]{1,1000}')

#: Entries looked at when polling a directory's modification times.
_MAX_STAMP_ENTRIES = 20_000
#: What WATCHFILES_FORCE_POLLING may say to mean "no" (as watchfiles reads it).
_NOT_FORCED = frozenset({"false", "disable", "disabled"})

_STORE_AT = Location("<store>", 1, 1)
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in opens, it does not block
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def default_cache_dir() -> Path:
    """Where the last good remote bundle is kept by default: ``$XDG_CACHE_HOME/kilo-rules/
    bundles`` (``~/.cache/kilo-rules/bundles``), or a per-user directory under the system's
    temporary directory when there is no home."""
    base = os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "kilo-rules" / "bundles"
    try:
        return Path.home() / ".cache" / "kilo-rules" / "bundles"
    except RuntimeError:  # no HOME and no passwd entry (a bare container)
        uid = getattr(os, "getuid", lambda: 0)()
        return Path(tempfile.gettempdir()) / f"kilo-rules-{uid}" / "bundles"


def _split(value: Any) -> Any:
    # From the environment a list is written "a, b" (or as a JSON array).
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [v.strip() for v in text.split(",") if v.strip()]
    return value


class StoreSettings(BaseSettings):
    """How a :class:`PolicyStore` is fed (``KILO_RULES_STORE_*`` environment variables).

    Exactly one source is given to :meth:`PolicyStore.from_settings`: ``directory``,
    ``bundle`` or ``url``. ``preload`` is written comma-separated or as a JSON array."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_STORE_", extra="ignore", frozen=True)

    directory: Path | None = Field(
        None, description="A policy directory (routes.yaml at its root), watched for changes."
    )
    bundle: Path | None = Field(None, description="A bundle file (kilo-rules bundle build).")
    url: str | None = Field(None, description="The URL of a bundle, polled for a new one.")
    public_key: Path | None = Field(
        None,
        description="An Ed25519 public key (PEM). When set, a bundle that is unsigned, "
        "signed with another key or changed after signing is refused.",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where the last good remote bundle and its ETag are kept, to start from "
        "while the server is down.",
    )
    work_dir: Path | None = Field(
        None,
        description="Where revisions are unpacked, in a private directory made under it "
        "(default: the system's temporary directory).",
    )
    poll_seconds: float = Field(
        10.0, gt=0, description="Seconds between polls of a bundle URL or file."
    )
    poll_max_seconds: float = Field(
        300.0,
        gt=0,
        description="Longest wait between polls after failures (exponential backoff with "
        "full jitter).",
    )
    debounce_seconds: float = Field(
        0.2,
        ge=0,
        description="A watched directory reloads once it has been quiet this long.",
    )
    preload: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Catalog model ids compiled at every reload, besides the models in use.",
    )
    max_models: int = Field(
        256,
        ge=1,
        description="Models remembered as in use (compiled at every reload); the least "
        "recently used is forgotten first.",
    )
    allow_private: bool = Field(
        False,
        description="The bundle URL's host may resolve to a private or loopback address "
        "(an internal bundle server); that host only.",
    )
    allow_rollback: bool = Field(
        False,
        description="Accept a bundle whose revision number is not above the one served (or "
        "that has none after a numbered one was): going back to an older release on purpose. "
        "Without it such a bundle is refused (bundle.rollback).",
    )

    @field_validator("preload", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split(value)

    @model_validator(mode="after")
    def _one_source(self) -> StoreSettings:
        given = [n for n in ("directory", "bundle", "url") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one source, not {' and '.join(given)}")
        if self.poll_max_seconds < self.poll_seconds:
            raise ValueError("poll_max_seconds must be at least poll_seconds")
        return self

    def source(self) -> SourceKind | None:
        """Which source these settings name, or None."""
        if self.directory is not None:
            return "directory"
        if self.bundle is not None:
            return "bundle"
        return "url" if self.url is not None else None


@dataclass(frozen=True)
class ReloadResult:
    """What one reload attempt did.

    ``revision`` is the revision served after it ("" while none is) and ``previous`` the
    one served before; ``candidate`` the revision the source offered, when it got that far.
    ``reason`` starts with ``new revision``, ``unchanged``, ``not modified (304)``,
    ``rejected:`` or ``source unavailable:``. ``diagnostics`` are the checks' and the
    compiler's (warnings too) for a new or rejected revision. ``repeated`` marks a
    rejection of what was refused before and offered again since (the same files
    re-checked): it is not counted, nor logged, a second time."""

    swapped: bool
    revision: str
    previous: str | None
    diagnostics: tuple[Diagnostic, ...]
    reason: str
    candidate: str | None = None
    repeated: bool = False

    @property
    def rejected(self) -> bool:
        """The source offered a revision and it failed its checks."""
        return self.reason.startswith("rejected")

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """Diagnostics of severity error."""
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object (for logs and the sidecar)."""
        return {
            "swapped": self.swapped,
            "revision": self.revision,
            "previous": self.previous,
            "candidate": self.candidate,
            "reason": self.reason,
            "repeated": self.repeated,
            "diagnostics": [d.to_json() for d in self.diagnostics],
        }


def _iso(when: float | None) -> str | None:
    """``when`` (Unix seconds) as the decision log writes times: UTC, milliseconds, ``Z``."""
    if when is None:
        return None
    text = datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


@dataclass(frozen=True)
class Rejection:
    """A revision the store refused, kept for the operator asking why.

    ``candidate`` is the revision the source offered (None when it was refused before it
    had one, such as a bundle whose signature does not verify), ``reason`` the result's
    (``rejected: file:line:col: message``) and ``diagnostics`` every diagnostic, located
    in the source. ``first_at`` and ``last_at`` (Unix seconds) say when it was first and
    last refused, ``attempts`` how many reloads refused it: a watched directory is
    re-checked, and a bundle may be downloaded again, until the files change, and each of
    those is the same rejection."""

    candidate: str | None
    reason: str
    diagnostics: tuple[Diagnostic, ...]
    first_at: float
    last_at: float
    attempts: int = 1

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """Diagnostics of severity error."""
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def to_json(self) -> dict[str, Any]:
        """The rejection as a JSON object (times as ISO 8601 UTC)."""
        return {
            "candidate": self.candidate,
            "reason": self.reason,
            "first_at": _iso(self.first_at),
            "last_at": _iso(self.last_at),
            "attempts": self.attempts,
            "diagnostics": [d.to_json() for d in self.diagnostics],
        }


@dataclass(frozen=True)
class StoreStats:
    """Counters of a store: the revision served ("" while none is), swaps, rejected
    revisions, reload attempts, attempts the source could not answer, and the reason of
    the last attempt when it failed (None once one succeeds)."""

    revision: str
    swaps: int
    rejected: int
    reloads: int
    last_error: str | None
    unavailable: int = 0

    def to_json(self) -> dict[str, Any]:
        """The counters as a JSON object."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StoreStatus:
    """What a store serves and why it serves nothing else, for an operator.

    ``source`` and ``kind`` name where revisions come from; ``revision`` is the one served
    ("" while none is) and ``swapped_at`` when it went in; ``checked_at`` and ``reason``
    describe the last reload attempt. ``rejection`` is the last revision refused (kept
    after a good one replaced it; ``rejection_pending`` says whether the source still
    offers it). ``problems`` says why nothing is served while ``ready`` is false: the
    diagnostics of the refused revision, or a ``store.unavailable`` one for a source that
    cannot be read; empty once a revision serves."""

    source: str
    kind: SourceKind
    revision: str
    ready: bool
    swapped_at: float | None
    checked_at: float | None
    reason: str | None
    rejection: Rejection | None
    rejection_pending: bool
    problems: tuple[Diagnostic, ...]
    stats: StoreStats

    def to_json(self) -> dict[str, Any]:
        """The status as a JSON object (times as ISO 8601 UTC)."""
        return {
            "ready": self.ready,
            "source": {"kind": self.kind, "location": self.source},
            "revision": self.revision or None,
            "swapped_at": _iso(self.swapped_at),
            "checked_at": _iso(self.checked_at),
            "reason": self.reason,
            "rejection": None if self.rejection is None else self.rejection.to_json(),
            "rejection_pending": self.rejection_pending,
            "problems": [d.to_json() for d in self.problems],
            "stats": self.stats.to_json(),
        }


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after ``failures`` failures in a row: exponential backoff with full
    jitter, uniform in ``[0, min(cap, base * 2**failures)]`` (``base`` after no failure),
    the shared retry policy's (:class:`kilo_rules.engine.base.retry.Backoff`)."""
    if failures <= 0:
        return base
    # The poller's first wait after a failure is already twice its interval: step n + 1.
    return Backoff(base, cap, "full").delay(failures + 1, rng.uniform)


def _pause(seconds: float) -> None:
    """The store's waits between retries (a seam: tests record them instead)."""
    time.sleep(seconds)


# -- revisions --------------------------------------------------------------------------------


#: Catalog lookups a store keeps (an id the catalog lacks raises and is not kept, so the
#: keys are the catalog's ids and api ids).
_CATALOG_CACHE_SIZE = 1024
_CatalogCache = LRUCache[str, tuple[ModelInfo, str]]


def _catalog_model(model_id: str, cache: _CatalogCache) -> tuple[ModelInfo, str]:
    def make() -> tuple[ModelInfo, str]:
        info = bundled_catalog().get(model_id)
        return info, info.model_dump_json()

    return cache.get_or(model_id, make)


def _model(model: str | ModelInfo, cache: _CatalogCache) -> tuple[ModelInfo, str]:
    """The descriptor of ``model`` and the key its plans are kept under."""
    if isinstance(model, ModelInfo):
        return model, model.model_dump_json()
    return _catalog_model(model, cache)


def _declared(routes: Routes, cache: _CatalogCache) -> list[tuple[ModelInfo, str]]:
    """The catalog models the operator's routes declare, which every revision is checked
    against whoever has asked for what: each model a route names by id (``match: {id:
    ...}``), and for every routed policy the first catalog model it serves, so that a
    policy that compiles for no model is refused before anyone asks. An id the catalog does
    not hold is left to ``check_routes``, which reports it."""
    out: dict[str, tuple[ModelInfo, str]] = {}
    for route in routes.spec.routes:
        if route.match.id is None:
            continue
        try:
            info, key = _catalog_model(route.match.id, cache)
        except KiloRulesError:
            continue
        out.setdefault(key, (info, key))
    covered: set[str | Path] = set()
    for info in bundled_catalog().models:
        ref = routes.policy_for(info).policy
        if ref not in covered:
            covered.add(ref)
            info, key = _catalog_model(info.id, cache)
            out.setdefault(key, (info, key))
    return list(out.values())


#: The session every revision builds one request of, for every model it is checked against,
#: before it may serve: a task, a tool call and its result, as every agent's first steps.
#: A policy that compiles but raises while applied (a value read per step that divides by
#: zero, a rule that contradicts itself for one model) is refused here, not by its callers.
CANARY_SESSION = Session(
    id="ses_canary",
    messages=[
        Message(
            id="msg_canary_1",
            role="user",
            created=1_700_000_000_000,
            parts=[TextPart(id="prt_canary_1", text="Run the tests and fix what fails.")],
        ),
        Message(
            id="msg_canary_2",
            role="assistant",
            created=1_700_000_001_000,
            parent_id="msg_canary_1",
            finish="tool-calls",
            parts=[
                TextPart(id="prt_canary_2", text="Running the tests first."),
                ToolPart(
                    id="prt_canary_3",
                    call_id="call_canary_1",
                    tool="bash",
                    input={"command": "pytest -q"},
                    output="1 failed, 12 passed",
                ),
            ],
        ),
    ],
    tools=[ToolDefinition(name="bash", description="Run a shell command.")],
)


def _no_fetch(url: str, timeout: float, max_bytes: int) -> str:
    # A canary reads nothing beyond the revision: an instruction URL is a warning.
    raise OSError(f"the revision check does not fetch {url}")


def _canary_failed(model: ModelInfo, rev: _Revision, exc: Exception) -> Diagnostic:
    """The diagnostic of a revision whose plan for ``model`` raised on the canary."""
    route_at = rev.routes.policy_for(model).at
    if isinstance(exc, CancellationError):
        cause, at, code = f"it took longer than {CANARY_SECONDS:g} s", route_at, "cancelled"
    elif isinstance(exc, KiloRulesError):
        cause, at, code = exc.diagnostic.message, exc.diagnostic.location, exc.diagnostic.code
    else:  # an engine bug is still this revision's refusal, never a swap
        cause, at, code = f"{type(exc).__name__}: {exc}", route_at, None
    return Diagnostic(
        "store.canary-failed",
        f"the revision compiles for {model.id} but fails building a request for it: {cause}",
        at,
        hint="the canary is a short session (a user message, a tool call and its result) "
        "built once per checked model before a swap; fix the policy for this model",
        details={"model": model.id, "cause": code},
    )


def _unservable(model: ModelInfo, diags: Sequence[Diagnostic]) -> ModelUnservableError:
    """The error of a model described inline that the revision's policy does not compile
    for: the caller's, located at the policy's first error, with every diagnostic kept."""
    first = next((d for d in diags if d.severity == "error"), diags[0])
    return ModelUnservableError(
        Diagnostic(
            "model.unservable",
            f"the policy served cannot be built for the model {model.id!r} described inline: "
            f"{first.message}",
            first.location,
            hint="describe a model this policy can serve (its window, its limits), or ask "
            "for a catalog model",
            details={"causes": [d.to_json() for d in diags[:_MAX_CAUSES]]},
        )
    )


class _Revision:
    """One built revision: its files' directory, its routes, its resolved policies and the
    plans compiled from them (by the store's compiler). Immutable but for the plan cache
    and the hold count (the store's lock guards ``holders`` and ``retired``)."""

    def __init__(
        self,
        rid: str,
        root: Path,
        routes: Routes,
        policies: Mapping[str | Path, ResolvedPolicy],
        max_models: int,
        aliases: Mapping[str, str],
        compiler: Compiler,
    ) -> None:
        self.id = rid
        self.compiler = compiler
        self.root = root
        self.aliases = dict(aliases)
        self.names = _Aliases(aliases)
        self.routes = routes
        self.policies = dict(policies)
        self.plans: LRUCache[str, Plan] = LRUCache(max_models)
        # Plans of models a caller described inline: cached apart, so that a caller sending
        # new descriptors cannot push the operator's models out of ``plans``.
        self.inline: LRUCache[str, Plan] = LRUCache(max_models)
        self.holders = 0
        self.retired = False
        self._compiling = threading.Lock()

    def compile(self, model: ModelInfo) -> Plan:
        """The routed policy of ``model`` compiled for it (not cached)."""
        choice = self.routes.policy_for(model)
        policy = self.policies.get(choice.policy)
        if policy is None:  # policies() lists every ref policy_for can return
            raise StoreError(
                Diagnostic(
                    "store.unrouted",
                    f"route {choice.route!r} names a policy the revision did not load",
                    choice.at,
                )
            )
        # Located in the source people know, not the store's private copy: the plan's
        # values and layers, and every decision a step cites from it.
        return self.names.plan(self.compiler.compile(policy, model))

    def plan(self, key: str, model: ModelInfo, *, inline: bool = False) -> Plan:
        """The plan of ``model``, compiled once per revision (``inline``: a model a caller
        described, kept in the cache of its own)."""
        cache = self.inline if inline else self.plans
        hit = cache.get(key)
        if hit is not None:
            return hit
        with self._compiling:  # one compile per model, however many steps ask at once
            hit = cache.get(key)
            if hit is None:
                hit = self.compile(model)
                cache.put(key, hit)
            return hit


class StoreSnapshot:
    """One revision of a store, held for as long as the ``with`` block of
    :meth:`PolicyStore.snapshot` lasts: everything asked of it answers from that revision,
    whatever reloads meanwhile."""

    def __init__(self, store: PolicyStore, revision: _Revision) -> None:
        self._store = store
        self._rev = revision

    @property
    def revision(self) -> str:
        """The revision id (``sha256:...``)."""
        return self._rev.id

    @property
    def routes(self) -> Routes:
        """The revision's routes."""
        return self._rev.routes

    def route_for(self, model: str | ModelInfo) -> RouteChoice:
        """Which route and policy serve ``model`` in this revision."""
        return self._rev.routes.policy_for(_model(model, self._store._catalog)[0])

    def plan_for(self, model: str | ModelInfo) -> Plan:
        """The plan of ``model`` in this revision (compiled once, then cached)."""
        return self._store._plan(self._rev, model)

    def apply(
        self, session: Session, model: str | ModelInfo, step: StepInput | None = None
    ) -> StepResult:
        """One step of ``session`` for ``model`` on this revision."""
        plan = self._store._plan(self._rev, model)
        try:
            result = apply_plan(plan, session, step)
        except CancellationError:
            raise
        except KiloRulesError as exc:
            # An expression compiled from the revision's files names them where it fails.
            raise self._rev.names.error(exc) from None
        return dataclasses.replace(result, revision=self._rev.id)


# -- sources ----------------------------------------------------------------------------------


class _UnavailableError(Exception):
    """The source cannot be read now (a missing directory, a server that is down)."""


@dataclass(frozen=True)
class _Staged:
    """What a source put in place: a manifest when files were staged; otherwise why none
    were (``not modified (304)``). ``note`` tells where staged files came from."""

    manifest: Manifest | None
    reason: str = ""
    note: str = ""


class _Source(ABC):
    kind: SourceKind
    label: str

    @abstractmethod
    def stage(self, dest: Path, current: str | None) -> _Staged:
        """Put the source's files under ``dest`` (which does not exist yet), unless they are
        known to be those of ``current``. Raises _UnavailableError, or KiloRulesError for files
        that are refused."""

    def settle(self, accepted: bool, revision: str | None) -> None:  # noqa: B027 - an optional hook
        """Told whether what the last :meth:`stage` put in place was accepted."""

    def fallback(self, dest: Path, why: str) -> _Staged | None:
        """The last good copy to start from while the store has no revision, or None."""
        return None

    def changed(self) -> bool:
        """Whether the source may have changed since the last stage (pollers ask)."""
        return True

    def aliases(self, dest: Path) -> dict[str, str]:
        """Paths in diagnostics → how people know them (a revision's directory → the
        source)."""
        return {str(dest): self.label}


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file at ``path`` (at most ``limit``), or None when it is not
    one any more (gone, swapped for a link or a FIFO, grown past the limit)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, _NEW_FLAGS, 0o644)
    try:
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.write(data)
    finally:
        os.close(fd)


class _ChangedError(Exception):
    """The directory changed between being hashed and being copied: read it again."""


class _DirectorySource(_Source):
    kind: SourceKind = "directory"

    def __init__(self, root: Path, rng: random.Random | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self.label = str(self.root)
        self._rng = rng if rng is not None else random.Random()

    def stage(self, dest: Path, current: str | None) -> _Staged:
        if not self.root.is_dir():
            raise _UnavailableError(f"{self.root} is not a directory")

        def once() -> _Staged:
            # The files are what the hash says, or the copy is made again: a directory
            # rewritten while it is read never yields a revision whose id lies.
            manifest = directory_revision(self.root)
            if manifest.revision == current:
                return _Staged(None, "unchanged")
            if self._copy(manifest, dest):
                return _Staged(manifest)
            shutil.rmtree(dest, ignore_errors=True)
            raise _ChangedError

        def give_up(state: RetryState, deadline: bool) -> _Staged:
            raise _UnavailableError(f"{self.root} kept changing while it was read")

        again = retrying(
            attempts=COPY_ATTEMPTS,
            wait=_COPY_BACKOFF.wait(self._rng.uniform),
            retry_if=lambda exc: isinstance(exc, _ChangedError),
            give_up=give_up,
            sleep=_pause,
        )
        staged: _Staged = again(once)
        return staged

    def _copy(self, manifest: Manifest, dest: Path) -> bool:
        dest.mkdir(mode=0o700)
        made: set[Path] = set()
        for rel, digest in manifest.files.items():
            # directory_revision refused names with "..", dot-files or absolute parts.
            data = _read_regular(self.root / rel, MAX_FILE_BYTES)
            if data is None or hashlib.sha256(data).hexdigest() != digest:
                return False
            target = dest / rel
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            _write_new(target, data)
        return True


#: The routes of the bundled policies served alone: every model on kilo-default.
BUNDLED_ROUTES = "version: 1\nroutes: []\ndefault: kilo-default\n"


def _bundled_routes(default: str) -> str:
    return BUNDLED_ROUTES.replace("kilo-default", default)


class _BundledSource(_Source):
    """The policies shipped with kilo-rules, every model routed to ``kilo-default``: what
    a store serves when the operator named nothing else."""

    kind: SourceKind = "bundled"
    label = "<bundled>"

    def __init__(self, default: str = "kilo-default") -> None:
        self.default = default

    def stage(self, dest: Path, current: str | None) -> _Staged:
        dest.mkdir(mode=0o700)
        _write_new(dest / ROUTES_FILE, _bundled_routes(self.default).encode("utf-8"))
        return _Staged(directory_revision(dest))

    def changed(self) -> bool:
        return False  # the package's own files do not change under a running process


def _file_stamp(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _BundleSource(_Source):
    kind: SourceKind = "bundle"

    def __init__(self, path: Path, public_key: bytes | None) -> None:
        self.path = Path(path).expanduser().absolute()
        self.label = str(self.path)
        self.public_key = public_key
        self._attempted: tuple[int, int, int, int] | None = None
        self._pending: tuple[int, int, int, int] | None = None
        self._accepted: tuple[int, int, int, int] | None = None

    def stage(self, dest: Path, current: str | None) -> _Staged:
        stamp = _file_stamp(self.path)
        self._attempted = stamp
        if stamp is None:
            raise _UnavailableError(f"cannot read {self.path}")
        if current is not None and stamp == self._accepted:
            return _Staged(None, "unchanged")
        self._pending = stamp
        return _Staged(extract_bundle(self.path, dest, self.public_key))

    def settle(self, accepted: bool, revision: str | None) -> None:
        if accepted:
            self._accepted = self._pending

    def changed(self) -> bool:
        return _file_stamp(self.path) != self._attempted

    def aliases(self, dest: Path) -> dict[str, str]:
        return {str(dest): f"{self.label}!"}


def _clean_etag(value: str | None) -> str | None:
    return value if value is not None and _ETAG.fullmatch(value) else None


class _RemoteSource(_Source):
    kind: SourceKind = "url"

    def __init__(
        self, url: str, cache_dir: Path, public_key: bytes | None, client: NetClient
    ) -> None:
        self.url = url
        self.label = url
        self.public_key = public_key
        self.client = client
        self.cache_dir = Path(cache_dir).expanduser().absolute()
        # One file per URL, so one cache directory can serve several stores.
        name = hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]
        self.cached = self.cache_dir / f"{name}.tar.gz"
        self.meta = self.cache_dir / f"{name}.json"
        self.download = self.cache_dir / f"{name}.download"
        self.etag = self._cached_etag()
        self._fetched: str | None = None  # the ETag of a download not yet settled
        self._downloaded = False

    def _cached_etag(self) -> str | None:
        if not self.cached.is_file():
            return None
        raw = _read_regular(self.meta, _MAX_META_BYTES)
        try:
            meta = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        if not isinstance(meta, dict) or meta.get("url") != self.url:
            return None
        etag = meta.get("etag")
        return _clean_etag(etag) if isinstance(etag, str) else None

    def stage(self, dest: Path, current: str | None) -> _Staged:
        self._downloaded = False
        headers = {"accept": "application/gzip, application/octet-stream;q=0.9, */*;q=0.1"}
        # An ETag is only worth sending when a 304 leaves something to serve.
        etag = self.etag if current is not None or self.cached.is_file() else None
        if etag is not None:
            headers["if-none-match"] = etag
        try:
            reply = self.client.request(
                "GET", self.url, headers=headers, max_bytes=MAX_BUNDLE_BYTES
            )
        except NetworkError as exc:
            raise _UnavailableError(exc.diagnostic.message) from None
        if reply.status_code == 304 and etag is not None:
            return _Staged(None, "not modified (304)")
        if reply.status_code != 200:
            raise _UnavailableError(f"{self.url}: HTTP {reply.status_code}")
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileNotFoundError):
                self.download.unlink()
            _write_new(self.download, reply.content)
        except OSError as exc:
            raise _UnavailableError(
                f"cannot write {self.download}: {exc.strerror or exc}"
            ) from None
        self._downloaded = True
        self._fetched = _clean_etag(reply.headers.get("etag"))
        return _Staged(extract_bundle(self.download, dest, self.public_key))

    def settle(self, accepted: bool, revision: str | None) -> None:
        if not self._downloaded:
            return
        self._downloaded = False
        # Remembered either way: a bundle already rejected is not downloaded again until
        # the server has another one.
        self.etag = self._fetched
        if not accepted:
            with contextlib.suppress(OSError):
                self.download.unlink()
            return
        try:
            self.download.replace(self.cached)
            meta = {"url": self.url, "etag": self._fetched, "revision": revision}
            safefs.write_atomic(self.meta, json.dumps(meta, indent=2).encode("utf-8"))
        except OSError as exc:  # the revision serves; only a cold start loses it
            _log.warning("cannot keep the bundle of %s in %s: %s", self.url, self.cache_dir, exc)

    def fallback(self, dest: Path, why: str) -> _Staged | None:
        if not self.cached.is_file():
            return None
        # Verified again, with the key in force now: the cache is only a file on disk.
        manifest = extract_bundle(self.cached, dest, self.public_key)
        return _Staged(manifest, note=f"from the cached bundle ({why})")

    def aliases(self, dest: Path) -> dict[str, str]:
        return {str(dest): f"{self.url}!", str(self.download): self.url}


class _Aliases(PathAliases):
    """The store's private paths (a revision's directory, a download) and the names people
    know them by (the watched directory, ``bundle.tar.gz!``, the URL), applied to whatever
    the store hands out: diagnostics, a plan's locations, an error raised while applying."""

    def plan(self, plan: Plan) -> Plan:
        """``plan`` with every location it reports (its values, prompt, layers, warnings,
        and what :meth:`Plan.locate` answers, which the decisions cite) in the source."""
        locate = plan._locate
        alias = self.location

        def public_locate(path: tuple[str | int, ...]) -> Location:
            return alias(locate(path))

        prompt = plan.prompt
        if prompt is not None:
            prompt = dataclasses.replace(
                prompt, file=self.text(prompt.file), location=alias(prompt.location)
            )
        return dataclasses.replace(
            plan,
            policy_file=self.text(plan.policy_file),
            values={
                k: dataclasses.replace(v, location=alias(v.location))
                for k, v in plan.values.items()
            },
            prompt=prompt,
            layers=tuple(dataclasses.replace(x, location=alias(x.location)) for x in plan.layers),
            warnings=tuple(self.diagnostic(d) for d in plan.warnings),
            _locate=public_locate,
        )


def _relabel(diags: Sequence[Diagnostic], aliases: Mapping[str, str]) -> tuple[Diagnostic, ...]:
    """``diags`` with the store's private paths shown as the source people know, each
    problem once (a policy error is met once per model compiled), sorted."""
    names = _Aliases(aliases)
    out: list[Diagnostic] = []
    seen: set[tuple[str, str, str]] = set()
    for d in diags:
        d = names.diagnostic(d)
        key = (d.code, d.message, str(d.location))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return tuple(sorted(out, key=Diagnostic.sort_key))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(text: str) -> str:
    """``text`` on one log line: a control character (a newline a policy's message quotes)
    is written as its escape, so no line of a log can be forged by a policy file."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _tree_stamp(root: Path) -> tuple[tuple[str, int, int, int, str], ...]:
    """What polling compares: every entry under ``root`` (dot-files and links included, as
    a ConfigMap volume swaps its ``..data`` link) with its times, size and link target."""
    out: list[tuple[str, int, int, int, str]] = []
    try:
        top = root.stat()
    except OSError:
        return ()
    out.append((".", top.st_mtime_ns, top.st_size, top.st_ino, ""))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)  # noqa: PTH118 - os.walk hands out strings
            try:
                st = os.lstat(path)
                link = str(Path(path).readlink()) if stat.S_ISLNK(st.st_mode) else ""
            except OSError:
                continue
            out.append((path, st.st_mtime_ns, st.st_size, st.st_ino, link))
            if len(out) >= _MAX_STAMP_ENTRIES:
                return tuple(out)
    return tuple(out)


def _read_key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    data = _read_regular(Path(path).expanduser(), _MAX_KEY_BYTES)
    if data is None:
        raise StoreError(
            Diagnostic(
                "store.public-key",
                f"cannot read the public key {str(path)!r} (a regular PEM file is expected)",
                Location(str(path), 1, 1),
            )
        )
    return data


class _RollbackGuard:
    """The revision number a bundle source last served, kept in ``path`` (beside the cached
    bundle) so that it outlives the process: a bundle is refused unless its number is above
    it, or it is that very revision again (a cold start from the cached copy). A bundle
    without a number (a version 1 manifest) counts as 0: it is accepted only while nothing
    numbered has been served."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label
        self.number, self.revision = self._load()

    def _load(self) -> tuple[int, str | None]:
        raw = _read_regular(self.path, _MAX_META_BYTES)
        try:
            data = json.loads(raw) if raw is not None else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("source") != self.label:
            return 0, None
        number, revision = data.get("revision_number"), data.get("revision")
        if type(number) is not int or number < 0 or not isinstance(revision, str):
            _log.warning("ignoring %s: not a served-revision record", self.path)
            return 0, None
        return number, revision

    def refusal(self, manifest: Manifest) -> Diagnostic | None:
        """Why ``manifest`` may not replace what was served, or None when it may."""
        number, served = manifest.revision_number, self.number
        if served == 0 or number > served:
            return None
        if number == served and manifest.revision == self.revision:
            return None
        where = manifest.where
        at = where.get("revision_number") or where.get("revision") or Location(self.label, 1, 1)
        if number == 0:
            message = (
                f"the bundle has no revision number (a version 1 manifest), and revision "
                f"number {served} ({self.revision}) has been served"
            )
        elif number == served:
            message = (
                f"revision number {number} already names {self.revision}, not "
                f"{manifest.revision}: a number names one release"
            )
        else:
            message = (
                f"revision number {number} is older than {served}, the one served "
                f"({self.revision}): a bundle replayed or rolled back is refused"
            )
        return Diagnostic(
            "bundle.rollback",
            message,
            at,
            hint="publish the release with a higher revision number (kilo-rules bundle build "
            "--revision N), or set allow_rollback (KILO_RULES_STORE_ALLOW_ROLLBACK, serve "
            "--allow-rollback) to go back on purpose",
            details={
                "revision_number": number,
                "served_number": served,
                "served_revision": self.revision,
            },
        )

    def record(self, manifest: Manifest) -> None:
        """Remember ``manifest`` as the one served, on disk too (atomically)."""
        self.number, self.revision = manifest.revision_number, manifest.revision
        data = {
            "source": self.label,
            "revision": manifest.revision,
            "revision_number": manifest.revision_number,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            safefs.write_atomic(self.path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
        except OSError as exc:
            # The revision serves; only a restart loses the number it would refuse below.
            _log.warning("cannot record the served revision in %s: %s", self.path, exc)


def _guard_path(cache_dir: Path, kind: str, label: str) -> Path:
    name = hashlib.sha256(f"{kind}\0{label}".encode()).hexdigest()[:32]
    return Path(cache_dir).expanduser().absolute() / f"{name}.served.json"


def _with_source(settings: StoreSettings | None, **source: Any) -> StoreSettings:
    base = settings if settings is not None else StoreSettings.model_construct()
    return base.model_copy(update={"directory": None, "bundle": None, "url": None, **source})


# -- the store --------------------------------------------------------------------------------


class PolicyStore:
    """The policies a long-running process serves, reloaded and swapped whole.

    Build one with :meth:`from_directory`, :meth:`from_bundle`, :meth:`from_url` or
    :meth:`from_settings`; each loads the source once before returning (a source that is
    down or refused leaves the store without a revision, and :meth:`plan_for` raises
    :class:`StoreError` ``store.not-ready`` until one passes). :meth:`start` runs the
    background watcher (a directory), or poller (a URL or bundle file); :meth:`reload`
    reloads now. Every method may be called from any thread. ``compiler`` is the store's
    own :class:`~kilo_rules.engine.compiler.compile.Compiler`: its caches are not the process's.
    """

    def __init__(
        self,
        source: _Source,
        settings: StoreSettings,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._source = source
        # A directory is the operator's own files, unnumbered; a bundle is a release that
        # must not be replaced by an older one.
        self._guard = (
            _RollbackGuard(_guard_path(settings.cache_dir, source.kind, source.label), source.label)
            if source.kind in ("bundle", "url")
            else None
        )
        # The operator's roots in force now: the background thread has a context of its own.
        self._read_roots = sandbox.operator_roots()
        # The store's own caches: its compiles and catalog lookups share nothing with the
        # process's default compiler, and go when the store does.
        self.compiler = Compiler(max(CACHE_SIZE, settings.max_models))
        self._catalog: _CatalogCache = LRUCache(_CATALOG_CACHE_SIZE)
        self._preload = [_model(m, self._catalog) for m in settings.preload]
        self._bundled = bundled_root().resolve()
        parent = settings.work_dir
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self._work = Path(tempfile.mkdtemp(prefix="kilo-rules-store-", dir=parent)).resolve()
        self._lock = threading.Lock()  # the current revision, holds, models, counters
        self._reloading = threading.Lock()  # one reload at a time
        self._current: _Revision | None = None
        self._models: LRUCache[str, ModelInfo] = LRUCache(settings.max_models)
        self._listeners: list[Callable[[ReloadResult], None]] = []
        self._counter = itertools.count(1)
        self._swaps = self._rejected = self._reloads = self._unavailable = 0
        self._failures = 0
        self._last_error: str | None = None
        self._last_result: ReloadResult | None = None
        self._swapped_at: float | None = None
        self._checked_at: float | None = None
        # What was refused since the source last offered something good, by revision (or,
        # without one, by its diagnostics): offered again, it is the same rejection.
        self._refused: LRUCache[str, Rejection] = LRUCache(_MAX_REFUSED)
        self._last_rejection: Rejection | None = None
        self._rng = rng if rng is not None else random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        try:
            self.reload()
        except BaseException:
            shutil.rmtree(self._work, ignore_errors=True)
            raise

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_directory(
        cls,
        root: str | Path,
        *,
        settings: StoreSettings | None = None,
        watch: bool = False,
    ) -> PolicyStore:
        """A store over a policy directory (``routes.yaml`` at its root). With ``watch``,
        the directory is watched (watchfiles' file events; its modification times polled
        where those fail, or ``WATCHFILES_FORCE_POLLING`` is set) and reloaded once it has
        been quiet for ``debounce_seconds``.

        Dot-files and dot-directories are not part of a revision, and symbolic links are
        neither followed nor copied (as in a bundle)."""
        s = _with_source(settings, directory=Path(root))
        store = cls(_DirectorySource(Path(root)), s)
        if watch:
            store.start()
        return store

    @classmethod
    def from_bundled(
        cls, *, settings: StoreSettings | None = None, default: str = "kilo-default"
    ) -> PolicyStore:
        """A store over the policies shipped with kilo-rules, every model on ``default``
        (``kilo-default``: the routes :data:`BUNDLED_ROUTES`): what ``kilo-rules serve``
        serves when no source is named (``kilo-rules gateway`` serves ``gateway``). Its
        source reads ``<bundled>``; it never changes, so there is nothing to watch."""
        return cls(_BundledSource(default), _with_source(settings))

    @classmethod
    def from_bundle(
        cls,
        path: str | Path,
        *,
        public_key: bytes | None = None,
        settings: StoreSettings | None = None,
    ) -> PolicyStore:
        """A store over a bundle file. With a public key (here, or ``settings.public_key``)
        a bundle that is unsigned or does not match its signature is refused. :meth:`start`
        polls the file every ``poll_seconds`` and reloads it when it is replaced."""
        s = _with_source(settings, bundle=Path(path))
        key = public_key if public_key is not None else _read_key(s.public_key)
        return cls(_BundleSource(Path(path), key), s)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cache_dir: str | Path | None = None,
        public_key: bytes | None = None,
        settings: StoreSettings | None = None,
        poll: bool = False,
        network: NetworkSettings | None = None,
    ) -> PolicyStore:
        """A store over a bundle served at ``url``, fetched through the network policy
        (``network``, default the one in force: :func:`kilo_rules.engine.base.net.use_network`) with
        a total deadline and the bundle size cap. A 304 answer to ``If-None-Match`` costs
        nothing more; the last good bundle and its ETag are kept in ``cache_dir`` (None:
        ``settings.cache_dir``, a per-user cache directory by default), and the store starts
        from them (verified again) when the server cannot be reached. With
        ``poll`` the URL is polled every ``poll_seconds``, backing off exponentially, with
        full jitter, up to ``poll_max_seconds`` while it fails."""
        s = _with_source(settings, url=url)
        if cache_dir is not None:
            s = s.model_copy(update={"cache_dir": Path(cache_dir)})
        key = public_key if public_key is not None else _read_key(s.public_key)
        host = httpx.URL(url).host
        client = NetClient(
            network if network is not None else network_settings(),
            private_hosts=(host,) if s.allow_private and host else (),
        )
        store = cls(_RemoteSource(url, s.cache_dir, key, client), s)
        if poll:
            store.start()
        return store

    @classmethod
    def from_settings(cls, settings: StoreSettings | None = None) -> PolicyStore:
        """A store over the one source ``settings`` names (default: ``StoreSettings()``,
        read from ``KILO_RULES_STORE_*``). The background thread is not started."""
        s = settings if settings is not None else StoreSettings()
        kind = s.source()
        if kind == "directory" and s.directory is not None:
            return cls.from_directory(s.directory, settings=s)
        if kind == "bundle" and s.bundle is not None:
            return cls.from_bundle(s.bundle, settings=s)
        if kind == "url" and s.url is not None:
            return cls.from_url(s.url, cache_dir=s.cache_dir, settings=s)
        raise StoreError(
            Diagnostic(
                "store.source",
                "a policy store needs a source: a directory, a bundle or a url",
                _STORE_AT,
                hint="set KILO_RULES_STORE_DIRECTORY, KILO_RULES_STORE_BUNDLE or "
                "KILO_RULES_STORE_URL",
            )
        )

    # -- reading ----------------------------------------------------------------------------

    @property
    def revision(self) -> str:
        """The revision served now (``sha256:...``), or "" while none has passed."""
        current = self._current
        return current.id if current is not None else ""

    @property
    def work_dir(self) -> Path:
        """The store's private directory: one subdirectory per revision still served or held
        by a step, removed by :meth:`close`."""
        return self._work

    @property
    def source(self) -> str:
        """The source as configured: the directory, the bundle file or the URL."""
        return self._source.label

    def _acquire(self) -> _Revision:
        with self._lock:
            if self._closed:
                raise StoreError(
                    Diagnostic("store.closed", "the policy store is closed", _STORE_AT)
                )
            current = self._current
            if current is None:
                why = f": {self._last_error}" if self._last_error else ""
                causes = self._problems(self._last_result)[:_MAX_CAUSES]
                raise StoreError(
                    Diagnostic(
                        "store.not-ready",
                        f"no policy revision has passed its checks yet{why}",
                        Location(self._source.label, 1, 1),
                        hint="the store serves nothing unchecked; fix the source, then reload",
                        details={"causes": [d.to_json() for d in causes]},
                    )
                )
            current.holders += 1
            return current

    def _release(self, rev: _Revision) -> None:
        with self._lock:
            rev.holders -= 1
            dead = rev.retired and rev.holders == 0
        if dead:
            self._remove(rev.root)

    def _remember(self, key: str, model: ModelInfo) -> None:
        with self._lock:
            self._models.put(key, model)

    def _plan(self, rev: _Revision, model: str | ModelInfo) -> Plan:
        info, key = _model(model, self._catalog)
        # A descriptor is the caller's own model: its plan is cached for this revision, but
        # it is never remembered as in use, so no caller decides which revisions the
        # operator can deploy (its compile error is that caller's answer alone).
        inline = isinstance(model, ModelInfo)
        try:
            plan = rev.plan(key, info, inline=inline)
        except KiloRulesError as exc:
            diags = _relabel(exc.diagnostics, rev.aliases)
            if inline and not isinstance(exc, CatalogError):
                raise _unservable(info, diags) from None
            raise type(exc)(list(diags)) from None
        # Only a model that compiled is in use: one that fails here must not reject every
        # revision after it.
        if not inline:
            self._remember(key, info)
        return plan

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[StoreSnapshot]:
        """Hold the current revision for the ``with`` block: a swap meanwhile changes
        nothing the snapshot answers. Raises :class:`StoreError` while there is none."""
        rev = self._acquire()
        try:
            yield StoreSnapshot(self, rev)
        finally:
            self._release(rev)

    def plan_for(self, model: str | ModelInfo) -> Plan:
        """The plan of ``model`` (a catalog id or a descriptor) under the current revision:
        its routed policy compiled for it, once per revision. Raises :class:`StoreError`
        while no revision has passed, or the compile's error for a model first asked for."""
        rev = self._acquire()
        try:
            return self._plan(rev, model)
        finally:
            self._release(rev)

    def apply(
        self, session: Session, model: str | ModelInfo, step: StepInput | None = None
    ) -> StepResult:
        """One step of ``session`` for ``model``, on one revision from start to end; the
        result's ``revision`` names it."""
        with self.snapshot() as snap:
            return snap.apply(session, model, step)

    def stats(self) -> StoreStats:
        """The store's counters now."""
        with self._lock:
            current = self._current
            return StoreStats(
                revision=current.id if current is not None else "",
                swaps=self._swaps,
                rejected=self._rejected,
                reloads=self._reloads,
                last_error=self._last_error,
                unavailable=self._unavailable,
            )

    def status(self) -> StoreStatus:
        """What the store serves, the last reload and the last rejection, and (while
        nothing is served) the diagnostics of why (:class:`StoreStatus`)."""
        stats = self.stats()
        with self._lock:
            current = self._current
            last = self._last_result
            rejection = self._last_rejection
            pending = bool(self._refused)
            swapped_at, checked_at = self._swapped_at, self._checked_at
        return StoreStatus(
            source=self._source.label,
            kind=self._source.kind,
            revision=current.id if current is not None else "",
            ready=current is not None and not self._closed,
            swapped_at=swapped_at if current is not None else None,
            checked_at=checked_at,
            reason=last.reason if last is not None else None,
            rejection=rejection,
            rejection_pending=pending,
            problems=() if current is not None else self._problems(last),
            stats=stats,
        )

    def _problems(self, last: ReloadResult | None) -> tuple[Diagnostic, ...]:
        """Why nothing is served after ``last``, as diagnostics."""
        at = Location(self._source.label, 1, 1)
        if last is not None and last.rejected and last.diagnostics:
            return last.diagnostics
        if last is not None and last.reason.startswith("source unavailable"):
            why = last.reason.partition(":")[2].strip() or "no answer"
            return (
                Diagnostic(
                    "store.unavailable",
                    f"the policy source cannot be read: {why}",
                    at,
                    hint="the store serves nothing unchecked; it retries at every poll",
                ),
            )
        reason = last.reason if last is not None else "not loaded"
        return (Diagnostic("store.not-ready", f"no policy revision is served ({reason})", at),)

    def add_listener(self, fn: Callable[[ReloadResult], None]) -> None:
        """Call ``fn`` with the result of every reload attempt from now on (from the thread
        that reloaded; an exception it raises is logged, never propagated)."""
        with self._lock:
            self._listeners.append(fn)

    # -- reloading --------------------------------------------------------------------------

    def reload(self) -> ReloadResult:
        """Load the source now and, when it holds a new revision that passes its checks and
        compiles for every model in use, swap it in (see the module docstring)."""
        with self._reloading:
            if self._closed:
                raise StoreError(
                    Diagnostic("store.closed", "the policy store is closed", _STORE_AT)
                )
            first, failed = self._attempt(self._source.stage)
            result = first or ReloadResult(False, "", None, (), "source unavailable")
            if self._current is None and not result.swapped:
                # Nothing good yet: the source's last good copy, if it kept one.
                why = result.reason
                second, _ = self._attempt(functools.partial(self._fallback, why=why))
                if second is not None:
                    result = second
            with self._lock:
                self._reloads += 1
                self._failures = self._failures + 1 if failed else 0
                ok = result.swapped or not result.reason.startswith(("rejected", "source"))
                self._last_error = None if ok else result.reason
                self._last_result = result
                self._checked_at = time.time()
                if result.swapped or result.reason == "unchanged":
                    # The source offers a good revision: a refused one offered again
                    # after this is a new edit, a new rejection.
                    self._refused.clear()
                listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(result)
            except Exception:
                _log.exception("a policy store listener failed on %s", result.reason)
        return result

    def _fallback(self, dest: Path, current: str | None, *, why: str) -> _Staged | None:
        return self._source.fallback(dest, why)

    def _attempt(
        self, stage: Callable[[Path, str | None], _Staged | None]
    ) -> tuple[ReloadResult | None, bool]:
        """One try at staging, checking and swapping in a revision: (result, whether the
        source failed to answer); no result when ``stage`` had nothing to offer."""
        current = self._current
        cur = current.id if current is not None else None
        here = cur or ""
        dest = self._work / f"r{next(self._counter):06d}"
        aliases = self._source.aliases(dest)
        kept = False
        try:
            try:
                staged = stage(dest, cur)
            except (_UnavailableError, OSError) as exc:
                # An OSError here is the store's own disk (full, unwritable): nothing was
                # learnt about the revision, so it is not rejected.
                why = str(exc) if isinstance(exc, _UnavailableError) else f"{exc.strerror or exc}"
                with self._lock:
                    self._unavailable += 1
                return ReloadResult(False, here, cur, (), f"source unavailable: {why}"), True
            except CancellationError:
                raise  # the caller gave up: nothing was learnt about the revision
            except KiloRulesError as exc:
                self._source.settle(False, None)
                return self._rejection(cur, None, _relabel(exc.diagnostics, aliases)), False
            if staged is None:
                return None, False
            if staged.manifest is None:
                return ReloadResult(False, here, cur, (), staged.reason), False
            revision = staged.manifest.revision
            if revision == cur:
                self._source.settle(True, revision)
                return ReloadResult(False, here, cur, (), "unchanged", revision), False
            root = dest.resolve()
            aliases = {**aliases, **self._source.aliases(root)}
            guard = self._guard
            refusal = None if guard is None else guard.refusal(staged.manifest)
            if refusal is not None and not self.settings.allow_rollback:
                self._source.settle(False, revision)
                return self._rejection(cur, revision, _relabel([refusal], aliases)), False
            try:
                rev, diags = self._build(root, revision, aliases)
            except CancellationError:
                raise
            except KiloRulesError as exc:
                self._source.settle(False, revision)
                return self._rejection(cur, revision, _relabel(exc.diagnostics, aliases)), False
            kept = True
            self._swap(rev)
            if guard is not None:
                guard.record(staged.manifest)
            self._source.settle(True, revision)
            reason = "new revision" + (f" {staged.note}" if staged.note else "")
            result = ReloadResult(True, revision, cur, _relabel(diags, aliases), reason, revision)
            return result, False
        finally:
            if not kept:
                self._remove(dest)

    def _rejection(
        self, cur: str | None, candidate: str | None, diags: tuple[Diagnostic, ...]
    ) -> ReloadResult:
        """The result of a refused revision: counted and logged once, however many reloads
        find it again (a watched directory re-checked, the same bundle downloaded again)."""
        first = next((d for d in diags if d.severity == "error"), diags[0] if diags else None)
        why = f"{first.location}: {first.message}" if first is not None else "refused"
        reason = f"rejected: {why}"
        key = candidate or json.dumps([[d.code, d.message, str(d.location)] for d in diags])
        now = time.time()
        with self._lock:
            seen = self._refused.get(key)
            if seen is not None:
                rejection = dataclasses.replace(
                    seen, reason=reason, diagnostics=diags, last_at=now, attempts=seen.attempts + 1
                )
            else:
                self._rejected += 1
                rejection = Rejection(candidate, reason, diags, now, now)
            self._refused.put(key, rejection)
            self._last_rejection = rejection
        if seen is None:
            self._log_rejection(rejection, cur)
        return ReloadResult(
            False, cur or "", cur, diags, reason, candidate, repeated=seen is not None
        )

    def _log_rejection(self, rejection: Rejection, cur: str | None) -> None:
        """One line saying what was refused and what serves instead, then one line per
        diagnostic (``file:line:col: severity[code]: message``)."""
        what = rejection.candidate or "a revision"
        stays = f"{cur} keeps serving" if cur else "nothing is served until one passes"
        _log.warning(
            "policy store: %s from %s rejected (%d diagnostic%s); %s",
            what,
            self._source.label,
            len(rejection.diagnostics),
            "" if len(rejection.diagnostics) == 1 else "s",
            stays,
        )
        for d in rejection.diagnostics:
            _log.warning("%s", _one_line(str(d)))

    def _wanted(
        self, declared: Sequence[tuple[ModelInfo, str]] = ()
    ) -> list[tuple[str, ModelInfo]]:
        """The models a revision must compile for: those its routes name by catalog id, the
        preloaded ones and the catalog models in use. Never a model a caller described
        inline (see :meth:`_plan`)."""
        with self._lock:
            in_use = list(self._models.items())
        named = [(k, m) for m, k in (*declared, *self._preload)]
        return list(dict([*named, *in_use]).items())

    def _build(
        self, root: Path, revision: str, aliases: Mapping[str, str]
    ) -> tuple[_Revision, list[Diagnostic]]:
        """The revision whose files are under ``root``, checked and compiled for every model
        in use; a StoreError carrying every diagnostic when anything fails."""
        roots = (*self._read_roots, root)
        routes_file = root / ROUTES_FILE
        at = Location(str(routes_file), 1, 1)
        if not routes_file.is_file():
            raise StoreError(
                Diagnostic(
                    "store.no-routes",
                    f"the revision has no {ROUTES_FILE} at its root",
                    at,
                    hint=f"a policy directory or bundle names its policies in {ROUTES_FILE}",
                )
            )
        with sandbox.allow_read(roots):
            report = check_paths([str(routes_file)])
            diags = list(report.diagnostics)
            diags.extend(Diagnostic("store.check", u, at) for u in report.usage_errors)
            if any(d.severity == "error" for d in diags):
                raise StoreError(diags)
            routes = load_routes(routes_file)
        policies: dict[str | Path, ResolvedPolicy] = {}
        errors: list[Diagnostic] = []
        for ref in routes.policies():
            if isinstance(ref, Path):
                real = Path(os.path.realpath(ref))
                if not (real.is_relative_to(root) or real.is_relative_to(self._bundled)):
                    # Its content would not be part of the revision it is served under.
                    errors.append(
                        Diagnostic(
                            "store.policy-outside",
                            f"{real} is outside the revision; a routed policy is a file of "
                            "the policy directory or bundle (or a bundled policy name)",
                            at,
                        )
                    )
                    continue
            try:
                policies[ref] = self.compiler.resolve_policy(ref, read_roots=roots)
            except KiloRulesError as exc:
                errors.extend(exc.diagnostics)
        if errors:
            raise StoreError([*errors, *diags])
        rev = _Revision(
            revision, root, routes, policies, self.settings.max_models, aliases, self.compiler
        )
        declared = _declared(routes, self._catalog)
        done: set[str] = set()
        with tempfile.TemporaryDirectory(prefix="canary-", dir=self._work) as empty:
            # The canary's workspace and home: empty, so that no instruction file of the
            # process's own directory or user decides whether a revision passes.
            step = StepInput(
                workspace=Workspace(cwd=empty, root=empty, home=empty), fetch=_no_fetch
            )
            for _ in range(_MODEL_ROUNDS):
                todo = [(k, m) for k, m in self._wanted(declared) if k not in done]
                if not todo:
                    break
                for key, model in todo:
                    done.add(key)
                    try:
                        plan = rev.compile(model)
                    except CancellationError:
                        raise
                    except KiloRulesError as exc:
                        errors.extend(exc.diagnostics)
                        continue
                    try:
                        with cancellable(CancelToken.after(CANARY_SECONDS)):
                            apply_plan(plan, CANARY_SESSION, step)
                    except Exception as exc:  # any failure refuses the revision, typed
                        errors.append(_canary_failed(model, rev, exc))
                        continue
                    rev.plans.put(key, plan)
                    diags.extend(plan.warnings)
        if errors:
            raise StoreError([*errors, *diags])
        return rev, diags

    def _swap(self, rev: _Revision) -> None:
        with self._lock:
            old = self._current
            self._current = rev
            self._swaps += 1
            self._swapped_at = time.time()
            dead = old is not None and self._retire(old)
        if dead and old is not None:
            self._remove(old.root)
        _log.info("policy store: serving %s from %s", rev.id, self._source.label)

    @staticmethod
    def _retire(rev: _Revision) -> bool:
        """Mark ``rev`` no longer current (the lock is held); True when nothing holds it."""
        rev.retired = True
        return rev.holders == 0

    def _remove(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        if self._closed:
            with contextlib.suppress(OSError):
                self._work.rmdir()  # the last revision gone: the work directory too

    # -- background -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (once): a directory is watched, a URL or a bundle
        file polled. :meth:`close` stops it."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"kilo-rules-store {self._source.label}", daemon=True
            )
            thread = self._thread
        thread.start()

    def _run(self) -> None:
        source = self._source
        if isinstance(source, _BundledSource):
            return  # the shipped policies never change: nothing to watch or poll
        if isinstance(source, _DirectorySource):
            self._watch_directory(source.root)
        elif isinstance(source, _BundleSource):
            while not self._stop.wait(self.settings.poll_seconds):
                if source.changed():
                    self._reload_logged()
        else:
            delay = self.next_delay()
            while not self._stop.wait(delay):
                delay = self.poll_once()

    def _reload_logged(self) -> None:
        try:
            self.reload()
        except StoreError:
            pass  # closed meanwhile
        except Exception:
            _log.exception("reloading the policy store from %s failed", self._source.label)
            with self._lock:
                self._failures += 1

    def next_delay(self) -> float:
        """Seconds the poller waits before its next poll: ``poll_seconds`` after a poll the
        source answered, the backoff delay (:func:`backoff_delay`) after failures."""
        with self._lock:
            failures = self._failures
        s = self.settings
        return backoff_delay(failures, s.poll_seconds, s.poll_max_seconds, self._rng)

    def poll_once(self) -> float:
        """One poll, as the background poller makes it: reload, then return the seconds to
        wait before the next (:meth:`next_delay`)."""
        self._reload_logged()
        return self.next_delay()

    def _watch_directory(self, root: Path) -> None:
        """Watch ``root`` until the store stops, reloading once it has been quiet for
        ``debounce_seconds``: by watchfiles' file events, else by :meth:`_poll_directory`
        (``WATCHFILES_FORCE_POLLING`` set, as on a volume that sends no events; events that
        fail, such as inotify's watch limit reached; a root that does not exist yet)."""
        s = self.settings
        forced = os.environ.get("WATCHFILES_FORCE_POLLING", "")
        try:
            import watchfiles
        except ImportError:  # a core dependency; a broken install still serves
            watchfiles = None  # type: ignore[assignment]
        if watchfiles is not None and (not forced or forced.lower() in _NOT_FORCED):
            quiet = max(1, int(s.debounce_seconds * 1000))
            armed = False  # the first wake-up follows the watcher's start
            reloaded = time.monotonic()
            try:
                for changes in watchfiles.watch(
                    root,
                    watch_filter=None,
                    step=quiet,
                    debounce=max(quiet * 10, 1600),
                    stop_event=self._stop,
                    rust_timeout=max(quiet, 500),
                    yield_on_timeout=True,
                    raise_interrupt=False,
                    force_polling=False,
                ):
                    if self._stop.is_set():
                        return
                    # Besides changes: once the watcher is armed (a change made before it
                    # was is otherwise missed), then every poll_seconds (a change it cannot
                    # see, such as the root's own link swapped, is still found).
                    due = time.monotonic() - reloaded >= s.poll_seconds
                    if changes or not armed or due:
                        armed = True
                        reloaded = time.monotonic()
                        self._reload_logged()
                return
            except (OSError, RuntimeError) as exc:
                if self._stop.is_set():
                    return
                _log.info("cannot watch %s (%s); polling it instead", root, exc)
        self._poll_directory(root)

    def _poll_directory(self, root: Path) -> None:
        # Not watchfiles' own polling (force_polling=True): it compares modification times
        # to the second, so a file rewritten within a second of the write before, at the
        # same size, goes unseen until the next change or poll_seconds; this compares them
        # to the nanosecond, with size, inode and link target.
        s = self.settings
        interval = max(s.debounce_seconds, 0.05)
        last = _tree_stamp(root)
        dirty = True  # a change made before the thread started
        reloaded = time.monotonic()
        while not self._stop.wait(interval):
            stamp = _tree_stamp(root)
            if stamp != last:
                last, dirty = stamp, True
                continue  # reload once it has been quiet for one interval
            if dirty or time.monotonic() - reloaded >= s.poll_seconds:
                dirty = False
                reloaded = time.monotonic()
                self._reload_logged()

    @contextlib.contextmanager
    def quiesced(self) -> Iterator[None]:
        """Hold the store still for the ``with`` block: no reload runs and no revision is
        swapped, held or released meanwhile. For forking a process that inherits the store
        (``kilo-rules serve --workers``): the child's copies of the store's locks are then
        held by the forking thread only, which releases them on leaving the block."""
        with self._reloading, self._lock:
            yield

    def close(self) -> None:
        """Stop the background thread and remove the store's revision directories (one a
        step still holds goes when the step ends). Plans already handed out keep working."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._reloading, self._lock:
            if self._closed:
                return
            self._closed = True
            current = self._current
            dead = current is not None and self._retire(current)
        if dead and current is not None:
            self._remove(current.root)
        elif current is None:
            self._remove(self._work)

    def __enter__(self) -> PolicyStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"{self._source.kind}={self._source.label!r}"
        return f"PolicyStore({where}, revision={self.revision!r})"
