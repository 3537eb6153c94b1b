"""Small builders for runtime tests: models and sessions written inline."""

from __future__ import annotations

from typing import Any

from kilo_rules.engine.formats.catalog import ModelInfo, model_from_data
from kilo_rules.engine.formats.session import (
    Message,
    Session,
    TextPart,
    TokenUsage,
    ToolDefinition,
    ToolPart,
)


def model(**kw: Any) -> ModelInfo:
    """An inline model descriptor; every field can be overridden."""
    data: dict[str, Any] = {
        "id": "test/model",
        "provider": "anthropic",
        "family": "claude",
        "api_id": "claude-test",
        "api": "anthropic",
        "limits": {"context": 200_000, "output": 64_000},
        "cache": {"kind": "explicit", "max_breakpoints": 4, "min_cacheable_tokens": 1024},
    }
    limits = kw.pop("limits", None)
    if limits:
        data["limits"] = limits
    data.update(kw)
    return model_from_data(data)


def user(mid: str, text: str, created: int = 1_700_000_000_000, **kw: Any) -> Message:
    return Message(
        id=mid, role="user", created=created, parts=[TextPart(id=f"{mid}-t", text=text)], **kw
    )


def assistant(mid: str, *parts: Any, tokens: TokenUsage | None = None, **kw: Any) -> Message:
    kw.setdefault("finish", "stop")
    return Message(id=mid, role="assistant", parts=list(parts), tokens=tokens, **kw)


def text(pid: str, value: str) -> TextPart:
    return TextPart(id=pid, text=value)


def tool(pid: str, output: str = "ok", name: str = "read", **kw: Any) -> ToolPart:
    return ToolPart(
        id=pid, call_id=f"call_{pid}", tool=name, input={"path": "a.py"}, output=output, **kw
    )


def session(*messages: Message, tools: tuple[str, ...] = ("read",)) -> Session:
    return Session(
        id="s",
        messages=list(messages),
        tools=[ToolDefinition(name=t, description=f"the {t} tool") for t in tools],
    )
