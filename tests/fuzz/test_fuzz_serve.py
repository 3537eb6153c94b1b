"""The sidecar's request bodies, mutated and driven through the ASGI app in process: every
answer is a success or a typed error, and the only 5xx are the typed server errors (no
slot free, no revision, past the time bound); never ``internal``, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

import anyio
import httpx
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.budget import FUZZ
from tests.fuzz.mutate import dumps, mutated
from tests.fuzz.test_fuzz_session import SESSION

MODEL = "anthropic/claude-sonnet-4-5"
TOKEN = "fuzz-token-0123456789abcdef"
#: The 5xx answers that are the server's state, not a failure: each with its code.
SERVER_ERRORS = {
    503: {"server.busy", "store.not-ready"},
    504: {"build.timeout", "check.timeout", "plan.timeout"},
}
POLICY = "version: 1\nname: main\nextends: kilo-default\ncompaction:\n  tail_turns: 2\n"

_APP: dict[str, Any] = {}


def app() -> tuple[Any, Path]:
    """One sidecar for the whole fuzzer (made on first use), with a workspace root."""
    if not _APP:
        from kilo_rules.tools.serving.sidecar import create_app
        from kilo_rules.tools.serving.store import PolicyStore

        root = Path(tempfile.mkdtemp(prefix="kilo-rules-fuzz-serve-"))
        (root / "policies").mkdir()
        (root / "policies/routes.yaml").write_text(
            "version: 1\nroutes: []\ndefault: ./main.yaml\n", encoding="utf-8"
        )
        (root / "policies/main.yaml").write_text(POLICY, encoding="utf-8")
        work = root / "work"
        work.mkdir()
        (work / "AGENTS.md").write_text("Run the tests.\n", encoding="utf-8")
        store = PolicyStore.from_directory(root / "policies")
        _APP["app"] = create_app(store, tokens=[TOKEN], workspace_roots=(work,), build_timeout=20)
        _APP["work"] = work
    return _APP["app"], _APP["work"]


def build_body(work: Path) -> dict[str, Any]:
    return {
        "session": SESSION,
        "model": MODEL,
        "step": {
            "step": 1,
            "max_steps": 5,
            "agent": {"name": "code", "skills": [{"name": "s", "description": "d"}]},
            "workspace": {
                "cwd": str(work),
                "root": str(work),
                "home": str(work),
                "open_files": ["a.py"],
            },
            "options": {"temperature": 0.5},
            "provider": "openai",
        },
    }


CHECK = {
    "policy": POLICY,
    "routes": "version: 1\nroutes: []\ndefault: ./policy.yaml\n",
    "models": [MODEL],
}


def send(method: str, path: str, content: bytes | None = None, **params: Any) -> httpx.Response:
    application, _ = app()

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)  # app exceptions propagate: a failure
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.request(
                method,
                path,
                content=content,
                params=params or None,
                headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
            )

    return anyio.run(call)


def check_answer(r: httpx.Response) -> None:
    """A success, or a typed JSON error; a 5xx only as a typed server error."""
    if r.status_code == 200:
        r.json()
        return
    error = r.json()["error"]
    assert isinstance(error["code"], str) and error["code"] != "internal", r.text[:2000]
    if r.status_code >= 500:
        assert error["code"] in SERVER_ERRORS.get(r.status_code, set()), r.text[:2000]
    for diag in error["diagnostics"]:
        assert diag["location"]["line"] >= 1 and diag["location"]["col"] >= 1


# Texts that once reached the engine untyped: a huge integer, a NUL in a path, a float
# that is not finite when parsed, a byte that is not UTF-8.
NASTY = st.sampled_from(
    [
        "9" * 5000,
        "-" + "1" * 4301,
        "1e999",
        '"a\\u0000b"',
        '"\\u0000"',
        '"/tmp/\\u0000x"',
        '"\\ud800"',
        "[" * 3000 + "]" * 3000,
        '""',
        "null",
        "-0",
        "1.5",
        '{"": {}}',
    ]
)


@st.composite
def spliced(draw: st.DrawFn, doc: dict[str, Any]) -> bytes:
    """``doc``, mutated, then one of its values replaced by a :data:`NASTY` text, or its
    bytes cut or flipped."""
    text = dumps(draw(mutated(doc)))
    how = draw(st.sampled_from(["as-is", "nasty", "nasty", "cut", "flip"]))
    if how == "nasty":
        # Replace a JSON scalar (a number, a string, true/false/null) by the nasty text.
        import re

        spots = [
            m.span() for m in re.finditer(r'-?\d+(\.\d+)?|"(\\.|[^"\\])*"|true|false|null', text)
        ]
        if spots:
            start, end = draw(st.sampled_from(spots))
            text = text[:start] + draw(NASTY) + text[end:]
    raw = text.encode("utf-8", "surrogatepass")
    if how == "cut" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif how == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    return raw


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_build_bodies(data: st.DataObject) -> None:
    _, work = app()
    raw = data.draw(spliced(build_body(work)))
    check_answer(send("POST", "/v1/build", raw))


@pytest.mark.slow
@FUZZ
@given(raw=spliced(CHECK))
def test_check_bodies(raw: bytes) -> None:
    check_answer(send("POST", "/v1/check", raw))


@pytest.mark.slow
@FUZZ
@given(model=st.text(max_size=300) | st.sampled_from([MODEL, "openai/gpt-5", "x/\x00", "a" * 257]))
def test_plan_queries(model: str) -> None:
    check_answer(send("GET", "/v1/plan", model=model))


def test_the_nasty_values_are_typed_4xx() -> None:
    _, work = app()
    body = build_body(work)
    text = json.dumps(body)
    for needle, nasty in [
        ('"step": 1', '"step": ' + "9" * 5000),
        ('"created": 1', '"created": ' + "9" * 5000),
        (json.dumps(str(work)), json.dumps(str(work) + "/\x00x")),
        ('"temperature": 0.5', '"temperature": 1e999'),
        ('"temperature": 0.5', '"temperature": NaN'),
        ('"temperature": 0.5', '"temperature": ' + "1" * 100),
    ]:
        assert needle in text, needle
        r = send("POST", "/v1/build", text.replace(needle, nasty, 1).encode())
        check_answer(r)
        assert 400 <= r.status_code < 500, (needle, r.text[:500])
