"""The sidecar reads a resent session through a reader of its own (only the messages not
seen before are parsed), with every error located in the body as before; and a build's
200 carries the request's wire bytes as they are, byte-identical to encoding the response."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from kilo_rules.engine.formats import wireapi
from kilo_rules.engine.formats.session import dump_session, session_from_data
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import StepResult, apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.tools.serving.sidecar.app import _response_json, build_response
from kilo_rules.tools.serving.sidecar.body import ApiError, dumps, lazy_text, parse_json
from kilo_rules.tools.serving.store import PolicyStore

from .conftest import MODEL, RECORDED, Live, small_session


def _grown(n: int) -> dict[str, Any]:
    """A session of ``n`` messages, each one longer than the reader's shortest entry."""
    messages = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"message {i}: " + "words of a longer turn " * 12
        messages.append(
            {
                "id": f"msg_{i:03d}",
                "role": role,
                "created": 1_700_000_000_000 + i,
                "parts": [{"type": "text", "id": f"prt_{i:03d}", "text": text}],
            }
        )
    return {"version": 1, "id": "ses_grown", "messages": messages}


def test_a_resent_session_reuses_the_messages_read_before(live: Live) -> None:
    reader = live.app.state.sidecar.reader
    with live.client() as http:
        for n in (3, 5, 7):
            r = http.post("/v1/build", json={"session": _grown(n), "model": MODEL})
            assert r.status_code == 200, r.text
    stats = reader.stats()
    # 3 read afresh, then 3 + 2 found and 2 new, then 5 + 2 found and 2 new.
    assert (stats.hits, stats.misses) == (8, 7)
    want = apply_plan(
        live.store.plan_for(MODEL),
        session_from_data(_grown(7)),
        StepInput(workspace=Workspace(cwd=live.app.state.sidecar.cwd)),
    )
    assert r.json()["request"] == want.request


def _error(live: Live, content: bytes) -> tuple[int, Any]:
    """Post ``content`` as a build body: the status and the JSON answered."""
    with live.client() as http:
        r = http.post("/v1/build", content=content, headers={"content-type": "application/json"})
    return r.status_code, r.json()


def test_a_bad_message_after_reused_ones_is_located_in_the_body(
    live: Live, live_factory: Any, policy_dir: Any
) -> None:
    good = _grown(4)
    bad = _grown(5)
    bad["messages"][4]["role"] = "robot"
    body = json.dumps({"model": MODEL, "session": bad}, indent=1).encode()
    warm = json.dumps({"model": MODEL, "session": good}, indent=1).encode()
    assert _error(live, warm)[0] == 200
    status, got = _error(live, body)
    assert live.app.state.sidecar.reader.stats().hits >= 4  # the good ones were found again
    # A sidecar that never met the session answers the same, at the same place.
    cold = live_factory(PolicyStore.from_directory(policy_dir))
    assert _error(cold, body) == (status, got)
    assert status == 422
    (diag,) = got["error"]["diagnostics"]
    assert diag["code"] == "session.invalid"
    assert diag["details"]["path"][:4] == ["session", "messages", 4, "role"]
    line = body.decode().splitlines().index('    "role": "robot",') + 1
    assert diag["location"]["file"] == "<request>"
    assert diag["location"]["line"] == line


def test_a_repeated_message_id_after_reused_ones_is_located_in_the_body(live: Live) -> None:
    warm = json.dumps({"session": _grown(4), "model": MODEL}, indent=1).encode()
    assert _error(live, warm)[0] == 200
    again = _grown(5)
    again["messages"][4]["id"] = "msg_001"
    body = json.dumps({"session": again, "model": MODEL}, indent=1).encode()
    status, got = _error(live, body)
    assert live.app.state.sidecar.reader.stats().hits >= 4
    assert status == 422, got
    (diag,) = got["error"]["diagnostics"]
    assert diag["code"] == "session.duplicate-id"
    assert diag["details"]["path"] == ["session", "messages", 4, "id"]
    lines = body.decode().splitlines()
    assert diag["location"]["line"] == lines.index('    "id": "msg_001",', 40) + 1


@pytest.mark.parametrize(
    "text",
    [
        '{"session": {"version": 1}, "model": "m", "session": {}}',  # a repeated key
        ' \n{"model":"m" , "session" :{"id":"s","messages":[]} }\n',
        "{}",
        '{"a": [1, 2.5, "x", null, true, {"b": {}}]}',
    ],
)
def test_the_body_decodes_as_json_does(text: str) -> None:
    body = parse_json(text.encode())
    assert body.data == json.loads(text)
    for key, (start, end) in body.spans.items():
        assert json.loads(text[start:end]) == body.data[key]


def test_a_repeated_key_leaves_no_span_to_read_again() -> None:
    body = parse_json(b'{"session": {"version": 1}, "session": {"id": "s"}}')
    assert body.spans == {}
    assert body.data == {"session": {"id": "s"}}


@pytest.mark.parametrize(
    ("text", "code", "line", "col"),
    [
        ('{"session": {"messages": [1,]}}', "request.json", 1, 29),
        ('{"session": 1, "model": NaN}', "request.number", 1, 25),
        ('{"session": {\n"n": 1' + "0" * 80 + "}}", "request.number", 2, 6),
        ('{"session": 1} x', "request.json", 1, 16),
        ("\ufeff{}", "request.json", 1, 1),
        ("[1]", "request.invalid", 1, 1),
    ],
)
def test_bad_bodies_are_located_as_before(text: str, code: str, line: int, col: int) -> None:
    with pytest.raises(ApiError) as caught:
        parse_json(text.encode())
    (diag,) = caught.value.diagnostics
    assert (diag.code, diag.location.line, diag.location.col) == (code, line, col)


def _results() -> list[StepResult]:
    store = PolicyStore.from_directory(_policies())
    try:
        plan = store.plan_for(MODEL)
    finally:
        store.close()
    sessions = [session_from_data(small_session("Fix it — naïve “quotes” 🙂 \\ / </script>"))]
    if RECORDED.exists():
        recorded = read_session(RECORDED)
        sessions.append(recorded.model_copy(update={"messages": recorded.messages[:40]}))
    out = []
    for session in sessions:
        for api in wireapi.BUILTIN:
            step = StepInput(workspace=Workspace(cwd="/tmp"), provider=api.name)
            out.append(apply_plan(plan, session, step))
    return out


def _policies() -> Any:
    import tempfile
    from pathlib import Path

    from .conftest import write_policy

    root = Path(tempfile.mkdtemp(prefix="kilo-rules-reader-"))
    write_policy(root, "rev-A")
    return root


def test_a_build_response_is_the_encoded_response_byte_for_byte() -> None:
    results = _results()
    assert len({r.provider for r in results}) == len(wireapi.BUILTIN)
    for result in results:
        assert build_response(result) == dumps(_response_json(result))


def test_a_wire_with_a_lone_surrogate_is_written_as_its_escape() -> None:
    result = _results()[0]
    text = result.body()
    odd = dataclasses.replace(
        result, wire=text.replace("Fix it", "Fix \ud800").encode("utf-8", "surrogatepass")
    )
    sent = build_response(odd)
    assert sent == dumps(_response_json(odd))
    assert "Fix \\ud800" in sent.decode("utf-8")
    assert json.loads(sent)["request"] == json.loads(odd.body())


def test_dump_session_round_trips_through_the_reader(live: Live) -> None:
    # A session written by dump_session (indented) is read as it is sent.
    session = session_from_data(_grown(3))
    text = '{"model": ' + json.dumps(MODEL) + ', "session": ' + dump_session(session) + "}"
    with live.client() as http:
        r = http.post(
            "/v1/build", content=text.encode(), headers={"content-type": "application/json"}
        )
    assert r.status_code == 200, r.text
    assert live.app.state.sidecar.reader.stats().misses == 3


_SESSION = '{"version": 1, "id": "s", "messages": [{"a": [1, {"b": ", \\"c\\": 2}"}]}]}'


def _layouts() -> list[str]:
    s = _SESSION
    return [
        '{"session": ' + s + ', "model": "m", "step": {"a": 1, "b": [2, 3]}}',
        '{"model": {"id": "x", "limits": {"a": 1, "b": 2}}, "session": ' + s + "}",
        ' {"step": {}, "session" : ' + s + ' ,\n "model": "m"}\n',
        '{"session": ' + s + "}",
        '{"session": ' + s + ', "model": {"id": "x", "a": [1, {"b": 2}], "c": "d, \\"e\\""},'
        ' "step": {"agent": {"name": "code", "skills": ["a", "b"]}, "step": 2}}',
        '{"session": "a, \\"b\\": 1", "model": "m"}',
    ]


@pytest.mark.parametrize("text", _layouts())
def test_a_lazy_member_is_located_exactly(text: str) -> None:
    body = parse_json(text.encode(), lazy="session")
    start, end = body.spans["session"]
    assert "session" not in body.data
    assert {**body.data, "session": json.loads(text[start:end])} == json.loads(text)
    for key, (a, b) in body.spans.items():
        assert json.loads(text[a:b]) == json.loads(text)[key]


@pytest.mark.parametrize(
    "text",
    [
        '{"session": {"id": "s"},}',  # a trailing comma
        '{"session": {"id": "s"}, "session": {"id": "t"}}',
        '{"model": "m", "session": {"id": "s"}, "model": "n"}',
        '{"session": {"id": "s"} "model": "m"}',
    ],
)
def test_a_lazy_member_of_a_body_that_is_not_plain_is_no_json_value(text: str) -> None:
    # What is located is then no JSON value: no reader takes it, and the body is read whole.
    body = parse_json(text.encode(), lazy="session")
    lazy = lazy_text(body, "session")
    assert lazy is not None
    with pytest.raises(json.JSONDecodeError):
        json.loads(lazy)


def test_a_long_integer_in_a_resent_session_is_refused_where_it_is(live: Live) -> None:
    warm = json.dumps({"session": _grown(3), "model": MODEL}, indent=1).encode()
    assert _error(live, warm)[0] == 200
    session = _grown(4)
    session["messages"][3]["created"] = int("1" * 70)
    body = json.dumps({"session": session, "model": MODEL}, indent=1).encode()
    status, got = _error(live, body)
    assert status == 422
    (diag,) = got["error"]["diagnostics"]
    assert diag["code"] == "request.number"
    assert (
        diag["location"]["line"]
        == body.decode().splitlines().index('    "created": ' + "1" * 70 + ",") + 1
    )


def test_a_bad_session_text_is_refused_as_bad_json_before_a_bad_model(live: Live) -> None:
    body = b'{"session": {"version": 1, "id": "s", "messages": [}, "model": 7}'
    status, got = _error(live, body)
    assert status == 422
    assert got["error"]["code"] == "request.json"
    assert got["error"]["diagnostics"][0]["location"]["col"] == 52
