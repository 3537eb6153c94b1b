"""docs/getting-started.md works against the current API: its Python blocks run in order in
one namespace (from the repository root, the model call faked by the page itself), and every
``kilo-rules`` command its shell blocks name exists."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import pytest

from kilo_rules.tools.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[str]:
    """The fenced blocks of ``lang`` on the page, at the left margin, in order."""
    return [body for kind, body in _FENCE.findall(PAGE.read_text(encoding="utf-8")) if kind == lang]


def test_the_python_blocks_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = blocks("python")
    assert len(code) >= 4
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": "getting_started"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the page uses no deprecated name
        for i, block in enumerate(code):
            exec(compile(block, f"{PAGE}:block{i + 1}", "exec"), namespace)
    from kilo_rules import StepResult

    step = namespace["step"]
    assert isinstance(step, StepResult)
    # Three turns ran: the session the loop kept holds every answer and the next question.
    ids = [m.id for m in namespace["session"].messages]  # type: ignore[attr-defined]
    assert ids == ["u1", "a1", "u2", "a2", "u3", "a3", "u4"]
    assert step.request["messages"][-1]["role"] == "user"
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_every_command_on_the_page_exists() -> None:
    seen = set()
    for block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.startswith("kilo-rules "):
                continue
            words = shlex.split(line, comments=True)[1:]
            if words[0].startswith("-"):
                continue
            assert words[0] in COMMANDS, line
            seen.add(words[0])
            # The options parse as that command's parser reads them.
            _, extra = build_parser(words[0]).parse_known_args(words)
            assert not extra, line
    assert {"check", "test", "verify", "serve", "simulate", "tune", "bundle", "build"} <= seen
