"""The grammar's LALR tables, built once when the grammar changes rather than in every process.

Building the parser from ``grammar.lark`` (lark's grammar analysis and LALR construction)
costs about a tenth of a second, which every ``kilo-rules check`` in a fresh process paid
before reading a single policy. :mod:`kilo_rules.engine.frontend.expr._grammar_tables`
holds the result of that analysis, serialized by lark itself, together with the SHA-256 of
the grammar and the lark version it was built from; :func:`lalr_parser` loads it when both
still match and builds from the grammar otherwise, so a stale file is slower, never wrong.

Regenerate after editing the grammar (``tests/expr`` fails until then)::

    .venv/bin/python -m kilo_rules.engine.frontend.expr.build_tables

The serialized form holds only built-in containers, strings, numbers and booleans: it is
read with an unpickler that refuses every global, so the file cannot name code to run.
"""

from __future__ import annotations

import base64
import hashlib
import io
import pickle
import zlib
from importlib import resources
from typing import Any

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

#: The options every parser of the grammar is built with; the tables are built with them.
OPTIONS: dict[str, Any] = {"parser": "lalr", "lexer": "basic", "propagate_positions": True}


def grammar_text() -> str:
    """The grammar source as the package ships it."""
    return resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")


def grammar_digest(text: str) -> str:
    """The SHA-256 of the grammar ``text``, which the tables are keyed by (with lark's
    version)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler for plain data: any class or function named in the stream is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the grammar tables name {module}.{name}")


def encode(parser: Lark) -> str:
    """The serialized tables of ``parser``, as :data:`TABLES` holds them."""
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    raw = pickle.dumps({"data": data, "memo": memo}, protocol=4)
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def decode(blob: str) -> dict[str, Any]:
    """The tables :func:`encode` gave (raises :class:`pickle.UnpicklingError` on any global)."""
    raw = zlib.decompress(base64.b64decode(blob))
    loaded: dict[str, Any] = _BuiltinsOnly(io.BytesIO(raw)).load()
    return loaded


def shipped_tables(text: str) -> dict[str, Any] | None:
    """The shipped tables if they were built from ``text`` by this lark version, else None."""
    try:
        from kilo_rules.engine.frontend.expr import _grammar_tables as shipped
    except ImportError:
        return None
    if grammar_digest(text) != shipped.GRAMMAR_SHA256 or lark.__version__ != shipped.LARK_VERSION:
        return None
    return decode(shipped.TABLES)


def lalr_parser(text: str, **options: Any) -> Lark:
    """A parser of the grammar ``text`` with :data:`OPTIONS` and ``options`` (such as a
    ``transformer``): loaded from the shipped tables when they are current, else built."""
    tables = shipped_tables(text)
    if tables is None:
        return Lark(text, **OPTIONS, **options)
    # The loader the standalone parsers lark generates use; the analysis is not repeated.
    loaded: Lark = Lark._load_from_dict(  # type: ignore[no-untyped-call]
        tables["data"], tables["memo"], **options
    )
    return loaded
