"""Located errors: truncated and corrupted copies of each log, shape errors, detection."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from importer_helpers import EXAMPLES, SUBAGENT, SWE_AGENT, TRAJECTORIES, shared_log

from kilo_rules.engine.base.errors import ImportFormatError
from kilo_rules.engine.formats.session import TextPart
from kilo_rules.engine.importers import FORMATS, detect_format, import_file, import_text

LOGS = [
    ("claude_code", SUBAGENT),
    ("swe_agent", SWE_AGENT),
    ("claude_code", TRAJECTORIES / "claude-code-opus46-spotter-8463c716.jsonl"),
    ("openhands", TRAJECTORIES / "openhands-llama4-multiswebench-output.jsonl"),
    ("mini_swe_agent", TRAJECTORIES / "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json"),
    ("mini_swe_agent", TRAJECTORIES / "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json"),
]
IDS = [path.name for _, path in LOGS]


def _text(path: Path) -> str:
    if path.parent != EXAMPLES:
        path = shared_log(path.name)
    return path.read_text(encoding="utf-8")


def _error(tmp_path: Path, data: bytes, fmt: str = "auto") -> ImportFormatError:
    bad = tmp_path / "bad.log"
    bad.write_bytes(data)
    with pytest.raises(ImportFormatError) as info:
        import_file(bad, fmt=fmt)
    assert info.value.diagnostic.location.file == str(bad)
    return info.value


@pytest.mark.parametrize(("fmt", "path"), LOGS, ids=IDS)
@pytest.mark.parametrize("given", [False, True], ids=["auto", "named"])
def test_truncated_mid_line(tmp_path: Path, fmt: str, path: Path, given: bool) -> None:
    text = _text(path)
    lines = text.split("\n")
    # Cut in the middle of the line at 60 % of the file, as an interrupted copy would be.
    n = int(len(lines) * 0.6) or 1
    while len(lines[n - 1]) < 10:
        n += 1
    cut = "\n".join([*lines[: n - 1], lines[n - 1][: len(lines[n - 1]) // 2]])
    err = _error(tmp_path, cut.encode(), fmt if given else "auto")
    diag = err.diagnostic
    assert diag.code == "import.json"
    assert diag.location.line == n
    assert 1 <= diag.location.col <= len(lines[n - 1]) // 2 + 1


@pytest.mark.parametrize(("fmt", "path"), LOGS, ids=IDS)
def test_corrupted_line(tmp_path: Path, fmt: str, path: Path) -> None:
    lines = _text(path).split("\n")
    # Break the first key/value colon at or after the middle line.
    n = len(lines) // 2 + 1
    pattern = re.compile(r'"[^":\\]*"(:)')
    while not pattern.search(lines[n - 1]):
        n += 1
    found = pattern.search(lines[n - 1])
    assert found is not None
    col = found.start(1) + 1  # 1-based column of the colon
    lines[n - 1] = lines[n - 1][: col - 1] + ";" + lines[n - 1][col:]
    diag = _error(tmp_path, "\n".join(lines).encode(), fmt).diagnostic
    assert (diag.code, diag.message) == ("import.json", "not valid JSON: Expecting ':' delimiter")
    assert (diag.location.line, diag.location.col) == (n, col)


@pytest.mark.parametrize(("fmt", "path"), LOGS[:2], ids=IDS[:2])
def test_invalid_utf8(tmp_path: Path, fmt: str, path: Path) -> None:
    data = path.read_bytes()
    lines = data.split(b"\n")
    lines[9] = lines[9][:5] + b"\xff" + lines[9][6:]
    diag = _error(tmp_path, b"\n".join(lines)).diagnostic
    assert diag.code == "import.encoding"
    assert (diag.location.line, diag.location.col) == (10, 6)


def test_wrong_shape_in_a_jsonl_line_is_located(tmp_path: Path) -> None:
    lines = SUBAGENT.read_text(encoding="utf-8").split("\n")
    record = json.loads(lines[1])
    record["message"] = 42
    lines[1] = json.dumps(record)
    diag = _error(tmp_path, "\n".join(lines).encode()).diagnostic
    assert diag.code == "import.shape"
    assert diag.message == "message: expected an object, found a number"
    assert (diag.location.line, diag.location.col) == (2, lines[1].index("42") + 1)


def test_json_lines_given_to_a_document_format(tmp_path: Path) -> None:
    diag = _error(tmp_path, SUBAGENT.read_bytes(), "swe_agent").diagnostic
    assert diag.code == "import.json"
    assert (diag.location.line, diag.location.col) == (2, 1)
    assert diag.hint is not None and "JSON Lines" in diag.hint


def test_document_given_to_claude_code(tmp_path: Path) -> None:
    diag = _error(tmp_path, SWE_AGENT.read_bytes(), "claude_code").diagnostic
    assert diag.code == "import.shape"
    assert (diag.location.line, diag.location.col) == (1, 1)


def test_openhands_without_history(tmp_path: Path) -> None:
    data = b'{"instance_id": "x", "history": null}\n{"instance_id": "y"}\n'
    diag = _error(tmp_path, data, "openhands").diagnostic
    assert diag.message == "history: expected an array, found null"
    assert (diag.location.line, diag.location.col) == (1, data.index(b"null") + 1)


def test_unknown_format_names_the_formats_tried() -> None:
    with pytest.raises(ImportFormatError) as info:
        detect_format('{"hello": "world"}', name="x.json")
    diag = info.value.diagnostic
    assert diag.code == "import.format"
    assert diag.message == (
        "cannot tell the format of this JSON (tried mini_swe_agent, "
        "swe_agent, openhands, claude_code, openai_responses, "
        "anthropic_messages, openai_chat)"
    )
    assert str(diag.location) == "x.json:1:1"
    with pytest.raises(ImportFormatError, match="JSON Lines file"):
        detect_format('{"a": 1}\n{"b": 2}\n')


def test_empty_file(tmp_path: Path) -> None:
    assert _error(tmp_path, b"  \n\n").diagnostic.code == "import.empty"


def test_unknown_format_name() -> None:
    with pytest.raises(ImportFormatError) as info:
        import_text("[]", fmt="claude-code")
    diag = info.value.diagnostic
    assert diag.code == "import.unknown-format"
    assert diag.hint is not None and diag.hint.startswith("did you mean 'claude_code'?")
    assert set(FORMATS) == {
        "anthropic_messages",
        "claude_code",
        "mini_swe_agent",
        "openai_chat",
        "openai_responses",
        "openhands",
        "swe_agent",
    }


def test_run_of_a_single_run_format() -> None:
    with pytest.raises(ImportFormatError) as info:
        import_file(SWE_AGENT, run=1)
    assert info.value.diagnostic.code == "import.run"
    assert info.value.diagnostic.message == (
        "run 1 is out of range: a swe_agent log holds 1 run (run 0)"
    )
    assert import_file(SWE_AGENT, run=0) == import_file(SWE_AGENT)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError) as info:
        import_file(tmp_path / "missing.jsonl")
    assert info.value.diagnostic.code == "io.read"


# -- wrong shapes, limits and untrusted values: each located at the offending value ---------


def _text_error(text: str, fmt: str = "auto") -> tuple[str, str, int, int]:
    with pytest.raises(ImportFormatError) as info:
        import_text(text, fmt=fmt, name="log.json")
    diag = info.value.diagnostic
    assert diag.location.file == "log.json"
    return diag.code, diag.message, diag.location.line, diag.location.col


def _col(text: str, needle: str, line: int = 1) -> int:
    return text.split("\n")[line - 1].index(needle) + 1


_TCM = '"tool_call_metadata": {"tool_call_id": "c", "model_response": {"id": "r", '
_OPENHANDS_CALL = (
    '{"instance_id": "x", "history": [{"id": 1, "source": "agent", "action": "run", '
    + _TCM
    + '"choices": [{"message": {"tool_calls": 5}}]}}}]}'
)


@pytest.mark.parametrize(
    ("fmt", "text", "message", "at"),
    [
        (
            "claude_code",
            '{"type": {}, "sessionId": "x"}',
            "type: expected a string, found an object",
            "{}",
        ),
        (
            "openhands",
            _OPENHANDS_CALL,
            "history[0].tool_call_metadata.model_response.choices[0].message.tool_calls: "
            "expected an array, found a number",
            "5",
        ),
        (
            "openhands",
            '{"instance_id": "x", "history": [{"id": 1, "source": "user", "action": "message", '
            '"args": {"content": "hi", "image_urls": 7}}]}',
            "history[0].args.image_urls: expected an array, found a number",
            "7",
        ),
        (
            "mini_swe_agent",
            '{"trajectory_format": "mini-swe-agent-1", "messages": [{"role": "assistant", '
            '"content": "x", "extra": {"response": {"choices": [{"finish_reason": [1]}]}}}]}',
            "messages[0].extra.response.choices[0].finish_reason: "
            "expected a string, found an array",
            "[1]",
        ),
        (
            "claude_code",
            '{"type": "assistant", "sessionId": "x", "message": {"id": "m", "model": 3, '
            '"content": []}}',
            "message.model: expected a string, found a number",
            "3",
        ),
        (
            "claude_code",
            '{"type": "user", "sessionId": "x", "cwd": ["/"], "message": {"content": "hi"}}',
            "cwd: expected a string, found an array",
            '["/"]',
        ),
        (
            "anthropic_messages",
            '{"messages": [{"role": "assistant", "content": [{"type": "thinking", '
            '"thinking": "t", "signature": {"s": 1}}]}]}',
            "messages[0].content[0].signature: expected a string, found an object",
            '{"s"',
        ),
        (
            "anthropic_messages",
            '{"messages": [{"role": "user", "content": [{"type": "image", "title": 1, '
            '"source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}',
            "messages[0].content[0].title: expected a string, found a number",
            "1,",
        ),
        (
            "anthropic_messages",
            '{"tools": {"name": "x"}, "messages": []}',
            "tools: expected an array, found an object",
            '{"name"',
        ),
        (
            "openai_chat",
            '{"tools": 1.5, "messages": [{"role": "user", "content": "hi"}]}',
            "tools: expected an array, found a number",
            "1.5",
        ),
        (
            "openai_chat",
            '{"messages": [{"role": "assistant", "content": "x", "finish_reason": ["stop"]}]}',
            "messages[0].finish_reason: expected a string, found an array",
            '["stop"]',
        ),
        (
            "openai_chat",
            '[{"role": "user", "content": [{"type": "file", "file": {"file_data": 9}}]}]',
            "[0].content[0].file.file_data: expected a string, found a number",
            "9",
        ),
    ],
    ids=[
        "claude-type-object",
        "openhands-tool-calls-number",
        "openhands-image-urls",
        "mini-finish-reason",
        "claude-model",
        "claude-cwd",
        "anthropic-signature",
        "anthropic-title",
        "anthropic-tools",
        "openai-tools",
        "openai-finish-reason",
        "openai-file-data",
    ],
)
def test_wrong_types_are_located(fmt: str, text: str, message: str, at: str) -> None:
    code, got, line, col = _text_error(text, fmt)
    assert (code, got) == ("import.shape", message)
    assert (line, col) == (1, _col(text, at))


def test_wrong_type_of_a_claude_code_type_is_not_claude_code() -> None:
    # Detection looks for a Claude Code "type"; an object there is no such record.
    code, _, line, col = _text_error('{"type": {}, "sessionId": "x"}')
    assert (code, line, col) == ("import.format", 1, 1)


def test_repeated_tool_call_id_is_located() -> None:
    lines = [
        '{"type": "assistant", "sessionId": "s", "message": {"id": "a", "content": '
        '[{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]}}',
        '{"type": "assistant", "sessionId": "s", "message": {"id": "b", "content": '
        '[{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]}}',
    ]
    code, message, line, col = _text_error("\n".join(lines))
    assert code == "import.duplicate-id"
    assert message == "message.content[0].id: tool call id 'toolu_1' is used by an earlier call"
    assert (line, col) == (2, _col(lines[1], '"toolu_1"'))


def test_repeated_openai_call_id_is_located() -> None:
    call = '{"id": "call_1", "function": {"name": "bash", "arguments": "{}"}}'
    text = json.dumps(
        [
            {"role": "assistant", "tool_calls": [json.loads(call)]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
            {"role": "assistant", "tool_calls": [json.loads(call)]},
        ],
        indent=1,
    )
    code, message, line, _ = _text_error(text, "openai_chat")
    assert code == "import.duplicate-id"
    assert message.startswith("[2].tool_calls[0].id: tool call id 'call_1'")
    lines = text.split("\n")
    assert line == [n for n, ln in enumerate(lines, 1) if ln.strip() == '"id": "call_1",'][1]


@pytest.mark.parametrize("fmt", ["claude_code", "auto"])
def test_deep_nesting_is_located(fmt: str) -> None:
    line2 = '{"type": "user", "sessionId": "s", "toolUseResult": ' + "[" * 2000 + "]" * 2000 + "}"
    text = '{"type": "summary", "summary": "t", "leafUuid": "u"}\n' + line2
    code, message, line, col = _text_error(text, fmt)
    assert code == "import.depth"
    assert message == "toolUseResult[0][0][0][0][0][0][0]…: nested deeper than 90 levels"
    # The record is level 1, so the 90th bracket opens level 91.
    assert (line, col) == (2, _col(line2, "[") + 89)


def test_nesting_that_json_reads_is_still_bounded() -> None:
    doc = {"messages": [{"role": "user", "content": "hi", "x": "DEEP"}]}
    text = json.dumps(doc).replace('"DEEP"', "[" * 95 + "]" * 95)
    code, _, line, col = _text_error(text, "openai_chat")
    assert (code, line) == ("import.depth", 1)
    assert col == _col(text, "[[") + 87  # messages[0].x is level 4: its 88th array is level 91


@pytest.mark.parametrize(
    ("fmt", "text", "at"),
    [
        ("openai_chat", r'[{"role": "user", "content": "a\ud800"}]', r'"a\ud800"'),
        (
            "claude_code",
            r'{"type": "user", "sessionId": "s", "message": {"content": "\udc00"}}',
            r'"\udc00"',
        ),
    ],
)
def test_lone_surrogates_are_located(fmt: str, text: str, at: str) -> None:
    code, message, line, col = _text_error(text, fmt)
    assert code == "import.surrogate"
    assert message.endswith("holds a lone UTF-16 surrogate, which is not a character")
    assert (line, col) == (1, _col(text, at))


def test_nan_is_refused() -> None:
    text = '[{"role": "assistant", "content": "x", "usage": {"prompt_tokens": NaN}}]'
    code, message, line, col = _text_error(text, "openai_chat")
    assert (code, message) == (
        "import.number",
        "[0].usage.prompt_tokens: NaN and infinities are not JSON numbers",
    )
    assert (line, col) == (1, _col(text, "NaN"))


def test_bad_embedded_json_is_kept_as_text() -> None:
    # Tool-call arguments are JSON in a string; a lone surrogate or depth inside them
    # makes them unparsable arguments, kept verbatim, as any other broken arguments.
    for args in [r'{"c": "\ud800"}', "[" * 2000 + "]" * 2000]:
        text = json.dumps(
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "b", "arguments": args}}],
                }
            ]
        )
        part = import_text(text, fmt="openai_chat").messages[0].parts[0]
        assert part.type == "tool"
        assert part.input == {"arguments": args}
        assert part.metadata == {"arguments_not_json": True}


def test_size_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kilo_rules.engine.importers as importers
    from kilo_rules.engine.importers import _source, read_session

    monkeypatch.setattr(importers, "MAX_BYTES", 100)
    monkeypatch.setattr(_source, "MAX_BYTES", 100)
    log = tmp_path / "big.json"
    log.write_text('[{"role": "user", "content": "' + "x" * 200 + '"}]')
    for read in (import_file, read_session):
        with pytest.raises(ImportFormatError) as info:
            read(log)
        assert info.value.diagnostic.code == "import.size"
        assert str(info.value.diagnostic.location) == f"{log}:1:1"
    with pytest.raises(ImportFormatError, match="larger than the limit of 100 bytes"):
        import_text(log.read_text(), fmt="openai_chat")


@pytest.mark.parametrize(
    ("fmt", "text", "message", "at"),
    [
        (
            "anthropic_messages",
            '[{"role": "assistant", "content": "x", "stop_reason": ["end_turn"]}]',
            "[0].stop_reason: expected a string, found an array",
            '["end_turn"]',
        ),
        (
            "anthropic_messages",
            '[{"role": "assistant", "content": [{"type": "thinking", "thinking": 4}]}]',
            "[0].content[0].thinking: expected a string, found a number",
            "4}",
        ),
        (
            "anthropic_messages",
            '[{"role": "assistant", "content": [{"type": "redacted_thinking", "data": true}]}]',
            "[0].content[0].data: expected a string, found a boolean",
            "true",
        ),
        (
            "openhands",
            '{"instance_id": "x", "history": [{"id": 0, "source": "agent", "action": "system", '
            '"args": {"tools": [{"function": {"name": "t", "parameters": "none"}}]}}]}',
            "history[0].args.tools[0].function.parameters: expected an object, found a string",
            '"none"',
        ),
    ],
    ids=["anthropic-stop-reason", "thinking-text", "redacted-data", "openhands-parameters"],
)
def test_fuzzer_findings_are_located(fmt: str, text: str, message: str, at: str) -> None:
    code, got, line, col = _text_error(text, fmt)
    assert (code, got, line, col) == ("import.shape", message, 1, _col(text, at))


def test_fuzzer_findings_that_import() -> None:
    # A compaction summary whose blocks hold no text strings: only text strings count.
    summary = (
        '{"type": "user", "sessionId": "s", "isCompactSummary": true, "message": '
        '{"content": [{"type": "text", "text": null}, {"text": ["a"]}, {"text": "kept"}]}}'
    )
    part = import_text(summary, fmt="claude_code").messages[-1].parts[0]
    assert isinstance(part, TextPart) and part.text == "kept"
    # mini-swe-agent v1 with "choices" an object instead of an array: no reasoning, no crash.
    v1 = {
        "trajectory_format": "mini-swe-agent-1",
        "messages": [
            {"role": "assistant", "content": "x", "extra": {"response": {"choices": {"a": 1}}}}
        ],
    }
    assert import_text(json.dumps(v1)).messages[0].parts[0].type == "text"
    # Roles that are not strings: not OpenAI chat, and detection says so instead of crashing.
    with pytest.raises(ImportFormatError) as info:
        import_text('[{"role": ["user"], "content": "x"}]')
    assert info.value.diagnostic.code == "import.format"
    # A time in seconds so large that milliseconds overflow a float is no time.
    v2 = {
        "trajectory_format": "mini-swe-agent-1.1",
        "messages": [{"role": "assistant", "content": "x", "extra": {"timestamp": 1e306}}],
    }
    assert import_text(json.dumps(v2)).messages[0].created == 0
