"""Generic chat formats (OpenAI chat, Anthropic Messages), built from a real recorded log.

No log in the set is a plain chat export, so the Claude Code subagent log (in
examples/sessions) is rewritten into each shape here; the import must give back the same
calls and results as the Claude Code importer does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from importer_helpers import SUBAGENT, check_session, jsonl_records, result_text, tool_parts

from kilo_rules.engine.base.errors import ImportFormatError
from kilo_rules.engine.formats.session import FilePart, ReasoningPart, Session, TextPart
from kilo_rules.engine.importers import detect_format, import_file, import_text


def _anthropic_messages() -> list[dict[str, Any]]:
    """The subagent log as an Anthropic Messages array: one message per response, its tool
    results gathered into the user message after it."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for _, rec in jsonl_records(SUBAGENT):
        if rec["type"] not in ("user", "assistant"):
            continue
        content = rec["message"]["content"]
        if rec["type"] == "assistant":
            if current.get("id") == rec["message"]["id"]:
                current["message"]["content"].extend(content)
            else:
                current = {
                    "id": rec["message"]["id"],
                    "message": {"role": "assistant", "content": list(content)},
                }
                out.append(current["message"])
        elif isinstance(content, list):  # tool results, gathered after their response
            if out[-1]["role"] == "user":
                out[-1]["content"].extend(content)
            else:
                out.append({"role": "user", "content": list(content)})
        else:
            out.append({"role": "user", "content": content})
            current = {}
    return out


def _openai_messages() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a subagent."}]
    for m in _anthropic_messages():
        if m["role"] == "assistant":
            text = "\n".join(b["text"] for b in m["content"] if b["type"] == "text")
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
                }
                for b in m["content"]
                if b["type"] == "tool_use"
            ]
            out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif isinstance(m["content"], str):
            out.append(m)
        else:
            out.extend(
                {"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]}
                for b in m["content"]
            )
    return out


@pytest.fixture(scope="module")
def reference() -> Session:
    return import_file(SUBAGENT)


def _calls(session: Session) -> list[tuple[str, str, dict[str, Any], str]]:
    return [(p.call_id, p.tool, p.input, result_text(p)) for p in tool_parts(session)]


def test_anthropic_messages_matches_claude_code(reference: Session) -> None:
    doc = {
        "model": "claude-sonnet-4-5-20250929",
        "system": "You are a subagent.",
        "messages": _anthropic_messages(),
    }
    text = json.dumps(doc, indent=2)
    assert detect_format(text) == "anthropic_messages"
    session = import_text(text, name="chat.json")
    check_session(session)
    assert _calls(session) == _calls(reference)
    assert [p.status for p in tool_parts(session)] == [p.status for p in tool_parts(reference)]
    assert len([m for m in session.messages if m.role == "assistant"]) == 12
    assert session.metadata["system_prompt"] == "You are a subagent."
    assert session.model == "claude-sonnet-4-5-20250929"


def test_openai_chat_matches_claude_code(reference: Session) -> None:
    text = json.dumps(_openai_messages())
    assert detect_format(text) == "openai_chat"
    session = import_text(text, name="chat.json")
    check_session(session)
    assert _calls(session) == _calls(reference)
    assert session.metadata["system_prompt"] == "You are a subagent."
    assert len([m for m in session.messages if m.role == "assistant"]) == 12


def test_openai_chat_edge_cases() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "hmm",
            "function_call": {"name": "grep", "arguments": "{not json"},
        },
        {"role": "function", "name": "grep", "content": "no match"},
        {"role": "developer", "content": "be brief"},
        {"role": "tool", "tool_call_id": "call_nowhere", "content": "stray"},
    ]
    session = import_text(
        json.dumps(
            {
                "messages": messages,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "grep",
                            "description": "search",
                            "parameters": {"type": "object"},
                        },
                    }
                ],
            }
        ),
        fmt="openai_chat",
    )
    check_session(session)
    user, assistant, developer, stray = session.messages
    assert isinstance(user.parts[1], FilePart) and user.parts[1].mime == "image/png"
    assert isinstance(assistant.parts[0], ReasoningPart)
    (call,) = tool_parts(session)
    assert (call.tool, call.input, call.output) == ("grep", {"arguments": "{not json"}, "no match")
    assert call.metadata == {"arguments_not_json": True}
    assert developer.parts[0].metadata == {"role": "developer"}
    assert stray.parts[0].metadata == {"orphan_tool_result": "call_nowhere"}
    assert session.tools[0].description == "search"


def test_anthropic_blocks() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"},
                }
            ],
        },
        {
            "role": "assistant",
            "stop_reason": "end_turn",
            "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "done"},
            ],
            "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 7},
        },
    ]
    session = import_text(json.dumps(messages), fmt="anthropic_messages")
    user, assistant = session.messages
    assert isinstance(user.parts[0], FilePart)
    assert user.parts[0].url == "data:image/jpeg;base64,AAAA"
    reasoning, text = assistant.parts
    assert isinstance(reasoning, ReasoningPart) and reasoning.encrypted == "opaque"
    assert isinstance(text, TextPart) and text.text == "done"
    assert assistant.finish == "stop"
    assert assistant.tokens is not None and assistant.tokens.cache.read == 7


@pytest.mark.parametrize("fmt", ["openai_chat", "anthropic_messages"])
def test_unknown_role_is_located(fmt: str) -> None:
    text = json.dumps(
        [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], indent=2
    )
    with pytest.raises(ImportFormatError) as info:
        import_text(text, fmt=fmt, name="chat.json")
    diag = info.value.diagnostic
    assert diag.code == "import.shape"
    assert diag.message.startswith("[1].role: unknown role 'robot'")
    line = text.split("\n").index('    "role": "robot",') + 1
    assert (diag.location.file, diag.location.line, diag.location.col) == ("chat.json", line, 13)
