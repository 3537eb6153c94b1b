"""Routes: which policy serves which model, read from a ``routes.yaml`` file.

A routes file lists routes in order; each matches models by catalog id, provider, family or
an fnmatch-style glob over the catalog id, and names a policy. The first route whose match
holds chooses the policy; a model no route matches gets the ``default``::

    version: 1
    routes:
      - name: claude-long
        match: {family: claude, glob: "anthropic/*"}
        policy: long-run
      - match: {provider: openrouter}
        policy: ./openrouter.yaml
    default: kilo-default

A policy ref is a bundled policy name (``kilo-default``) or, when it holds a ``/`` (or
``\\``) or ends in ``.yaml``/``.yml``, a path relative to the routes file. A path is read
only where a policy's own ``extends:`` may be read (:mod:`kilo_rules.engine.base.sandbox`): under
the routes file's directory, the bundled policies, or a directory the operator allowed.

Loading refuses, with located diagnostics, what would make a route ambiguous or unreadable
(schema errors, a match with no key, repeated route names, an unknown policy, a path outside
the allowed directories). :func:`check_routes` then reports, against a model catalog, what
loads but is probably a mistake (see its docstring for the severities).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kilo_rules.engine.base import sandbox
from kilo_rules.engine.base.errors import Diagnostic, Location, PolicyError
from kilo_rules.engine.formats.catalog import Catalog, ModelInfo
from kilo_rules.engine.formats.load import DEFAULT_LIMITS, Document, JsonPath, load_yaml_file
from kilo_rules.engine.formats.validate import dotted, schema_diagnostics
from kilo_rules.engine.frontend.resolve import (
    bundled_policy_names,
    bundled_root,
    is_path_ref,
    unknown_bundled,
)

#: The routes file's name at the root of a policy directory or bundle.
ROUTES_FILE = "routes.yaml"

#: Most routes one file may hold. The unreachable-route check compares every pair, and a
#: routes file arrives as untrusted as a policy does.
MAX_ROUTES = 1000

#: The name a route choice carries when no route matched.
DEFAULT_ROUTE = "default"

_MATCH_KEYS = ("id", "provider", "family", "glob")
_GLOB_SPECIAL = "*?["
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_REF_MAX = 1024
_KEY_MAX = 256


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RouteMatch(_Model):
    """Which models a route is for. At least one key is given, and every key given must hold
    for the model (keys combine with *and*)."""

    # Editors learn from the schema that an empty match is refused.
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    id: str | None = Field(
        None,
        min_length=1,
        max_length=_KEY_MAX,
        description="Exact catalog id, e.g. anthropic/claude-sonnet-4-6.",
    )
    provider: str | None = Field(
        None, min_length=1, max_length=_KEY_MAX, description="Provider id, e.g. openrouter."
    )
    family: str | None = Field(
        None, min_length=1, max_length=_KEY_MAX, description="Model family, e.g. claude."
    )
    glob: str | None = Field(
        None,
        min_length=1,
        max_length=_KEY_MAX,
        description="fnmatch-style pattern over the catalog id, case-sensitive, e.g. "
        "openai/gpt-5* (* also matches /).",
    )

    @model_validator(mode="after")
    def _at_least_one_key(self) -> RouteMatch:
        if not self.given():
            raise ValueError(f"a match needs at least one of {', '.join(_MATCH_KEYS)}")
        return self

    def given(self) -> dict[str, str]:
        """The keys this match sets, with their values."""
        return {k: v for k in _MATCH_KEYS if (v := getattr(self, k)) is not None}

    def matches(self, model: ModelInfo) -> bool:
        """Whether every key given holds for ``model``."""
        return (
            (self.id is None or model.id == self.id)
            and (self.provider is None or model.provider == self.provider)
            and (self.family is None or model.family == self.family)
            and (self.glob is None or fnmatchcase(model.id, self.glob))
        )


class Route(_Model):
    """One route: the models it matches and the policy they get."""

    name: str | None = Field(
        None,
        pattern=_NAME_PATTERN,
        max_length=64,
        description="A name for the route, shown in route choices and diagnostics (unique "
        "in the file; 'default' is reserved). Unnamed routes are shown as routes[N].",
    )
    match: RouteMatch = Field(description="Which models this route is for.")
    policy: str = Field(
        min_length=1,
        max_length=_REF_MAX,
        description="A bundled policy name (e.g. kilo-default, long-run) or a path to a "
        "policy file relative to the routes file (a path holds a / or ends in .yaml/.yml).",
    )


class RoutesFile(_Model):
    """A routes file (Routes v1): routes tried in order, then the default."""

    version: Literal[1] = Field(description="Routes format version.")
    routes: tuple[Route, ...] = Field(
        (),
        max_length=MAX_ROUTES,
        description="Routes in order; the first whose match holds chooses the policy.",
    )
    default: str = Field(
        min_length=1,
        max_length=_REF_MAX,
        description="The policy for a model no route matches: a bundled policy name or a "
        "path relative to the routes file.",
    )


@dataclass(frozen=True)
class RouteChoice:
    """The policy chosen for one model, and which route chose it."""

    route: str
    """The route's name, ``routes[N]`` when it has none, or ``default``."""
    policy: str | Path
    """A bundled policy name, or the resolved absolute path of a policy file."""
    at: Location
    """Where the chosen route (or the default) is written."""


@dataclass(frozen=True)
class Routes:
    """A loaded routes file: its spec, every policy ref resolved, every route located.

    ``resolved`` and ``where`` hold one entry per route and a last one for the default;
    :func:`load_routes` fills them. A ``Routes`` built from a file and a spec alone resolves
    path refs against the file's directory without the sandbox checks loading makes."""

    file: Path
    spec: RoutesFile
    resolved: tuple[str | Path, ...] = field(default=(), compare=False, repr=False)
    where: tuple[Location, ...] = field(default=(), compare=False, repr=False)

    def _ref(self, index: int) -> str | Path:
        if len(self.resolved) == len(self.spec.routes) + 1:
            return self.resolved[index]
        raw = self.spec.routes[index].policy if index < len(self.spec.routes) else self.spec.default
        if not is_path_ref(raw):
            return raw
        p = Path(raw).expanduser()
        return Path(os.path.normpath(p if p.is_absolute() else self.file.absolute().parent / p))

    def _at(self, index: int) -> Location:
        if len(self.where) == len(self.spec.routes) + 1:
            return self.where[index]
        return Location(str(self.file), 1, 1)

    def route_name(self, index: int) -> str:
        """How route ``index`` is shown: its name, or ``routes[index]``."""
        return self.spec.routes[index].name or f"routes[{index}]"

    def route_location(self, index: int) -> Location:
        """Where route ``index`` is written."""
        return self._at(index)

    @property
    def default_location(self) -> Location:
        """Where the default is written."""
        return self._at(len(self.spec.routes))

    def first_match(self, model: ModelInfo) -> int | None:
        """The index of the first route that matches ``model``, or None."""
        for i, route in enumerate(self.spec.routes):
            if route.match.matches(model):
                return i
        return None

    def policy_for(self, model: ModelInfo) -> RouteChoice:
        """The policy for ``model``: the first route that matches it, else the default."""
        i = self.first_match(model)
        if i is None:
            n = len(self.spec.routes)
            return RouteChoice(DEFAULT_ROUTE, self._ref(n), self._at(n))
        return RouteChoice(self.route_name(i), self._ref(i), self._at(i))

    def policies(self) -> list[str | Path]:
        """Every distinct policy ref, the default's included, in the order the file writes
        them (bundled names as ``str``, files as resolved paths)."""
        order = sorted(
            range(len(self.spec.routes) + 1), key=lambda i: (self._at(i).line, self._at(i).col)
        )
        return list(dict.fromkeys(self._ref(i) for i in order))


# -- loading --------------------------------------------------------------------------------

#: The sandbox's refusals, renamed for a policy a routes file names.
_SANDBOX_CODES = {
    "policy.file-outside-roots": "routes.outside-roots",
    "policy.missing-file": "routes.missing-policy",
    "policy.not-a-regular-file": "routes.not-a-regular-file",
    "policy.file-too-large": "routes.file-too-large",
    "policy.file-unreadable": "routes.file-unreadable",
}


def _refs(data: dict[str, Any]) -> Iterator[tuple[JsonPath, str]]:
    """(path, ref) of every route's policy, then the default's."""
    for i, route in enumerate(data.get("routes") or []):
        yield ("routes", i, "policy"), route["policy"]
    yield ("default",), data["default"]


def _shape_problems(doc: Document) -> list[Diagnostic]:
    """What the schema lets through but a route may not be: a match whose keys are all
    null, a repeated route name, a route named like the default."""
    out: list[Diagnostic] = []
    named: dict[str, int] = {}
    for i, route in enumerate(doc.data.get("routes") or []):
        match = route["match"]
        if all(match.get(k) is None for k in _MATCH_KEYS):
            out.append(
                Diagnostic(
                    "routes.empty-match",
                    f"routes[{i}].match sets no key: it would match every model",
                    doc.locate(("routes", i, "match")),
                    hint=f"give at least one of {', '.join(_MATCH_KEYS)} (glob: '*' matches "
                    "every model)",
                )
            )
        name = route.get("name")
        if name is None:
            continue
        at = doc.locate(("routes", i, "name"))
        if name == DEFAULT_ROUTE:
            out.append(
                Diagnostic(
                    "routes.reserved-name",
                    f"routes[{i}]: the name {DEFAULT_ROUTE!r} is reserved for the default",
                    at,
                    hint="route choices show 'default' when no route matched; pick another name",
                )
            )
        elif name in named:
            first = named[name]
            out.append(
                Diagnostic(
                    "routes.duplicate-name",
                    f"routes[{i}]: route name {name!r} is already used by routes[{first}]",
                    at,
                    details={"name": name, "first": first},
                    hint="first used at line "
                    f"{doc.locate(('routes', first, 'name')).line}; route names are unique",
                )
            )
        else:
            named[name] = i
    return out


def _resolve_ref(
    ref: str, at: Location, base: Path, roots: Sequence[Path]
) -> tuple[str | Path, Diagnostic | None]:
    """(the resolved ref, the reason it cannot be used or None). A bad ref is returned as
    written, a string, so that nothing reads a file it names."""
    if not is_path_ref(ref):
        names = bundled_policy_names()
        if ref in names:
            return ref, None
        return ref, unknown_bundled(ref, "routes.unknown-policy", at, bundled=names)
    named = sandbox.FileRef(ref, at, base)
    real, problem = sandbox.file_problem(
        named, roots, max_bytes=DEFAULT_LIMITS.max_bytes, what="policy file"
    )
    if problem is None:
        return real, None
    hint = problem.hint
    if problem.code == "policy.missing-file" and not (hint or "").startswith("did you mean"):
        hint = "paths are relative to the routes file"
    return ref, replace(problem, code=_SANDBOX_CODES.get(problem.code, problem.code), hint=hint)


def _invalid(exc: ValidationError, doc: Document) -> list[Diagnostic]:
    """Errors the model finds that the schema did not (a defence: the two agree)."""
    out = []
    for e in exc.errors()[:20]:
        path: JsonPath = tuple(p for p in e["loc"] if isinstance(p, str | int))
        out.append(Diagnostic("routes.invalid", f"{dotted(path)}: {e['msg']}", doc.locate(path)))
    return out


def read_routes(path: str | Path) -> tuple[Routes | None, list[Diagnostic]]:
    """What :func:`load_routes` reads, and every problem it finds, without raising.

    The :class:`Routes` is returned whenever the file's shape is valid, even when some
    policy refs are not (``kilo-rules check`` still runs :func:`check_routes` on it); a bad
    ref is then kept as written, a string, and no file it names is ever read. Only a result
    with no diagnostics is fit to route with."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError:
        mode = None  # reading it below reports why (io.read)
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        # A FIFO would block the read; a device would never end.
        return None, [
            Diagnostic(
                "routes.not-a-regular-file",
                f"{str(p)!r} is not a regular file; only regular files are read",
                Location(str(p), 1, 1),
            )
        ]
    try:
        doc = load_yaml_file(p)
    except PolicyError as exc:
        return None, list(exc.diagnostics)
    if not isinstance(doc.data, dict):
        return None, [
            Diagnostic(
                "schema.type",
                "a routes file must be a mapping (version, routes, default)",
                doc.locate(()),
            )
        ]
    diags = schema_diagnostics(doc, "routes.v1.json") or _shape_problems(doc)
    if diags:
        return None, diags
    try:
        spec = RoutesFile.model_validate(doc.data)
    except ValidationError as exc:
        return None, _invalid(exc, doc)
    base = p.absolute().parent
    roots = (base, bundled_root(), *sandbox.operator_roots())
    resolved: list[str | Path] = []
    for ref_path, ref in _refs(doc.data):
        target, problem = _resolve_ref(ref, doc.locate(ref_path), base, roots)
        resolved.append(target)
        if problem is not None:
            diags.append(problem)
    where = tuple(doc.locate(("routes", i)) for i in range(len(spec.routes)))
    routes = Routes(
        file=p.absolute(),
        spec=spec,
        resolved=tuple(resolved),
        where=(*where, doc.locate_key(("default",))),
    )
    return routes, sorted(diags, key=Diagnostic.sort_key)


def load_routes(path: str | Path) -> Routes:
    """Load a routes file and resolve every policy it names.

    Raises :class:`PolicyError` with every located problem: YAML (``yaml.*``, ``io.read``),
    the schema (``schema.*``), and the routes' own (``routes.*``: an empty match, a repeated
    or reserved route name, an unknown bundled policy, a policy file that is missing or lies
    outside the directories a policy may read)."""
    routes, diags = read_routes(path)
    if diags or routes is None:
        raise PolicyError(
            diags
            or Diagnostic("routes.invalid", "routes file not loaded", Location(str(path), 1, 1))
        )
    return routes


# -- checking -------------------------------------------------------------------------------


def _literal_prefix(glob: str) -> str:
    """The part of ``glob`` before its first special character: every id it matches starts
    with it."""
    cut = min((i for i in (glob.find(c) for c in _GLOB_SPECIAL) if i >= 0), default=len(glob))
    return glob[:cut]


def _is_literal(glob: str) -> bool:
    return not any(c in glob for c in _GLOB_SPECIAL)


def _glob_covers(pattern: str, later: RouteMatch) -> bool:
    """Whether every model ``later`` matches has an id ``pattern`` matches. Only the cases
    that can be decided for sure answer True: an exact id, a glob without wildcards, the
    same glob, or ``pattern`` is a literal prefix then ``*`` and ``later``'s ids all start
    with that prefix (``*`` alone covers everything)."""
    if not pattern.strip("*"):
        return True
    if later.id is not None and fnmatchcase(later.id, pattern):
        return True
    if later.glob is None:
        return False
    if later.glob == pattern:
        return True
    if _is_literal(later.glob):
        return fnmatchcase(later.glob, pattern)
    head = pattern.rstrip("*")
    return head != pattern and _is_literal(head) and _literal_prefix(later.glob).startswith(head)


def covers(earlier: RouteMatch, later: RouteMatch) -> bool:
    """Whether ``earlier`` matches every model ``later`` can match, so that a route with
    ``later`` placed after one with ``earlier`` is never chosen. Conservative: True only
    when that is certain from the keys alone."""
    for key in ("id", "provider", "family"):
        want = getattr(earlier, key)
        if want is None or getattr(later, key) == want:
            continue
        if key == "id" and later.glob is not None and later.glob == want and _is_literal(want):
            continue  # a glob without wildcards pins the id
        return False
    return earlier.glob is None or _glob_covers(earlier.glob, later)


def _pinned(match: RouteMatch, known: dict[str, ModelInfo]) -> RouteMatch:
    """``match`` with the provider and family of the catalog model its exact id names
    filled in: such a route can only match that model, so it holds them too."""
    model = known.get(match.id) if match.id is not None else None
    if model is None:
        return match
    return match.model_copy(
        update={
            "provider": match.provider or model.provider,
            "family": match.family or model.family,
        }
    )


def _matches_everything(match: RouteMatch) -> bool:
    return set(match.given()) == {"glob"} and not (match.glob or "").strip("*")


def _label(routes: Routes, index: int) -> str:
    name = routes.spec.routes[index].name
    return f"route {name!r}" if name else f"routes[{index}]"


def _listed(ids: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def check_routes(routes: Routes, catalog: Catalog) -> list[Diagnostic]:
    """What loads but is probably a mistake, each diagnostic located at its route:

    * ``routes.unreachable`` (error): an earlier route matches every model this one can
      match (the same or fewer keys with the same values, or a glob that covers this one's
      ids, ``*`` covering all), so this route is never chosen, whatever the model. An exact
      id that ``catalog`` knows stands for that model, its provider and family included
      (``family: claude`` before ``id: anthropic/claude-sonnet-4-6`` shadows it). It is an
      error because the file cannot mean what it says.
    * ``routes.no-model`` (warning): the route matches no model of ``catalog``. A model
      described inline, or added to the catalog later, may still match it.
    * ``routes.default-unreachable`` (warning, at the default): a route matches every model,
      so the default is never used.
    * ``routes.default-models`` (warning, at the default): the catalog models no route
      matches, in one diagnostic; they get the default, which may be what was meant.
      Not reported for a file with no routes, where every model gets the default.
    """
    out: list[Diagnostic] = []
    specs = routes.spec.routes
    known = {m.id: m for m in catalog.models}
    unreachable: set[int] = set()
    for j, later in enumerate(specs):
        pinned = _pinned(later.match, known)
        for i in range(j):
            if covers(specs[i].match, pinned):
                unreachable.add(j)
                out.append(
                    Diagnostic(
                        "routes.unreachable",
                        f"{_label(routes, j)} is never chosen: {_label(routes, i)} before it "
                        "matches every model it matches",
                        routes.route_location(j),
                        details={
                            "route": routes.route_name(j),
                            "shadowed_by": routes.route_name(i),
                        },
                        hint=f"move it above {routes.route_name(i)}, or narrow that route's match",
                    )
                )
                break
    for j, route in enumerate(specs):
        if j not in unreachable and not any(route.match.matches(m) for m in catalog.models):
            out.append(
                Diagnostic(
                    "routes.no-model",
                    f"{_label(routes, j)} matches no catalog model",
                    routes.route_location(j),
                    details={"route": routes.route_name(j), "match": route.match.given()},
                    hint="check the spelling against `kilo-rules models`",
                    severity="warning",
                )
            )
    catch_all = next((i for i, r in enumerate(specs) if _matches_everything(r.match)), None)
    default = routes.spec.default
    if catch_all is not None and catch_all not in unreachable:
        out.append(
            Diagnostic(
                "routes.default-unreachable",
                f"the default {default!r} is never used: {_label(routes, catch_all)} "
                "matches every model",
                routes.default_location,
                details={"route": routes.route_name(catch_all)},
                hint="make that route's policy the default and drop the route",
                severity="warning",
            )
        )
    elif specs:
        fallen = [m.id for m in catalog.models if routes.first_match(m) is None]
        if fallen:
            out.append(
                Diagnostic(
                    "routes.default-models",
                    f"{len(fallen)} catalog model(s) match no route and get the default "
                    f"{default!r}: {_listed(fallen)}",
                    routes.default_location,
                    details={"models": fallen, "default": default},
                    hint="add a route for any of them that needs another policy",
                    severity="warning",
                )
            )
    return sorted(out, key=Diagnostic.sort_key)
