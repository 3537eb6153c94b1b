"""Session v1: loading, located validation errors, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilo_rules.engine.base.errors import Location, SessionError
from kilo_rules.engine.formats.session import (
    MAX_BYTES,
    CompactionPart,
    Message,
    Session,
    TextPart,
    ToolPart,
    dump_session,
    load_session,
    session_from_data,
    session_from_json,
)


def _session() -> Session:
    return Session(
        id="s1",
        messages=[
            Message(id="m1", role="user", parts=[TextPart(id="p1", text="hi")]),
            Message(
                id="m2",
                role="assistant",
                parts=[
                    ToolPart(id="p2", call_id="c1", tool="read", input={"path": "a"}, output="x")
                ],
            ),
            Message(id="m3", role="user", parts=[CompactionPart(id="p3", auto=True)]),
        ],
    )


def test_round_trip_keeps_every_part() -> None:
    s = _session()
    again = session_from_json(dump_session(s))
    assert again == s
    assert json.loads(dump_session(s))["messages"][1]["parts"][0]["type"] == "tool"


def test_errors_are_located(tmp_path: Path) -> None:
    text = (
        '{\n  "id": "s",\n  "messages": [\n    {"id": "m1", "role": "robot", "parts": []},\n'
        '    {"id": "m2", "role": "user", "parts": [{"type": "tool", "id": "p"}]}\n  ]\n}\n'
    )
    p = tmp_path / "s.json"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(SessionError) as err:
        load_session(p)
    diags = err.value.diagnostics
    role = next(d for d in diags if "role" in d.message)
    assert (role.location.line, role.location.col) == (4, 26)
    missing = [d for d in diags if "call_id" in d.message]
    assert missing and missing[0].location.line == 5
    assert all(d.code == "session.invalid" for d in diags)


def test_a_field_named_like_a_part_type_is_located_at_its_value() -> None:
    # pydantic puts the part type ("tool", "text") into the error path; the fields of those
    # parts with the same names must still be named and located.
    text = (
        '{"id": "s", "messages": [{"id": "m", "role": "user", "parts": [\n'
        '  {"type": "tool", "id": "p", "call_id": "c", "tool": 5},\n'
        '  {"type": "text", "id": "q", "text": 7}]}]}'
    )
    with pytest.raises(SessionError) as err:
        session_from_json(text, "s.json")
    assert [(str(d.location), d.message) for d in err.value.diagnostics] == [
        ("s.json:2:55", "messages[0].parts[0].tool: Input should be a valid string"),
        ("s.json:3:39", "messages[0].parts[1].text: Input should be a valid string"),
    ]


def test_bad_json_is_located() -> None:
    with pytest.raises(SessionError) as err:
        session_from_json('{"id": "s",\n "messages": [}', "s.json")
    d = err.value.diagnostic
    assert (d.code, d.location.line) == ("session.json", 2)


def test_unknown_part_type_is_rejected() -> None:
    with pytest.raises(SessionError) as err:
        session_from_json(
            '{"id": "s", "messages": [{"id": "m", "role": "user", '
            '"parts": [{"type": "video", "id": "p"}]}]}'
        )
    assert "video" in err.value.diagnostic.message or "tag" in err.value.diagnostic.message


def test_missing_file_is_an_io_error(tmp_path: Path) -> None:
    with pytest.raises(SessionError) as err:
        load_session(tmp_path / "nope.json")
    assert err.value.diagnostic.code == "io.read"


# -- untrusted input ------------------------------------------------------------------------

_PARTS = '[{"type": "text", "id": "p1", "text": "hi"}]'


def _doc(messages: str, metadata: str = "{}") -> str:
    return f'{{"version": 1, "id": "s",\n "metadata": {metadata},\n "messages": {messages}}}'


def _text_message(text: str) -> str:
    """One user message whose text part holds the JSON string ``text``."""
    part = f'{{"type": "text", "id": "p", "text": {text}}}'
    return f'[{{"id": "m1", "role": "user", "parts": [{part}]}}]'


def _error(text: str) -> tuple[str, str, int, int]:
    with pytest.raises(SessionError) as info:
        session_from_json(text, file="s.json")
    diag = info.value.diagnostic
    return diag.code, diag.message, diag.location.line, diag.location.col


def test_nesting_2000_deep_is_a_located_error() -> None:
    text = _doc("[]", '{"a": ' + "[" * 2000 + "]" * 2000 + "}")
    code, message, line, col = _error(text)
    assert code == "session.depth"
    assert message == "metadata.a[0][0][0][0][0][0]…: nested deeper than 100 levels"
    # The array opened at level 101: the 99th bracket of the run (the root and metadata
    # objects are levels 1 and 2).
    assert (line, col) == (2, text.split("\n")[1].index("[") + 99)


def test_nesting_up_to_the_limit_loads() -> None:
    # metadata.a's outermost array is level 3: 98 arrays end at level 100, 99 go past it.
    fine = _doc("[]", '{"a": ' + "[" * 98 + "]" * 98 + "}")
    assert session_from_json(fine).metadata["a"] == json.loads(fine)["metadata"]["a"]
    text = _doc("[]", '{"a": ' + "[" * 99 + "]" * 99 + "}")
    code, _, line, col = _error(text)
    assert (code, line, col) == ("session.depth", 2, text.split("\n")[1].index("[") + 99)


@pytest.mark.parametrize(
    ("messages", "path", "message"),
    [
        (
            f'[{{"id": "m1", "role": "user", "parts": {_PARTS}}}, '
            '{"id": "m1", "role": "user", "parts": []}]',
            "messages[1].id",
            "message id 'm1' is already used by messages[0]",
        ),
        (
            f'[{{"id": "m1", "role": "user", "parts": {_PARTS}}}, '
            f'{{"id": "m2", "role": "user", "parts": {_PARTS}}}]',
            "messages[1].parts[0].id",
            "part id 'p1' is already used by messages[0].parts[0]",
        ),
        (
            '[{"id": "m1", "role": "assistant", "parts": ['
            '{"type": "tool", "id": "p1", "call_id": "toolu_1", "tool": "read"}, '
            '{"type": "tool", "id": "p2", "call_id": "toolu_1", "tool": "read"}]}]',
            "messages[0].parts[1].call_id",
            "tool call id 'toolu_1' is already used by messages[0].parts[0]",
        ),
        (
            '[{"id": "m1", "role": "assistant", "parts": ['
            '{"type": "tool", "id": "p1", "call_id": "c", "tool": "read", "attachments": ['
            '{"id": "p1", "mime": "image/png", "url": "data:,"}]}]}]',
            "messages[0].parts[0].attachments[0].id",
            "part id 'p1' is already used by messages[0].parts[0]",
        ),
    ],
    ids=["message", "part", "call", "attachment"],
)
def test_repeated_ids_are_located(messages: str, path: str, message: str) -> None:
    text = _doc(messages)
    code, got, line, col = _error(text)
    assert (code, got) == ("session.duplicate-id", f"{path}: {message}")
    # Located at the repeated value: the last occurrence of it in the text.
    value = message.split("'")[1]
    offset = text.rindex(f'"{value}"')
    assert (line, col) == (3, offset - text.rindex("\n", 0, offset))


def test_repeated_tool_use_ids_never_reach_a_request() -> None:
    # The same document with distinct ids loads: only the repetition is refused.
    ok = (
        '[{"id": "m1", "role": "assistant", "parts": ['
        '{"type": "tool", "id": "p1", "call_id": "toolu_1", "tool": "read"}, '
        '{"type": "tool", "id": "p2", "call_id": "toolu_2", "tool": "read"}]}]'
    )
    assert len(session_from_json(_doc(ok)).messages[0].parts) == 2
    assert _error(_doc(ok.replace("toolu_2", "toolu_1")))[0] == "session.duplicate-id"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (r'"a\ud800"', "messages[0].parts[0].text"),
        (r'"\udc00b"', "messages[0].parts[0].text"),
        (r'"\ude00\ud83d"', "messages[0].parts[0].text"),  # a pair in the wrong order
    ],
)
def test_lone_surrogates_are_located(text: str, path: str) -> None:
    doc = _doc(_text_message(text))
    code, message, line, col = _error(doc)
    assert code == "session.surrogate"
    assert message == f"{path}: holds a lone UTF-16 surrogate, which is not a character"
    assert (line, col) == (3, doc.split("\n")[2].index(text) + 1)


def test_a_surrogate_pair_is_one_character() -> None:
    doc = _doc(_text_message(r'"\ud83d\ude00"'))
    session = session_from_json(doc)
    assert session.messages[0].parts[0] == TextPart(id="p", text="\U0001f600")
    assert session_from_json(dump_session(session)) == session


def test_lone_surrogate_in_a_key_and_in_data_without_text() -> None:
    doc = _doc("[]", r'{"ok": 1, "k\udbff": 2}')
    code, message, line, col = _error(doc)
    assert (code, line, col) == ("session.surrogate", 2, doc.split("\n")[1].index("2") + 1)
    assert message.startswith("metadata.k")
    with pytest.raises(SessionError) as info:
        session_from_data(json.loads(doc), file="s.json")
    assert info.value.diagnostic.code == "session.surrogate"
    assert str(info.value.diagnostic.location) == "s.json:1:1"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_are_refused(number: str) -> None:
    doc = _doc("[]", f'{{"cost": {number}}}')
    code, message, line, col = _error(doc)
    assert (code, message) == (
        "session.number",
        "metadata.cost: NaN and infinities are not JSON numbers",
    )
    assert (line, col) == (2, doc.split("\n")[1].index(number) + 1)


def test_size_is_capped_without_reading_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(_doc("[]", '{"pad": "' + "x" * 2000 + '"}'))
    assert load_session(path).id == "s"
    with pytest.raises(SessionError) as info:
        load_session(path, max_bytes=1000)
    diag = info.value.diagnostic
    assert (diag.code, str(diag.location)) == ("session.size", f"{path}:1:1")
    assert MAX_BYTES >= 64 * 1024 * 1024  # real sessions of tens of megabytes load


def test_invalid_utf8_file_is_located(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(_doc("[]", '{"a": "x\xffy"}').encode("latin-1"))
    with pytest.raises(SessionError) as info:
        load_session(path)
    diag = info.value.diagnostic
    assert diag.code == "session.encoding"
    assert (diag.location.line, diag.location.col) == (2, ' "metadata": {"a": "x'.find("x") + 2)


# -- hostile numbers, NULs and FIFOs ---------------------------------------------------------

HUGE = "9" * 5000


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("created", HUGE),
        ("created", "-" + HUGE),
        ("created", "1" * 1001),
        ("cost", HUGE + ".5"),
        ("cost", "1e999"),
    ],
)
def test_a_number_no_session_can_hold_is_located(where: str, value: str) -> None:
    text = (
        '{"version": 1, "id": "s",\n "messages": [\n'
        f'  {{"id": "m", "role": "assistant", "{where}": {value}, "parts": []}}]}}'
    )
    with pytest.raises(SessionError) as err:
        session_from_json(text)
    d = err.value.diagnostic
    assert d.code == "session.number"
    assert (d.location.line, d.location.col) == (3, text.split("\n")[2].index(value) + 1)


def test_a_thousand_digits_still_load() -> None:
    text = '{"version": 1, "id": "s", "messages": [], "metadata": {"n": %s}}' % ("7" * 1000)
    assert session_from_json(text).metadata["n"] == int("7" * 1000)


def test_a_nul_in_the_working_directory_is_located() -> None:
    text = '{"version": 1, "id": "s",\n "directory": "/w\\u0000x", "messages": []}'
    with pytest.raises(SessionError) as err:
        session_from_json(text)
    d = err.value.diagnostic
    assert d.code == "session.invalid" and "NUL" in d.message
    assert (d.location.line, d.location.col) == (2, 15)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "s.json"
    os.mkfifo(fifo)
    # No writer ever opens the FIFO: a blocking open would hang this test for good.
    with pytest.raises(SessionError) as err:
        load_session(fifo)
    assert err.value.diagnostic.code == "io.not-regular-file"
    from kilo_rules.engine.importers import read_session

    with pytest.raises(SessionError) as refused:
        read_session(fifo)
    assert refused.value.diagnostic.code == "io.not-regular-file"
    assert refused.value.diagnostic.location == Location(str(fifo), 1, 1)
