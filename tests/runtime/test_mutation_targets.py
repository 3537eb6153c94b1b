"""Mutations find their target message from the end of the history: the last message with
the id, as a map of every id would; an added message must be new anywhere."""

from __future__ import annotations

from kilo_rules.engine.formats.session import TextPart
from kilo_rules.engine.runtime.mutations import apply_mutations

from .helpers import session, user


def test_a_part_goes_to_the_last_message_with_the_id() -> None:
    s = session(user("dup", "first"), user("other", "x"), user("dup", "second"))
    part = TextPart(id="added", text="env").model_dump(mode="json")
    out = apply_mutations(s, [{"op": "add_part", "message_id": "dup", "part": part}])
    assert [len(m.parts) for m in out.messages] == [1, 1, 2]


def test_a_message_whose_id_is_taken_anywhere_is_not_added() -> None:
    s = session(user("old", "first"), *(user(f"m{k}", "x") for k in range(20)))
    part = TextPart(id="added", text="env").model_dump(mode="json")
    again = user("old", "again").model_dump(mode="json")
    fresh = user("new", "hello").model_dump(mode="json")
    out = apply_mutations(
        s,
        [
            {"op": "add_part", "message_id": "m19", "part": part},
            {"op": "add_message", "message": again},
            {"op": "add_message", "message": fresh},
            {"op": "add_part", "message_id": "new", "part": part},
        ],
    )
    assert [m.id for m in out.messages] == [m.id for m in s.messages] + ["new"]
    assert [p.id for p in out.messages[-1].parts] == ["new-t", "added"]
    assert [p.id for p in out.messages[-2].parts] == ["m19-t", "added"]
