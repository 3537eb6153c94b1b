"""One diagnostic shape for every stage, and the error hierarchy that carries it.

A :class:`Diagnostic` is ``code + message + location + details + hint``. Every stage of the
pipeline (YAML loading, schema validation, expression parsing and checking, compile, apply)
reports problems in this shape, so that ``kilo-rules check`` and library callers see one
format. Lines and columns are 1-based, as editors show them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True, order=True)
class Location:
    """A position in a source file: 1-based line and column (``file:line:col``)."""

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def shifted(self, line_offset: int, col: int) -> Location:
        """A location ``line_offset`` lines below this one, at column ``col``."""
        return Location(self.file, self.line + line_offset, col)

    def relative(self, cwd: Path | None = None) -> Location:
        """This location with its file shown relative to ``cwd`` (default: the working
        directory), as people read paths. A file outside ``cwd``, or a pseudo-file such as
        ``<stdin>``, is returned unchanged."""
        if not self.file or self.file.startswith("<"):
            return self
        try:
            base = (cwd or Path.cwd()).resolve()
            rel = Path(self.file).resolve().relative_to(base)
        except (ValueError, OSError):  # elsewhere, or the working directory is gone
            return self
        return Location(str(rel), self.line, self.col, self.end_line, self.end_col)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "col": self.col}
        if self.end_line is not None:
            out["end_line"] = self.end_line
            out["end_col"] = self.end_col
        return out


UNKNOWN = Location("<unknown>", 1, 1)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """A located problem: what went wrong, where, and what to do about it."""

    code: str
    message: str
    location: Location = UNKNOWN
    details: Mapping[str, Any] = field(default_factory=dict)
    hint: str | None = None
    severity: Severity = "error"

    def sort_key(self) -> tuple[str, int, int, str, str]:
        loc = self.location
        return (loc.file, loc.line, loc.col, self.code, self.message)

    def __str__(self) -> str:
        return f"{self.location}: {self.severity}[{self.code}]: {self.message}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "location": self.location.to_json(),
        }
        if self.details:
            out["details"] = dict(self.details)
        if self.hint:
            out["hint"] = self.hint
        return out


class KiloRulesError(Exception):
    """Base of every error kilo-rules raises on bad input; carries diagnostics."""

    def __init__(self, diagnostics: Diagnostic | Sequence[Diagnostic]) -> None:
        diags = [diagnostics] if isinstance(diagnostics, Diagnostic) else list(diagnostics)
        if not diags:
            raise ValueError("an error needs at least one diagnostic")
        self.diagnostics: list[Diagnostic] = sorted(diags, key=Diagnostic.sort_key)
        super().__init__(str(self.diagnostics[0]))

    @property
    def diagnostic(self) -> Diagnostic:
        """The first (best) diagnostic."""
        return self.diagnostics[0]

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as ``cls(*args)``, and args hold the rendered message, not the
        # diagnostics: rebuilt that way, the error of a worker process (a corpus run, a
        # Dask cluster) would fail to unpickle in the parent and take the pool down with it.
        # Rebuilt without calling ``__init__`` instead, a subclass with its own signature
        # (SummarizerError, RegexError) comes back with the same args and attributes.
        return (_restore, (type(self), self.args), self.__dict__)


def _restore(cls: type[KiloRulesError], args: tuple[Any, ...]) -> KiloRulesError:
    """An error of ``cls`` with these ``args``, its attributes (the diagnostics among them)
    set afterwards by pickle from the state ``KiloRulesError.__reduce__`` gave."""
    error = cls.__new__(cls)
    error.args = args
    return error


class PolicyError(KiloRulesError):
    """A policy file is unreadable, invalid, or contradicts itself."""


class SessionError(KiloRulesError):
    """A session document does not follow Session v1."""


class CatalogError(KiloRulesError):
    """The model catalog or an inline model descriptor is invalid, or a model is unknown."""


class ModelUnservableError(CatalogError):
    """The policy served does not compile for a model the caller described inline
    (``model.unservable``): the caller's model is at fault for its own request, and the
    revision stays in force for everyone else (``kilo_rules.tools.serving.store``). The compiler's
    diagnostics are in the details' ``causes``."""


class ExprError(KiloRulesError):
    """An expression does not parse or does not type-check."""


class EvalError(KiloRulesError):
    """An expression failed while being evaluated (division by zero, null operand, ...)."""


class ImportFormatError(KiloRulesError):
    """A foreign agent log could not be imported."""


class ContextOverflowError(KiloRulesError):
    """The request cannot be brought under the model's window (compaction exhausted)."""


class NetworkError(KiloRulesError):
    """A fetch was refused by the network policy or failed (``kilo_rules.engine.base.net``).

    The code names the rule: ``net.scheme``, ``net.host``, ``net.address``, ``net.redirect``,
    ``net.deadline``, ``net.too-large``, ``net.status``, ``net.encoding``, ``net.transport``
    or ``net.url``; the details carry the URL and the limit that was hit."""


class BundleError(KiloRulesError):
    """A policy bundle was refused or could not be made (``kilo_rules.engine.formats.bundle``).

    The code names the check (``bundle.gzip``, ``bundle.tar``, ``bundle.path``,
    ``bundle.link``, ``bundle.digest``, ``bundle.signature``, ...; docs/bundles.md lists
    them); the location is the bundle file, the member (``bundle.tar.gz!/prompts/a.md``) or
    the value in its ``manifest.json``."""


class StoreError(KiloRulesError):
    """A policy store has nothing good to serve, or was set up wrongly
    (``kilo_rules.tools.serving.store``).

    The code says which: ``store.not-ready`` (no revision has passed its checks yet),
    ``store.closed``, ``store.source`` (no source, or more than one), ``store.public-key``;
    a revision refused while it was being built carries its own diagnostics."""


def render_text(
    diagnostics: Iterable[Diagnostic],
    sources: Mapping[str, str] | None = None,
) -> str:
    """Render diagnostics for people: ``file:line:col: error[code]: message``, the source
    line, a caret under the column, then the hint and details."""
    lines: list[str] = []
    cache: dict[str, list[str]] = {}
    for diag in diagnostics:
        lines.append(str(diag))
        text = (sources or {}).get(diag.location.file)
        if text is not None:
            src = cache.setdefault(diag.location.file, text.splitlines())
            if 1 <= diag.location.line <= len(src):
                line = src[diag.location.line - 1]
                gutter = f"{diag.location.line:>4} | "
                lines.append(gutter + line)
                pad = "".join("\t" if ch == "\t" else " " for ch in line[: diag.location.col - 1])
                width = 1
                if diag.location.end_line == diag.location.line and diag.location.end_col:
                    width = max(1, diag.location.end_col - diag.location.col)
                lines.append(" " * (len(gutter) - 2) + "| " + pad + "^" * width)
        if diag.hint:
            lines.append(f"  hint: {diag.hint}")
    return "\n".join(lines)


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    """Render diagnostics as a JSON array (stable field names, see ``Diagnostic.to_json``)."""
    return json.dumps([d.to_json() for d in diagnostics], indent=2, ensure_ascii=False)


def _gh_escape(text: str, *, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def render_github(diagnostics: Iterable[Diagnostic]) -> str:
    """Render diagnostics as GitHub Actions workflow commands (inline annotations)."""
    out = []
    for d in diagnostics:
        loc = d.location
        level = "error" if d.severity == "error" else "warning"
        props = f"file={_gh_escape(loc.file, prop=True)},line={loc.line},col={loc.col}"
        if loc.end_line is not None:
            props += f",endLine={loc.end_line},endColumn={loc.end_col}"
        props += f",title={_gh_escape(d.code, prop=True)}"
        msg = d.message + (f"\n{d.hint}" if d.hint else "")
        out.append(f"::{level} {props}::{_gh_escape(msg)}")
    return "\n".join(out)


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``word`` if it is close enough to be a likely typo."""
    import difflib

    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


class CancellationError(KiloRulesError):
    """The work was stopped before it finished: its deadline passed or its caller cancelled
    it (``kilo_rules.engine.base.cancel``). Not a problem of any input."""


class MultipleRunsWarning(UserWarning):
    """A log holds several runs and none was asked for: run 0 was read.

    ``file``, ``runs`` (how many the file holds) and ``run`` (the one read) say which;
    pass ``run=N`` to pick another, or filter this warning to accept the first. The CLI
    prints it as a note naming ``--run``."""

    def __init__(self, file: str, runs: int, run: int, instance: str | None = None) -> None:
        self.file, self.runs, self.run, self.instance = file, runs, run, instance
        what = f" ({instance})" if instance else ""
        super().__init__(
            f"{file} holds {runs} runs; run {run}{what} was read: pass run=N (0–{runs - 1}) "
            "to pick another"
        )


class PathAliases:
    """Private paths (a temporary copy of a policy tree, a download) and the names people
    know them by (the directory they edit, ``bundle.tar.gz!``, a URL), applied to what is
    shown to them: text, locations, diagnostics and errors."""

    def __init__(self, aliases: Mapping[str, str]) -> None:
        # A private path only where it ends a path component: r000001 is not r0000010.
        self._patterns = [
            # The replacement is a template: a backslash in it is escaped to stay one.
            (re.compile(re.escape(private) + r"(?![\w.-])"), public.replace("\\", "\\\\"))
            for private, public in sorted(aliases.items(), key=lambda kv: -len(kv[0]))
        ]

    def text(self, text: str) -> str:
        """``text`` with every private path replaced by its public name."""
        for pattern, public in self._patterns:
            text = pattern.sub(public, text)
        return text

    def location(self, loc: Location) -> Location:
        """``loc`` in the file people know."""
        file = self.text(loc.file)
        return loc if file == loc.file else dataclasses.replace(loc, file=file)

    def diagnostic(self, d: Diagnostic) -> Diagnostic:
        """``d`` located, worded and hinted with public names (its details too)."""
        details = {k: self.text(v) if isinstance(v, str) else v for k, v in d.details.items()}
        return dataclasses.replace(
            d,
            message=self.text(d.message),
            hint=self.text(d.hint) if d.hint else d.hint,
            location=self.location(d.location),
            details=details,
        )

    def error(self, exc: KiloRulesError) -> KiloRulesError:
        """A copy of ``exc`` (same type and attributes) whose diagnostics name the source."""
        diags = [self.diagnostic(d) for d in exc.diagnostics]
        out = copy.copy(exc)
        out.diagnostics = sorted(diags, key=Diagnostic.sort_key)
        out.args = (str(out.diagnostics[0]),)
        return out
