"""``read_session`` reads a Session v1 text through the reader ``session_from_json`` keeps:
a session re-read with one more message validates that message only, and a bad one is the
same located error as ever."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.base.errors import SessionError
from kilo_rules.engine.formats.session import DEFAULT_READER, session_from_data
from kilo_rules.engine.importers import read_session, read_session_bytes


def _session(n: int, tag: str) -> dict[str, Any]:
    messages = [
        {
            "id": f"msg_{i:03d}",
            "role": "user" if i % 2 == 0 else "assistant",
            "created": 1_700_000_000_000 + i,
            "parts": [{"type": "text", "id": f"prt_{i:03d}", "text": f"{tag} {i} " + "x" * 200}],
        }
        for i in range(n)
    ]
    return {"version": 1, "id": f"ses_{tag}", "messages": messages}


def _text(n: int, tag: str) -> str:
    return json.dumps(_session(n, tag), indent=2)


def test_a_session_text_read_again_reuses_its_messages(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex  # messages no other test has read
    before = DEFAULT_READER.stats()
    first = read_session(text=_text(3, tag))
    path = tmp_path / "s.json"
    path.write_text(_text(5, tag), encoding="utf-8")
    second = read_session(path)
    third = read_session_bytes(_text(6, tag).encode())
    after = DEFAULT_READER.stats()
    assert after.hits - before.hits >= 3 + 5
    assert second == session_from_data(_session(5, tag))
    assert third == session_from_data(_session(6, tag))
    assert second.messages[:3] == first.messages


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda m: m.update(role="robot"), "session.invalid"),
        (lambda m: m.update(id="msg_001"), "session.duplicate-id"),
        (lambda m: m["parts"][0].update(text="\ud800"), "session.surrogate"),
    ],
)
def test_a_bad_message_after_reused_ones_is_located_as_before(change: Any, code: str) -> None:
    tag = uuid.uuid4().hex
    read_session(text=_text(4, tag))
    bad = _session(5, tag)
    change(bad["messages"][4])
    text = json.dumps(bad, indent=2)
    with pytest.raises(SessionError) as caught:
        read_session(text=text, name="s.json")
    with pytest.raises(SessionError) as cold:
        session_from_data(json.loads(text), file="s.json", text=text)
    assert caught.value.diagnostics == cold.value.diagnostics
    (diag,) = caught.value.diagnostics
    assert diag.code == code
    assert diag.location.file == "s.json"
    assert diag.location.line > text[: text.index('"msg_003"')].count("\n") + 1


def test_a_log_is_still_imported_as_a_log() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    session = read_session(text=json.dumps(chat))
    assert session.messages[0].role == "user"
    assert session.metadata["import"]["format"] == "openai_chat"


def test_the_reader_is_public() -> None:
    import kilo_rules
    from kilo_rules.engine.formats.session import SessionReader

    assert "SessionReader" in kilo_rules.__all__
    assert kilo_rules.SessionReader is SessionReader
    reader = kilo_rules.SessionReader(max_chars=1 << 20)
    tag = uuid.uuid4().hex
    reader.read(_text(2, tag))
    reader.read(_text(3, tag))
    assert (reader.stats().hits, reader.stats().misses) == (2, 3)
