"""YAML files → plain data plus a source map (JSON path → ``file:line:col``), within limits.

PyYAML composes a node graph that keeps every position; we build the data from it ourselves so
that (a) each value and each key keeps its location, (b) aliases are counted and their
expansion is bounded (a billion-laughs document stops after a few thousand nodes, not after
the machine runs out of memory), (c) nesting depth is bounded without Python recursion
errors, and (d) only the standard YAML tags are accepted. PyYAML marks are 0-based; our
locations are 1-based.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import math
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from kilo_rules.engine.base import safefs
from kilo_rules.engine.base.errors import Diagnostic, Location, PolicyError

# Re-exported: the source map a document carries is defined in source.py, beside the JSON
# one, and the modules that take documents from here keep importing these names from here.
from kilo_rules.engine.base.source import Document as Document
from kilo_rules.engine.base.source import JsonPath as JsonPath
from kilo_rules.engine.base.source import ScalarInfo as ScalarInfo
from kilo_rules.engine.base.source import lookup as lookup


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a YAML document may cost to load."""

    max_bytes: int = 1_000_000
    max_aliases: int = 100
    max_nodes: int = 20_000
    """Values (scalars, lists, mappings; keys not counted) one document may hold, counted
    while composing, and again after alias expansion."""
    max_depth: int = 64
    max_number: int = 2**53
    """Largest magnitude of a number: every integer up to it is exact in a JSON double."""


DEFAULT_LIMITS = Limits()

#: Characters a policy may not contain, raw or escaped: C0 and C1 controls except tab and
#: line breaks, DEL, lone surrogates and the non-characters U+FFFE and U+FFFF. Raw, PyYAML
#: refuses most of them with an unlocated reader error; escaped ("\x1b"), they would reach
#: prompts and request bodies.
_FORBIDDEN_CHARACTER = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]"
)

_STANDARD_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:timestamp",
}


class _BoundedComposer(Composer):
    """A safe composer that counts aliases as it meets them (before any expansion)."""

    # Given by the parser it is mixed with (PyYAML's or libyaml's).
    check_event: Callable[..., bool]
    peek_event: Callable[[], Any]

    def _start(self, limits: Limits) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)  # type: ignore[arg-type]  # always mixed in with it
        Resolver.__init__(self)  # type: ignore[arg-type]  # always mixed in with it
        self.limits = limits
        self.alias_count = 0
        self.node_count = 0
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # A mapping key is composed with index None; keys are not counted as values.
        is_key = isinstance(parent, MappingNode) and index is None
        if not is_key and not self.check_event(yaml.events.AliasEvent):
            # Counted before the node exists, so a flat list of a million small items
            # stops here after max_nodes of them instead of after composing them all.
            self.node_count += 1
            if self.node_count > self.limits.max_nodes:
                event = self.peek_event()
                raise _LimitHitError("yaml.nodes", "", event.start_mark, None)
        if self.check_event(yaml.events.AliasEvent):
            self.alias_count += 1
            if self.alias_count > self.limits.max_aliases:
                event = self.peek_event()
                raise _LimitHitError(
                    "yaml.aliases",
                    f"too many aliases (more than {self.limits.max_aliases})",
                    event.start_mark,
                    "anchors and aliases are allowed, but only a few; use extends: to share "
                    "whole sections",
                )
        self.depth += 1
        try:
            if self.depth > self.limits.max_depth:
                event = self.peek_event()
                raise _LimitHitError(
                    "yaml.depth",
                    f"nesting deeper than {self.limits.max_depth} levels",
                    event.start_mark,
                    None,
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Loader(Reader, Scanner, yaml.parser.Parser, _BoundedComposer, SafeConstructor, Resolver):
    """The pure-Python loader: its errors are the ones we report."""

    def __init__(self, stream: str, limits: Limits) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        self._start(limits)


_CParser: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)

if _CParser is not None:

    class _FastLoader(_BoundedComposer, _CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """libyaml's scanner and parser under the same bounded composer: about eight times
        faster, and the same nodes, marks and values (a differential test holds the two to
        that). Any failure is parsed again by :class:`_Loader`, whose messages we report."""

        def __init__(self, stream: str, limits: Limits) -> None:
            _CParser.__init__(self, stream)
            self._start(limits)

        def compose_scalar_node(self, anchor: Any) -> ScalarNode:
            node = super().compose_scalar_node(anchor)
            if node.start_mark.index == node.end_mark.index:
                # An empty value: the two parsers place it differently.
                raise _LimitHitError("yaml.empty", "", node.start_mark, None)
            return node


#: What libyaml and PyYAML read differently: libyaml accepts tabs where PyYAML refuses
#: them, and a comment right after a block scalar's indicator (``|#``); it treats the
#: Unicode line breaks differently, and does not count a byte-order mark in its marks.
#: (Found by the differential test; a text with any of them takes the Python parser.)
_SLOW_ONLY = re.compile("[\t\x85\u2028\u2029\ufeff]|[|>][-+0-9]*#")


def _fast_compose(text: str, limits: Limits) -> tuple[Node | None, SafeConstructor] | None:
    """The root node by libyaml, or None when it is not available, the text holds one of
    the characters the two parsers read differently, or anything goes wrong."""
    if _CParser is None or _SLOW_ONLY.search(text):
        return None
    loader = _FastLoader(text, limits)
    try:
        return loader.get_single_node(), loader
    except Exception:  # every failure is reported by the Python loader
        return None
    finally:
        loader.dispose()


class _LimitHitError(Exception):
    def __init__(self, code: str, message: str, mark: Any, hint: str | None) -> None:
        super().__init__(message)
        self.code, self.message, self.mark, self.hint = code, message, mark, hint


def _mark_loc(file: str, mark: Any) -> Location:
    if mark is None:
        return Location(file, 1, 1)
    return Location(file, mark.line + 1, mark.column + 1)


def _too_many_values(file: str, mark: Any, limits: Limits) -> Diagnostic:
    return Diagnostic(
        "yaml.nodes",
        f"document holds more than {limits.max_nodes:,} values",
        _mark_loc(file, mark),
        details={"limit": limits.max_nodes},
        hint="a policy is a few hundred settings; move long lists or texts into files",
    )


def _first_value_over_limit(text: str, limits: Limits) -> Any:
    """The mark of the value past ``max_nodes``, found by libyaml's parser (when PyYAML has
    it) before the pure-Python one composes anything: counting tens of thousands of values
    in C takes milliseconds, composing them in Python takes seconds. Counted as the composer
    counts (values, not keys; an alias is not a new value). None when within the limit, and
    when the text does not parse, so that the Python parser reports the syntax error."""
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    from yaml import events

    # One entry per open collection: for a mapping, whether its next node is a key.
    expecting_key: list[bool | None] = []
    count = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, events.NodeEvent):
                top = expecting_key[-1] if expecting_key else None
                if top is not None:
                    expecting_key[-1] = not top
                if not top and not isinstance(event, events.AliasEvent):
                    count += 1
                    if count > limits.max_nodes:
                        return event.start_mark
                if isinstance(event, events.MappingStartEvent):
                    expecting_key.append(True)
                elif isinstance(event, events.SequenceStartEvent):
                    expecting_key.append(None)
                if len(expecting_key) > limits.max_depth:
                    return None  # the composer stops here, at the exact place, as yaml.depth
            elif isinstance(event, events.CollectionEndEvent):
                expecting_key.pop()
    except yaml.YAMLError:
        return None
    return None


def _offset_loc(file: str, text: str, offset: int) -> Location:
    line_start = text.rfind("\n", 0, offset) + 1
    return Location(file, text.count("\n", 0, offset) + 1, offset - line_start + 1)


def _character_diagnostic(ch: str, where: Location) -> Diagnostic:
    code = ord(ch)
    name = (
        unicodedata.name(ch, "")
        or _CONTROL_NAMES.get(code)
        or (
            "lone surrogate"
            if 0xD800 <= code <= 0xDFFF
            else "non-character"
            if code in (0xFFFE, 0xFFFF)
            else "control character"
        )
    )
    return Diagnostic(
        "yaml.character",
        f"character U+{code:04X} ({name}) is not allowed in a policy",
        where,
        details={"codepoint": code},
        hint="policies are plain text: remove the character (tabs and line breaks are fine)",
    )


_CONTROL_NAMES = {0x00: "NUL", 0x1B: "ESC", 0x7F: "DEL"}


def parse_yaml(text: str, file: str = "<string>", limits: Limits = DEFAULT_LIMITS) -> Document:
    """Parse one YAML document into a :class:`Document`; every failure is a located
    :class:`PolicyError` (syntax, duplicate key, custom tag, limits)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise PolicyError(
            Diagnostic(
                "yaml.size",
                f"file is {size:,} bytes; the limit is {limits.max_bytes:,}",
                Location(file, 1, 1),
                details={"bytes": size, "limit": limits.max_bytes},
                hint="split the policy with extends:, or move long prompt texts into files",
            )
        )
    bad = _FORBIDDEN_CHARACTER.search(text)
    if bad:
        raise PolicyError(_character_diagnostic(bad.group(), _offset_loc(file, text, bad.start())))
    fast = _fast_compose(text, limits)
    if fast is not None:
        return _document(file, text, *fast, limits)
    over = _first_value_over_limit(text, limits)
    if over is not None:
        raise PolicyError(_too_many_values(file, over, limits))
    loader: _Loader | None = None
    try:
        loader = _Loader(text, limits)
        root = loader.get_single_node()
    except _LimitHitError as hit:
        if hit.code == "yaml.nodes":
            raise PolicyError(_too_many_values(file, hit.mark, limits)) from None
        raise PolicyError(
            Diagnostic(hit.code, hit.message, _mark_loc(file, hit.mark), hint=hit.hint)
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise PolicyError(
            Diagnostic("yaml.syntax", f"YAML syntax error: {problem}", _mark_loc(file, mark))
        ) from None
    except yaml.reader.ReaderError as exc:  # a character the scan above let through
        raise PolicyError(
            _character_diagnostic(chr(exc.character), _offset_loc(file, text, exc.position))
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyError(
            Diagnostic("yaml.syntax", f"YAML error: {exc}", Location(file, 1, 1))
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return _document(file, text, root, loader, limits)


def _document(
    file: str, text: str, root: Node | None, constructor: SafeConstructor, limits: Limits
) -> Document:
    doc = Document(file=file, text=text, data=None)
    if root is not None:
        doc.data = _Builder(doc, constructor, limits).build(root)
    return doc


class _Builder:
    """Turns the node graph into JSON-like data, iteratively, counting expanded nodes."""

    def __init__(self, doc: Document, constructor: SafeConstructor, limits: Limits) -> None:
        self.doc = doc
        self.constructor = constructor
        self.limits = limits
        self.nodes = 0

    def error(self, code: str, message: str, node: Node, hint: str | None = None) -> PolicyError:
        return PolicyError(
            Diagnostic(code, message, _mark_loc(self.doc.file, node.start_mark), hint=hint)
        )

    def scalar(self, node: ScalarNode, path: JsonPath) -> Any:
        tag = node.tag
        if tag == "tag:yaml.org,2002:str":
            bad = _FORBIDDEN_CHARACTER.search(node.value)
            if bad:  # written as an escape in a quoted scalar
                raise PolicyError(
                    _character_diagnostic(bad.group(), _mark_loc(self.doc.file, node.start_mark))
                )
            # Plain style is None from PyYAML and "" from libyaml.
            self.doc.scalars[path] = ScalarInfo(
                node.style or None, node.start_mark.index, node.end_mark.index
            )
            return node.value
        if tag == "tag:yaml.org,2002:timestamp":
            # JSON has no dates: keep the text the author wrote.
            return node.value
        if tag in (
            "tag:yaml.org,2002:int",
            "tag:yaml.org,2002:float",
            "tag:yaml.org,2002:bool",
            "tag:yaml.org,2002:null",
        ):
            return self.number(node)
        raise self.error(
            "yaml.tag",
            f"tag {node.tag!r} is not allowed",
            node,
            "policies use plain YAML: strings, numbers, booleans, null, lists and mappings",
        )

    def number(self, node: ScalarNode) -> Any:
        """An int, float, bool or null scalar; numbers must be finite and within
        ``max_number``, so that every later computation stays exact and cannot overflow."""
        bound = self.limits.max_number
        shown = node.value if len(node.value) <= 24 else node.value[:21] + "..."
        hint = "larger values cannot be represented exactly; no setting needs them"
        try:
            value = self.constructor.construct_object(node)
        except (ValueError, OverflowError):  # more digits than int() accepts
            value = None
        else:
            if isinstance(value, float) and value != value:  # NaN is not JSON
                raise self.error("yaml.value", "NaN is not allowed", node)
            if isinstance(value, float) and math.isinf(value):
                raise self.error(
                    "yaml.value", f"{shown} is not a finite number", node, "write a finite number"
                )
            if isinstance(value, bool) or not isinstance(value, int | float) or abs(value) <= bound:
                return value
        raise self.error(
            "yaml.value",
            f"{shown} is out of range: numbers must be within ±2^53 (±{bound:_})",
            node,
            hint,
        )

    def build(self, root: Node) -> Any:
        # An explicit stack instead of recursion: depth is already bounded by the composer,
        # but expansion of aliases must also be bounded in total work.
        result: list[Any] = [None]
        stack: list[tuple[Node, JsonPath, Any, Any]] = [(root, (), result, 0)]
        while stack:
            node, path, container, slot = stack.pop()
            self.nodes += 1
            if self.nodes > self.limits.max_nodes:
                raise self.error(
                    "yaml.expansion",
                    f"document expands to more than {self.limits.max_nodes:,} values "
                    "through its aliases",
                    node,
                    "an alias repeats everything its anchor holds; nested aliases multiply",
                )
            self.doc.values.setdefault(path, _mark_loc(self.doc.file, node.start_mark))
            if node.tag not in _STANDARD_TAGS:
                raise self.error(
                    "yaml.tag",
                    f"tag {node.tag!r} is not allowed",
                    node,
                    "policies use plain YAML: strings, numbers, booleans, null, lists and mappings",
                )
            if isinstance(node, ScalarNode):
                container[slot] = self.scalar(node, path)
            elif isinstance(node, SequenceNode):
                seq: list[Any] = [None] * len(node.value)
                container[slot] = seq
                for i in range(len(node.value) - 1, -1, -1):
                    stack.append((node.value[i], (*path, i), seq, i))
            elif isinstance(node, MappingNode):
                mapping: dict[str, Any] = {}
                container[slot] = mapping
                pending = []
                for key_node, value_node in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        raise self.error(
                            "yaml.merge",
                            "merge keys (<<) are not supported",
                            key_node,
                            "use extends: to build on another policy",
                        )
                    if not isinstance(key_node, ScalarNode) or key_node.tag not in (
                        "tag:yaml.org,2002:str",
                        "tag:yaml.org,2002:int",
                        "tag:yaml.org,2002:bool",
                        "tag:yaml.org,2002:null",
                    ):
                        raise self.error("yaml.key", "mapping keys must be plain strings", key_node)
                    key = str(key_node.value)
                    if key in mapping:
                        raise self.error(
                            "yaml.duplicate-key",
                            f"duplicate key {key!r}",
                            key_node,
                            f"{key!r} is already set at line {self.doc.keys[(*path, key)].line}",
                        )
                    mapping[key] = None
                    self.doc.keys[(*path, key)] = _mark_loc(self.doc.file, key_node.start_mark)
                    pending.append((value_node, (*path, key), mapping, key))
                stack.extend(reversed(pending))
        return result[0]


def read_text_limited(
    path: Path, limits: Limits = DEFAULT_LIMITS, *, root: Path | None = None
) -> str:
    """Read a file, refusing to load more than the size limit into memory.

    The file is read through :mod:`kilo_rules.engine.base.safefs`: a FIFO, device or directory is
    refused without blocking (a pipe named as a policy must never hang the reader), and
    at most the limit plus one byte is read. With ``root`` the file must lie beneath it
    and is opened one component at a time without following a symlink
    (:func:`~kilo_rules.engine.base.safefs.read_beneath`). A file over the limit is a located
    ``yaml.size`` :class:`PolicyError`; any other refusal is a
    :class:`~kilo_rules.engine.base.safefs.ReadRefused` (an :class:`OSError`) with its reason."""
    try:
        if root is None:
            raw = safefs.read_regular(path, max_bytes=limits.max_bytes)
        else:
            # A relative path is the caller's (relative to the working directory), not the root's.
            raw = safefs.read_beneath(root, safefs.lexical(path), max_bytes=limits.max_bytes)[1]
    except safefs.ReadRefused as exc:
        if exc.reason != "too-large":
            raise
        size = limits.max_bytes + 1
        with contextlib.suppress(OSError, ValueError):
            size = max(size, path.stat().st_size)
        raise PolicyError(
            Diagnostic(
                "yaml.size",
                f"file is {size:,} bytes; the limit is {limits.max_bytes:,}",
                Location(str(path), 1, 1),
                details={"bytes": size, "limit": limits.max_bytes},
                hint="split the policy with extends:, or move long prompt texts into files",
            )
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise PolicyError(
            Diagnostic("yaml.encoding", "file is not valid UTF-8", Location(str(path), line, col))
        ) from None


#: The diagnostic code of each reason :mod:`kilo_rules.engine.base.safefs` refuses a read for.
_REFUSED_CODES = {
    "not-regular": "io.not-regular-file",
    "outside": "io.outside-root",
    "changed": "io.changed",
}


def read_error(exc: OSError, file: str, what: str = "file") -> Diagnostic:
    """The located diagnostic of a file that could not be read: ``io.read``, or for a
    :class:`~kilo_rules.engine.base.safefs.ReadRefused` the code of its reason
    (``io.not-regular-file`` for a FIFO, device or directory; ``io.outside-root``;
    ``io.changed``)."""
    if isinstance(exc, safefs.ReadRefused):
        code = _REFUSED_CODES.get(exc.reason, "io.read")
        # Its message starts with the path, which the location already shows.
        detail = str(exc).removeprefix(f"{exc.path}: ")
    else:
        code, detail = "io.read", exc.strerror or str(exc)
    return Diagnostic(
        code, f"cannot read{' ' + what if what else ''}: {detail}", Location(file, 1, 1)
    )


def load_yaml_file(
    path: str | Path, limits: Limits = DEFAULT_LIMITS, *, root: Path | None = None
) -> Document:
    """Read and parse a YAML file (see :func:`read_text_limited`; a file that cannot be
    read is a located :func:`read_error` diagnostic)."""
    p = Path(path)
    try:
        text = read_text_limited(p, limits, root=root)
    except OSError as exc:
        raise PolicyError(read_error(exc, str(p))) from None
    return parse_yaml(text, str(p), limits)


def resource_root() -> Any:
    """The bundled ``policies/`` directory (a Traversable; a real path in a checkout)."""
    return importlib.resources.files("kilo_rules.policies")


def schema_root() -> Any:
    """The bundled ``schemas/`` directory."""
    return importlib.resources.files("kilo_rules.schemas")


def load_yaml_resource(name: str) -> Document:
    """Parse a bundled file from ``policies/`` (e.g. ``models.yaml``)."""
    res = resource_root() / name
    label = str(res) if isinstance(res, Path) else f"<bundled>/{name}"
    return parse_yaml(res.read_text(encoding="utf-8"), label)


def iter_paths(data: Any, path: JsonPath = ()) -> Iterator[tuple[JsonPath, Any]]:
    """Every (path, value) pair of a JSON-like tree, parents before children."""
    stack = [(path, data)]
    while stack:
        p, v = stack.pop()
        yield p, v
        if isinstance(v, dict):
            stack.extend(((*p, k), c) for k, c in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend(((*p, i), c) for i, c in reversed(list(enumerate(v))))
