"""What the extractive summarizer pulls out of a head: texts, tool activity, paths, errors.

Everything here is a pure function of the messages; :mod:`.extractive` turns the
:class:`Facts` into bullets. Paths, commands and error lines are kept byte-exact (only
surrounding whitespace is trimmed); prose is collapsed onto one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilo_rules.engine.formats.request import ModelMessage, Text, ToolCall, ToolResult
from kilo_rules.engine.summarizers._shared import one_line, result_text

# Blocks the runtime injects into user turns; they are context, not the user's words.
_INJECTED = re.compile(
    r"<(environment_details|system-reminder|system_reminder|ide_selection|env"
    r"|task-notification|local-command-stdout|command-name|command-message|command-args)>"
    r".*?</\1>",
    re.DOTALL,
)
# Texts the runtime itself posts as user turns around a compaction.
_RUNTIME_USER_TEXTS = ("What did we do so far?", "Continue if you have next steps")

_PATH_KEYS = (
    "path",
    "file_path",
    "filePath",
    "filepath",
    "file",
    "filename",
    "notebook_path",
    "target_file",
    "source",
    "destination",
    "old_path",
    "new_path",
    "dir_path",
    "directory",
)
_LIST_KEYS = ("paths", "files", "file_paths", "filePaths")
_SHELL_WORDS = ("bash", "shell", "terminal", "exec", "command", "powershell", "run")
_EDITOR_SUBCOMMANDS = {
    "view": "read",
    "create": "created",
    "str_replace": "edited",
    "insert": "edited",
    "undo_edit": "edited",
    "write": "created",
    "edit": "edited",
}
_ACTION_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("created", ("write", "create", "new_file")),
    ("edited", ("edit", "replace", "patch", "insert", "update", "modify")),
    ("deleted", ("delete", "remove")),
    ("read", ("read", "view", "open", "cat")),
    ("searched", ("glob", "grep", "search", "find", "list", "ls")),
)
# Tools whose output is file contents: paths and "errors" inside it are code, not events.
_CONTENT_ACTIONS = ("read",)
_FAILED = " (failed)"

_EXTENSION_WORDS = (
    "py pyi pyx js jsx ts tsx mjs cjs json jsonl yaml yml toml ini cfg conf md rst txt c h cc "
    "cpp cxx hpp rs go java kt kts rb ex exs heex eex erl hrl php cs swift scala sh bash zsh "
    "fish ps1 html htm css scss sass less sql xml lock mod sum pony lua vue svelte dart gradle "
    "proto log csv tsv ipynb tf hcl dockerfile env patch diff lark j2 jinja tmpl"
)
_EXTENSIONS = frozenset(_EXTENSION_WORDS.split())
_TOKEN = re.compile(r"[^\s'\"`()<>\[\]{},;:=|&*?!$]+")
_HAS_LETTER = re.compile(r"[A-Za-z]")
_ERROR_LINE = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception)\b(?::|$)"
    r"|^(?:error|fatal|panic|ERROR|FATAL|FAILED|FAIL)\b"
    r"|:\d+(?::\d+)?:\s*(?:fatal )?error\b"
    r"|\bFAILED\b"
    r"|\b[Ee]xit(?:ed with)? (?:code|status)[:= ]*-?[1-9]\d*"
    r"|non-zero exit status"
    r"|Segmentation fault|core dumped|No such file or directory|command not found"
    r"|Permission denied"
)
# A numbered source listing ("261:    AttributeError", "  12→raise ValueError") is code.
_LISTING = re.compile(r"^\d+(?::|→|\t)")
_URL = re.compile(r"https?://[^\s<>\"'`)\]]+")


@dataclass
class Call:
    """One tool call with its result (None when the result never arrived)."""

    call: ToolCall
    result: ToolResult | None
    index: int  # position among all calls, for ordering
    command: str | None  # the shell command, for shell tools
    action: str  # read / created / edited / deleted / searched / ran / used
    paths: tuple[str, ...]  # paths named in the input

    @property
    def failed(self) -> bool:
        """The call errored."""
        return self.result is not None and self.result.is_error

    @property
    def target(self) -> str:
        """What the call acted on, to tell whether a later call retried it successfully."""
        if self.command is not None:
            return self.command
        if self.paths:
            return self.paths[0]
        for value in self.call.input.values():
            if isinstance(value, str) and value.strip():
                return one_line(value)[:80]
        return self.call.name


@dataclass
class Facts:
    """The raw material of one summary."""

    user_texts: list[str] = field(default_factory=list)  # real user texts, injections removed
    assistant_texts: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)  # path → actions, first seen
    errors: list[str] = field(default_factory=list)  # error lines, oldest first, deduped
    last_role: str | None = None  # role of the last message with text or calls


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _is_shell(call: ToolCall) -> bool:
    low = call.name.lower()
    return _str(call.input.get("command")) is not None and any(w in low for w in _SHELL_WORDS)


def _action(call: ToolCall, shell: bool) -> str:
    if shell:
        return "ran"
    sub = _str(call.input.get("command"))
    if sub is not None and sub in _EDITOR_SUBCOMMANDS:
        return _EDITOR_SUBCOMMANDS[sub]
    low = call.name.lower()
    for action, words in _ACTION_WORDS:
        if any(w in low for w in words):
            return action
    return "used"


def _input_paths(call: ToolCall) -> list[str]:
    out: list[str] = []
    for key in _PATH_KEYS:
        value = _str(call.input.get(key))
        if value is not None:
            out.append(value.strip())
    for key in _LIST_KEYS:
        values = call.input.get(key)
        if isinstance(values, list):
            out.extend(v.strip() for v in values if _str(v) is not None)
    glob = _str(call.input.get("glob"))
    if glob is not None:
        out.append(glob.strip())
    # A glob tool's pattern is a path pattern; a grep tool's pattern is a regex, not a path.
    pattern = _str(call.input.get("pattern"))
    if pattern is not None and "glob" in call.name.lower():
        out.append(pattern.strip())
    return list(dict.fromkeys(out))


def text_paths(text: str, limit: int = 40) -> list[str]:
    """Path-like tokens in free text: ``a/b.py``, ``/abs/dir``, ``name.ext`` with a known ext."""
    out: dict[str, None] = {}
    for tok in _TOKEN.findall(text):
        tok = tok.rstrip(".")
        if not tok or tok.startswith(("//", "/dev/", "/proc/")) or "://" in tok:
            continue
        last = tok.rsplit("/", 1)[-1]
        ext = last.rsplit(".", 1)[-1].lower() if "." in last[1:] else ""
        path_like = ext in _EXTENSIONS or (
            "/" in tok and tok.startswith(("/", "./", "../", "~/")) and tok.count("/") >= 2
        )
        # The letter test last: most tokens are words that are no path at all.
        if path_like and _HAS_LETTER.search(tok):
            out[tok] = None
            if len(out) >= limit:
                break
    return list(out)


def error_lines(text: str) -> Iterator[str]:
    """Lines of tool output or pasted text that report an error, trimmed, in order."""
    for raw in text.splitlines():
        line = raw.strip().removeprefix("<tool_use_error>").removesuffix("</tool_use_error>")
        line = line.strip()
        if (
            len(line.split()) >= 2  # a bare "ERROR:" says nothing; its detail is elsewhere
            and len(line) < 2000
            and not _LISTING.match(line)
            and _ERROR_LINE.search(line)
        ):
            yield line


def urls(text: str) -> list[str]:
    """URLs in ``text``, exact, in order."""
    return [u.rstrip(".,;:") for u in _URL.findall(text)]


def user_text(part: Text) -> str | None:
    """The user's own words in a text part; None for injected or runtime-made text."""
    if part.synthetic:
        return None
    text = _INJECTED.sub("", part.text).strip()
    if not text or text.startswith(_RUNTIME_USER_TEXTS):
        return None
    return text


def _note(files: dict[str, list[str]], path: str, action: str) -> None:
    actions = files.setdefault(path, [])
    if action == "created" and any(a in ("read", "edited", "created") for a in actions):
        action = "edited"  # writing over a file already seen is an edit, not a creation
    if action.endswith(_FAILED) and action.removesuffix(_FAILED) in actions:
        return  # it worked before; this failure is not what the file is known for
    if action + _FAILED in actions:
        actions.remove(action + _FAILED)  # it worked in the end
    if action not in actions:
        actions.append(action)


def gather(messages: Sequence[ModelMessage]) -> Facts:
    """Walk the head once and collect everything the sections are built from."""
    facts = Facts()
    results: dict[str, ToolResult] = {}
    for msg in messages:
        for p in msg.parts:
            if isinstance(p, ToolResult):
                results.setdefault(p.call_id, p)
    seen_errors: dict[str, None] = {}
    for msg in messages:
        for p in msg.parts:
            if isinstance(p, Text) and msg.role == "user":
                text = user_text(p)
                if text is not None:
                    facts.user_texts.append(text)
                    facts.last_role = "user"
                    for line in error_lines(text):
                        seen_errors.setdefault(line, None)
            elif isinstance(p, Text) and msg.role == "assistant" and p.text.strip():
                facts.assistant_texts.append(p.text.strip())
                facts.last_role = "assistant"
            elif isinstance(p, ToolCall):
                facts.last_role = "assistant"
                _add_call(facts, p, results.get(p.call_id), seen_errors)
    facts.errors = list(seen_errors)
    return facts


def _add_call(
    facts: Facts, call: ToolCall, result: ToolResult | None, errors: dict[str, None]
) -> None:
    shell = _is_shell(call)
    command = _str(call.input.get("command")) if shell else None
    action = _action(call, shell)
    paths = _input_paths(call)
    if command is not None:
        paths += [t for t in text_paths(command, 10) if t not in paths]
    entry = Call(call, result, len(facts.calls), command, action, tuple(paths))
    facts.calls.append(entry)
    for path in paths:
        _note(facts.files, path, action + _FAILED if entry.failed else action)
    if result is None:
        return
    out = result_text(result)
    if action in _CONTENT_ACTIONS and not result.is_error:
        return
    for line in error_lines(out):
        if line != "Traceback (most recent call last):":  # the exception line says more
            errors.pop(line, None)
            errors[line] = None  # re-seen errors move to the end: they are still current
    for path in text_paths(out, 20):
        if path not in facts.files:
            _note(facts.files, path, "seen")
