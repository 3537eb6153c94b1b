"""The OpenAI Responses API body: instructions, input items, call/output pairing,
encrypted reasoning, media in tool results and explicit breakpoints."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from provider_samples import PDF, PNG, sample_request
from wire_checks import check

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.catalog import bundled_catalog
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
from kilo_rules.engine.providers import count_markers, endpoint, render
from kilo_rules.engine.providers.acceptance import BodyContext, check_body
from kilo_rules.engine.providers.openai_responses import MAX_CALL_ID, call_id
from kilo_rules.engine.runtime.cache import place_markers

API = "openai-responses"
MARK = CacheMark()
BREAKPOINT = {"mode": "explicit"}


def body_of(request: ModelRequest, **options: Any) -> dict[str, Any]:
    """The rendered body, checked against the SDK type and the acceptance rules."""
    body = render(replace(request, options=options) if options else request, API)
    check(body, API)
    assert check_body(body, API) == []
    return body


def turn(*messages: ModelMessage, model: str = "gpt-5.6") -> ModelRequest:
    return ModelRequest(model, (ModelMessage("user", (Text("go"),)), *messages))


def kinds(body: dict[str, Any]) -> list[str]:
    """Each input item as its type, or ``role`` for a message."""
    return [i.get("type") or i["role"] for i in body["input"]]


# -- system text ------------------------------------------------------------------------


def test_system_text_is_sent_as_instructions_joined_by_newlines() -> None:
    body = body_of(sample_request())
    assert body["instructions"] == (
        "You are Kilo, a coding agent.\nProject rules: run the tests before you finish."
    )
    assert all(i.get("role") not in ("system", "developer") for i in body["input"])
    assert list(body)[:3] == ["model", "instructions", "input"]


def test_blank_system_text_is_left_out_of_instructions() -> None:
    request = ModelRequest(
        "gpt-5",
        (
            ModelMessage("system", (Text("header"), Text("  \n"))),
            ModelMessage("system", (Text(""),)),
            ModelMessage("user", (Text("hi"),)),
        ),
    )
    assert body_of(request)["instructions"] == "header"
    only_blank = replace(request, messages=request.messages[1:])
    assert "instructions" not in body_of(only_blank)


def test_system_as_developer_messages_when_instructions_are_off() -> None:
    body = body_of(sample_request(), system_as_instructions=False)
    assert "instructions" not in body
    assert body["input"][:2] == [
        {"role": "developer", "content": "You are Kilo, a coding agent."},
        {"role": "developer", "content": "Project rules: run the tests before you finish."},
    ]
    assert body["input"][2]["role"] == "user"


def test_developer_messages_carry_breakpoints_instructions_cannot() -> None:
    request = place_markers(sample_request(), CacheSettings(placement="message"))[0]
    as_instructions = body_of(request, prompt_cache_breakpoints=True)
    as_messages = body_of(request, system_as_instructions=False, prompt_cache_breakpoints=True)
    # Kilo's rule marks both system messages and the last two others; the assistant turn
    # takes none, so instructions leave one mark and developer messages three.
    assert count_markers(as_instructions, API) == 1
    assert count_markers(as_messages, API) == 3
    first = as_messages["input"][0]["content"]
    assert first == [
        {
            "type": "input_text",
            "text": "You are Kilo, a coding agent.",
            "prompt_cache_breakpoint": BREAKPOINT,
        }
    ]


# -- tools and top-level fields -----------------------------------------------------------


def test_tools_are_flat_and_not_strict_and_limits_are_spelled_for_responses() -> None:
    body = body_of(sample_request())
    assert body["tools"][1] == {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
        # strict defaults to true here, which would refuse this open schema
        "strict": False,
    }
    assert body["max_output_tokens"] == 1024
    assert body["store"] is False
    assert "max_tokens" not in body and "messages" not in body
    assert endpoint(sample_request(), API) == "/v1/responses"


def test_no_output_limit_unless_the_request_sets_one() -> None:
    body = body_of(replace(sample_request(), max_tokens=None))
    assert "max_output_tokens" not in body
    assert body["store"] is False


# -- calls and outputs --------------------------------------------------------------------


def test_calls_and_outputs_pair_by_call_id_in_order() -> None:
    body = body_of(sample_request())
    assert kinds(body) == [
        "user",
        "assistant",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "assistant",
        "user",
    ]
    calls = [i for i in body["input"] if i.get("type") == "function_call"]
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == [o["call_id"] for o in outputs]
    assert calls[0] == {
        "type": "function_call",
        "call_id": "call.read:1",  # the Responses API takes ids as they are, up to 64 long
        "name": "read_file",
        "arguments": '{"path": "app.py"}',
    }
    assert json.loads(calls[1]["arguments"]) == {"command": "pytest -q"}
    # no error flag on this item: an error is told by its text
    assert outputs[1] == {
        "type": "function_call_output",
        "call_id": "toolu_02",
        "output": "1 failed",
    }


def test_result_text_parts_are_joined_and_an_empty_result_is_an_empty_string() -> None:
    request = turn(
        ModelMessage("assistant", (ToolCall("c1", "run", {}), ToolCall("c2", "run", {}))),
        ModelMessage(
            "tool",
            (
                ToolResult("c1", "run", (Text("line one"), Text(" "), Text("line two"))),
                ToolResult("c2", "run", ()),
            ),
        ),
    )
    outputs = [i["output"] for i in body_of(request)["input"][-2:]]
    assert outputs == ["line one\nline two", ""]


def test_long_call_ids_are_shortened_alike_for_call_and_output() -> None:
    long_a = "call_" + "a" * 70 + "_first"
    long_b = "call_" + "a" * 70 + "_second"
    request = turn(
        ModelMessage("assistant", (ToolCall(long_a, "run", {}), ToolCall(long_b, "run", {}))),
        ModelMessage(
            "tool",
            (ToolResult(long_a, "run", (Text("a"),)), ToolResult(long_b, "run", (Text("b"),))),
        ),
    )
    items = body_of(request)["input"]
    ids = [i["call_id"] for i in items[1:]]
    assert ids[0] == ids[2] == call_id(long_a)
    assert ids[1] == ids[3] == call_id(long_b)
    assert ids[0] != ids[1]
    assert all(len(i) == MAX_CALL_ID for i in ids)
    assert call_id("x" * MAX_CALL_ID) == "x" * MAX_CALL_ID


def test_an_output_before_its_call_is_refused_by_the_rules() -> None:
    body = body_of(sample_request())
    outputs = body["input"][4:6]
    del body["input"][5]
    body["input"][2:2] = outputs[1:]  # toolu_02's output moved before its call
    found = {(v.rule, v.path) for v in check_body(body, API)}
    assert ("result-has-call", "input[2].call_id") in found
    assert ("call-answered", "input[4].call_id") in found


# -- reasoning ----------------------------------------------------------------------------


def reasoning_turn(reasoning: Reasoning, *rest: Any) -> ModelRequest:
    parts = rest or (Text("done"),)
    return turn(ModelMessage("assistant", (reasoning, *parts)))


def test_openai_encrypted_reasoning_goes_back_before_its_output_without_an_id() -> None:
    mine = Reasoning("Look at app.py first.", encrypted="gAAAA-enc", origin="openai")
    request = turn(
        ModelMessage("assistant", (mine, ToolCall("c1", "read", {}))),
        ModelMessage("tool", (ToolResult("c1", "read", (Text("body"),)),)),
    )
    body = body_of(request)
    items = body["input"]
    assert items[1] == {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Look at app.py first."}],
        "encrypted_content": "gAAAA-enc",
    }
    assert kinds(body)[2] == "function_call"
    context = BodyContext(signature_issuers={"gAAAA-enc": "openai"})
    assert check_body(body, API, context) == []


def test_blank_reasoning_text_gives_an_empty_summary() -> None:
    body = body_of(reasoning_turn(Reasoning("", encrypted="enc", origin="openai")))
    assert body["input"][1]["summary"] == []


@pytest.mark.parametrize(
    "reasoning",
    [
        Reasoning("t", encrypted="enc", origin="anthropic"),  # Claude's redacted thinking
        Reasoning("t", encrypted="enc", origin="google"),
        Reasoning("t", encrypted="enc"),  # unknown origin: the API would refuse it whole
        Reasoning("t", signature="sig", origin="openai"),  # nothing to decrypt
        Reasoning("t", origin="openai"),
    ],
    ids=["anthropic", "google", "unknown", "signature-only", "text-only"],
)
def test_reasoning_the_api_cannot_read_is_not_sent(reasoning: Reasoning) -> None:
    body = body_of(reasoning_turn(reasoning))
    assert kinds(body) == ["user", "assistant"]
    assert "enc" not in json.dumps(body) and "sig" not in json.dumps(body)


def test_reasoning_with_nothing_after_it_is_not_sent() -> None:
    alone = Reasoning("t", encrypted="enc", origin="openai")
    request = turn(ModelMessage("assistant", (alone,)), ModelMessage("user", (Text("next"),)))
    assert kinds(body_of(request)) == ["user", "user"]


def test_foreign_encrypted_content_is_refused_by_the_rules() -> None:
    body = body_of(reasoning_turn(Reasoning("", encrypted="enc", origin="openai")))
    found = check_body(body, API, BodyContext(signature_issuers={"enc": "anthropic"}))
    assert [(v.rule, v.path) for v in found] == [("signature-issuer", "input[1].encrypted_content")]


# -- content and media --------------------------------------------------------------------


def test_one_unmarked_text_is_a_string_and_anything_else_a_part_list() -> None:
    body = body_of(sample_request())
    assert body["input"][1] == {
        "role": "assistant",
        "content": "I'll read the file and run the tests.",
    }
    user = body["input"][0]["content"]
    assert [p["type"] for p in user] == ["input_text", "input_image", "input_text"]
    assert user[1] == {
        "type": "input_image",
        "image_url": f"data:image/png;base64,{PNG}",
        "detail": "auto",
    }
    last = body["input"][-1]["content"]
    assert last[1] == {
        "type": "input_file",
        "filename": "spec.pdf",
        "file_data": f"data:application/pdf;base64,{PDF}",
    }


def test_assistant_text_parts_each_become_a_message_and_blank_text_none() -> None:
    request = turn(ModelMessage("assistant", (Text("one"), Text("\n\n"), Text("two"))))
    assert body_of(request)["input"][1:] == [
        {"role": "assistant", "content": "one"},
        {"role": "assistant", "content": "two"},
    ]


def test_media_kinds_on_the_input_side() -> None:
    request = ModelRequest(
        "gpt-5",
        (
            ModelMessage(
                "user",
                (
                    Media("application/pdf", url="https://x.test/spec.pdf"),
                    Media("text/plain", data="aGVsbG8=", filename="notes.txt"),
                    Media("audio/wav", data="AA==", filename="a.wav"),
                    Media("image/png", url="https://x.test/a.png"),
                ),
            ),
        ),
    )
    parts = body_of(request)["input"][0]["content"]
    assert parts[0] == {"type": "input_file", "file_url": "https://x.test/spec.pdf"}
    assert parts[1] == {"type": "input_text", "text": "hello"}
    assert (
        parts[2]["text"] == "[attachment a.wav (audio/wav) omitted: type not supported by this API]"
    )
    assert parts[3]["image_url"] == "https://x.test/a.png"


def test_media_in_a_tool_result_make_its_output_a_part_list() -> None:
    image = Media("image/png", data="AA==", filename="shot.png")
    request = turn(
        ModelMessage("assistant", (ToolCall("c1", "shot", {}),)),
        ModelMessage("tool", (ToolResult("c1", "shot", (Text("see"), image)),)),
    )
    output = body_of(request)["input"][-1]["output"]
    assert output == [
        {"type": "input_text", "text": "see"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "auto"},
    ]


def test_media_in_an_assistant_turn_become_a_placeholder() -> None:
    request = turn(ModelMessage("assistant", (Media("image/png", data="AA=="), Text("ok"))))
    items = body_of(request)["input"]
    assert items[1]["content"].startswith("[attachment (image/png) omitted")
    assert items[2] == {"role": "assistant", "content": "ok"}


def test_an_empty_user_message_is_left_out() -> None:
    request = turn(ModelMessage("user", (Text(" "),)), ModelMessage("user", (Text("real"),)))
    assert body_of(request)["input"] == [
        {"role": "user", "content": "go"},
        {"role": "user", "content": "real"},
    ]


# -- breakpoints --------------------------------------------------------------------------


def test_marks_are_ignored_unless_explicit_breakpoints_are_asked_for() -> None:
    request = place_markers(sample_request(), CacheSettings(placement="last-part"))[0]
    plain = body_of(request)
    assert count_markers(plain, API) == 0
    assert "prompt_cache_breakpoint" not in json.dumps(plain)
    explicit = body_of(request, prompt_cache_breakpoints=True)
    assert count_markers(explicit, API) == 1
    assert explicit["input"][-1]["content"][1]["prompt_cache_breakpoint"] == BREAKPOINT


def test_a_marked_single_text_stays_a_part_list() -> None:
    request = ModelRequest("gpt-5.6", (ModelMessage("user", (Text("hi", cache=MARK),)),))
    body = body_of(request, prompt_cache_breakpoints=True)
    assert body["input"][0]["content"] == [
        {"type": "input_text", "text": "hi", "prompt_cache_breakpoint": BREAKPOINT}
    ]


def test_a_marked_tool_result_carries_its_breakpoint_in_a_part_list() -> None:
    request = turn(
        ModelMessage("assistant", (ToolCall("c1", "run", {}),), cache=MARK),
        ModelMessage("tool", (ToolResult("c1", "run", (Text("ok"),)),), cache=MARK),
    )
    body = body_of(request, prompt_cache_breakpoints=True)
    # the assistant's call has no input part to carry a mark; the result's does
    assert body["input"][1] == {
        "type": "function_call",
        "call_id": "c1",
        "name": "run",
        "arguments": "{}",
    }
    assert body["input"][2]["output"] == [
        {"type": "input_text", "text": "ok", "prompt_cache_breakpoint": BREAKPOINT}
    ]
    assert count_markers(body, API) == 1


def test_a_mark_on_blank_text_moves_to_text_with_content() -> None:
    message = ModelMessage("user", (Text("words"), Text("\n", cache=MARK)))
    body = body_of(ModelRequest("gpt-5.6", (message,)), prompt_cache_breakpoints=True)
    assert body["input"][0]["content"] == [
        {"type": "input_text", "text": "words", "prompt_cache_breakpoint": BREAKPOINT}
    ]


# -- catalog ------------------------------------------------------------------------------


def test_codex_is_served_by_the_responses_api_in_the_catalog() -> None:
    codex = bundled_catalog().get("openai/gpt-5-codex")
    assert codex.api == API
    assert codex.source is not None and codex.source.startswith("https://")


def test_a_reasoning_model_asks_for_its_encrypted_reasoning_back() -> None:
    """With ``store: false`` the only way to hand a reasoning model its earlier reasoning is
    the encrypted content, which the API returns only when ``include`` asks for it."""
    plain = body_of(turn())
    assert "include" not in plain
    reasoning = body_of(turn(), reasoning=True)
    assert reasoning["include"] == ["reasoning.encrypted_content"]


def test_spec_9_1_codex_sends_the_system_prompt_as_instructions() -> None:
    """request.ts@0361076:119-127: on the Responses API (Codex) the system prompt goes as
    `instructions` and no system messages are sent; a reasoning model asks for its
    encrypted reasoning back."""
    from kilo_rules.engine.compiler.compile import compile_policy
    from kilo_rules.engine.formats.session import Message, Session, TextPart
    from kilo_rules.engine.runtime.apply import apply_plan
    from kilo_rules.engine.runtime.context import StepInput

    codex = bundled_catalog().get("openai/gpt-5-codex")
    s = Session(
        id="s", messages=[Message(id="u1", role="user", parts=[TextPart(id="t", text="hi")])]
    )
    result = apply_plan(compile_policy("kilo-default", codex), s, StepInput())
    body = result.request
    assert result.provider == API
    assert body["instructions"].startswith("You are")
    assert not [i for i in body["input"] if i.get("role") in ("system", "developer")]
    assert (body.get("include") == ["reasoning.encrypted_content"]) is codex.reasoning
    check(body, API)
