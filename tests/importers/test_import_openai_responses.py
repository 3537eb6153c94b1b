"""OpenAI Responses API request bodies (``openai_responses``): each item type's mapping, the
``msg_{item index}`` id convention a gateway relies on, orphan outputs, located errors,
detection beside the chat formats, and a round trip through Session v1."""

from __future__ import annotations

import json
from typing import Any

import pytest
from importer_helpers import check_session, tool_parts

from kilo_rules.engine.base.errors import ImportFormatError
from kilo_rules.engine.formats.session import FilePart, ReasoningPart, Session, TextPart
from kilo_rules.engine.importers import FORMATS, detect_format, import_text, read_session
from kilo_rules.engine.importers.openai_responses import NAME

HUGE = "8" * 5000


def _body() -> dict[str, Any]:
    """A tool-using request body with every item kind the importer converts."""
    return {
        "model": "gpt-5",
        "instructions": "You are a careful coding agent.",
        "previous_response_id": "resp_0",
        "input": [
            {"type": "message", "role": "developer", "content": "Prefer small diffs."},  # 0
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Why does test_parse fail?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    {"type": "input_file", "file_id": "file-9", "filename": "log.txt"},
                ],
            },  # 1
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [
                    {"type": "summary_text", "text": "Read parse()."},
                    {"type": "summary_text", "text": "Then the test."},
                ],
                "encrypted_content": "gAAAA-opaque",
            },  # 2
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "read",
                "arguments": '{"path": "src/parse.py"}',
            },  # 3
            {
                "type": "function_call",
                "id": "fc_2",
                "call_id": "call_2",
                "name": "read",
                "arguments": "{not json",
            },  # 4
            {"type": "function_call_output", "call_id": "call_1", "output": "def parse(s): ..."},
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [
                    {"type": "input_text", "text": "tests/test_parse.py"},
                    {"type": "input_image", "image_url": "https://x/shot.png"},
                ],
            },  # 6
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_abc",
                "phase": "final_answer",
                "content": [
                    {"type": "output_text", "text": "parse() strips commas only at the ends."},
                    {"type": "refusal", "refusal": "I will not delete the tests."},
                ],
            },  # 7
            {"role": "user", "content": "Fix it."},  # 8
            {"role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},  # 9
        ],
        "tools": [
            {
                "type": "function",
                "name": "read",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                "strict": True,
            },
            {"type": "web_search"},
        ],
    }


def _import(doc: Any, **kw: Any) -> Session:
    return import_text(json.dumps(doc, indent=2), name="resp.json", **kw)


def test_the_format_is_registered() -> None:
    assert NAME == "openai_responses"
    assert FORMATS.get(NAME)


def test_every_item_kind_maps() -> None:
    session = _import(_body())
    check_session(session)
    assert session.model == "gpt-5"
    meta = session.metadata
    assert meta["system_prompt"] == "You are a careful coding agent.\n\nPrefer small diffs."
    assert meta["previous_response_id"] == "resp_0"
    assert meta["other_tools"] == [{"type": "web_search"}]
    assert meta["import"] == {"format": NAME, "items": 10}
    (tool,) = session.tools
    assert (tool.name, tool.description) == ("read", "Read a file.")
    assert tool.input_schema["properties"] == {"path": {"type": "string"}}

    user, assistant, answer, fix, system = session.messages
    # the user message: text, image and file parts
    text, image, file = user.parts
    assert isinstance(text, TextPart) and text.text == "Why does test_parse fail?"
    assert isinstance(image, FilePart) and (image.mime, image.url) == (
        "image/png",
        "data:image/png;base64,AAAA",
    )
    assert isinstance(file, FilePart)
    assert (file.mime, file.url, file.filename) == ("text/plain", "file-id:file-9", "log.txt")

    # reasoning and both calls make one assistant message, answering the user
    assert assistant.role == "assistant" and assistant.parent_id == user.id
    reasoning, call1, call2 = assistant.parts
    assert isinstance(reasoning, ReasoningPart)
    assert reasoning.text == "Read parse().\n\nThen the test."
    assert reasoning.encrypted == "gAAAA-opaque"
    assert reasoning.metadata == {"item_id": "rs_1"}
    assert assistant.finish == "tool-calls"
    assert [p.id for p in tool_parts(session)] == [call1.id, call2.id]
    first, second = tool_parts(session)
    assert (first.call_id, first.tool, first.input) == ("call_1", "read", {"path": "src/parse.py"})
    assert (first.status, first.output) == ("completed", "def parse(s): ...")
    assert first.metadata == {"item_id": "fc_1"}
    assert second.input == {"arguments": "{not json"}
    assert second.metadata == {"item_id": "fc_2", "arguments_not_json": True}
    assert second.output == "tests/test_parse.py"
    assert [(a.mime, a.url) for a in second.attachments] == [("image/*", "https://x/shot.png")]

    # the assistant's answer: output text and refusal, the item's id and phase on each part
    out, refusal = answer.parts
    assert isinstance(out, TextPart) and out.text == "parse() strips commas only at the ends."
    assert out.metadata == {"item_id": "msg_abc", "phase": "final_answer"}
    assert isinstance(refusal, TextPart) and refusal.text == "I will not delete the tests."
    assert refusal.metadata == {"item_id": "msg_abc", "phase": "final_answer", "refusal": True}
    assert answer.finish == "stop"

    # the short form is a user message; a later system message a synthetic user text
    (said,) = fix.parts
    assert fix.role == "user" and isinstance(said, TextPart) and said.text == "Fix it."
    assert system.role == "user"
    (note,) = system.parts
    assert isinstance(note, TextPart) and note.synthetic and note.metadata == {"role": "system"}
    assert note.text == "Be brief."


def test_message_ids_are_the_item_indexes() -> None:
    # The gateway maps a Session message back to the client's item by parsing its id.
    session = _import(_body())
    assert [m.id for m in session.messages] == [
        "msg_000001",  # user
        "msg_000002",  # reasoning + function_call x2: the item that started it
        "msg_000007",  # assistant message
        "msg_000008",  # short-form user
        "msg_000009",  # late system message
    ]


def test_a_function_call_with_nothing_before_it_starts_an_assistant_message() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call_output", "call_id": "nowhere", "output": "stray"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a"},
        {"type": "function_call", "call_id": "c3", "name": "ls", "arguments": "{}"},  # 5
        {"type": "function_call_output", "call_id": "c2", "output": "b"},
        {"type": "function_call_output", "call_id": "c3", "output": "c"},
    ]
    session = _import(items)
    check_session(session)
    assert [(m.id, m.role, len(m.parts)) for m in session.messages] == [
        ("msg_000000", "user", 1),
        ("msg_000001", "user", 1),
        ("msg_000002", "assistant", 2),
        ("msg_000005", "assistant", 1),
    ]
    assert [p.output for p in tool_parts(session)] == ["a", "b", "c"]
    assert session.tools[0].name == "ls"  # no definitions: the names used


def test_an_orphan_output_is_a_synthetic_user_text() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call_output", "call_id": "call_nowhere", "output": "stray"},
        {
            "type": "function_call_output",
            "output": [
                {"type": "input_text", "text": "no id"},
                {"type": "input_file", "file_data": "QUJD", "filename": "a.pdf"},
            ],
        },
    ]
    session = _import(items)
    check_session(session)
    _, stray, anonymous = session.messages
    assert stray.id == "msg_000001"
    (part,) = stray.parts
    assert isinstance(part, TextPart) and part.synthetic and part.text == "stray"
    assert part.metadata == {"orphan_tool_result": "call_nowhere"}
    text, file = anonymous.parts
    assert isinstance(text, TextPart) and text.metadata == {"orphan_tool_result": None}
    assert isinstance(file, FilePart)
    assert (file.mime, file.url, file.filename) == (
        "application/pdf",
        "data:application/pdf;base64,QUJD",
        "a.pdf",
    )


def test_an_unanswered_call_is_listed() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
    ]
    session = _import(items)
    check_session(session)
    assert session.metadata["import"]["unanswered"] == ["c1"]
    assert tool_parts(session)[0].status == "pending"


def test_a_string_input_is_one_user_message() -> None:
    session = _import({"model": "gpt-5", "input": "Hello there", "instructions": "Be kind."})
    check_session(session)
    (msg,) = session.messages
    (said,) = msg.parts
    assert (msg.id, msg.role) == ("msg_000000", "user")
    assert isinstance(said, TextPart) and said.text == "Hello there"
    assert session.metadata["system_prompt"] == "Be kind."
    assert detect_format(json.dumps({"model": "gpt-5", "input": "hi"})) == NAME


def test_other_items_are_kept_on_the_message_they_follow() -> None:
    reference = {"type": "item_reference", "id": "msg_old"}
    short_reference = {"id": "rs_old"}
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    custom = {"type": "custom_tool_call", "call_id": "x", "name": "patch", "input": "..."}
    items = [
        reference,
        short_reference,
        {"role": "user", "content": "search"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        search,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        custom,
    ]
    session = _import({"model": "gpt-5", "input": items})
    check_session(session)
    assert session.metadata["items"] == [reference, short_reference]
    user, assistant = session.messages
    assert "items" not in user.metadata
    assert assistant.metadata["items"] == [search, custom]
    reasoning, text = assistant.parts
    assert isinstance(reasoning, ReasoningPart) and reasoning.text == ""
    assert isinstance(text, TextPart) and text.text == "ok"


def test_unknown_content_parts_are_kept() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    odd = {"type": "output_audio", "data": "x"}
    items = [
        {"role": "user", "content": [audio]},
        {"role": "assistant", "content": [odd]},
    ]
    session = _import({"model": "m", "input": items})
    user, assistant = session.messages
    assert user.metadata["content"] == [audio] and not user.parts
    assert assistant.metadata["content"] == [odd] and not assistant.parts


# -- errors -------------------------------------------------------------------------------
def _col(text: str, needle: str) -> tuple[int, int]:
    at = text.index(needle)
    return text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1


@pytest.mark.parametrize(
    ("items", "message", "at"),
    [
        (
            [{"type": "function_call", "call_id": 7, "name": "ls", "arguments": "{}"}],
            "input[0].call_id: expected a string, found a number",
            "7",
        ),
        (
            [{"type": "function_call", "call_id": "c", "name": None, "arguments": "{}"}],
            "input[0].name: expected a string, found null",
            "null",
        ),
        (
            [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 3}]}],
            "input[0].content[0].text: expected a string, found a number",
            "3",
        ),
        (
            [{"type": "message", "role": "user", "content": {"text": "hi"}}],
            "input[0].content: expected an array, found an object",
            '{"text"',
        ),
        (
            [{"type": "reasoning", "id": "rs", "summary": "thinking"}],
            "input[0].summary: expected an array, found a string",
            '"thinking"',
        ),
        (
            [{"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": ["x"]}],
            "input[0].encrypted_content: expected a string, found an array",
            '["x"]',
        ),
        (
            [{"type": "function_call_output", "call_id": "c", "output": 12.5}],
            "input[0].output: expected an array, found a number",
            "12.5",
        ),
        (
            [{"type": "message", "role": "robot", "content": "x"}],
            "input[0].role: unknown role 'robot' (expected user, assistant, system or developer)",
            '"robot"',
        ),
        (
            [{"type": ["message"], "role": "user", "content": "x"}],
            "input[0].type: expected a string, found an array",
            '["message"]',
        ),
        (
            [{"content": "no type, no role"}],
            "input[0]: expected an input item: an object with a type or a role",
            '{"content"',
        ),
        (
            ["just text"],
            "input[0]: expected an object, found a string",
            '"just text"',
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": {"url": "x"}}],
                }
            ],
            "input[0].content[0].image_url: expected a string, found an object",
            '{"url"',
        ),
    ],
)
def test_malformed_items_are_located(items: list[Any], message: str, at: str) -> None:
    text = json.dumps({"model": "gpt-5", "input": items})
    with pytest.raises(ImportFormatError) as info:
        import_text(text, fmt=NAME, name="resp.json")
    diag = info.value.diagnostic
    assert diag.code == "import.shape"
    assert diag.message == message
    line, col = _col(text, at)
    assert (diag.location.file, diag.location.line, diag.location.col) == ("resp.json", line, col)


@pytest.mark.parametrize(
    ("doc", "message", "at"),
    [
        ({"model": "m", "input": [], "instructions": 5}, "instructions: expected a string", "5"),
        ({"model": "m", "input": [], "tools": {"a": 1}}, "tools: expected an array", '{"a"'),
        (
            {"model": "m", "input": [], "tools": [{"type": "function", "name": 1}]},
            "tools[0].name: expected a string",
            "1}",
        ),
        ({"model": "m", "input": 5}, "input: expected an array, found a number", "5}"),
        ({"model": "m"}, "input: expected an array, found null", '{"model"'),
    ],
)
def test_malformed_bodies_are_located(doc: dict[str, Any], message: str, at: str) -> None:
    text = json.dumps(doc)
    with pytest.raises(ImportFormatError) as info:
        import_text(text, fmt=NAME, name="resp.json")
    diag = info.value.diagnostic
    assert diag.message.startswith(message)
    line, col = _col(text, at)
    assert (diag.location.line, diag.location.col) == (line, col)


def test_a_repeated_call_id_is_refused_where_it_stands() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
    text = json.dumps([call, {"type": "function_call_output", "call_id": "c1", "output": ""}, call])
    with pytest.raises(ImportFormatError) as info:
        import_text(text, fmt=NAME, name="resp.json")
    diag = info.value.diagnostic
    assert diag.code == "import.duplicate-id"
    assert diag.location.col == text.rindex('"c1"') + 1


# -- detection ----------------------------------------------------------------------------
def test_detection_picks_responses_and_leaves_the_chat_formats_alone() -> None:
    assert detect_format(json.dumps(_body())) == NAME
    items = _body()["input"]
    assert detect_format(json.dumps(items)) == NAME  # a bare array of items
    assert (
        detect_format(
            json.dumps([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
        )
        == NAME
    )
    chat = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        ],
    }
    assert detect_format(json.dumps(chat)) == "openai_chat"
    assert detect_format(json.dumps(chat["messages"])) == "openai_chat"
    assert detect_format(json.dumps([{"role": "user", "content": "hi"}])) == "openai_chat"
    anthropic = {
        "model": "claude-sonnet-4-5",
        "system": "s",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "type": "message",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
        ],
    }
    assert detect_format(json.dumps(anthropic)) == "anthropic_messages"
    assert detect_format(json.dumps(anthropic["messages"])) == "anthropic_messages"
    # "input" beside "messages" is not a Responses body
    assert detect_format(json.dumps({**chat, "input": "x"})) == "openai_chat"


def test_not_a_responses_body() -> None:
    for doc in ({"input": ["a", "b"], "model": "text-embedding-3"}, {"input": "x"}):
        with pytest.raises(ImportFormatError) as info:
            detect_format(json.dumps(doc))
        assert info.value.diagnostic.code == "import.format"


# -- round trip and hostile input ---------------------------------------------------------
def test_read_session_gives_a_valid_session_that_round_trips() -> None:
    session = read_session(data=_body())
    check_session(session)
    assert session == _import(_body())
    assert session == read_session(text=json.dumps(_body()), fmt=NAME)


def test_a_huge_number_is_located_and_one_in_arguments_is_kept_as_text() -> None:
    text = (
        '{"model": "m", "input": [\n'
        ' {"role": "user", "content": "go"},\n'
        f' {{"type": "reasoning", "id": "rs", "summary": [], "n": {HUGE}}}\n'
        "]}"
    )
    with pytest.raises(ImportFormatError) as info:
        import_text(text, name="resp.json")
    diag = info.value.diagnostic
    assert diag.code == "import.number"
    assert (diag.location.line, diag.location.col) == (3, text.split("\n")[2].index(HUGE) + 1)

    args = f'{{"n": {HUGE}}}'
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": args},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    session = import_text(json.dumps(items), fmt=NAME)
    (tool,) = tool_parts(session)
    assert tool.input == {"arguments": args}
    assert tool.metadata["arguments_not_json"] is True


def test_a_log_nested_too_deeply_is_located() -> None:
    deep: Any = "x"
    for _ in range(400):
        deep = [deep]
    text = json.dumps({"model": "m", "input": [{"type": "web_search_call", "id": "w", "x": deep}]})
    with pytest.raises(ImportFormatError) as info:
        import_text(text, fmt=NAME, name="resp.json")
    assert info.value.diagnostic.code == "import.depth"
    assert info.value.diagnostic.location.file == "resp.json"
