"""Session v1: loading, located validation errors, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilo_rules.errors import SessionError
from kilo_rules.session import (
    CompactionPart,
    Message,
    Session,
    TextPart,
    ToolPart,
    dump_session,
    load_session,
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
