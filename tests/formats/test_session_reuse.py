"""SessionReader: a session resent with more messages reuses the messages read before, and
reads exactly as a reading from scratch would (equal sessions, the same located errors)."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.base.errors import Diagnostic, SessionError
from kilo_rules.engine.formats.session import (
    DEFAULT_READER,
    Session,
    SessionReader,
    _session_from_json_cold,
    dump_session,
    session_from_json,
)
from kilo_rules.engine.importers import read_session
from tests.fuzz.budget import FUZZ

TRAJECTORIES = Path(__file__).resolve().parents[2].parent / "shared/data/trajectories"
LONG = "x" * 300  # longer than SessionReader.PREFIX: such messages are remembered


def _message(i: int, text: str = LONG, mid: str | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "id": f"p{i}", "text": text}]
    if i % 2:
        parts.append(
            {"type": "tool", "id": f"t{i}", "call_id": f"c{i}", "tool": "r", "output": text}
        )
    role = "assistant" if i % 2 else "user"
    return {"id": mid or f"m{i}", "role": role, "created": i, "parts": parts}


def _doc(messages: list[dict[str, Any]], **rest: Any) -> str:
    return json.dumps({"version": 1, "id": "s", **rest, "messages": messages}, indent=2)


def _cold(text: str) -> Session:
    """The reading of every message afresh, as session_from_json read before reuse."""
    return _session_from_json_cold(text, "<session>")


def _outcome(read: Any, text: str) -> tuple[str, Any]:
    try:
        session = read(text)
    except SessionError as exc:
        return "error", exc.diagnostics
    return "ok", (session, session.model_fields_set, dump_session(session))


def _fresh_cold(text: str) -> tuple[str, Any]:
    # A reader that never saw a message reads every one of them: compare with that too.
    return _outcome(lambda t: SessionReader().read(t), text)


def test_a_resent_session_reuses_its_messages() -> None:
    reader = SessionReader()
    text = _doc([_message(i) for i in range(4)])
    first = reader.read(text)
    again = reader.read(text)
    assert again == first
    assert all(a is b for a, b in zip(again.messages, first.messages, strict=True))
    assert again.messages is not first.messages  # each session has a list of its own


def test_appended_messages_are_read_and_the_others_reused() -> None:
    reader = SessionReader()
    before = reader.read(_doc([_message(i) for i in range(3)]))
    after = reader.read(_doc([_message(i) for i in range(5)]))
    assert [m.id for m in after.messages] == ["m0", "m1", "m2", "m3", "m4"]
    assert all(a is b for a, b in zip(after.messages[:3], before.messages, strict=True))
    assert after == _cold(_doc([_message(i) for i in range(5)]))


def test_two_messages_with_one_id_do_not_collide() -> None:
    reader = SessionReader()
    # Same id, same beginning (longer than the prefix that finds an entry), other ending.
    one = _message(0, LONG + " first")
    other = _message(0, LONG + " second")
    a = reader.read(_doc([one]))
    b = reader.read(_doc([other]))
    assert a.messages[0].parts[0].text.endswith(" first")  # type: ignore[union-attr]
    assert b.messages[0].parts[0].text.endswith(" second")  # type: ignore[union-attr]
    # Both versions are kept, and each text still reads as itself.
    assert reader.read(_doc([one])).messages[0] is a.messages[0]
    assert reader.read(_doc([other])).messages[0] is b.messages[0]


def test_a_known_message_changed_or_followed_by_junk_reads_as_from_scratch() -> None:
    reader = SessionReader()
    plain = _doc([_message(0)])
    reader.read(plain)
    known = json.dumps(_message(0), indent=2).replace("\n", "\n    ")
    assert known in plain
    # The known text with one more key: another message, read afresh.
    changed = plain.replace(known, known[:-1] + ', "agent": "plan"}')
    assert reader.read(changed).messages[0].agent == "plan"
    assert reader.read(changed) == _cold(changed)
    # The known text whole, then what no array may hold: found, then refused as before.
    hits = reader.stats().hits
    for junk in (" 1", '"x"', "}", ": 2"):
        text = plain.replace(known, known + junk)
        assert _outcome(reader.read, text) == _outcome(_cold, text)
        assert _outcome(reader.read, text)[0] == "error"
    assert reader.stats().hits > hits


def test_a_bad_message_after_reused_ones_is_located_as_before() -> None:
    reader = SessionReader()
    good = [_message(i) for i in range(3)]
    reader.read(_doc(good))
    bad = _doc([*good, {"id": "m9", "role": "robot", "parts": []}])
    with pytest.raises(SessionError) as err:
        reader.read(bad)
    (diag,) = err.value.diagnostics
    assert diag.code == "session.invalid"
    line = bad.splitlines().index('      "role": "robot",') + 1
    assert (diag.location.line, diag.location.col) == (line, 15)
    assert _outcome(reader.read, bad) == _fresh_cold(bad) == _outcome(_cold, bad)


def test_an_id_repeated_across_reused_messages_is_refused_as_before() -> None:
    reader = SessionReader()
    reader.read(_doc([_message(0), _message(1)]))
    text = _doc([_message(0), _message(1), _message(2, mid="m1")])
    with pytest.raises(SessionError) as err:
        reader.read(text)
    assert err.value.diagnostic.code == "session.duplicate-id"
    assert _outcome(reader.read, text) == _outcome(_cold, text)
    # A part id or a tool call id repeated by a reused message is found the same way.
    for again in (_message(1, mid="m7"), {**_message(3), "parts": _message(1)["parts"]}):
        text = _doc([_message(0), _message(1), again])
        assert _outcome(reader.read, text) == _outcome(_cold, text)
        assert _outcome(reader.read, text)[0] == "error"


@pytest.mark.parametrize(
    "text",
    [
        "\ufeff" + _doc([_message(0)]),
        _doc([_message(0)]) + " x",
        _doc([_message(0)])[:-3],
        _doc([_message(0)]).replace('"version": 1', '"version": 1, "version": 2'),
        _doc([_message(0)]).replace('"id": "s"', '"id": "s", "messages": 5'),
        '{"version": 1, "id": "s", "messages": [' + json.dumps(_message(0)) + "]]",
        _doc([_message(0), 7]),  # type: ignore[list-item]
        _doc([_message(0)], extra=1),
        _doc([_message(0)], metadata={"n": 1e999}),
        _doc([_message(0)]).replace(LONG, LONG + "\\ud800"),
        _doc([_message(0)]).replace(LONG, LONG + "\\uDC00x"),
        _doc([_message(0)]).replace(LONG, LONG + "\ud800"),  # the character itself
        _doc([_message(0)]).replace(LONG, LONG + "\\ud55c \\ud83d\\ude00"),  # no lone one
        _doc([_message(0)]).replace(LONG, "[" * 200),
        _doc([json.loads("[" * 120 + "]" * 120)]),
        _doc([{**_message(0), "created": int("9" * 1200)}]),
        _doc([{**_message(0), "metadata": {"x": float("nan")}}]),
        "[]",
        "",
    ],
)
def test_odd_and_bad_documents_read_as_from_scratch(text: str) -> None:
    reader = SessionReader()
    reader.read(_doc([_message(0), _message(1)]))  # m0 is known
    assert _outcome(reader.read, text) == _outcome(_cold, text) == _fresh_cold(text)


def test_lone_surrogates_are_refused_and_pairs_kept() -> None:
    for lone in ("\\ud800", "\\uDFFF", "\udc00"):
        text = _doc([_message(0)]).replace(LONG, LONG + lone)
        with pytest.raises(SessionError) as err:
            SessionReader().read(text)
        assert err.value.diagnostic.code == "session.surrogate"
    text = _doc([_message(0)]).replace(LONG, LONG + "\\ud83d\\ude00\\ud55c")
    assert SessionReader().read(text).messages[0].parts[0].text.endswith("\U0001f600\ud55c")  # type: ignore[union-attr]


def test_a_repeated_messages_key_keeps_the_last_as_json_does() -> None:
    again = json.dumps(_message(0))
    text = f'{{"version": 1, "id": "s", "messages": [], "messages": [{again}]}}'
    assert SessionReader().read(text) == _cold(text)
    assert len(SessionReader().read(text).messages) == 1


def _size(i: int) -> int:
    return len(json.dumps(_message(i), indent=2).replace("\n", "\n    "))


def test_the_reader_is_bounded_in_characters_of_text() -> None:
    budget = 3 * _size(0) + 10
    reader = SessionReader(max_chars=budget)
    for i in range(0, 40, 2):
        reader.read(_doc([_message(i)]))
    held = reader.stats()
    assert held.messages == 3 and held.chars <= budget == held.max_chars
    # The most recent are kept; forgotten messages are read again, correctly.
    assert reader.read(_doc([_message(38)])) == _cold(_doc([_message(38)]))
    assert reader.stats().hits == 1
    assert reader.read(_doc([_message(0)])) == _cold(_doc([_message(0)]))
    assert reader.stats().hits == 1


def test_a_message_longer_than_the_bound_is_read_afresh() -> None:
    reader = SessionReader(max_chars=_size(0) - 1)
    text = _doc([_message(0)])
    assert reader.read(text) == reader.read(text) == _cold(text)
    assert reader.stats().messages == 0
    assert SessionReader(max_chars=0).read(text) == _cold(text)
    with pytest.raises(ValueError):
        SessionReader(max_chars=-1)


def test_versions_of_one_beginning_are_bounded() -> None:
    reader = SessionReader()
    texts = [_doc([_message(0, LONG + str(v))]) for v in range(10)]
    for text in texts:
        reader.read(text)
    assert reader.stats().messages == SessionReader.VERSIONS
    assert all(reader.read(t) == _cold(t) for t in texts)
    # The newest versions are those kept.
    hits = reader.stats().hits
    reader.read(texts[-1])
    assert reader.stats().hits == hits + 1


def test_short_messages_are_read_every_time() -> None:
    reader = SessionReader()
    text = _doc([{"id": "a", "role": "user"}, {"id": "b", "role": "assistant"}])
    first, again = reader.read(text), reader.read(text)
    assert first == again == _cold(text)
    assert reader.stats().messages == 0


def test_session_from_json_reads_through_the_default_reader() -> None:
    text = _doc([_message(i) for i in range(2)] + [_message(99, LONG + "default-reader")])
    first = session_from_json(text)
    assert session_from_json(text).messages[2] is first.messages[2]
    assert DEFAULT_READER.stats().messages >= 1


def test_threads_reading_at_once_each_get_their_own_session() -> None:
    reader = SessionReader(max_chars=3 * _size(0) * 6)
    texts = [_doc([_message(i, LONG + str(v)) for i in range(6)]) for v in range(4)]
    expected = [_cold(t) for t in texts]
    failures: list[int] = []

    def work(k: int) -> None:
        for n in range(30):
            v = (k + n) % len(texts)
            if reader.read(texts[v]) != expected[v]:
                failures.append(v)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def _recorded() -> list[Path]:
    if not TRAJECTORIES.is_dir():
        return []
    return sorted(p for p in TRAJECTORIES.iterdir() if p.name != "SOURCES.md")


@pytest.mark.slow
@pytest.mark.parametrize("path", _recorded(), ids=lambda p: p.name)
def test_every_recorded_session_reads_warm_as_cold(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # which run of a many-run file is read: not the point
        session = read_session(path)
    n = len(session.messages)
    reader = SessionReader()
    for cut in sorted({1, n // 3, n // 2, n - 1, n}):
        text = dump_session(session.model_copy(update={"messages": session.messages[:cut]}))
        assert _outcome(reader.read, text) == _outcome(_cold, text)
    # Each message of the whole session, read before as part of a shorter one, is reused.
    full = reader.read(dump_session(session))
    assert full == session
    warm = reader.read(dump_session(session))
    assert all(a is b for a, b in zip(warm.messages, full.messages, strict=True))


# Edits a client may make between two sends, applied to the document as data.
_TEXTS = st.sampled_from([LONG, LONG + "!", "short", LONG + "\\ud800", ""])
_EDIT = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 40), _TEXTS),
    st.tuples(st.just("drop"), st.integers(0, 40), st.none()),
    st.tuples(st.just("retext"), st.integers(0, 40), _TEXTS),
    st.tuples(st.just("reid"), st.integers(0, 40), st.sampled_from(["m0", "m1", "new"])),
    st.tuples(st.just("break"), st.integers(0, 40), st.sampled_from(["robot", 5, None])),
    st.tuples(st.just("swap"), st.integers(0, 40), st.none()),
    st.tuples(st.just("compact"), st.just(0), st.none()),
    st.tuples(st.just("top"), st.just(0), st.sampled_from(["title", "model", "extra", "tools"])),
)


def _edited(messages: list[dict[str, Any]], edits: list[tuple[str, int, Any]]) -> str:
    out = [json.loads(json.dumps(m)) for m in messages]
    compact = False
    top: dict[str, Any] = {}
    for kind, at, arg in edits:
        i = at % len(out) if out else 0
        if kind == "append":
            out.append(_message(100 + len(out), arg))
        elif kind == "drop" and out:
            del out[i]
        elif kind == "retext" and out:
            out[i]["parts"][0]["text"] = arg
        elif kind == "reid" and out:
            out[i]["id"] = arg
        elif kind == "break" and out:
            out[i]["role"] = arg
        elif kind == "swap" and len(out) > 1:
            out[i], out[i - 1] = out[i - 1], out[i]
        elif kind == "compact":
            compact = True
        elif kind == "top":  # a member beside the messages: valid, or not a Session field
            top[arg] = [{"name": "read"}] if arg == "tools" else LONG
    doc = {"version": 1, "id": "s", **top, "messages": out}
    return json.dumps(doc) if compact else json.dumps(doc, indent=2)


@FUZZ
@given(
    n=st.integers(0, 6),
    first=st.lists(_EDIT, max_size=4),
    second=st.lists(_EDIT, max_size=4),
)
def test_edited_sessions_read_warm_as_cold(
    n: int, first: list[tuple[str, int, Any]], second: list[tuple[str, int, Any]]
) -> None:
    base = [_message(i) for i in range(n)]
    reader = SessionReader(max_chars=16 * _size(0))
    for text in (_edited(base, []), _edited(base, first), _edited(base, first + second)):
        warm = _outcome(reader.read, text)
        assert warm == _outcome(_cold, text)
        if warm[0] == "error":
            assert all(isinstance(d, Diagnostic) for d in warm[1])
