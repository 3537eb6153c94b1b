"""Policy files → one resolved policy: ``extends:`` chains merged, overrides collected.

Each file is validated against ``schemas/policy.v1.json`` on its own (so errors point into
the file that has them), then merged over its base: mappings merge key by key, lists of
mappings that all carry an ``id`` merge by id, anything else is replaced. An item whose id
the base has is merged field by field onto the inherited one, so a system layer written
as ``{id: soul, when: false}`` keeps its inherited ``source`` (a layer left without one
matched nothing it could change: the ``layers`` check says so). The merged document keeps,
for every path, the file and position it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kilo_rules.engine.base import sandbox
from kilo_rules.engine.base.errors import Diagnostic, Location, PolicyError
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.base.source import Document, JsonPath, nearest
from kilo_rules.engine.formats.load import (
    DEFAULT_LIMITS,
    Limits,
    load_yaml_file,
    parse_yaml,
    read_text_limited,
    resource_root,
)
from kilo_rules.engine.formats.validate import schema_diagnostics


def bundled_policy_names() -> list[str]:
    """Names of the policies shipped with kilo-rules (``kilo-default``, ...)."""
    names = []
    for entry in resource_root().iterdir():
        n = entry.name
        if n.endswith(".yaml") and n != "models.yaml":
            names.append(n[: -len(".yaml")])
    return sorted(names)


# functools.cache, not a compiler's cache: it takes no argument, so it holds one value,
# fixed by where the package is installed.
@cache
def bundled_root() -> Path:
    """The bundled ``policies/`` directory as a path: every policy may read under it."""
    return Path(str(resource_root()))


def bundled_policy_path(name: str) -> Path:
    """Filesystem path of a bundled policy."""
    return Path(str(resource_root() / f"{name}.yaml"))


_CACHED_TEXT_MAX = 256 * 1024

_RootState = tuple[dict[str, Any], dict[JsonPath, tuple[Document, JsonPath]]]


class ResolveCaches:
    """The bounded caches of policy resolution, keyed by content.

    * ``documents``: parsed policy files with their schema diagnostics, by file name,
      content and limits. ``check`` resolves every policy of a directory, and each of them
      reads its bases again: the bundled base was parsed and validated once per policy.
      The file name is part of the key because every location in a document names its
      file; files past 256 KiB are not kept, so the cache stays small however large the
      policies are.
    * ``scalar_locations``: locations of characters inside scalars, by document content,
      path and offset.
    * ``directories``: the directory of a file name.
    * ``roots``: the merged body and origins of a chain's root document. Keyed by the
      document object: the documents come from ``documents``, one object per file name and
      content, so within one set of caches the object stands for its content.

    A :class:`kilo_rules.engine.compiler.compile.Compiler` owns one; thread-safe (each cache holds a
    lock).
    """

    def __init__(self) -> None:
        self.documents: LRUCache[
            tuple[str, str, Limits], tuple[Document, tuple[Diagnostic, ...] | None]
        ] = LRUCache(256)
        self.scalar_locations: LRUCache[tuple[str, str, JsonPath, int], Location] = LRUCache(16384)
        self.directories: LRUCache[str, Path] = LRUCache(1024)
        self.roots: LRUCache[Document, _RootState] = LRUCache(64, by_identity=True)

    def caches(self) -> dict[str, LRUCache[Any, Any]]:
        """Each cache by name (for statistics and :meth:`clear`)."""
        return {
            "documents": self.documents,
            "scalar_locations": self.scalar_locations,
            "directories": self.directories,
            "roots": self.roots,
        }

    def clear(self) -> None:
        """Forget every entry."""
        for c in self.caches().values():
            c.clear()


#: What calls that name no caches share (the default compiler's).
DEFAULT_RESOLVE_CACHES = ResolveCaches()


def _directory_of(file: str, caches: ResolveCaches) -> Path:
    if file[:1] == "<":
        return Path.cwd()
    return caches.directories.get_or(file, lambda: Path(file).parent)


def locate_in_document(
    doc: Document, path: JsonPath, offset: int, *, caches: ResolveCaches | None = None
) -> Location:
    """Where character ``offset`` of the string at ``path`` of ``doc`` was written.

    A base's expressions are located again for every policy extending it; the answer
    depends only on the document's content, so it is shared (in ``caches``, default
    :data:`DEFAULT_RESOLVE_CACHES`)."""
    key = (doc.file, doc.text, path, offset)
    cache = (DEFAULT_RESOLVE_CACHES if caches is None else caches).scalar_locations
    return cache.get_or(key, lambda: doc.locate_in_scalar(path, offset))


def load_policy_document(
    path: Path, limits: Limits = DEFAULT_LIMITS, *, caches: ResolveCaches | None = None
) -> Document:
    """``load_yaml_file(path, limits)``, parsed once per file name and content.

    The document is shared with every caller that reads the same file and content (through
    ``caches``, default :data:`DEFAULT_RESOLVE_CACHES`): it is read only, as every document
    of a resolved policy's chain is."""
    own = DEFAULT_RESOLVE_CACHES if caches is None else caches
    return _checked_document(path, limits, own, schema=False)[0]


def _checked_document(
    path: Path,
    limits: Limits,
    caches: ResolveCaches,
    *,
    schema: bool = True,
    text: str | None = None,
) -> tuple[Document, tuple[Diagnostic, ...]]:
    """The document of ``path`` and, with ``schema``, its policy-schema diagnostics (each
    computed once per file name and content). ``text`` is the file's content when the
    caller has already read it (through the sandbox)."""
    if text is None:
        try:
            text = read_text_limited(path, limits)
        except OSError:
            return load_yaml_file(path, limits), ()  # raises the located io.read error
    key = (str(path), text, limits)
    doc, errors = caches.documents.get(key) or (parse_yaml(text, str(path), limits), None)
    if errors is None and schema:
        errors = _schema_errors(doc)
    if len(text) <= _CACHED_TEXT_MAX:
        caches.documents.put(key, (doc, errors))
    return doc, errors or ()


def _schema_errors(doc: Document) -> tuple[Diagnostic, ...]:
    if not isinstance(doc.data, dict):
        return ()
    return tuple(schema_diagnostics(doc, "policy.v1.json"))


def is_path_ref(ref: str) -> bool:
    """Whether a policy ref names a file (as ``extends:`` tells): it holds a ``/`` or ``\\``
    or ends in ``.yaml``/``.yml``; otherwise it is a bundled policy name."""
    return "/" in ref or "\\" in ref or ref.endswith((".yaml", ".yml"))


def unknown_bundled(ref: str, code: str, at: Location, **details: Any) -> Diagnostic:
    """``ref`` names no bundled policy: the diagnostic, with the nearest name and the list."""
    from kilo_rules.engine.base.errors import did_you_mean

    names = bundled_policy_names()
    guess = did_you_mean(ref, names)
    return Diagnostic(
        code,
        f"no bundled policy named {ref!r}",
        at,
        details=details,
        hint=(f"did you mean {guess!r}? " if guess else "")
        + f"bundled: {', '.join(names)}; a file path needs a '/' or a .yaml suffix",
    )


@dataclass
class ResolvedPolicy:
    """A policy with its ``extends:`` chain merged. Overrides are kept, not applied."""

    name: str
    data: dict[str, Any]
    chain: list[Document]
    origin: dict[JsonPath, tuple[Document, JsonPath]] = field(default_factory=dict)
    #: Directories the operator allowed reads under when the policy was resolved; the files
    #: it names are checked against these (plus its own tree and the bundled policies).
    read_roots: tuple[Path, ...] = ()
    #: The caches it was resolved with, which locating its values shares (not part of the
    #: policy: two policies with equal content are equal whichever caches made them).
    caches: ResolveCaches = field(default=DEFAULT_RESOLVE_CACHES, repr=False, compare=False)

    @property
    def file(self) -> str:
        """The file the policy was loaded from (the last of the chain)."""
        return self.chain[-1].file

    def locate(self, path: JsonPath) -> Location:
        """Where the value at ``path`` of the merged policy was written."""
        hit = nearest(self.origin, path)
        if hit is None:
            return Location(self.file, 1, 1)
        (doc, dpath), rest = hit
        return doc.locate((*dpath, *rest))

    def locate_in_scalar(self, path: JsonPath, offset: int) -> Location:
        """Where character ``offset`` of the string at ``path`` was written."""
        hit = self.origin.get(path)
        if hit is None:
            return self.locate(path)
        return locate_in_document(*hit, offset, caches=self.caches)

    def declared_in(self, path: JsonPath) -> Path:
        """Directory of the file that set ``path`` (relative file references start there)."""
        return _directory_of(self.locate(path).file, self.caches)

    def file_ref(self, path: JsonPath, value: str) -> sandbox.FileRef:
        """The file named by ``value`` at ``path``, located at that value."""
        return sandbox.FileRef(value, self.locate(path), self.declared_in(path))

    def file_roots(self, path: JsonPath) -> tuple[Path, ...]:
        """Where the file named at ``path`` may lie: the tree of the file that names it,
        the bundled policies, and the operator's roots."""
        return (self.declared_in(path), bundled_root(), *self.read_roots)

    def sources(self) -> dict[str, str]:
        """File → text of every file in the chain (for rendering carets)."""
        return {d.file: d.text for d in self.chain}


def policy_bodies(data: dict[str, Any]) -> Iterator[tuple[JsonPath, dict[str, Any]]]:
    """The policy body and every override's ``set``, with the path prefix of each."""
    yield (), data
    for i, ov in enumerate(data.get("overrides") or []):
        if isinstance(ov, dict) and isinstance(ov.get("set"), dict):
            yield ("overrides", i, "set"), ov["set"]


def _merge(
    base: Any,
    over: Any,
    path: JsonPath,
    over_doc: Document,
    over_path: JsonPath,
    origin: dict[JsonPath, tuple[Document, JsonPath]],
) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if k in out:
                out[k] = _merge(out[k], v, (*path, k), over_doc, (*over_path, k), origin)
            else:
                out[k] = v
                _record(v, (*path, k), over_doc, (*over_path, k), origin)
        return out
    if (
        isinstance(base, list)
        and isinstance(over, list)
        and base
        and all(isinstance(x, dict) and "id" in x for x in base + over)
    ):
        out_list = list(base)
        index = {x["id"]: i for i, x in enumerate(out_list)}
        for j, item in enumerate(over):
            if item["id"] in index:
                i = index[item["id"]]
                out_list[i] = _merge(
                    out_list[i], item, (*path, i), over_doc, (*over_path, j), origin
                )
            else:
                index[item["id"]] = len(out_list)
                _record(item, (*path, len(out_list)), over_doc, (*over_path, j), origin)
                out_list.append(item)
        return out_list
    if isinstance(base, dict | list):  # a scalar has no origins below it to forget
        _drop(path, origin)
    _record(over, path, over_doc, over_path, origin)
    return over


def _record(
    value: Any,
    path: JsonPath,
    doc: Document,
    dpath: JsonPath,
    origin: dict[JsonPath, tuple[Document, JsonPath]],
) -> None:
    stack = [(value, path, dpath)]
    while stack:
        v, p, d = stack.pop()
        origin[p] = (doc, d)
        if isinstance(v, dict):
            stack.extend((c, (*p, k), (*d, k)) for k, c in v.items())
        elif isinstance(v, list):
            stack.extend((c, (*p, i), (*d, i)) for i, c in enumerate(v))


def _body(doc: Document) -> dict[str, Any]:
    return {k: v for k, v in doc.data.items() if k not in ("extends", "overrides")}


def _root_state(doc: Document) -> tuple[dict[str, Any], dict[JsonPath, tuple[Document, JsonPath]]]:
    origin: dict[JsonPath, tuple[Document, JsonPath]] = {}
    return _merge({}, _copy_data(_body(doc)), (), doc, (), origin), origin


def _copy_data(value: Any) -> Any:
    """A private copy of loaded data (dicts, lists and scalars only): what ``deepcopy``
    does for it, in a fraction of the time."""
    if isinstance(value, dict):
        return {k: _copy_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_data(v) for v in value]
    return value


def _drop(path: JsonPath, origin: dict[JsonPath, tuple[Document, JsonPath]]) -> None:
    n = len(path)
    for p in [p for p in origin if len(p) > n and p[:n] == path]:
        del origin[p]


def _extends_not_found(ref: str, path: Path, at: Location) -> Diagnostic:
    return Diagnostic(
        "policy.extends-not-found", f"extended policy {ref!r} not found (looked at {path})", at
    )


def _documents(
    ref: str | Path,
    *,
    limits: Limits,
    relative_to: Path | None,
    seen: list[Path],
    at: Location | None,
    read_roots: tuple[Path, ...],
    caches: ResolveCaches,
) -> Iterator[Document]:
    """The extends chain of ``ref``, base first. A base named by ``extends:`` (``at``) is
    read only inside the allowed roots, as every file a policy names."""
    ref_s = str(ref)
    named_file = isinstance(ref, Path) or is_path_ref(ref_s)
    text: str | None = None
    if named_file:
        path = Path(ref_s).expanduser()
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
    else:
        if ref_s not in bundled_policy_names():
            raise PolicyError(
                unknown_bundled(ref_s, "policy.extends-not-found", at or Location(ref_s, 1, 1))
            )
        path = bundled_policy_path(ref_s)
    resolved = path.resolve()
    if resolved in seen:
        cycle = " -> ".join(p.name for p in [*seen[seen.index(resolved) :], resolved])
        raise PolicyError(
            Diagnostic(
                "policy.extends-cycle",
                f"extends cycle: {cycle}",
                at or Location(str(path), 1, 1),
                hint="a policy may not extend itself, directly or through others",
            )
        )
    if at is not None and named_file:
        named = sandbox.FileRef(ref_s, at, relative_to or Path.cwd())
        roots = (named.base, bundled_root(), *read_roots)
        _, outside = sandbox.confine(named, roots)
        if outside is not None:
            raise PolicyError(outside)
        if not path.exists():
            raise PolicyError(_extends_not_found(ref_s, path, at))
        # Read here, through the sandbox, not by name below: a directory or the file swapped
        # for a symlink after the check would otherwise be followed out of the roots.
        _, text = sandbox.read_text(
            named, roots, max_bytes=limits.max_bytes, what="extended policy"
        )
    elif at is not None and not path.exists():
        raise PolicyError(_extends_not_found(ref_s, path, at))
    elif named_file and path.exists() and not (path.is_file() or path.is_dir()):
        # The policy the caller names may sit anywhere, but a FIFO would still block the read.
        raise PolicyError(
            Diagnostic(
                "policy.not-a-regular-file",
                f"{ref_s!r} is not a regular file; only regular files are read",
                Location(str(path), 1, 1),
            )
        )
    doc, found = _checked_document(path, limits, caches, text=text)
    if not isinstance(doc.data, dict):
        raise PolicyError(
            Diagnostic(
                "schema.type",
                "a policy must be a mapping (key: value pairs)",
                doc.locate(()),
            )
        )
    errors = list(found)
    base = doc.data.get("extends")
    if isinstance(base, str):
        try:
            yield from _documents(
                base,
                limits=limits,
                relative_to=path.parent,
                seen=[*seen, resolved],
                at=doc.locate(("extends",)),
                read_roots=read_roots,
                caches=caches,
            )
        except PolicyError as exc:
            raise PolicyError([*errors, *exc.diagnostics]) from None
    if errors:
        raise PolicyError(errors)
    yield doc


def resolve_policy(
    ref: str | Path,
    *,
    limits: Limits = DEFAULT_LIMITS,
    read_roots: Iterable[str | Path] | None = None,
    caches: ResolveCaches | None = None,
) -> ResolvedPolicy:
    """Load a policy by bundled name or path, validate every file of its chain, merge.

    ``read_roots`` are directories the policy may read files under besides its own tree
    and the bundled policies (default: those of :func:`kilo_rules.engine.base.sandbox.allow_read`).
    ``caches`` holds the parsed files to share (default :data:`DEFAULT_RESOLVE_CACHES`;
    :meth:`kilo_rules.engine.compiler.compile.Compiler.resolve` passes its own). Raises
    :class:`PolicyError` with every located problem found."""
    own = DEFAULT_RESOLVE_CACHES if caches is None else caches
    roots = (
        sandbox.operator_roots()
        if read_roots is None
        else tuple(Path(r).expanduser().resolve() for r in read_roots)
    )
    docs = list(
        _documents(
            ref,
            limits=limits,
            relative_to=Path.cwd(),
            seen=[],
            at=None,
            read_roots=roots,
            caches=own,
        )
    )
    # The first document is the root base, shared by every policy extending it: its merge
    # is made once, and each policy starts from a private copy of it.
    base_data, base_origin = own.roots.get_or(docs[0], lambda: _root_state(docs[0]))
    data: dict[str, Any] = _copy_data(base_data)
    origin = dict(base_origin)
    overrides: list[Any] = []
    for n, doc in enumerate(docs):
        if n:
            data = _merge(data, _copy_data(_body(doc)), (), doc, (), origin)
        for i, ov in enumerate(doc.data.get("overrides") or []):
            pos = len(overrides)
            overrides.append(_copy_data(ov))
            _record(ov, ("overrides", pos), doc, ("overrides", i), origin)
    if overrides:
        data["overrides"] = overrides
    data.pop("extends", None)
    return ResolvedPolicy(
        name=str(data.get("name", "?")),
        data=data,
        chain=docs,
        origin=origin,
        read_roots=roots,
        caches=own,
    )


def merged_onto(base: ResolvedPolicy, doc: Document, data: dict[str, Any]) -> ResolvedPolicy:
    """``base`` with ``data`` merged on top as ``extends:`` merges a file onto its base,
    its values located in ``doc``: ``data`` is the content of ``doc`` or a part of it (what
    ``kilo-rules check`` can still look at when ``doc`` itself has errors)."""
    origin = dict(base.origin)
    body = {k: v for k, v in data.items() if k not in ("extends", "overrides")}
    merged = _merge(_copy_data(base.data), _copy_data(body), (), doc, (), origin)
    overrides = list(merged.get("overrides") or [])
    for i, ov in enumerate(data.get("overrides") or []):
        _record(ov, ("overrides", len(overrides)), doc, ("overrides", i), origin)
        overrides.append(_copy_data(ov))
    if overrides:
        merged["overrides"] = overrides
    return ResolvedPolicy(
        name=str(merged.get("name", "?")),
        data=merged,
        chain=[*base.chain, doc],
        origin=origin,
        read_roots=base.read_roots,
        caches=base.caches,
    )
