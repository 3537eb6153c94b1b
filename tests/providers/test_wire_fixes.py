"""What the real APIs refuse although the SDK types accept it: blank text, Gemini turn order,
Gemini 3 call signatures, and signatures sent to a vendor that did not issue them."""

from __future__ import annotations

import json

import pytest

from kilo_rules.engine.compiler.plan import CacheSettings
from kilo_rules.engine.formats.catalog import signature_issuer
from kilo_rules.engine.formats.request import (
    CacheMark,
    ModelMessage,
    ModelRequest,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from kilo_rules.engine.formats.session import Message, ReasoningPart, TextPart, ToolPart
from kilo_rules.engine.providers import APIS, render
from kilo_rules.engine.providers.gemini import FOREIGN_CALL_SIGNATURE, requires_call_signatures
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.cache import place_markers
from kilo_rules.engine.runtime.lower import LowerSettings, lower

BLANK = "\n\n"
MARK = CacheMark()


def _texts(body: object) -> list[str]:
    """Every ``text`` value anywhere in a rendered body."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                # OpenAI's plain string content counts as text too.
                if key in ("text", "content") and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(body)
    return found


def claude_code_turn() -> ModelRequest:
    """Blank text where Claude Code records it: before tool calls, in a system block, in a
    tool result, and as the only text of a user message."""
    return ModelRequest(
        "m",
        (
            ModelMessage("system", (Text("You are an agent."), Text("  \n"))),
            ModelMessage("user", (Text("fix it"),)),
            ModelMessage("assistant", (Text(BLANK), ToolCall("c1", "read", {"p": "a"}))),
            ModelMessage("tool", (ToolResult("c1", "read", (Text(" "),)),)),
            ModelMessage("user", (Text(BLANK, cache=MARK),)),
            ModelMessage("assistant", (Text("done"),)),
            ModelMessage("user", (Text("thanks"), Text("\t"))),
        ),
    )


@pytest.mark.parametrize("api", APIS)
def test_blank_text_is_sent_nowhere(api: str) -> None:
    body = render(claude_code_turn(), api)
    texts = _texts(body)
    assert "fix it" in texts and "thanks" in texts
    # An empty string is how OpenAI spells a content-less tool or user message, and how
    # Gemini's functionResponse says a tool printed nothing; neither is a text block.
    assert all(t == "" or t.strip() for t in texts), texts
    if api in ("anthropic", "bedrock"):
        assert "" not in texts


def test_a_mark_never_lands_on_blank_text() -> None:
    request = ModelRequest(
        "anthropic/claude-sonnet-4.5",
        (
            ModelMessage("user", (Text("read a"),)),
            ModelMessage("assistant", (Text("plan"), Text(BLANK, cache=MARK))),
            ModelMessage("user", (Text("go on"),)),
        ),
    )
    body = render(request, "openai-compatible")
    assistant = body["messages"][1]["content"]
    assert assistant == [{"type": "text", "text": "plan", "cache_control": {"type": "ephemeral"}}]
    anthropic = render(request, "anthropic")["messages"][1]["content"]
    assert anthropic == [{"type": "text", "text": "plan", "cache_control": {"type": "ephemeral"}}]


def test_message_marks_skip_a_trailing_blank_part() -> None:
    turn = ModelMessage("user", (Text("real words"), Text(BLANK)), cache=MARK)
    request = place_markers(ModelRequest("m", (turn,)), CacheSettings(placement="message"))[0]
    for api in ("anthropic", "openai-compatible"):
        body = render(request, api)
        content = body["messages"][0]["content"]
        assert content == [
            {"type": "text", "text": "real words", "cache_control": {"type": "ephemeral"}}
        ]


# -- Gemini turn order ---------------------------------------------------------------------


def gemini_roles(request: ModelRequest, model: str = "gemini-2.5-pro") -> list[str]:
    body = render(ModelRequest(model, request.messages), "gemini")
    return [c["role"] for c in body["contents"]]


def test_gemini_merges_a_summary_with_the_first_kept_call_turn() -> None:
    request = ModelRequest(
        "gemini-2.5-pro",
        (
            ModelMessage("user", (Text("What did we do so far?"),)),
            ModelMessage("assistant", (Text("Summary: we read a.py."),)),
            ModelMessage("assistant", (ToolCall("c1", "read", {"p": "b"}),)),
            ModelMessage("tool", (ToolResult("c1", "read", (Text("b"),)),)),
        ),
    )
    body = render(request, "gemini")
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    model_parts = body["contents"][1]["parts"]
    assert model_parts[0] == {"text": "Summary: we read a.py."}
    assert model_parts[1]["functionCall"]["name"] == "read"


def test_gemini_merges_a_function_response_with_the_next_user_words() -> None:
    request = ModelRequest(
        "gemini-2.5-pro",
        (
            ModelMessage("user", (Text("task one"),)),
            ModelMessage("user", (Text("task two"),)),
            ModelMessage("assistant", (ToolCall("c1", "run", {}), ToolCall("c2", "run", {}))),
            ModelMessage(
                "tool",
                (ToolResult("c1", "run", (Text("ok"),)), ToolResult("c2", "run", (Text("ok"),))),
            ),
            ModelMessage("user", (Text("continue"),)),
        ),
    )
    body = render(request, "gemini")
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][0]["parts"] == [{"text": "task one"}, {"text": "task two"}]
    last = body["contents"][2]["parts"]
    assert [next(iter(p)) for p in last] == ["functionResponse", "functionResponse", "text"]


# -- Gemini 3 call signatures ---------------------------------------------------------------


def calls_request(model: str, *calls: ToolCall) -> ModelRequest:
    results = tuple(ToolResult(c.call_id, c.name, (Text("ok"),)) for c in calls)
    return ModelRequest(
        model,
        (
            ModelMessage("user", (Text("go"),)),
            ModelMessage("assistant", calls),
            ModelMessage("tool", results),
        ),
    )


def test_which_models_validate_call_signatures() -> None:
    assert requires_call_signatures("gemini-3-pro-preview")
    assert requires_call_signatures("models/gemini-3.1-flash")
    assert requires_call_signatures("gemini-4-ultra")
    assert not requires_call_signatures("gemini-2.5-pro")
    assert not requires_call_signatures("claude-sonnet-4-5")


def test_gemini_3_gets_the_documented_value_for_foreign_calls() -> None:
    request = calls_request(
        "gemini-3-pro-preview", ToolCall("c1", "read", {}), ToolCall("c2", "grep", {})
    )
    parts = render(request, "gemini")["contents"][1]["parts"]
    assert parts[0]["thoughtSignature"] == FOREIGN_CALL_SIGNATURE
    assert "thoughtSignature" not in parts[1]  # only the first call of a turn is validated
    # Gemini 2.5 does not validate them, so nothing is added there.
    older = render(calls_request("gemini-2.5-pro", ToolCall("c1", "read", {})), "gemini")
    assert "thoughtSignature" not in older["contents"][1]["parts"][0]


def test_gemini_3_keeps_its_own_signatures() -> None:
    own = ToolCall("c1", "read", {}, signature="g-sig", origin="google")
    unknown = ToolCall("c2", "read", {}, signature="u-sig")
    body = render(calls_request("gemini-3-pro-preview", own, unknown), "gemini")
    parts = body["contents"][1]["parts"]
    assert parts[0]["thoughtSignature"] == "g-sig"
    assert parts[1]["thoughtSignature"] == "u-sig"


# -- signature provenance -------------------------------------------------------------------


def reasoning_request(model: str, reasoning: Reasoning, call: ToolCall) -> ModelRequest:
    return ModelRequest(
        model,
        (
            ModelMessage("user", (Text("go"),)),
            ModelMessage("assistant", (reasoning, call)),
            ModelMessage("tool", (ToolResult(call.call_id, call.name, (Text("ok"),)),)),
        ),
    )


def test_claude_signatures_never_reach_gemini() -> None:
    thinking = Reasoning("look at a.py", signature="claude-sig", origin="anthropic")
    call = ToolCall("toolu_1", "read", {}, signature=None, origin="anthropic")
    body = render(reasoning_request("gemini-3-pro-preview", thinking, call), "gemini")
    text = json.dumps(body)
    assert "claude-sig" not in text
    parts = body["contents"][1]["parts"]
    assert parts[0] == {"text": "look at a.py", "thought": True}
    assert parts[1]["thoughtSignature"] == FOREIGN_CALL_SIGNATURE


def test_gemini_signatures_never_reach_anthropic_or_bedrock() -> None:
    thought = Reasoning("hmm", signature="gemini-sig", origin="google")
    call = ToolCall("c1", "read", {}, signature="gemini-call-sig", origin="google")
    for api, model in (("anthropic", "claude-sonnet-4-5"), ("bedrock", "anthropic.claude-x")):
        body = render(reasoning_request(model, thought, call), api)
        assert "gemini-sig" not in json.dumps(body)
        assert "gemini-call-sig" not in json.dumps(body)


def test_claude_signatures_reach_claude_wherever_it_is_served() -> None:
    thinking = Reasoning("t", signature="claude-sig", origin="anthropic")
    call = ToolCall("c1", "read", {}, origin="anthropic")
    anthropic = render(reasoning_request("claude-opus-4-6", thinking, call), "anthropic")
    assert anthropic["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "t",
        "signature": "claude-sig",
    }
    bedrock = render(reasoning_request("anthropic.claude-opus-4-6", thinking, call), "bedrock")
    assert bedrock["messages"][1]["content"][0]["reasoningContent"]["reasoningText"] == {
        "text": "t",
        "signature": "claude-sig",
    }
    # Another vendor's model on Bedrock cannot read Claude's signature.
    nova = render(reasoning_request("amazon.nova-pro-v1:0", thinking, call), "bedrock")
    assert "claude-sig" not in json.dumps(nova)


def test_encrypted_reasoning_follows_the_same_rule() -> None:
    redacted = Reasoning("", encrypted="opaque", origin="anthropic")
    call = ToolCall("c1", "read", {})
    assert "opaque" in json.dumps(render(reasoning_request("c", redacted, call), "anthropic"))
    foreign = Reasoning("", encrypted="opaque", origin="openai")
    assert "opaque" not in json.dumps(render(reasoning_request("c", foreign, call), "anthropic"))


def test_unknown_origin_is_passed_back_as_recorded() -> None:
    thinking = Reasoning("t", signature="sig")
    body = render(reasoning_request("claude-x", thinking, ToolCall("c1", "r", {})), "anthropic")
    assert body["messages"][1]["content"][0]["signature"] == "sig"


def test_lowering_records_who_signed() -> None:
    def assistant(model: str | None) -> Message:
        return Message(
            id="m2",
            role="assistant",
            model=model,
            parts=[
                ReasoningPart(id="r", text="t", signature="s"),
                ToolPart(
                    id="t",
                    call_id="c1",
                    tool="read",
                    metadata={"thought_signature": "g"},
                ),
            ],
        )

    user = Message(id="m1", role="user", parts=[TextPart(id="p", text="go")])
    for model, origin in (
        ("claude-opus-4-6", "anthropic"),
        ("gemini-3-pro-preview", "google"),
        (None, None),
    ):
        lowered = lower([user, assistant(model)], LowerSettings())
        reasoning, call = lowered[1].parts
        assert isinstance(reasoning, Reasoning) and isinstance(call, ToolCall)
        assert reasoning.origin == call.origin == origin
        assert signature_issuer(model) == origin


def test_the_suite_checks_every_body_the_engine_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/conftest.py wraps Plan.apply; with the blank-text rule undone, a Claude Code
    # style turn ("\n\n" text before a tool call) must be refused by that wrapper.
    import kilo_rules.engine.providers.anthropic as anthropic
    from kilo_rules.engine.compiler import compile as compile_module
    from kilo_rules.engine.compiler.compile import compile_policy
    from kilo_rules.engine.runtime.context import StepInput
    from tests.runtime.helpers import assistant, session, text, tool, user

    log = session(
        user("u1", "fix it"),
        assistant("a1", text("a1t", BLANK), tool("t1", "file body")),
        user("u2", "go on"),
    )
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    apply_plan(plan, log, StepInput())  # passes the wrapper as it is
    monkeypatch.setattr(anthropic, "is_blank_text", lambda part: False)
    # A plan of its own: the first one keeps the turns it rendered before the patch.
    compile_module.clear_cache()
    plan = compile_policy("kilo-default", "anthropic/claude-sonnet-4-5")
    with pytest.raises(AssertionError, match="text-not-blank"):
        apply_plan(plan, log, StepInput())
