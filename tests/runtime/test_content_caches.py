"""Content-addressed caches: a session read back from JSON (all message objects new) is
lowered from the cache, and the cache can never hand back the lowering of a message that
differs in anything lowering reads."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.session import (
    ApprovalPart,
    CompactionPart,
    FilePart,
    Message,
    MessageError,
    ReasoningPart,
    StepStartPart,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolTime,
    session_from_json,
)
from kilo_rules.engine.frontend.checks import MAX_FILE_BYTES
from kilo_rules.engine.runtime.apply import apply_plan, run
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.lower import LowerSettings, lower, lowering_key
from kilo_rules.engine.runtime.memo import ContentKey, ContentMemo, UnkeyableError, data_key

from .helpers import assistant, model, session, tool, user

PNG = "data:image/png;base64,iVBORw0KGgo="
FILE = FilePart(id="f", mime="image/png", url=PNG, filename="a.png")

# Alternative values for every field of every session model a message is made of: a test
# below fails when a model gains a field that is not listed here.
ALTERNATIVES: dict[tuple[type, str], list[Any]] = {
    (Message, "id"): ["m2"],
    (Message, "role"): ["user", "assistant"],
    (Message, "created"): [5],
    (Message, "parts"): [[]],
    (Message, "agent"): ["plan"],
    (Message, "model"): [None, "anthropic/claude-x", "openai/gpt-5", "google/gemini-2.5-pro"],
    (Message, "system"): ["be brief"],
    (Message, "parent_id"): ["u0"],
    (Message, "summary"): [True],
    (Message, "finish"): [None, "stop"],
    (Message, "error"): [
        None,
        MessageError(name="MessageAbortedError"),
        MessageError(name="APIError", message="x"),
    ],
    (Message, "tokens"): [None, TokenUsage(input=5)],
    (Message, "cost"): [None, 0.0, -0.0, 1.5],
    (Message, "metadata"): [
        {},
        {"cache_control": {"type": "ephemeral"}},
        {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"cache_control": True},
        {"cache_control": 1},
        {"note": "x"},
    ],
    (TextPart, "type"): [],
    (TextPart, "id"): ["t9"],
    (TextPart, "text"): ["", "  ", "other text"],
    (TextPart, "synthetic"): [True, False],
    (TextPart, "ignored"): [True, False],
    (TextPart, "metadata"): [
        {},
        {"cache_control": {"type": "ephemeral"}},
        {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"cache_control": 1},
        {"cache_control": True},
    ],
    (ReasoningPart, "type"): [],
    (ReasoningPart, "id"): ["r9"],
    (ReasoningPart, "text"): ["", "thinking more"],
    (ReasoningPart, "signature"): [None, "sig2"],
    (ReasoningPart, "encrypted"): [None, "enc"],
    (ReasoningPart, "metadata"): [{}, {"x": 1}],
    (FilePart, "type"): [],
    (FilePart, "id"): ["f9"],
    (FilePart, "mime"): ["image/png", "application/pdf", "text/plain", "image/jpeg"],
    (FilePart, "url"): [PNG, "data:text/plain,hi", "data:text/plain;base64,aGk=", "https://x/a"],
    (FilePart, "filename"): [None, "b.png"],
    (FilePart, "synthetic"): [True],
    (ToolPart, "type"): [],
    (ToolPart, "id"): ["x9"],
    (ToolPart, "call_id"): ["call_other"],
    (ToolPart, "tool"): ["bash"],
    (ToolPart, "input"): [
        {},
        {"path": "b.py"},
        {"n": 1},
        {"n": True},
        {"n": 1.0},
        {"n": 0.0},
        {"n": -0.0},
        {"n": [1]},
        {"n": (1,)},
        {"n": {"a": None}},
        {"n": None},
    ],
    (ToolPart, "status"): ["pending", "running", "completed", "error"],
    (ToolPart, "output"): ["", "other output"],
    (ToolPart, "error"): [None, "failed"],
    (ToolPart, "title"): ["t"],
    (ToolPart, "attachments"): [[], [FILE], [FILE.model_copy(update={"mime": "text/plain"})]],
    (ToolPart, "time"): [ToolTime(), ToolTime(compacted=7), ToolTime(start=1, end=2)],
    (ToolPart, "metadata"): [
        {},
        {"thought_signature": "ts"},
        {"thought_signature": 1},
        {"cache_control": {"type": "ephemeral"}},
        {"diff": ["a", "b"]},
    ],
    (StepStartPart, "type"): [],
    (StepStartPart, "id"): ["s9"],
    (ApprovalPart, "type"): [],
    (ApprovalPart, "id"): ["ap9"],
    (ApprovalPart, "approval_id"): ["ap-other"],
    (ApprovalPart, "call_id"): ["call_other"],
    (ApprovalPart, "approved"): [None, True, False],
    (ApprovalPart, "reason"): [None, "looks safe"],
    (CompactionPart, "type"): [],
    (CompactionPart, "id"): ["c9"],
    (CompactionPart, "auto"): [False],
    (CompactionPart, "overflow"): [None, True, False],
    (CompactionPart, "tail_start_id"): [None, "m1"],
}

SETTINGS = [
    LowerSettings(),
    LowerSettings(media_in_tool_results=False),
    LowerSettings(strip_historical_media=True),
    LowerSettings(tool_output_max_chars=3),
    LowerSettings(strip_all_media=True),
    LowerSettings(drop_errored_assistant=False),
]


def _base_messages() -> list[Message]:
    parts: list[Any] = [
        TextPart(id="t1", text="hello"),
        ReasoningPart(id="r1", text="hmm", signature="sig"),
        StepStartPart(id="s1"),
        ToolPart(
            id="x1",
            call_id="call_1",
            tool="read",
            input={"path": "a.py", "n": 1},
            output="contents",
            attachments=[FILE],
        ),
        FilePart(id="f1", mime="image/png", url=PNG),
        ApprovalPart(id="ap1", approval_id="ap-1", call_id="call_1", approved=True),
    ]
    return [
        Message(id="m1", role="assistant", parts=parts, model="anthropic/claude-x"),
        Message(
            id="u1",
            role="user",
            parts=[TextPart(id="t2", text="go"), FILE, CompactionPart(id="c1")],
        ),
    ]


def _variants(msg: Message) -> list[Message]:
    """``msg`` with one field of the message or of one part changed, every way listed."""
    out = []
    for (cls, name), values in ALTERNATIVES.items():
        if cls is Message:
            out += [msg.model_copy(update={name: v}) for v in values]
            continue
        for i, part in enumerate(msg.parts):
            if type(part) is not cls:
                continue
            for v in values:
                parts = list(msg.parts)
                parts[i] = part.model_copy(update={name: v})
                out.append(msg.model_copy(update={"parts": parts}))
    return out


def test_every_field_of_a_message_is_listed() -> None:
    for cls in (Message, TextPart, ReasoningPart, FilePart, ToolPart, StepStartPart, ApprovalPart):
        for name in cls.model_fields:
            assert (cls, name) in ALTERNATIVES, f"{cls.__name__}.{name}: add alternatives"
    for name in CompactionPart.model_fields:
        assert (CompactionPart, name) in ALTERNATIVES


@pytest.mark.parametrize("base", _base_messages(), ids=lambda m: m.role)
def test_equal_keys_lower_alike(base: Message) -> None:
    """Whatever one field is changed to, either the key changes or lowering does not."""
    variants = [base, *_variants(base)]
    checked = 0
    for a, b in itertools.combinations(variants, 2):
        if lowering_key(a) != lowering_key(b):
            continue
        checked += 1
        for settings in SETTINGS:
            assert lower([a], settings) == lower([b], settings), (a, b, settings)
    # Fields lowering does not read (created, tokens, title...) leave the key unchanged.
    assert checked > 10


def test_a_changed_field_that_lowering_reads_changes_the_key() -> None:
    base = _base_messages()[0]
    for variant in _variants(base):
        if any(lower([variant], s) != lower([base], s) for s in SETTINGS):
            assert lowering_key(variant) != lowering_key(base), variant


def test_data_keys_keep_scalar_types() -> None:
    assert data_key({"n": 1}) != data_key({"n": True})
    assert data_key({"n": 1}) != data_key({"n": 1.0})
    assert data_key({"n": 0.0}) != data_key({"n": -0.0})
    assert data_key([1]) != data_key((1,))
    assert data_key({"a": 1, "b": 2}) != data_key({"b": 2, "a": 1})  # order is written
    assert data_key({"n": math.nan}) == data_key({"n": math.nan})
    assert data_key({"a": [None, "x", {"b": False}]}) == data_key({"a": [None, "x", {"b": False}]})
    with pytest.raises(UnkeyableError):
        data_key({"path": Path("a")})


def test_content_keys_hash_by_summary_and_compare_in_full() -> None:
    a = ContentKey(("m1", "long text"), "m1")
    b = ContentKey(("m1", "long text"), "m1")
    c = ContentKey(("m1", "other text"), "m1")
    assert a == b and hash(a) == hash(b)
    assert a != c and hash(a) == hash(c)  # one bucket, two entries
    memo: ContentMemo[tuple[str, str], str] = ContentMemo(lambda t: ContentKey(t, t[0]))
    assert memo.get_or(("m1", "x"), lambda: "first") == "first"
    assert memo.get_or(("m1", "x"), lambda: "again") == "first"  # equal content: cached
    assert memo.get_or(("m1", "y"), lambda: "second") == "second"


def test_an_unkeyable_message_is_lowered_without_the_content_cache() -> None:
    msg = Message(
        id="m1",
        role="assistant",
        parts=[tool("x", output="out").model_copy(update={"input": {"p": Path("a")}})],
    )
    assert lowering_key(msg) is None
    memo: ContentMemo[Message, Any] = ContentMemo(lowering_key)
    assert lower([msg], LowerSettings(), memo) == lower([msg], LowerSettings())


def _long_session() -> Any:
    messages = [user("u1", "fix the bug")]
    for i in range(20):
        messages.append(
            assistant(f"a{i:02d}", tool(f"p{i}", output=f"line {i}\n" * 50), finish="tool-calls")
        )
    return session(*messages)


def test_a_session_read_back_from_json_reuses_the_lowering() -> None:
    plan = compile_policy("kilo-default", model())
    original = _long_session()
    first = run(plan, original, StepInput(), until="lower")
    reloaded = session_from_json(original.model_dump_json())
    assert reloaded.messages[3] is not original.messages[3]
    second = run(plan, reloaded, StepInput(), until="lower")
    assert len(first.lowered) == len(second.lowered) > 20
    assert all(a is b for a, b in zip(first.lowered, second.lowered, strict=True))
    body = apply_plan(plan, reloaded, StepInput()).request
    assert json.dumps(body) == json.dumps(apply_plan(plan, original, StepInput()).request)


def test_a_changed_message_is_lowered_again() -> None:
    plan = compile_policy("kilo-default", model())
    original = _long_session()
    run(plan, original, StepInput(), until="lower")
    data = json.loads(original.model_dump_json())
    data["messages"][5]["parts"][0]["output"] = "changed"
    changed = session_from_json(json.dumps(data))
    body = json.dumps(apply_plan(plan, changed, StepInput()).request)
    assert "changed" in body
    assert "line 4\\n" not in body  # the old output of that call is gone


def test_on_demand_instructions_are_read_to_the_cap(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "AGENTS.md").write_text("root rules")
    (repo / "pkg" / "AGENTS.md").write_text("x" * (MAX_FILE_BYTES + 1))
    read = ToolPart(id="r", call_id="c1", tool="read", input={"filePath": "pkg/a.py"}, output="x")
    s = session(user("u1", "look"), assistant("a1", read, finish="tool-calls"))
    plan = compile_policy("kilo-default", model())
    ws = Workspace(cwd=str(repo), root=str(repo))
    result = apply_plan(plan, s, StepInput(workspace=ws))
    assert not [d for d in result.decisions if d.rule == "on_demand"]
    assert "x" * 1000 not in json.dumps(result.request)
