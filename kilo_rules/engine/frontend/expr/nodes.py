"""The typed syntax tree of an expression, the parsed :class:`Expr`, and the language limits.

Nodes record the 0-based character span they cover in the expression text; an
:class:`Expr` turns spans into file locations with the ``locate`` callable its caller gave,
so every later stage (checker, compiler, runtime) reports ``file:line:col`` without knowing
how the expression was embedded in its YAML file.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kilo_rules.engine.base.errors import Location

#: Maps a 0-based offset in an expression's text to a location in its file.
Locate = Callable[[int], Location]


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep parsing, checking and evaluation cheap whatever the input."""

    max_length: int = 4096
    """Characters in one expression."""
    max_depth: int = 64
    """Nesting of brackets and of the syntax tree."""
    max_list_items: int = 256
    """Items in one list literal."""
    max_regex_length: int = 512
    """Characters in one regular expression."""
    max_int: int = 2**63 - 1
    """Largest magnitude of any number, literal or computed."""
    max_string: int = 65_536
    """Longest string a computation may build."""
    max_diagnostics: int = 20
    """Errors reported for one expression before the checker stops."""


LIMITS = Limits()


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """Base of all nodes: the span ``[start, end)`` in the text and the subtree depth."""

    start: int
    end: int
    depth: int = 1

    def children(self) -> tuple[Node, ...]:
        """The direct sub-expressions, in source order."""
        return ()


@dataclass(frozen=True, slots=True)
class Literal(Node):
    """A constant written in the source (numbers, sizes, durations, strings, true/false/null)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Name(Node):
    """A dotted vocabulary name such as ``model.limits.context``."""

    name: str


@dataclass(frozen=True, slots=True)
class ListExpr(Node):
    """A list literal ``[a, b, c]``."""

    items: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.items


@dataclass(frozen=True, slots=True)
class Unary(Node):
    """``-x`` or ``not x``."""

    op: str
    operand: Node

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)


@dataclass(frozen=True, slots=True)
class Binary(Node):
    """Any two-operand operator, including ``and``, ``or`` and ``??`` (which short-circuit)."""

    op: str
    left: Node
    right: Node

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class Conditional(Node):
    """``then if cond else orelse``."""

    then: Node
    cond: Node
    orelse: Node

    def children(self) -> tuple[Node, ...]:
        return (self.then, self.cond, self.orelse)


@dataclass(frozen=True, slots=True)
class Call(Node):
    """A call to a function of the fixed registry, e.g. ``clamp(x, 0, 10)``."""

    func: str
    args: tuple[Node, ...]

    def children(self) -> tuple[Node, ...]:
        return self.args


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree, parents before children, without recursion."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children()))


def text_locate(
    text: str, file: str = "<expr>", line: int = 1, col: int = 1, indent: int = 0
) -> Locate:
    """A ``locate`` for text whose first character sits at ``file:line:col`` and whose
    later lines start after ``indent`` columns (the shape of a YAML block scalar)."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def locate(offset: int) -> Location:
        row = bisect.bisect_right(starts, offset) - 1
        column = offset - starts[row]
        if row == 0:
            return Location(file, line, col + column)
        return Location(file, line + row, indent + 1 + column)

    return locate


@dataclass(frozen=True, slots=True)
class Expr:
    """A parsed expression: its source text, its syntax tree and how to locate offsets."""

    text: str
    root: Node
    locate: Locate = field(repr=False, compare=False)

    def location(self, node: Node | None = None) -> Location:
        """The location of ``node`` (default: the whole expression), with its end."""
        if node is None:
            node = self.root
        start, end = self.locate(node.start), self.locate(max(node.start, node.end))
        return Location(start.file, start.line, start.col, end.line, end.col)

    def source(self, node: Node) -> str:
        """The source text of ``node``."""
        return self.text[node.start : node.end]

    def __str__(self) -> str:
        return self.text
