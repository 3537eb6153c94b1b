"""kilo-default reproduces Kilo's history view and lowering (§6 placeholder, §7.6, §8)."""

from __future__ import annotations

import base64

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.request import Media, Text, ToolResult
from kilo_rules.engine.formats.session import (
    CompactionPart,
    FilePart,
    Message,
    MessageError,
    StepStartPart,
    TextPart,
    ToolTime,
)
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput
from kilo_rules.engine.runtime.history import project, turns
from kilo_rules.engine.runtime.lower import INTERRUPTED, LowerSettings, lower

from .helpers import assistant, model, session, text, tool, user

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode()


def _compacted_session() -> list[Message]:
    return [
        user("u1", "first"),
        assistant("a1", text("a1t", "one")),
        user("u2", "second"),
        assistant("a2", text("a2t", "two")),
        user("u3", "third"),
        assistant("a3", text("a3t", "three")),
        Message(id="c1", role="user", parts=[CompactionPart(id="c1p", tail_start_id="u3")]),
        assistant("s1", text("s1t", "SUMMARY"), summary=True, parent_id="c1"),
        user("u4", "fourth"),
    ]


def test_spec_7_6_filter_compacted_puts_summary_before_the_tail() -> None:
    view = project(_compacted_session())
    assert [m.id for m in view] == ["c1", "s1", "u3", "a3", "u4"]


def test_spec_7_6_unfinished_summary_is_not_a_boundary() -> None:
    msgs = _compacted_session()
    msgs[7] = msgs[7].model_copy(update={"finish": None})
    assert [m.id for m in project(msgs)] == [m.id for m in msgs]


def test_spec_7_6_manual_summary_trims_before_its_parent() -> None:
    msgs = [
        user("u1", "old"),
        assistant("a1", text("a1t", "x")),
        user("u2", "summarise please"),
        assistant("s1", text("s1t", "SUMMARY"), summary=True, parent_id="u2"),
        user("u3", "go on"),
    ]
    assert [m.id for m in project(msgs)] == ["u2", "s1", "u3"]


def test_spec_7_3_turns_start_at_user_messages_without_compaction() -> None:
    t = turns(_compacted_session())
    assert [(x.start, x.end) for x in t] == [(0, 2), (2, 4), (4, 8), (8, 9)]


def test_spec_7_6_compaction_request_renders_as_question() -> None:
    plan = compile_policy("kilo-default", model())
    result = apply_plan(plan, session(*_compacted_session()), StepInput())
    first = result.request["messages"][0]
    assert first["role"] == "user"
    assert first["content"][0]["text"] == "What did we do so far?"
    assert result.request["messages"][1]["content"][0]["text"] == "SUMMARY"


def test_spec_6_compacted_output_is_replaced_by_placeholder() -> None:
    msgs = [
        user("u1", "read it"),
        assistant(
            "a1",
            tool(
                "t1",
                "SECRET CONTENT",
                time=ToolTime(compacted=5),
                attachments=[FilePart(id="f", mime="image/png", url=PNG)],
            ),
        ),
    ]
    out = lower(msgs, LowerSettings())
    result = out[-1].parts[0]
    assert isinstance(result, ToolResult)
    assert result.content == (Text("[Old tool result content cleared]"),)


def test_interrupted_tool_call_gets_an_error_result() -> None:
    msgs = [user("u1", "run"), assistant("a1", tool("t1", status="running"))]
    out = lower(msgs, LowerSettings())
    result = out[-1].parts[0]
    assert isinstance(result, ToolResult) and result.is_error
    assert result.content == (Text(INTERRUPTED),)


def test_errored_assistant_dropped_unless_interrupted_with_content() -> None:
    failed = assistant("a1", text("x", "partial"), error=MessageError(name="APIError"))
    aborted = assistant("a2", text("y", "partial"), error=MessageError(name="MessageAbortedError"))
    empty_abort = assistant(
        "a3", StepStartPart(id="s"), error=MessageError(name="MessageAbortedError")
    )
    out = lower([user("u", "hi"), failed, aborted, empty_abort], LowerSettings())
    assert [m.source_id for m in out] == ["u", "a2"]


def test_step_start_splits_assistant_and_tool_messages() -> None:
    msg = assistant(
        "a1",
        StepStartPart(id="s1"),
        tool("t1"),
        StepStartPart(id="s2"),
        tool("t2"),
        text("t", "done"),
    )
    roles = [m.role for m in lower([user("u", "go"), msg], LowerSettings())]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]


def test_spec_8_historical_media_stripped_only_after_a_summary() -> None:
    img = FilePart(id="img", mime="image/png", url=PNG, filename="shot.png")
    msgs = [
        Message(id="u1", role="user", parts=[TextPart(id="x", text="look"), img]),
        assistant("a1", text("a", "seen")),
        user("u2", "and now"),
    ]
    kept = lower(msgs, LowerSettings(strip_historical_media=False))
    assert isinstance(kept[0].parts[1], Media)
    stripped = lower(msgs, LowerSettings(strip_historical_media=True))
    assert stripped[0].parts[1] == Text("[Attached image/png: shot.png]")


def test_media_move_out_of_tool_results_when_provider_cannot_take_them() -> None:
    shot = FilePart(id="f", mime="image/png", url=PNG)
    msgs = [user("u", "screenshot"), assistant("a", tool("t1", "taken", attachments=[shot]))]
    inside = lower(msgs, LowerSettings(media_in_tool_results=True))
    assert any(isinstance(c, Media) for c in inside[-1].parts[0].content)  # type: ignore[union-attr]
    moved = lower(msgs, LowerSettings(media_in_tool_results=False))
    assert [m.role for m in moved] == ["user", "assistant", "tool", "user"]
    assert isinstance(moved[-1].parts[-1], Media)


def test_spec_8_environment_block_is_byte_identical_across_steps() -> None:
    plan = compile_policy("kilo-default", model())
    s = session(user("u1", "hi"), assistant("a1", tool("t1", "x"), finish="tool-calls"))
    first = apply_plan(plan, s, StepInput(step=1))
    env = [m for m in first.mutations if m["op"] == "add_part"]
    assert len(env) == 1 and env[0]["message_id"] == "u1"
    assert env[0]["part"]["text"].startswith(
        "<environment_details>\nCurrent time: 2023-11-14T22:13:20Z"
    )
    # persist the block, then take another step with a new tool result
    persisted = s.model_copy(
        update={
            "messages": [
                s.messages[0].model_copy(
                    update={"parts": [*s.messages[0].parts, TextPart(**env[0]["part"])]}
                ),
                s.messages[1],
                assistant("a2", tool("t2", "y")),
            ]
        }
    )
    second = apply_plan(plan, persisted, StepInput(step=2))
    assert not [m for m in second.mutations if m["op"] == "add_part"]
    assert first.request["messages"][0] == second.request["messages"][0]


def _one_hour_client_mark() -> Message:
    """A user message whose text the client asked to cache for an hour."""
    return Message(
        id="u1",
        role="user",
        parts=[
            TextPart(
                id="p",
                text="big stable doc",
                metadata={"cache_control": {"type": "ephemeral", "ttl": "1h"}},
            )
        ],
    )


def test_client_cache_marks_are_kept_and_counted() -> None:
    from kilo_rules.engine.providers import count_markers

    marked = _one_hour_client_mark()
    s = session(
        marked,
        assistant("a1", text("t", "ok")),
        user("u2", "q"),
        assistant("a2", text("t2", "x")),
        user("u3", "more"),
    )
    result = apply_plan(compile_policy("kilo-default", model()), s, StepInput())
    first = result.request["messages"][0]["content"][0]
    assert first["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert count_markers(result.request, "anthropic") == 4  # 1 client + system + last 2


def test_gemini_function_call_signatures_are_sent_back() -> None:
    from kilo_rules.engine.formats.session import ToolPart

    signed = ToolPart(
        id="t1",
        call_id="c1",
        tool="read",
        input={},
        output="x",
        metadata={"thought_signature": "c2lnbmVk"},
    )
    m = model(
        id="g/m", provider="google", api="gemini", api_id="gemini-3-pro-preview", family="gemini"
    )
    plan = compile_policy("kilo-default", m)
    body = apply_plan(plan, session(user("u", "go"), assistant("a", signed)), StepInput()).request
    from ..providers.wire_checks import check

    check(body, "gemini")  # the documented request shape takes a signed call
    calls = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    assert calls == [
        {"functionCall": {"id": "c1", "name": "read", "args": {}}, "thoughtSignature": "c2lnbmVk"}
    ]


def test_marks_before_a_client_one_hour_mark_are_raised_to_one_hour() -> None:
    # Anthropic refuses a 1h breakpoint after a 5m one; the policy's own system marks come
    # before the client's 1h mark, so they are raised rather than sent in the wrong order.
    from kilo_rules.engine.providers.acceptance import check_body

    marked = _one_hour_client_mark()
    s = session(marked, assistant("a1", text("t", "ok")), user("u2", "q"))
    result = apply_plan(compile_policy("kilo-default", model()), s, StepInput())
    assert result.request["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    later = result.request["messages"][-1]["content"][-1]["cache_control"]
    assert later == {"type": "ephemeral"}  # after the 1h mark: left at 5 minutes
    raised = [d for d in result.decisions if "raised to 1h" in str(d.result)]
    assert [d.inputs["target"] for d in raised] == ["messages[0]"]
    assert raised[0].inputs["ttl"] == "1h"
    assert check_body(result.request, "anthropic") == []
