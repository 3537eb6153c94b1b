"""A real gateway for the tests: ``create_gateway`` under uvicorn on 127.0.0.1 in a thread,
in front of the fake upstream, and the client bodies of the recorded sessions."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog, model_from_data
from kilo_rules.engine.formats.session import Session
from kilo_rules.engine.importers import read_session
from kilo_rules.engine.runtime.apply import apply_plan

from ..threaded import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
TRAJECTORIES = ROOT.parent / "shared/data/trajectories"
TOKEN = "gateway-token-0123456789abcdef"
AUTH = {"proxy-authorization": f"Bearer {TOKEN}"}


def small_model(api_id: str, api: str, context: int, output: int = 4096) -> ModelInfo:
    """A model the tests route, with a window small enough to force compaction."""
    base = "anthropic/claude-sonnet-4-5" if api == "anthropic" else "openai/gpt-5"
    data = bundled_catalog().get(base).model_dump(mode="json")
    data.update(id=f"test/{api_id}", api_id=api_id, api=api)
    data["limits"] = {"context": context, "output": output}
    return model_from_data(data)


@dataclass
class Gateway:
    url: str
    app: Any


@contextlib.contextmanager
def running_gateway(
    upstream_url: str,
    tmp: Path,
    *,
    policy: str = "gateway",
    models: Mapping[str, ModelInfo] | None = None,
    ledger: Path | None = None,
    tokens: tuple[str, ...] = (TOKEN,),
    **settings: Any,
) -> Iterator[Gateway]:
    """Run a gateway over a policy directory whose every model is on ``policy``."""
    import uvicorn

    from kilo_rules.tools.serving.gateway import GatewaySettings, create_gateway
    from kilo_rules.tools.serving.sidecar.access import Access
    from kilo_rules.tools.serving.store import PolicyStore

    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "routes.yaml").write_text(
        f"version: 1\nroutes: []\ndefault: {policy}\n", encoding="utf-8"
    )
    store = PolicyStore.from_directory(policies)
    s = GatewaySettings(
        anthropic_url=upstream_url,
        openai_url=upstream_url,
        ledger=ledger if ledger is not None else tmp / "ledger.sqlite3",
        **settings,
    )
    access = (
        Access.with_tokens(tokens, allowed_hosts=["127.0.0.1"])
        if tokens
        else Access.without_auth(allowed_hosts=["127.0.0.1"])
    )
    app = create_gateway(store, s, access=access, models=models)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, ws="none", timeout_graceful_shutdown=2
    )
    try:
        with serve_in_thread(config, "the gateway") as (url, _):
            yield Gateway(url, app)
    finally:
        store.close()


# -- client bodies from the recorded sessions -------------------------------------------------

#: The recorded sessions and the API their agent speaks through the gateway.
SESSIONS = {
    "claude-code-opus46-spotter-8463c716.jsonl": "anthropic",
    "claude-code-sonnet45-subagent-a2898e3.jsonl": "anthropic",
    "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json": "openai",
    "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json": "openai",
    "openhands-llama4-multiswebench-output.jsonl": "openai-responses",
    "swe-agent-gpt4-pydicom-1458.traj": "openai",
}
#: The window each session is replayed at under compaction: about half of its history,
#: so that every policy compacts at least once and the last turn still fits.
WINDOWS = {
    "claude-code-opus46-spotter-8463c716.jsonl": 60_000,
    "claude-code-sonnet45-subagent-a2898e3.jsonl": 46_000,
    "mini-swe-agent-v1-gemini3pro-pylint-6528.traj.json": 40_000,
    "mini-swe-agent-v2-deepseek-sqlfluff-1733.traj.json": 40_000,
    "openhands-llama4-multiswebench-output.jsonl": 16_000,
    "swe-agent-gpt4-pydicom-1458.traj": 12_000,
}
_RENDER_MODEL = {
    "anthropic": "anthropic/claude-sonnet-4-5",
    "openai": "openai/gpt-4.1",
    "openai-responses": "openai/gpt-5-codex",
}
_ITEMS = {"anthropic": "messages", "openai": "messages", "openai-responses": "input"}


def _without_compactions(session: Session) -> Session:
    from kilo_rules.tools.simulation.simulate import without_recorded_compactions

    return without_recorded_compactions(session)


def full_body(name: str) -> tuple[str, dict[str, Any]]:
    """The API and the whole request body of a recorded session, as its agent would send
    it at the end (system prompt, tools, every message), rendered with no compaction."""
    api = SESSIONS[name]
    session = _without_compactions(read_session(TRAJECTORIES / name, run=0))
    model = bundled_catalog().get(_RENDER_MODEL[api]).model_dump(mode="json")
    model["limits"] = {"context": 10_000_000, "output": 4096}
    plan = compile_policy("kilo-default", model_from_data(model))
    body = json.loads(apply_plan(plan, session).wire)
    return api, body


def _role(api: str, item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    if api == "openai-responses":
        return item.get("role") if item.get("type", "message") == "message" else item.get("type")
    return item.get("role")


def step_bodies(name: str, model: str, every: int = 1) -> Iterator[dict[str, Any]]:
    """The body of each step of a recorded session: the history up to each point where the
    agent asks the model (after a user message or a tool result), for ``model``."""
    api, body = full_body(name)
    key = _ITEMS[api]
    items = body[key]
    body = {k: v for k, v in body.items() if k not in (key, "prompt_cache_key")}
    body["model"] = model
    ends = [
        k
        for k in range(1, len(items) + 1)
        if _role(api, items[k - 1]) in ("user", "tool", "function_call_output")
        and (k == len(items) or _role(api, items[k]) not in ("tool", "function_call_output"))
    ]
    if api == "anthropic":
        items = [_unmarked(m) for m in items]
    for n, k in enumerate(ends):
        if n % every == 0 or k == ends[-1]:
            step = items[:k]
            if api == "anthropic":  # as Claude Code does: a cache mark on the newest message
                step = [*step[:-1], _marked(step[-1])]
            yield {**body, key: step}


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
    return {**message, "content": blocks}


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not content:
        return message
    return {
        **message,
        "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}],
    }
