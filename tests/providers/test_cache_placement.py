"""Cache marker placement, named after the behaviour spec (kilo-behaviour.md §10)."""

from __future__ import annotations

from dataclasses import replace

from provider_samples import ENV, sample_request

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.request import (
    CacheMark,
    Media,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.providers import count_markers, render
from kilo_rules.engine.runtime.cache import place_markers


def marks(request: ModelRequest) -> list[str]:
    """Where the request carries marks, as decision targets."""
    out = [f"tools[{i}]" for i, t in enumerate(request.tools) if t.cache]
    for i, m in enumerate(request.messages):
        if m.cache:
            out.append(f"messages[{i}]")
        out.extend(f"messages[{i}].parts[{j}]" for j, p in enumerate(m.parts) if p.cache)
    return out


def conversation(n_system: int = 3) -> ModelRequest:
    systems = tuple(ModelMessage("system", (Text(f"system {i}"),)) for i in range(n_system))
    rest = (
        ModelMessage("user", (Text("one"),)),
        ModelMessage("assistant", (Text("two"),)),
        ModelMessage("user", (Text("three"),)),
        ModelMessage("assistant", (Text("four"),)),
        ModelMessage("user", (Text("five"), Text(ENV, synthetic=True))),
    )
    return ModelRequest("m", systems + rest)


def test_spec_10_1_first_two_system_last_two_non_system() -> None:
    request, decisions = place_markers(conversation(), CacheSettings())
    assert marks(request) == ["messages[0]", "messages[1]", "messages[6]", "messages[7]"]
    assert [d["action"] for d in decisions] == ["mark"] * 4
    assert decisions[0]["reason"] == "first 2 system messages"
    assert decisions[-1] == {
        "rule": "kilo",
        "action": "mark",
        "target": "messages[7]",
        "role": "user",
        "reason": "last 2 non-system messages",
        "ttl": None,
    }


def test_spec_10_1_message_level_placement_leaves_parts_alone() -> None:
    request, _ = place_markers(conversation(), CacheSettings(placement="message"))
    assert all(p.cache is None for m in request.messages for p in m.parts)
    body = render(request, "anthropic")
    # A message-level mark lands on the message's last block: here the environment text.
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_spec_10_1_last_part_placement() -> None:
    request, _ = place_markers(conversation(), CacheSettings(placement="last-part"))
    assert marks(request)[-1] == "messages[7].parts[1]"


def test_spec_10_1_skip_trailing_environment() -> None:
    settings = CacheSettings(placement="last-part", skip_trailing_environment=True)
    request, _ = place_markers(conversation(), settings)
    assert marks(request)[-1] == "messages[7].parts[0]"
    body = render(request, "openai-compatible")
    content = body["messages"][-1]["content"]
    assert content[0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in content[1]


def test_spec_10_1_skip_trailing_environment_falls_back_to_message() -> None:
    only_env = ModelRequest("m", (ModelMessage("user", (Text(ENV), Text("x", synthetic=True))),))
    settings = CacheSettings(placement="last-part", skip_trailing_environment=True)
    request, _ = place_markers(only_env, settings)
    assert marks(request) == ["messages[0]"]


def test_spec_10_1_automatic_caching_opt_out() -> None:
    settings = CacheSettings(respect_automatic=True, automatic_enabled=True)
    request, decisions = place_markers(conversation(), settings)
    assert marks(request) == []
    assert decisions[-1]["action"] == "off"
    assert "automatic caching" in decisions[-1]["reason"]
    ignoring = replace(settings, respect_automatic=False)
    assert len(marks(place_markers(conversation(), ignoring)[0])) == 4


def test_spec_10_1_gate_closed_or_rule_none_places_nothing() -> None:
    for settings in (CacheSettings(enabled=False), CacheSettings(rule="none")):
        request, decisions = place_markers(conversation(), settings)
        assert marks(request) == []
        assert [d["action"] for d in decisions] == ["off"]


def test_spec_10_2_auto_rule_tool_system_latest_user() -> None:
    request, decisions = place_markers(
        sample_request(), CacheSettings(rule="auto", non_system_last=0)
    )
    # Latest user message: the last text part that is not environment or synthetic.
    assert marks(request) == ["tools[1]", "messages[1].parts[0]", "messages[6].parts[0]"]
    assert [d["reason"] for d in decisions] == [
        "last tool definition",
        "last system message",
        "latest user message",
    ]


def test_spec_10_2_auto_latest_user_fallbacks() -> None:
    env_only = ModelMessage("user", (Text("note", synthetic=True), Text(ENV)))
    request, _ = place_markers(ModelRequest("m", (env_only,)), CacheSettings(rule="auto"))
    assert marks(request) == ["messages[0].parts[1]"]  # else the last text part
    media = ModelMessage("user", (Media("image/png", data="AA=="),))
    request, _ = place_markers(ModelRequest("m", (media,)), CacheSettings(rule="auto"))
    assert marks(request) == ["messages[0].parts[0]"]  # else the last part


def test_ttl_1h_on_every_wire() -> None:
    request, decisions = place_markers(sample_request(), CacheSettings(ttl="1h"))
    assert {d["ttl"] for d in decisions} == {"1h"}
    anthropic = render(request, "anthropic")
    assert anthropic["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    bedrock = render(request, "bedrock")
    assert bedrock["system"][1] == {"cachePoint": {"type": "default", "ttl": "1h"}}
    compat = render(request, "openai-compatible")
    assert compat["messages"][0]["content"][0]["cache_control"]["ttl"] == "1h"


def test_client_marks_are_kept_and_not_duplicated() -> None:
    base = conversation(n_system=2)
    last = base.messages[-1]
    client = replace(
        last, parts=(replace(last.parts[0], cache=CacheMark(client=True)), *last.parts[1:])
    )
    request = replace(base, messages=(*base.messages[:-1], client))
    settings = CacheSettings(placement="last-part", skip_trailing_environment=True)
    marked, decisions = place_markers(request, settings)
    assert marks(marked) == [
        "messages[0].parts[0]",
        "messages[1].parts[0]",
        "messages[5].parts[0]",
        "messages[6].parts[0]",
    ]
    assert marked.messages[-1].parts[0].cache == CacheMark(client=True)
    assert decisions[0] == {
        "rule": "kilo",
        "action": "keep",
        "target": "messages[6].parts[0]",
        "role": "user",
        "reason": "client mark",
        "client": True,
    }
    assert any(d["action"] == "skip" and "already marked" in d["reason"] for d in decisions)


def test_message_mark_and_last_part_mark_are_one_spot() -> None:
    base = conversation(n_system=0)
    last = base.messages[-1]
    tail = replace(
        last, parts=(*last.parts[:-1], replace(last.parts[-1], cache=CacheMark(client=True)))
    )
    request = replace(base, messages=(*base.messages[:-1], tail))
    marked, _ = place_markers(request, CacheSettings(placement="message"))
    assert marked.messages[-1].cache is None  # the client's mark already covers that block
    assert count_markers(render(marked, "anthropic"), "anthropic") == 2


def test_budget_keeps_the_latest_marks() -> None:
    request, decisions = place_markers(conversation(), CacheSettings(budget=2))
    assert marks(request) == ["messages[6]", "messages[7]"]
    skipped = [d for d in decisions if d["action"] == "skip"]
    assert [d["target"] for d in skipped] == ["messages[0]", "messages[1]"]
    assert all("over the budget of 2" in d["reason"] for d in skipped)


def test_budget_counts_client_marks_and_never_drops_them() -> None:
    base = sample_request()
    tools = tuple(replace(t, cache=CacheMark(client=True)) for t in base.tools)
    first = replace(base.messages[2], cache=CacheMark(client=True))
    request = replace(base, tools=tools, messages=(*base.messages[:2], first, *base.messages[3:]))
    marked, decisions = place_markers(request, CacheSettings())
    # Three client marks leave room for one: the latest of the policy's four.
    assert marks(marked) == ["tools[0]", "tools[1]", "messages[2]", "messages[6]"]
    assert count_markers(render(marked, "anthropic"), "anthropic") == 4
    client_over = replace(request, tools=tools * 3)
    _, decisions = place_markers(client_over, CacheSettings())
    assert any(d["action"] == "warn" for d in decisions)
    assert not any(d["action"] == "mark" for d in decisions)


def test_place_markers_leaves_its_input_alone() -> None:
    request = sample_request()
    place_markers(request, CacheSettings(rule="auto"))
    assert marks(request) == []


def test_anthropic_mark_on_thinking_moves_to_a_block_that_takes_it() -> None:
    message = ModelMessage(
        "assistant", (Text("before"), Reasoning("r", signature="s", cache=CacheMark()))
    )
    body = render(ModelRequest("m", (ModelMessage("user", (Text("q"),)), message)), "anthropic")
    text, thinking = body["messages"][1]["content"]
    assert text["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in thinking


def test_bedrock_cache_point_follows_the_marked_block() -> None:
    message = ModelMessage("user", (Text("a", cache=CacheMark()), Text("b")), cache=CacheMark())
    body = render(ModelRequest("m", (message,)), "bedrock")
    assert body["messages"][0]["content"] == [
        {"text": "a"},
        {"cachePoint": {"type": "default"}},
        {"text": "b"},
        {"cachePoint": {"type": "default"}},
    ]


def test_openai_and_gemini_ignore_marks() -> None:
    request, _ = place_markers(sample_request(), CacheSettings())
    for api in ("openai", "gemini"):
        assert count_markers(render(request, api), api) == 0
    assert render(request, "openai")["messages"][0]["content"] == "You are Kilo, a coding agent."


def test_openai_compatible_tool_call_only_turn_carries_the_mark_on_the_message() -> None:
    calls = ModelMessage("assistant", (ToolCall("c1", "bash", {}),), cache=CacheMark())
    result = ModelMessage("tool", (ToolResult("c1", "bash", (Text("ok"),)),))
    request = ModelRequest("m", (ModelMessage("user", (Text("go"),)), calls, result))
    body = render(request, "openai-compatible")
    assert body["messages"][1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][1]["content"] is None
