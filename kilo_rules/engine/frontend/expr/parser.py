"""Text → :class:`Expr`: the lark boundary.

The grammar (``grammar.lark``) is read once and made into two LALR parsers (from the
tables built beforehand, :mod:`kilo_rules.engine.frontend.expr.tables`): one that
builds our typed nodes directly while it parses (no intermediate tree, no recursion, so
deep input cannot exhaust the Python stack), and one that builds lark's own tree, used by
the reference interpreter. Every lark exception is translated here, once, into an
:class:`ExprError` whose message comes from :data:`GRAMMAR_ERRORS`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from lark import Lark, Token, Transformer, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from kilo_rules.engine.base.errors import Diagnostic, ExprError, Location
from kilo_rules.engine.base.lru import LRUCache
from kilo_rules.engine.frontend.expr.nodes import (
    LIMITS,
    Binary,
    Call,
    Conditional,
    Expr,
    ListExpr,
    Literal,
    Locate,
    Name,
    Node,
    Unary,
    text_locate,
)
from kilo_rules.engine.frontend.expr.tables import grammar_text, lalr_parser

_COMPARISONS = (
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "in",
    "not in",
    "contains",
    "startswith",
    "endswith",
    "matches",
)
_BINARY_OPS = ("+", "-", "*", "/", "//", "%", *_COMPARISONS, "and", "or", "??")

#: Plain-words syntax messages and inputs that must produce them. The parser state in which
#: each example fails is what identifies the message (lark's ``match_examples`` idea,
#: precomputed once), so a new message needs only a new row. Characters the lexer rejects
#: are told apart by the character itself. ``tests/expr`` runs every row.
GRAMMAR_ERRORS: dict[str, list[str]] = {
    "empty expression": ["", "   "],
    "unclosed parenthesis": ["(1 + 2", "min(1, 2", "((a)", "f(", "(a if b else c"],
    "unclosed bracket": ["[1, 2", "[", "[[1]"],
    "unmatched closing parenthesis": ["1 + 2)", "a)", ")"],
    "unmatched closing bracket": ["1]", "]"],
    "mismatched brackets": ["(1]", "[1)", "min([1, 2)]"],
    "missing right-hand operand": [f"a {op}" for op in _BINARY_OPS]
    + [f"(a {op} )" for op in ("+", "*", "==", "and", "??")]
    + ["a + * b", "a and or b"],
    "missing left-hand operand": [f"{op} a" for op in _BINARY_OPS if op not in ("-", "not in")]
    + ["(* 2)", "[== 1]", "f(and x)", "a + (or b)"],
    "missing operand after 'not'": ["not", "a and not", "(not )"],
    "missing operand after '-'": ["-", "1 + -", "(-)"],
    "two values without an operator": [
        "a b",
        "1 2",
        "1.5 2",
        "'x' y",
        "(a) b",
        "f(x) y",
        "[1] 2",
        "true x",
        "null 1",
        "50KB 2",
        "5s 1",
        "5min",
        "a [1]",
        "-a b",
        "a if b else c d",
        "model.id 'x'",
    ],
    "comparisons cannot be chained; join them with 'and'": [
        f"a {op} b {op2} c" for op in _COMPARISONS for op2 in ("<", "==", "in")
    ],
    "'not' after a value must be followed by 'in'": ["a not", "a not 3", "x not y"],
    "missing 'else' in 'a if condition else b'": ["a if b", "1 if x > 2", "(a if b)"],
    "missing condition after 'if'": ["a if", "a if else b"],
    "missing value after 'else'": ["a if b else", "(a if b else )"],
    "'if' needs a value before it: write 'a if condition else b'": ["if a else b", "(if a)"],
    "trailing comma": ["[1, 2,]", "min(1, 2,)"],
    "missing value before ','": ["[1, , 2]", "[,]", "min(,1)", "f(1,,2)"],
    "a comma is only allowed between list items and call arguments": ["1, 2", "(1, 2)"],
    "'=' is not a comparison, use '=='": ["a = 1", "a => 1", "a =< 1"],
    "'&&' is not an operator, use 'and'": ["a && b", "a & b"],
    "'||' is not an operator, use 'or'": ["a || b", "a | b"],
    "'!' is not an operator, use 'not' (or '!=')": ["!a", "a ! b"],
    "unterminated string": ['"abc', "'abc", "'abc\"", '"a\\"'],
    "unexpected character": ["a $ b", "a @ b", "a ^ b", "a.b.", "model.id ; 1", "`x`"],
}

_LEXER_MESSAGES = {
    "=": "'=' is not a comparison, use '=='",
    "&": "'&&' is not an operator, use 'and'",
    "|": "'||' is not an operator, use 'or'",
    "!": "'!' is not an operator, use 'not' (or '!=')",
    '"': "unterminated string",
    "'": "unterminated string",
}
_CLOSERS = {")": "(", "]": "["}
_BRACKET_NAMES = {"(": "parenthesis", "[": "bracket"}

# --- literals (shared with the tree interpreter) -----------------------------------------

_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_UNIT = re.compile(r"[A-Za-z]+$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)


def _checked_int(value: int, text: str) -> int:
    if abs(value) > LIMITS.max_int:
        raise ValueError(f"number {text} is out of range (at most {LIMITS.max_int:_})")
    return value


def decode_int(text: str) -> int:
    """``1_000`` → 1000."""
    return _checked_int(int(text), text)


def decode_float(text: str) -> float:
    """``1.5e3`` → 1500.0 (out-of-range literals are errors, never ``inf``)."""
    value = float(text)
    if not abs(value) <= LIMITS.max_int:
        raise ValueError(f"number {text} is out of range (at most {LIMITS.max_int:_})")
    return value


def _with_unit(text: str, units: dict[str, int]) -> int:
    unit = _UNIT.search(text)
    assert unit is not None  # the grammar guarantees a unit
    number = text[: unit.start()]
    scale = units[unit.group()]
    # Integral amounts stay exact; fractional ones (1.5MB) are floored to whole units.
    value = int(number) * scale if "." not in number else int(float(number) * scale)
    return _checked_int(value, text)


def decode_size(text: str) -> int:
    """``50KB`` → 50_000 bytes, ``50KiB`` → 51_200."""
    return _with_unit(text, _SIZE_UNITS)


def decode_duration(text: str) -> int:
    """``5m`` → 300 seconds."""
    return _with_unit(text, _DURATION_UNITS)


def decode_string(text: str) -> str:
    """Strip the quotes and decode ``\\n \\t \\r \\0 \\\\ \\" \\' \\uXXXX``.

    Any other backslash pair is kept as written, so regular expressions such as
    ``"\\d+"`` need no doubling.
    """

    def escape(m: re.Match[str]) -> str:
        code = m.group(1)
        if code[0] == "u" and len(code) == 5:
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, m.group(0))

    return _ESCAPE.sub(escape, text[1:-1])


# --- building nodes while parsing --------------------------------------------------------


class _SyntaxProblem(Exception):  # noqa: N818 -- internal, becomes an ExprError
    """Raised from inside the parser callbacks; turned into a diagnostic by :func:`parse`."""

    def __init__(self, code: str, message: str, start: int, end: int) -> None:
        super().__init__(message)
        self.code, self.message, self.start, self.end = code, message, start, end


def _span(children: Sequence[Any]) -> tuple[int, int, int]:
    """(start, end, depth) of a rule from its children (tokens and nodes)."""
    first, last = children[0], children[-1]
    start: int = (first.start_pos or 0) if isinstance(first, Token) else first.start
    end: int = (last.end_pos or 0) if isinstance(last, Token) else last.end
    depth = 1 + max((c.depth for c in children if isinstance(c, Node)), default=0)
    if depth > LIMITS.max_depth:
        raise _SyntaxProblem(
            "expr.limit",
            f"expression is nested too deeply (more than {LIMITS.max_depth} levels)",
            start,
            end,
        )
    return start, end, depth


def _literal(value_of: Any) -> Any:
    def build(self: _Builder, children: list[Token]) -> Literal:
        token = children[0]
        try:
            value = value_of(str(token))
        except ValueError as exc:
            raise _SyntaxProblem(
                "expr.limit", str(exc), token.start_pos or 0, token.end_pos or 0
            ) from None
        start, end, depth = _span(children)
        return Literal(value, start=start, end=end, depth=depth)

    return build


def _binary(op: str) -> Any:
    def build(self: _Builder, children: list[Any]) -> Binary:
        left, right = children[0], children[-1]
        start, end, depth = _span(children)
        return Binary(op, left, right, start=start, end=end, depth=depth)

    return build


class _Builder(Transformer[Token, Node]):
    """Parser callbacks, one per grammar rule or alias, building typed nodes."""

    int_ = _literal(decode_int)
    float_ = _literal(decode_float)
    size = _literal(decode_size)
    duration = _literal(decode_duration)
    string = _literal(decode_string)

    true = _literal(lambda _: True)
    false = _literal(lambda _: False)
    null = _literal(lambda _: None)

    def name(self, children: list[Token]) -> Name:
        start, end, depth = _span(children)
        return Name(str(children[0]), start=start, end=end, depth=depth)

    def call(self, children: list[Any]) -> Call:
        start, end, depth = _span(children)
        return Call(str(children[0]), tuple(children[1:-1]), start=start, end=end, depth=depth)

    def list_(self, children: list[Any]) -> ListExpr:
        start, end, depth = _span(children)
        items = tuple(children[1:-1])
        if len(items) > LIMITS.max_list_items:
            raise _SyntaxProblem(
                "expr.limit",
                f"list has {len(items)} items, more than the limit of {LIMITS.max_list_items}",
                start,
                end,
            )
        return ListExpr(items, start=start, end=end, depth=depth)

    def paren(self, children: list[Any]) -> Node:
        # The parentheses become part of the inner node's span, so that messages quote them.
        start, end, _ = _span(children)
        inner: Node = children[1]
        return dataclasses.replace(inner, start=start, end=end)

    def neg(self, children: list[Any]) -> Unary:
        start, end, depth = _span(children)
        return Unary("-", children[-1], start=start, end=end, depth=depth)

    def not_(self, children: list[Any]) -> Unary:
        start, end, depth = _span(children)
        return Unary("not", children[-1], start=start, end=end, depth=depth)

    def conditional(self, children: list[Any]) -> Conditional:
        then, cond, orelse = children
        start, end, depth = _span(children)
        return Conditional(then, cond, orelse, start=start, end=end, depth=depth)

    or_ = _binary("or")
    and_ = _binary("and")
    eq = _binary("==")
    ne = _binary("!=")
    lt = _binary("<")
    le = _binary("<=")
    gt = _binary(">")
    ge = _binary(">=")
    in_ = _binary("in")
    not_in = _binary("not in")
    contains = _binary("contains")
    startswith = _binary("startswith")
    endswith = _binary("endswith")
    matches = _binary("matches")
    coalesce = _binary("??")
    add = _binary("+")
    sub = _binary("-")
    mul = _binary("*")
    div = _binary("/")
    floordiv = _binary("//")
    mod = _binary("%")


# functools.cache on the argument-less functions here: each holds exactly one value (the
# grammar text, a parser built from it, the error table), fixed by the package itself.
@cache
def grammar() -> str:
    """The grammar source, read once from the package."""
    return grammar_text()


@cache
def _node_parser() -> Lark:
    return lalr_parser(grammar(), transformer=_Builder())


#: How many syntax trees a tree cache keeps.
TREES_SIZE = 4096


def tree_cache() -> LRUCache[str, Node]:
    """A new, empty cache of syntax trees by expression text, for :func:`parse`'s ``trees``.

    Trees are immutable and hold offsets, not locations, so one tree serves every file
    that writes the same text: a policy extending kilo-default repeats the base's
    expressions, and ``check`` of a directory parsed them once per policy. A
    :class:`kilo_rules.engine.compiler.compile.Compiler` owns one."""
    return LRUCache(TREES_SIZE)


#: The trees :func:`parse` keeps when the caller names no cache of its own (the default
#: compiler's expression caches hold this same one).
DEFAULT_TREES: LRUCache[str, Node] = tree_cache()


@cache
def tree_parser() -> Lark:
    """A parser that returns lark's own tree (used by the reference interpreter)."""
    return lalr_parser(grammar())


# --- errors ------------------------------------------------------------------------------


def _scan_brackets(text: str) -> tuple[list[tuple[str, int]], _SyntaxProblem | None]:
    """Match brackets outside strings: returns the still-open ones, or the first problem.

    This runs before lark so that depth is bounded before anything nests, and so that a
    stray closer is reported where it is rather than where the parser gives up.
    """
    stack: list[tuple[str, int]] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote or ch == "\n":
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            stack.append((ch, i))
            if len(stack) > LIMITS.max_depth:
                return stack, _SyntaxProblem(
                    "expr.limit",
                    f"expression is nested too deeply (more than {LIMITS.max_depth} levels)",
                    i,
                    i + 1,
                )
        elif ch in ")]":
            if not stack:
                name = _BRACKET_NAMES[_CLOSERS[ch]]
                return stack, _SyntaxProblem("expr.syntax", f"unmatched closing {name}", i, i + 1)
            opener, at = stack.pop()
            if opener != _CLOSERS[ch]:
                return stack, _SyntaxProblem(
                    "expr.syntax",
                    f"mismatched brackets: {ch!r} cannot close {opener!r} opened at offset {at}",
                    i,
                    i + 1,
                )
        i += 1
    return stack, None


@cache
def _error_table() -> tuple[dict[tuple[int, str], str], dict[int, str]]:
    """Parser state (and token) → message, from the examples in :data:`GRAMMAR_ERRORS`."""
    exact: dict[tuple[int, str], str] = {}
    by_state: dict[int, set[str]] = {}
    for message, examples in GRAMMAR_ERRORS.items():
        for example in examples:
            try:
                _node_parser().parse(example)
            except UnexpectedToken as exc:
                key = (exc.state.position, exc.token.type)
                exact.setdefault(key, message)
                by_state.setdefault(key[0], set()).add(message)
            except (UnexpectedInput, _SyntaxProblem):
                pass
    # A state alone decides only when every example failing there agrees on the message.
    single = {state: next(iter(msgs)) for state, msgs in by_state.items() if len(msgs) == 1}
    return exact, single


def _describe(token: Token) -> str:
    if token.type == "$END":
        return "end of expression"
    return f"{str(token)!r}"


def _syntax_problem(
    text: str, exc: UnexpectedInput, open_brackets: list[tuple[str, int]]
) -> _SyntaxProblem:
    if isinstance(exc, UnexpectedCharacters):
        pos: int = exc.pos_in_stream or 0
        ch = text[pos]
        message = _LEXER_MESSAGES.get(ch, f"unexpected character {ch!r}")
        if ch == "!" and text.startswith("!=", pos):
            message = f"unexpected character {ch!r}"
        return _SyntaxProblem("expr.syntax", message, pos, pos + 1)
    assert isinstance(exc, UnexpectedToken)
    token = exc.token
    at_end = token.type == "$END"
    if at_end and open_brackets:
        opener, at = open_brackets[-1]
        return _SyntaxProblem("expr.syntax", f"unclosed {_BRACKET_NAMES[opener]}", at, at + 1)
    exact, by_state = _error_table()
    state = exc.state.position
    message = (
        exact.get((state, token.type)) or by_state.get(state) or f"unexpected {_describe(token)}"
    )
    if at_end:
        pos = len(text.rstrip())
        return _SyntaxProblem("expr.syntax", message, pos, pos)
    start = token.start_pos or 0
    return _SyntaxProblem("expr.syntax", message, start, token.end_pos or start + 1)


_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "a number",
    "FLOAT": "a number",
    "SIZE": "a size",
    "DURATION": "a duration",
    "STRING": "a string",
    "$END": "the end",
}


def _expected_words(exc: UnexpectedInput) -> list[str]:
    if not isinstance(exc, UnexpectedToken):
        return []
    patterns = {t.name: t.pattern.value for t in _node_parser().terminals}
    words = {_TERMINAL_WORDS.get(name, repr(patterns.get(name, name))) for name in exc.expected}
    return sorted(words)


def parse(
    text: str, *, locate: Locate | None = None, trees: LRUCache[str, Node] | None = None
) -> Expr:
    """Parse ``text`` into an :class:`Expr`.

    ``locate`` maps 0-based offsets in ``text`` (0 to ``len(text)`` inclusive: errors at
    the end point just past the last character) to file locations; the YAML loader knows
    where the scalar is. By default offsets map to ``<expr>:line:col`` within the text.
    ``trees`` is the cache of syntax trees to use (:func:`tree_cache`; default
    :data:`DEFAULT_TREES`). Raises :class:`ExprError` (codes ``expr.syntax`` and
    ``expr.limit``).
    """
    cache = DEFAULT_TREES if trees is None else trees
    where = locate or text_locate(text)

    def fail(problem: _SyntaxProblem, details: dict[str, Any] | None = None) -> ExprError:
        start, end = where(problem.start), where(max(problem.start, problem.end))
        location = Location(start.file, start.line, start.col, end.line, end.col)
        return ExprError(Diagnostic(problem.code, problem.message, location, details=details or {}))

    if len(text) > LIMITS.max_length:
        raise fail(
            _SyntaxProblem(
                "expr.limit",
                f"expression is {len(text)} characters long, more than the limit of "
                f"{LIMITS.max_length}",
                0,
                0,
            )
        )
    if not text.strip():
        raise fail(_SyntaxProblem("expr.syntax", "empty expression", 0, 0))
    open_brackets, problem = _scan_brackets(text)
    if problem is not None:
        raise fail(problem)
    try:
        root = cache.get(text) or _node_parser().parse(text)
    except _SyntaxProblem as exc:
        raise fail(exc) from None
    except UnexpectedInput as exc:
        expected = _expected_words(exc)
        raise fail(
            _syntax_problem(text, exc, open_brackets), {"expected": expected} if expected else None
        ) from None
    assert isinstance(root, Node)
    cache.put(text, root)
    return Expr(text, root, where)
