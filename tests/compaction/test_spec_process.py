"""kilo-default runs Kilo's compaction ``process`` (spec §7.5), plus pinning and drift."""

from __future__ import annotations

import base64
from pathlib import Path

from kilo_rules.engine.formats.request import Text, ToolResult
from kilo_rules.engine.formats.session import CompactionPart, FilePart, Message, Session, TextPart
from kilo_rules.engine.runtime.compaction import PIN_HEADING, compact, drift, pinned_section
from kilo_rules.engine.runtime.history import project
from kilo_rules.engine.runtime.mutations import apply_mutations, missing
from kilo_rules.engine.text.tokens import estimate

from .helpers import FakeSummarizer, assistant, chars, derived, plan_for, session, text, tool, user

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG fake image").decode()


def _long_session() -> Session:
    return session(
        user("u1", "first"),
        assistant("a1", text("a1t", chars(3_000)), tool("t1", chars(1_500))),
        user("u2", "second"),
        assistant("a2", text("a2t", chars(3_000))),
        user("u3", "third"),
        assistant("a3", text("a3t", "short")),
    )


def _added(result_mutations: list[dict[str, object]]) -> list[Message]:
    return [
        Message.model_validate(m["message"]) for m in result_mutations if m["op"] == "add_message"
    ]


def test_spec_7_5_messages_added_by_an_automatic_compaction() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    s = _long_session()
    result = compact(plan, s, FakeSummarizer(), overflow=None, count=estimate)
    request, summary, cont = _added(result.mutations)
    part = request.parts[0]
    assert isinstance(part, CompactionPart)
    assert (part.auto, part.overflow, part.tail_start_id) == (True, None, result.tail_start_id)
    assert summary.summary and summary.finish == "stop" and summary.parent_id == request.id
    assert summary.parts[0].text == result.summary_text == "SUMMARY 1"  # type: ignore[union-attr]
    # new ids sort after every existing one and are the same on a second run
    assert min(m.id for m in (request, summary, cont)) > max(m.id for m in s.messages)
    assert request.id < summary.id < cont.id
    again = compact(plan, s, FakeSummarizer(), overflow=None, count=estimate)
    assert again.mutations == result.mutations
    # nothing is deleted: the session plus the mutations still holds every message
    assert missing(s, apply_mutations(s, result.mutations)) == []


def test_spec_7_5_continue_message_is_synthetic_with_metadata() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    result = compact(plan, _long_session(), FakeSummarizer(), overflow=None, count=estimate)
    cont = _added(result.mutations)[-1]
    part = cont.parts[0]
    assert isinstance(part, TextPart) and part.synthetic
    assert part.text == plan.settings.compaction.continue_text
    assert cont.metadata["compaction_continue"] is True
    assert part.metadata["compaction_continue"] is True
    assert result.replayed_message_id is None


def test_spec_7_5_continue_message_has_the_overflow_preamble_on_overflow() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    # a single user turn: there is no older user content, so nothing is replayed
    s = session(user("u1", "go"), assistant("a1", text("a1t", chars(6_000))))
    result = compact(plan, s, FakeSummarizer(), overflow=True, count=estimate)
    text_ = _added(result.mutations)[-1].parts[0].text  # type: ignore[union-attr]
    preamble = plan.settings.compaction.overflow_preamble
    assert text_ == f"{preamble}\n\n{plan.settings.compaction.continue_text}"


def test_spec_7_5_view_after_compaction_is_request_summary_tail_continue() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    s = _long_session()
    result = compact(plan, s, FakeSummarizer(), overflow=None, count=estimate)
    after = apply_mutations(s, result.mutations)
    request, summary, cont = _added(result.mutations)
    assert result.tail_start_id == "u2"
    assert [m.id for m in project(after.messages)] == [
        request.id, summary.id, "u2", "a2", "u3", "a3", cont.id,
    ]  # fmt: skip


def test_spec_7_5_summary_input_is_the_head_with_media_stripped_and_outputs_capped() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    image = FilePart(id="f1", mime="image/png", url=PNG, filename="shot.png")
    s = session(
        Message(id="u1", role="user", parts=[TextPart(id="u1t", text="see"), image]),
        assistant("a1", tool("t1", "y" * 5_000)),
        user("u2", "second"),
        assistant("a2", text("a2t", chars(3_000))),
        user("u3", "third"),
        assistant("a3", text("a3t", chars(3_000))),
    )
    fake = FakeSummarizer()
    compact(plan, s, fake, overflow=None, count=estimate)
    (req,) = fake.requests
    first = req.messages[0].parts
    assert first[1] == Text("[Attached image/png: shot.png]")
    result = next(p for m in req.messages for p in m.parts if isinstance(p, ToolResult))
    assert result.content[0].text.endswith(  # type: ignore[union-attr]
        "\n[Tool output truncated for compaction: omitted 3000 chars]"
    )
    new = plan.settings.compaction.summary.new_instruction
    assert req.instruction.startswith(new + "\n\n## ") or req.instruction.startswith(new + "\n\n")
    assert req.template and req.instruction == f"{new}\n\n{req.template}"
    assert req.previous_summary is None


def test_spec_7_5_prior_compactions_are_hidden_and_the_summary_rolls() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    fake = FakeSummarizer(reply="Edited `src/app.py`; ran `pytest -q`; saw ValueError: bad x")
    s = _long_session()
    s = apply_mutations(s, compact(plan, s, fake, overflow=None, count=estimate).mutations)
    more = [
        user("u4", "fourth"),
        assistant("a4", text("a4t", chars(3_000))),
        user("u5", "fifth"),
        assistant("a5", text("a5t", chars(3_000))),
    ]
    s = s.model_copy(update={"messages": [*s.messages, *more]})
    fake.reply = "Edited `src/app.py`."
    result = compact(plan, s, fake, overflow=None, count=estimate)
    second = fake.requests[-1]
    assert second.previous_summary == "Edited `src/app.py`; ran `pytest -q`; saw ValueError: bad x"
    update = plan.settings.compaction.summary.update_instruction
    assert second.instruction.startswith(update.replace("{previous}", second.previous_summary))
    # the old compaction request and summary are not part of the new head
    sources = {m.source_id for m in second.messages}
    assert not any(str(x).endswith(("-k1", "-k2")) for x in sources if x)
    d = next(x for x in result.decisions if x.rule == "drift")
    assert d.result["retained"] == 1 and d.result["dropped"] == 2
    assert d.result["commands"]["dropped"] == ["pytest -q"]
    assert d.result["errors"]["dropped"] == ["ValueError: bad x"]


def test_spec_7_5_replay_pulls_out_the_newest_user_message_on_overflow() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    image = FilePart(id="f9", mime="image/png", url=PNG, filename="big.png")
    s = _long_session()
    last = Message(id="u9", role="user", parts=[TextPart(id="u9t", text="look"), image])
    s = s.model_copy(update={"messages": [*s.messages, last]})
    fake = FakeSummarizer()
    result = compact(plan, s, fake, overflow=True, count=estimate)
    added = _added(result.mutations)
    assert len(added) == 3 and result.replayed_message_id == added[-1].id
    replay = added[-1]
    assert replay.metadata["compaction_replay_of"] == "u9"
    assert [p.text for p in replay.parts] == ["look", "[Attached image/png: big.png]"]  # type: ignore[union-attr]
    assert not any(m.metadata.get("compaction_continue") for m in added)
    # the history was cut before u9: it is neither summarised nor in the tail selection
    assert all(m.source_id != "u9" for m in fake.requests[0].messages)


def test_spec_7_5_replay_keeps_media_for_a_preflight_compaction() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    image = FilePart(id="f9", mime="image/png", url=PNG, filename="big.png")
    s = _long_session()
    last = Message(id="u9", role="user", parts=[TextPart(id="u9t", text="look"), image])
    s = s.model_copy(update={"messages": [*s.messages, last]})
    result = compact(plan, s, FakeSummarizer(), overflow=False, count=estimate)
    replay = _added(result.mutations)[-1]
    assert isinstance(replay.parts[1], FilePart) and replay.parts[1].url == PNG


def test_spec_7_5_no_replay_without_older_user_content() -> None:
    plan = plan_for(20_000, 10_000, output_token_max=2_000)
    s = session(user("u1", "go"), assistant("a1", text("a1t", chars(6_000))))
    result = compact(plan, s, FakeSummarizer(), overflow=False, count=estimate)
    assert result.replayed_message_id is None
    assert _added(result.mutations)[-1].metadata["compaction_continue"] is True


def test_spec_7_5_post_compaction_prune_runs_on_the_compacted_view() -> None:
    plan = plan_for(200_000, 8_000)  # preserve budget 8 000
    turns = []
    for k in range(4):
        outputs = [tool(f"t{k}{j}", chars(9_000)) for j in range(4)]
        turns += [user(f"u{k}", f"turn {k}"), assistant(f"a{k}", *outputs)]
    s = session(*turns, user("u9", "last"), assistant("a9", text("a9t", "ok")))
    result = compact(plan, s, FakeSummarizer(), overflow=None, count=estimate)
    marks = [m for m in result.mutations if m["op"] == "mark_compacted"]
    decision = next(d for d in result.decisions if d.rule == "prune.post-compaction")
    # the walk stops at the new summary, so only the verbatim tail could be pruned; the
    # tail here is the last two turns, which the protect rule keeps
    assert marks == [] and decision.result["parts"] == 0
    assert all(m["reason"] == "post-compaction" for m in marks)


def test_pinned_instructions_survive_repeated_compactions(tmp_path: Path) -> None:
    plan = derived(
        tmp_path,
        "compaction:\n  pin:\n    - messages_matching: '^ALWAYS'\n    - layer: instructions\n",
    )
    s = session(
        user("u0", "ALWAYS run ruff before committing.\nNever push to main."),
        assistant("a0", text("a0t", chars(3_000))),
        user("u1", "first"),
        assistant("a1", text("a1t", chars(3_000))),
        user("u2", "second"),
        assistant("a2", text("a2t", chars(3_000))),
    )
    first = compact(plan, s, FakeSummarizer(), overflow=None, count=estimate)
    assert first.pinned == ["u0"]
    s = apply_mutations(s, first.mutations)
    summary = _added(first.mutations)[1]
    assert summary.parts[1].text == pinned_section(  # type: ignore[union-attr]
        [{"id": "u0", "text": "ALWAYS run ruff before committing.\nNever push to main."}]
    )
    assert summary.parts[1].text.startswith(PIN_HEADING)  # type: ignore[union-attr]
    layer = next(d for d in first.decisions if d.rule == "pin.layer")
    assert layer.result == "re-sent" and layer.inputs == {"layer": "instructions"}
    more = [user("u3", "third"), assistant("a3", text("a3t", chars(3_000)))]
    more += [user("u4", "fourth"), assistant("a4", text("a4t", chars(3_000)))]
    s = s.model_copy(update={"messages": [*s.messages, *more]})
    fake = FakeSummarizer()
    second = compact(plan, s, fake, overflow=None, count=estimate)
    assert second.pinned == ["u0"]  # carried from the previous summary, not re-summarised
    assert "ALWAYS" not in (fake.requests[0].previous_summary or "")
    view = project(apply_mutations(s, second.mutations).messages)
    assert "ALWAYS run ruff" in view[1].parts[1].text  # type: ignore[union-attr]


def test_drift_counts_retained_and_dropped_facts() -> None:
    before = "See `make test` in src/kilo/app.py and docs/x.md; TypeError: boom"
    report = drift(before, "Only src/kilo/app.py matters.")
    assert report["paths"] == {"retained": 1, "dropped": ["docs/x.md"]}
    assert report["commands"]["dropped"] == ["make test"]
    assert report["errors"]["dropped"] == ["TypeError: boom"]
    assert (report["retained"], report["dropped"]) == (1, 3)
