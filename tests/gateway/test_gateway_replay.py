"""Every recorded session replayed through the gateway the way its agent sent it: each step
the whole history so far, through the official SDK client of its API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from .gateway_server import (  # noqa: E402
    AUTH,
    SESSIONS,
    TRAJECTORIES,
    WINDOWS,
    running_gateway,
    small_model,
    step_bodies,
)
from .upstream import Received, Upstream  # noqa: E402

pytestmark = pytest.mark.skipif(not TRAJECTORIES.is_dir(), reason="no recorded sessions")


class Client:
    """Sends a step body the way the agent's SDK does, and closes itself."""

    def __init__(self, api: str, url: str, headers: dict[str, str]) -> None:
        self.api = api
        self.bodies: list[bytes] = []  # what the SDK sent, byte for byte
        hooks = {"request": [self._capture]}
        if api == "anthropic":
            http = pytest.importorskip("httpx2")  # this SDK speaks through httpx2
            self.sdk: Any = anthropic.Anthropic(
                base_url=url,
                api_key="sk-ant-test",
                default_headers=headers,
                max_retries=0,
                http_client=http.Client(event_hooks=hooks),
            )
        else:
            import httpx

            self.sdk = openai.OpenAI(
                base_url=url + "/v1",
                api_key="sk-test",
                default_headers=headers,
                max_retries=0,
                http_client=httpx.Client(event_hooks=hooks),
            )

    def _capture(self, request: Any) -> None:
        request.read()
        self.bodies.append(request.content)

    def send(self, body: dict[str, Any]) -> None:
        if self.api == "anthropic":
            self.sdk.messages.create(**body)
        elif self.api == "openai":
            self.sdk.chat.completions.create(**body)
        else:
            self.sdk.responses.create(**body)

    def close(self) -> None:
        self.sdk.close()


def _replay(
    name: str, url: str, headers: dict[str, str], upstream: Upstream, model: str
) -> tuple[list[dict[str, Any]], list[Received], list[bytes]]:
    api = SESSIONS[name]
    client = Client(api, url, headers)
    sent: list[dict[str, Any]] = []
    got: list[Received] = []
    try:
        for body in step_bodies(name, model):
            before = len(upstream.received)
            client.send(body)
            sent.append(body)
            got.append(upstream.received[-1])
            assert len(upstream.received) == before + 1, "one request upstream per step"
    finally:
        client.close()
    return sent, got, client.bodies


def _share(got: list[Received]) -> float:
    read = sum((r.usage or {}).get("cache_read", 0) for r in got)
    total = sum((r.usage or {}).get("input_tokens", 0) for r in got)
    return read / total if total else 0.0


_MODEL_OF = {
    "anthropic": "claude-replay",
    "openai": "gpt-replay",
    "openai-responses": "codex-replay",
}


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_nothing_changes_without_compaction(name: str, upstream: Upstream, tmp_path: Path) -> None:
    api = SESSIONS[name]
    model = _MODEL_OF[api]
    models = {model: small_model(model, api, 10_000_000, output=4096)}
    with running_gateway(upstream.url, tmp_path, models=models) as gw:
        sent, got, bodies = _replay(name, gw.url, AUTH, upstream, model)
    assert got and all(r.refused is None for r in got)
    assert [r.body for r in got] == bodies  # the client's exact bytes, every step
    assert all(r.json == json.loads(json.dumps(body)) for body, r in zip(sent, got, strict=True))


def _busts(got: list[Received], skip: list[bool]) -> int:
    """Requests (but those in ``skip``) that did not read from the cache what the request
    before them sent (less a rounding of the automatic caches' 128-token steps)."""
    out = 0
    for i in range(1, len(got)):
        before, now = got[i - 1].usage or {}, got[i].usage or {}
        if not skip[i] and now.get("cache_read", 0) < before.get("input_tokens", 0) - 256:
            out += 1
    return out


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _first_user_text(api: str, items: list[Any]) -> str:
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            for block in content or ():
                text = block.get("text") if isinstance(block, dict) else None
                if text:
                    return str(text)
    raise AssertionError("no task")


@pytest.mark.parametrize("policy", ["kilo-default", "long-run"])
@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_replay_under_compaction(
    name: str, policy: str, upstream: Upstream, tmp_path: Path
) -> None:
    api = SESSIONS[name]
    model = _MODEL_OF[api]
    window = WINDOWS[name]
    items = "input" if api == "openai-responses" else "messages"
    # Sent directly to a provider with room for everything: the cache-read share to beat.
    upstream.window = 10_000_000
    _, direct, _ = _replay(name, upstream.url, {}, upstream, model)
    upstream.reset()
    upstream.window = window
    models = {model: small_model(model, api, window, output=4096)}
    log = tmp_path / "decisions.jsonl"
    with running_gateway(
        upstream.url, tmp_path, policy=policy, models=models, decision_log=log
    ) as gw:
        sent, got, _ = _replay(name, gw.url, AUTH, upstream, model)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    compacting = [("compaction" in line["rules"]) for line in lines if line["status"] == 200]
    refused = [r.refused for r in got if r.refused]
    assert refused == []  # no body refused: too long, tool pairs, signatures, turn order
    compacted = [
        r for r, body in zip(got, sent, strict=True) if len(r.json[items]) < len(body[items])
    ]
    assert compacted, "the window forces compaction"
    # The task's words, verbatim (long-run pins it) or in the summary's Goal (kilo-default,
    # whose summary joins lines).
    task = " ".join(_first_user_text(api, sent[0][items]).split())[:120]
    for r, body in zip(got, sent, strict=True):
        forwarded = r.json[items]
        assert forwarded[-1] == body[items][-1]  # the last turn, as sent
        assert task in " ".join(" ".join(_strings(forwarded)).split())
    # A compaction writes its new prefix once; every other request reads from the cache
    # all that the request before it sent, as the uncompacted history sent directly does:
    # no more cache busts through the gateway than direct.
    assert len(compacting) == len(got) and any(compacting)
    busts = _busts(got, compacting)
    print(
        f"{name} {policy}: {sum(compacting)} compactions in {len(got)} steps, cache-read share "
        f"{_share(got):.3f} through the gateway, {_share(direct):.3f} direct; busts "
        f"{busts} through the gateway, {_busts(direct, [False] * len(direct))} direct"
    )
    assert busts <= _busts(direct, [False] * len(direct))
