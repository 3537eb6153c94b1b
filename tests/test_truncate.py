"""Tool-output truncation: Kilo ``Truncate.output`` (spec §11.1) and the summary-time cut
``truncateToolOutput`` (spec §11.2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilo_rules.engine.text.truncate import (
    DELEGATE_ADVICE,
    GREP_ADVICE,
    MAX_BYTES,
    MAX_LINES,
    cleanup_spill_dir,
    spill_path_for,
    truncate_for_summary,
    truncate_output,
)

HINT_HEAD = "The tool call succeeded but the output was truncated. Full output saved to: "


def numbered(n: int) -> str:
    return "\n".join(f"line {i}" for i in range(n))


def test_spec_11_1_limits() -> None:
    assert MAX_LINES == 2000
    assert MAX_BYTES == 51200


# --- §11.1 Truncate.output ----------------------------------------------------------------


def test_spec_11_1_under_limits_unchanged_and_nothing_written(tmp_path: Path) -> None:
    text = numbered(2000)  # exactly max_lines lines
    result = truncate_output(text, spill_dir=tmp_path / "spill", call_id="c1")
    assert result.content == text
    assert not result.truncated
    assert result.removed == 0
    assert result.spill_path is None
    assert not (tmp_path / "spill").exists()


def test_spec_11_1_exactly_max_bytes_is_unchanged(tmp_path: Path) -> None:
    text = "a" * 10
    result = truncate_output(text, spill_dir=tmp_path, call_id="c", max_bytes=10)
    assert not result.truncated


def test_spec_11_1_line_limit_head(tmp_path: Path) -> None:
    text = numbered(2500)
    result = truncate_output(text, spill_dir=tmp_path, call_id="c1")
    assert result.truncated
    assert result.unit == "lines"
    assert result.removed == 500
    preview = numbered(2000)
    path = tmp_path / "tool_c1"
    assert result.spill_path == path
    assert result.content == (
        f"{preview}\n\n...500 lines truncated...\n\n{HINT_HEAD}{path}\n{DELEGATE_ADVICE}"
    )


def test_spec_11_1_byte_limit_wins_even_when_lines_also_exceeded(tmp_path: Path) -> None:
    # 3000 lines of 100 bytes: the byte limit stops the walk long before line 2000.
    lines = [f"{i:04d}" + "x" * 96 for i in range(3000)]
    text = "\n".join(lines)
    result = truncate_output(text, spill_dir=tmp_path, call_id="c2")
    assert result.unit == "bytes"
    # Each line costs 100 bytes plus 1 for its newline (none for the first): 506 lines fit.
    kept = 1 + (MAX_BYTES - 100) // 101
    assert kept == 506
    kept_bytes = 100 + (kept - 1) * 101
    assert kept_bytes <= MAX_BYTES < kept_bytes + 101
    assert result.removed == len(text.encode()) - kept_bytes
    assert result.content.startswith("\n".join(lines[:kept]) + "\n\n...")
    assert f"...{result.removed} bytes truncated..." in result.content


def test_spec_11_1_bytes_are_utf8(tmp_path: Path) -> None:
    text = "é" * 6  # 12 UTF-8 bytes, 6 code points
    result = truncate_output(text, spill_dir=tmp_path, call_id="c", max_bytes=11)
    assert result.truncated
    assert result.unit == "bytes"
    assert result.removed == 12  # the single line does not fit: everything removed


def test_spec_11_1_single_oversized_line_gives_empty_preview(tmp_path: Path) -> None:
    text = "y" * (MAX_BYTES + 1)
    result = truncate_output(text, spill_dir=tmp_path, call_id="big")
    assert result.unit == "bytes"
    assert result.removed == MAX_BYTES + 1
    assert result.content.startswith("\n\n...51201 bytes truncated...\n\n" + HINT_HEAD)


def test_spec_11_1_tail_layout(tmp_path: Path) -> None:
    text = numbered(10)
    result = truncate_output(
        text, spill_dir=tmp_path, call_id="t", max_lines=3, direction="tail", task_enabled=False
    )
    path = tmp_path / "tool_t"
    assert result.removed == 7
    assert result.unit == "lines"
    assert result.content == (
        f"...7 lines truncated...\n\n{HINT_HEAD}{path}\n{GREP_ADVICE}\n\nline 7\nline 8\nline 9"
    )


def test_spec_11_1_tail_byte_limit(tmp_path: Path) -> None:
    text = "aaaa\nbbbb\ncccc"
    # From the end: "cccc" (4), "\nbbbb" (5) → 9; "\naaaa" would make 14 > 10.
    result = truncate_output(text, spill_dir=tmp_path, call_id="t", max_bytes=10, direction="tail")
    assert result.unit == "bytes"
    assert result.removed == 14 - 9
    assert result.content.endswith("\n\nbbbb\ncccc")


def test_spec_11_1_hint_without_task_tool(tmp_path: Path) -> None:
    result = truncate_output(
        numbered(5), spill_dir=tmp_path, call_id="g", max_lines=2, task_enabled=False
    )
    assert result.content.endswith(f"{HINT_HEAD}{tmp_path / 'tool_g'}\n{GREP_ADVICE}")
    assert "Task" not in result.content
    # Kilo's text (truncate.ts@5124c73:134).
    assert GREP_ADVICE == (
        "Use Grep to search the full content or Read with offset/limit to view specific sections."
    )


def test_spec_11_1_hint_with_task_gives_both_advices(tmp_path: Path) -> None:
    # With the Task tool the hint still says how to search and read the file (Grep, Read
    # with offset/limit), and hands that to a sub-agent: Kilo's text, truncate.ts@5124c73:133.
    result = truncate_output(numbered(5), spill_dir=tmp_path, call_id="d", max_lines=2)
    path = tmp_path / "tool_d"
    assert result.content == (
        "line 0\nline 1\n\n...3 lines truncated...\n\n"
        f"The tool call succeeded but the output was truncated. Full output saved to: {path}\n"
        "Use the Task tool to have explore agent process this file with Grep and Read "
        "(with offset/limit). Do NOT read the full file yourself - delegate to save context."
    )
    assert GREP_ADVICE not in result.content  # the sentence of the agent without a Task tool


def test_spec_11_1_custom_hint_template(tmp_path: Path) -> None:
    result = truncate_output(
        numbered(5),
        spill_dir=tmp_path,
        call_id="h",
        max_lines=2,
        hint_template="see {path} {literal braces} / {advice}",
    )
    assert result.content.endswith(
        f"see {tmp_path / 'tool_h'} {{literal braces}} / {DELEGATE_ADVICE}"
    )


def test_spec_11_1_full_text_written(tmp_path: Path) -> None:
    text = "héllo\n" * 3000 + "end \U0001f600"
    spill = tmp_path / "nested" / "dir"
    result = truncate_output(text, spill_dir=spill, call_id="call_42")
    assert result.spill_path == spill / "tool_call_42"
    assert result.spill_path.read_bytes() == text.encode("utf-8")
    assert [p.name for p in spill.iterdir()] == ["tool_call_42"]  # no temp file left behind


def test_spec_11_1_call_id_cannot_escape_spill_dir(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    path = spill_path_for(spill, "../../etc/passwd")
    assert path.parent == spill
    assert path.name.startswith("tool_______etc_passwd.")
    assert spill_path_for(spill, "a\\b:c").name.startswith("tool_a_b_c.")
    for dots in (".", "..", "../", "/..", "./.", "..\\.."):
        assert spill_path_for(spill, dots).parent == spill
        assert spill_path_for(spill, dots).resolve().parent == spill.resolve()
    result = truncate_output(numbered(5), spill_dir=spill, call_id="../x", max_lines=1)
    assert result.spill_path is not None
    assert result.spill_path.parent == spill
    with pytest.raises(ValueError, match="call_id"):
        spill_path_for(spill, "")


def test_spec_11_1_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="direction"):
        truncate_output("x", spill_dir=tmp_path, call_id="c", direction="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        truncate_output("x", spill_dir=tmp_path, call_id="c", max_lines=-1)


def test_spec_11_1_lone_surrogates_count_like_node(tmp_path: Path) -> None:
    # Node's Buffer.byteLength counts a lone surrogate as U+FFFD (3 bytes).
    text = "\ud800" * 4  # 12 bytes in Node
    result = truncate_output(text, spill_dir=tmp_path, call_id="s", max_bytes=11)
    assert result.removed == 12
    assert result.spill_path is not None
    assert result.spill_path.read_bytes() == "\ufffd".encode() * 4


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.characters(exclude_categories=["Cs"]), max_size=300).map(
        lambda s: s.replace("\r", "\n")
    ),
    max_lines=st.integers(0, 20),
    max_bytes=st.integers(0, 200),
)
def test_spec_11_1_property_preview_is_prefix_or_suffix_within_budget(
    tmp_path: Path, text: str, max_lines: int, max_bytes: int
) -> None:
    for direction in ("head", "tail"):
        result = truncate_output(
            text,
            spill_dir=tmp_path,
            call_id="p",
            max_lines=max_lines,
            max_bytes=max_bytes,
            direction=direction,
        )
        if not result.truncated:
            assert result.content == text
            assert len(text.split("\n")) <= max_lines
            assert len(text.encode()) <= max_bytes
            continue
        hint = f"{HINT_HEAD}{tmp_path / 'tool_p'}\n{DELEGATE_ADVICE}"
        tail_block = f"...{result.removed} {result.unit} truncated...\n\n{hint}"
        if direction == "head":
            assert result.content.endswith("\n\n" + tail_block)
            preview = result.content[: -len("\n\n" + tail_block)]
            assert text.startswith(preview)
        else:
            assert result.content.startswith(tail_block + "\n\n")
            preview = result.content[len(tail_block + "\n\n") :]
            assert text.endswith(preview)
        kept_bytes = len(preview.encode())
        assert kept_bytes <= max_bytes
        assert len(preview.split("\n")) <= max(max_lines, 1)
        if result.unit == "bytes":
            assert result.removed == len(text.encode()) - kept_bytes


# --- retention ----------------------------------------------------------------------------


def test_spec_11_1_retention_cleanup(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    week = 7 * 24 * 3600
    old = tmp_path / "tool_old"
    fresh = tmp_path / "tool_fresh"
    other = tmp_path / "notes.txt"
    for path, age in ((old, week + 60), (fresh, week - 60), (other, 10 * week)):
        path.write_text("x")
        os.utime(path, (now - age, now - age))
    removed = cleanup_spill_dir(tmp_path, now=now)
    assert removed == [old]
    assert not old.exists()
    assert fresh.exists()
    assert other.exists()  # not a spill file
    assert cleanup_spill_dir(tmp_path, now=now, retention_seconds=0) == [fresh]


def test_spec_11_1_retention_missing_dir(tmp_path: Path) -> None:
    assert cleanup_spill_dir(tmp_path / "absent") == []


# --- §11.2 truncateToolOutput -------------------------------------------------------------


def test_spec_11_2_summary_cut() -> None:
    assert truncate_for_summary("abcdefghij", 4) == (
        "abcd\n[Tool output truncated for compaction: omitted 6 chars]"
    )
    assert truncate_for_summary("abcd", 4) == "abcd"
    assert truncate_for_summary("abcdefghij", None) == "abcdefghij"
    assert truncate_for_summary("ab", 0) == (
        "\n[Tool output truncated for compaction: omitted 2 chars]"
    )
    with pytest.raises(ValueError, match="negative"):
        truncate_for_summary("ab", -1)


def test_spec_11_2_surrogate_safe_cut_with_emoji_at_the_boundary() -> None:
    emoji = "\U0001f600"  # 2 UTF-16 units
    text = "abc" + emoji + "defg"  # units: a b c [hi lo] d e f g = 9
    # A cut at 4 units would keep the high surrogate alone: cut one unit earlier.
    assert truncate_for_summary(text, 4) == (
        "abc\n[Tool output truncated for compaction: omitted 6 chars]"
    )
    # A cut at 5 units keeps the whole emoji.
    assert truncate_for_summary(text, 5) == (
        "abc" + emoji + "\n[Tool output truncated for compaction: omitted 4 chars]"
    )
    assert truncate_for_summary(text, 9) == text  # 9 units fit, though len(text) is 8
    assert truncate_for_summary(text, 8).endswith("omitted 1 chars]")


def test_spec_11_2_counts_utf16_not_code_points() -> None:
    text = "\U0001f600" * 5  # 5 code points, 10 units
    assert truncate_for_summary(text, 6) == (
        "\U0001f600" * 3 + "\n[Tool output truncated for compaction: omitted 4 chars]"
    )
    assert truncate_for_summary(text, 10) == text


@given(st.text(max_size=60), st.integers(0, 80))
def test_spec_11_2_property(text: str, max_chars: int) -> None:
    out = truncate_for_summary(text, max_chars)
    units = len(text.encode("utf-16-le", "surrogatepass")) // 2
    if units <= max_chars:
        assert out == text
        return
    kept, note = out.rsplit("\n[Tool output truncated for compaction: omitted ", 1)
    kept_units = len(kept.encode("utf-16-le", "surrogatepass")) // 2
    assert max_chars - 1 <= kept_units <= max_chars
    assert note == f"{units - kept_units} chars]"
    assert text.encode("utf-16-le", "surrogatepass").startswith(
        kept.encode("utf-16-le", "surrogatepass")
    )


def test_spill_names_of_plain_ids_are_kilos(tmp_path: Path) -> None:
    assert spill_path_for(tmp_path, "toolu_01AbC-9").name == "tool_toolu_01AbC-9"
    assert spill_path_for(tmp_path, "x" * 64).name == "tool_" + "x" * 64


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("a/b", "a_b"),  # sanitised alike, and one of them plain
        ("a/b", "a:b"),  # sanitised alike, neither plain
        ("é", "ü"),  # one-character non-ASCII ids
        ("é", "_"),
        ("x" * 300, "x" * 299 + "y"),  # differ past the readable prefix
        ("a.b", "a_b"),
        ("\ud800", "\udc00"),  # lone surrogates, as a model may emit them
    ],
)
def test_spill_names_never_collide(tmp_path: Path, one: str, other: str) -> None:
    assert spill_path_for(tmp_path, one) != spill_path_for(tmp_path, other)
    for call_id in (one, other):
        truncate_output(numbered(5), spill_dir=tmp_path, call_id=call_id, max_lines=1)
    assert len(list(tmp_path.iterdir())) == 2


def test_spill_name_of_a_long_id_is_bounded(tmp_path: Path) -> None:
    call_id = "é/" * 150  # 300 characters, 450 UTF-8 bytes
    result = truncate_output(numbered(5), spill_dir=tmp_path, call_id=call_id, max_lines=1)
    assert result.spill_path is not None
    assert result.spill_path.parent == tmp_path
    assert len(result.spill_path.name) <= 70
    assert result.spill_path.read_text() == numbered(5)
    assert cleanup_spill_dir(tmp_path, now=10**12) == [result.spill_path]
