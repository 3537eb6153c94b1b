"""ExtractiveSummarizer: real imported sessions, rolling updates, bounds, and a property."""

from __future__ import annotations

import doctest
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilo_rules.engine.formats.request import (
    Media,
    ModelMessage,
    Part,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.lower import LowerSettings, lower
from kilo_rules.engine.summarizers import ExtractiveSummarizer, extractive
from kilo_rules.engine.summarizers._shared import DEFAULT_HEADINGS, parse_headings
from kilo_rules.engine.summarizers.protocol import Summarizer, SummaryRequest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (ROOT / "policies/prompts/summary-template.md").read_text(encoding="utf-8")
HEADINGS = [h.line for h in parse_headings(TEMPLATE)]
CLAUDE = ROOT / "examples/sessions/claude-code-sonnet45-subagent-a2898e3.jsonl"
SWE = ROOT / "examples/sessions/swe-agent-gpt4-pydicom-1458.traj"
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"


@cache
def head(path: Path) -> tuple[ModelMessage, ...]:
    """A recorded session lowered the way the summary input is."""
    settings = LowerSettings(tool_output_max_chars=2000, strip_all_media=True)
    return tuple(lower(read_session(path, run=0).messages, settings))


def run(
    messages: tuple[ModelMessage, ...],
    budget: int = 4000,
    previous: str | None = None,
    template: str = TEMPLATE,
) -> str:
    request = SummaryRequest("instruction", messages, budget, previous, template)
    return ExtractiveSummarizer().summarize(request)


def section(text: str, heading: str) -> list[str]:
    """The bullet lines under ``heading`` (up to the next heading)."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    out = []
    for line in lines[start:]:
        if line.startswith("#"):
            break
        if line.startswith("- "):
            out.append(line[2:])
    return out


def assert_headings(text: str, headings: list[str]) -> None:
    lines = text.splitlines()
    for h in headings:
        assert lines.count(h) == 1, h
    assert [ln for ln in lines if ln in headings] == headings  # in template order


def test_headings_come_from_the_template() -> None:
    assert HEADINGS == [
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "### Done",
        "### In Progress",
        "### Blocked",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
        "## Relevant Files",
    ]
    assert [h.line for h in DEFAULT_HEADINGS] == HEADINGS


def test_is_a_summarizer_and_the_doctest_holds() -> None:
    assert isinstance(ExtractiveSummarizer(), Summarizer)
    assert doctest.testmod(extractive).failed == 0


def test_claude_code_session() -> None:
    text = run(head(CLAUDE))
    assert_headings(text, HEADINGS)
    root = "/home/USER/projects/spotter-worktrees/spotter-dov"
    goal = section(text, "## Goal")
    assert goal[0].startswith("Very thorough exploration. I need to understand:")
    assert "Please provide the FULL content of each file - don't summarize." in section(
        text, "## Constraints & Preferences"
    )
    files = "\n".join(section(text, "## Relevant Files"))
    for rel in (
        "lib/spotter_web/live/session_live.ex",
        "assets/js/app.js",
        "lib/spotter/services/transcript_renderer.ex",
        "priv/static/assets/spotter.css",
    ):
        assert f"`{root}/{rel}` — " in files, rel
    assert f"`{root}/lib/spotter_web/live/subagent_live.ex` — read\n" in files + "\n"
    context = "\n".join(section(text, "## Critical Context"))
    assert f"Ran `ls -la {root}/assets/`" in context
    assert f'Ran `find {root}/priv -name "*.css" 2>/dev/null | head -5`' in context
    assert f"find: ‘{root}/assets/css’: No such file or directory" in context
    blocked = "\n".join(section(text, "### Blocked"))
    assert "session_live.html.heex`: File does not exist." in blocked
    assert "spotter_web/live/session_live.ex`:" not in blocked  # read again successfully


def test_swe_agent_session() -> None:
    text = run(head(SWE))
    assert_headings(text, HEADINGS)
    context = section(text, "## Critical Context")
    assert (
        "Error seen: AttributeError: Unable to convert the pixel data as the following "
        "required elements are missing from the dataset: PixelRepresentation"
    ) in context
    assert "Error seen: - E999 SyntaxError: unmatched ']'" in context
    assert "Ran `python reproduce_bug.py`" in context
    assert "Ran `rm reproduce_bug.py`" in context
    assert any(c.startswith("Reference: https://github.com/pydicom/pydicom/blob/") for c in context)
    files = "\n".join(section(text, "## Relevant Files"))
    assert "`/pydicom__pydicom/pydicom/pixel_data_handlers/numpy_handler.py`" in files
    assert "Always start by trying to replicate the bug that the issues discusses." in section(
        text, "## Constraints & Preferences"
    )
    assert section(text, "## Next Steps") == [
        "Let's proceed with the submission using the `submit` command."
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in TRAJECTORIES.glob("*.j*")) or ["-"])
def test_larger_recorded_sessions(name: str) -> None:
    path = TRAJECTORIES / name
    if not path.is_file():
        pytest.skip("the shared trajectories are not available")
    messages = head(path)
    text = run(messages)
    assert_headings(text, HEADINGS)
    assert len(text) <= 4000 * 4
    assert text == run(messages)


@pytest.mark.parametrize("budget", [0, 50, 300, 800, 2000])
def test_output_is_bounded(budget: int) -> None:
    text = run(head(CLAUDE) + head(SWE), budget=budget)
    assert_headings(text, HEADINGS)
    headings_only = len("\n\n".join(HEADINGS)) + 200
    assert len(text) <= max(budget * 4, headings_only)
    for line in text.splitlines():
        assert len(line) <= 2 + 300


def test_deterministic() -> None:
    messages = head(SWE)
    assert (
        run(messages)
        == run(messages)
        == ExtractiveSummarizer().summarize(
            SummaryRequest("other instruction", messages, 4000, None, TEMPLATE)
        )
    )


def test_rolling_update_on_a_real_session() -> None:
    messages = head(SWE)
    first = run(messages[:12])
    second = run(messages[12:], previous=first)
    assert_headings(second, HEADINGS)
    for h in ("## Goal", "## Constraints & Preferences", "## Key Decisions"):
        for bullet in section(first, h)[:6]:
            assert bullet in section(second, h), (h, bullet)
    assert second == run(messages[12:], previous=first)


def user(text: str, synthetic: bool = False) -> ModelMessage:
    return ModelMessage("user", (Text(text, synthetic=synthetic),))


def said(text: str, *calls: ToolCall) -> ModelMessage:
    return ModelMessage("assistant", (Text(text), *calls))


def results(*parts: ToolResult) -> ModelMessage:
    return ModelMessage("tool", parts)


def out(call_id: str, name: str, text: str, error: bool = False) -> ToolResult:
    return ToolResult(call_id, name, (Text(text),), is_error=error)


SMALL = (
    user("<environment_details>cwd: /repo</environment_details>", synthetic=True),
    user(
        "Port the CLI to click. Always keep the exit codes stable."
        "\n<environment_details>Current time: noon</environment_details>"
    ),
    said(
        "I decided to use click groups because the old parser nests subcommands.",
        ToolCall("1", "Read", {"file_path": "src/my app/cli ü.py"}),
        ToolCall("2", "Bash", {"command": "pytest -q tests/test_cli.py"}),
    ),
    results(
        out("1", "Read", "import argparse"),
        out(
            "2",
            "Bash",
            "FAILED tests/test_cli.py::test_exit - assert 2 == 0\nExit code 1",
            error=True,
        ),
    ),
    said(
        "Fixed the exit code mapping in the dispatcher.",
        ToolCall(
            "3", "Edit", {"file_path": "src/my app/cli ü.py", "old_string": "a", "new_string": "b"}
        ),
        ToolCall("4", "Write", {"file_path": "src/commands.py", "content": "x"}),
    ),
    results(out("3", "Edit", "ok"), out("4", "Write", "ok")),
    said("Next I will run the full test suite, then update the changelog."),
)


def test_sections_of_a_small_head() -> None:
    text = run(SMALL)
    assert "environment_details" not in text and "noon" not in text
    assert section(text, "## Goal") == ["Port the CLI to click. Always keep the exit codes stable."]
    assert section(text, "## Constraints & Preferences") == ["Always keep the exit codes stable."]
    assert section(text, "## Key Decisions") == [
        "I decided to use click groups because the old parser nests subcommands."
    ]
    done = section(text, "### Done")
    assert "Edited `src/my app/cli ü.py`" in done and "Created `src/commands.py`" in done
    assert "Fixed the exit code mapping in the dispatcher." in done
    assert section(text, "### Blocked") == [
        "`Bash` on `pytest -q tests/test_cli.py`: "
        "FAILED tests/test_cli.py::test_exit - assert 2 == 0"
    ]
    assert section(text, "## Next Steps") == [
        "Next I will run the full test suite, then update the changelog."
    ]
    assert section(text, "## Critical Context") == [
        "Error seen: FAILED tests/test_cli.py::test_exit - assert 2 == 0",
        "Error seen: Exit code 1",
        "Ran `pytest -q tests/test_cli.py` (failed)",
    ]
    assert section(text, "## Relevant Files") == [
        "`src/my app/cli ü.py` — read, edited",
        "`src/commands.py` — created",
        "`tests/test_cli.py` — ran (failed)",
    ]
    assert "summar" not in text.lower()


def test_rolling_update_merges_and_replaces_state() -> None:
    first = run(SMALL)
    later = (
        user("Also never print colours when stdout is not a TTY."),
        said(
            "Switched to click.echo instead of print because it handles encodings.",
            ToolCall(
                "9", "Edit", {"file_path": "src/commands.py", "old_string": "a", "new_string": "b"}
            ),
        ),
        results(out("9", "Edit", "ok")),
        said("Next I will update the changelog."),
    )
    second = run(later, previous=first)
    assert_headings(second, HEADINGS)
    assert section(second, "## Constraints & Preferences") == [
        "Always keep the exit codes stable.",
        "Also never print colours when stdout is not a TTY.",
    ]
    assert section(second, "## Key Decisions") == [
        "I decided to use click groups because the old parser nests subcommands.",
        "Switched to click.echo instead of print because it handles encodings.",
    ]
    # Next Steps describe the present: the new ones replace the old.
    assert section(second, "## Next Steps") == ["Next I will update the changelog."]
    assert section(second, "## Relevant Files")[:2] == [
        "`src/my app/cli ü.py` — read, edited",
        "`src/commands.py` — created, edited",
    ]
    # Updating again with nothing new changes nothing but the state sections.
    third = run((), previous=second)
    for h in (
        "## Goal",
        "## Constraints & Preferences",
        "## Key Decisions",
        "## Relevant Files",
        "## Next Steps",
    ):
        assert section(third, h) == section(second, h), h


def test_previous_text_from_a_model_is_read_leniently() -> None:
    previous = (
        "# Notes\nintro line\n\n## Goal\n* Ship v2\n\n## Constraints and preferences\n"
        "1. Use uv, not pip\n\n### Done\n- (none)\n- Wrote the parser\n\n## Oddities\n- x\n"
    )
    text = run((), previous=previous)
    assert section(text, "## Goal") == ["Ship v2"]
    assert section(text, "## Constraints & Preferences") == ["Use uv, not pip"]
    assert section(text, "### Done") == ["Wrote the parser"]
    assert "intro line" not in text and "Oddities" not in text


def test_custom_and_missing_templates() -> None:
    custom = "Use:\n\n## Task\n## Files touched\n## Open questions\n```\n## Not a heading\n```"
    text = run(SMALL, template=custom)
    assert_headings(text, ["## Task", "## Files touched", "## Open questions"])
    assert "## Not a heading" not in text
    assert section(text, "## Open questions") == ["(none)"]
    assert section(text, "## Files touched")[0] == "`src/my app/cli ü.py` — read, edited"
    assert_headings(run(SMALL, template=""), HEADINGS)


def test_empty_head_has_every_heading() -> None:
    text = run(())
    assert_headings(text, HEADINGS)
    assert section(text, "## Goal") == ["(none)"]
    assert "## Progress\n\n### Done" in text  # a parent heading has no placeholder


_TEXT = st.text(max_size=120)
_INPUT = st.dictionaries(
    st.sampled_from(["path", "file_path", "filePath", "command", "pattern", "glob", "paths", "q"]),
    st.one_of(_TEXT, st.integers(), st.none(), st.lists(_TEXT, max_size=3)),
    max_size=4,
)
_NAME = st.one_of(
    st.sampled_from(["bash", "Read", "Edit", "Write", "Glob", "str_replace_editor"]), _TEXT
)
_CALL_ID = st.sampled_from(["a", "b", "c"])
_PART: st.SearchStrategy[Part] = st.one_of(
    st.builds(Text, _TEXT, synthetic=st.booleans()),
    st.builds(Reasoning, _TEXT),
    st.builds(Media, st.just("image/png"), data=st.just("AAAA")),
    st.builds(ToolCall, _CALL_ID, _NAME, _INPUT),
    st.builds(
        ToolResult, _CALL_ID, _NAME, st.tuples(st.builds(Text, _TEXT)), is_error=st.booleans()
    ),
)
_MESSAGE = st.builds(
    ModelMessage,
    st.sampled_from(["system", "user", "assistant", "tool"]),
    st.lists(_PART, max_size=4).map(tuple),
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(_MESSAGE, max_size=8).map(tuple),
    budget=st.integers(-10, 3000),
    previous=st.one_of(st.none(), _TEXT, st.just(run(SMALL))),
    template=st.one_of(st.just(TEMPLATE), st.just(""), _TEXT),
)
def test_property_never_raises_and_keeps_every_heading(
    messages: tuple[ModelMessage, ...], budget: int, previous: str | None, template: str
) -> None:
    request = SummaryRequest("x", messages, budget, previous, template)
    text = ExtractiveSummarizer().summarize(request)
    headings = [h.line for h in (parse_headings(template) or DEFAULT_HEADINGS)]
    assert_headings(text, headings)
    assert text == ExtractiveSummarizer().summarize(request)
    bare = ExtractiveSummarizer().summarize(SummaryRequest("x", (), 0, None, template))
    assert len(text) <= max(budget * 4, len(bare))
    assert all(len(line) <= 302 for line in text.splitlines() if line.startswith("- "))
