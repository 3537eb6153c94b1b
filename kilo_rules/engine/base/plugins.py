"""System transforms: code that may change the system prompt after its layers are assembled.

Kilo lets a plugin mutate the assembled system array through the hook
``experimental.chat.system.transform`` (push entries, change the header). A policy names
the transforms it runs, in order, in ``system.transforms``; a name is found

* first among the transforms registered in this process with
  :func:`register_system_transform` (for a program that embeds kilo-rules), then
* among the entry points of the group ``kilo_rules.system_transforms`` that installed
  distributions declare, e.g. in a plugin's ``pyproject.toml``::

      [project.entry-points."kilo_rules.system_transforms"]
      team-rules = "team_plugin:push_rules"

A transform is called as ``transform(system, context)``: ``system`` is a fresh list of the
blocks so far, which it may change in place, and ``context`` a
:class:`SystemTransformContext`. It returns a new list, or None to keep the list it was
given. See ``docs/plugins.md``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

#: The entry-point group plugins declare their system transforms in.
SYSTEM_TRANSFORMS_GROUP = "kilo_rules.system_transforms"


@dataclass(frozen=True, slots=True)
class SystemTransformContext:
    """What a system transform is told about the request it transforms (Kilo passes its
    hook the session id and the model)."""

    model_id: str
    provider: str
    family: str
    api_id: str
    agent: str
    session_id: str
    step: int


#: ``transform(system, context) -> list[str] | None``.
SystemTransform = Callable[[list[str], SystemTransformContext], list[str] | None]


class TransformLoadError(Exception):
    """A named transform exists but could not be loaded (its entry point failed to import,
    or names something that is not callable)."""


_lock = threading.Lock()
_registered: dict[str, SystemTransform] = {}
# Entry points by name, discovered once per sys.path (a plugin installed into a path the
# process adds later is found then); loaded callables by entry-point value.
_discovered: tuple[tuple[str, ...], dict[str, metadata.EntryPoint]] | None = None
_loaded: dict[str, SystemTransform] = {}


def register_system_transform(name: str, transform: SystemTransform) -> None:
    """Make ``transform`` available to policies as ``system.transforms: [name]`` in this
    process. It takes precedence over an entry point of the same name; registering a name
    again replaces the earlier transform."""
    if not name or not isinstance(name, str):
        raise ValueError("a system transform needs a non-empty name")
    if not callable(transform):
        raise TypeError(f"system transform {name!r} is not callable")
    with _lock:
        _registered[name] = transform


def unregister_system_transform(name: str) -> None:
    """Forget a transform registered with :func:`register_system_transform` (an entry point
    of the same name, if any, is used again). Unknown names are ignored."""
    with _lock:
        _registered.pop(name, None)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    global _discovered
    key = tuple(sys.path)
    with _lock:
        if _discovered is not None and _discovered[0] == key:
            return _discovered[1]
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=SYSTEM_TRANSFORMS_GROUP):
        # The first distribution on sys.path wins, as it does for imports.
        found.setdefault(ep.name, ep)
    with _lock:
        _discovered = (key, found)
    return found


def system_transform_names() -> list[str]:
    """Every transform name a policy may use now: registered ones and entry points."""
    with _lock:
        names = set(_registered)
    return sorted(names | set(_entry_points()))


def find_system_transform(name: str) -> SystemTransform | None:
    """The transform called ``name``, or None when no registration or entry point has that
    name. Raises :class:`TransformLoadError` when the entry point cannot be loaded."""
    with _lock:
        hit = _registered.get(name)
    if hit is not None:
        return hit
    ep = _entry_points().get(name)
    if ep is None:
        return None
    with _lock:
        fn = _loaded.get(ep.value)
    if fn is None:
        try:
            obj = ep.load()
        except Exception as exc:  # a plugin's import may fail in any way
            raise TransformLoadError(
                f"entry point {name} = {ep.value} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        if not callable(obj):
            raise TransformLoadError(f"entry point {name} = {ep.value} is not callable")
        fn = obj
        with _lock:
            _loaded[ep.value] = fn
    return fn
