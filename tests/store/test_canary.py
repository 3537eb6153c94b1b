"""Before a swap, every checked model builds one request of a short session on the new
revision: a policy that compiles but raises while applied is refused (``store.canary-failed``,
naming the model) and the revision before keeps serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kilo_rules.tools.serving.store as store_module
from kilo_rules import PolicyStore
from kilo_rules.engine.base.errors import EvalError
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.tools.serving.store import CANARY_SESSION

from .helpers import FIRST, POLICY, ROUTES, SESSION, SONNET, marker_of, write_tree


def raises_for(model_id: str, marker: str) -> str:
    """A policy that compiles for every model but, for ``model_id``, divides by zero in a
    value read at every step of a one-turn session (the canary's)."""
    return POLICY.format(tail=2).replace("marker.txt", f"{marker}.txt") + (
        "prune:\n"
        f'  protect_tokens: floor(1000 / (session.turns - (1 if model.id == "{model_id}" '
        "else 0)))\n"
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    write_tree(root, "A")
    return root


def test_a_revision_that_raises_for_one_model_in_use_is_refused(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        good = store.revision
        store.plan_for(SONNET)  # in use
        (tree / "prompts" / "B.txt").write_text("MARKER<B>\n", encoding="utf-8")
        (tree / "team.yaml").write_text(raises_for(SONNET, "B"), encoding="utf-8")
        result = store.reload()
        assert result.rejected and not result.swapped and store.revision == good
        [error] = result.errors
        assert error.code == "store.canary-failed"
        assert SONNET in error.message and "division by zero" in error.message
        assert error.details == {"model": SONNET, "cause": "expr.eval"}
        assert error.location.file == str(tree / "team.yaml")
        assert (
            (tree / "team.yaml")
            .read_text()
            .splitlines()[error.location.line - 1]
            .startswith("  protect_tokens:")
        )
        # The old revision answers that model's clients, and everyone else's.
        assert marker_of(store.apply(SESSION, SONNET).body()) == "A"
        assert marker_of(store.apply(SESSION, FIRST).body()) == "A"


def test_without_the_canary_that_model_would_get_an_error(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same revision, the canary skipped: it compiles and is swapped in, and then
    # answers that model's clients with an error. That is what the canary stops.
    def skipped(plan: Any, session: Any, step: Any = None) -> Any:
        return None if session is CANARY_SESSION else apply_plan(plan, session, step)

    with PolicyStore.from_directory(tree) as store:
        store.plan_for(SONNET)
        monkeypatch.setattr(store_module, "apply_plan", skipped)
        (tree / "prompts" / "B.txt").write_text("MARKER<B>\n", encoding="utf-8")
        (tree / "team.yaml").write_text(raises_for(SONNET, "B"), encoding="utf-8")
        assert store.reload().swapped
        one_turn = CANARY_SESSION.model_copy(update={"id": "ses_client"})
        with pytest.raises(EvalError):
            store.apply(one_turn, SONNET)
        assert marker_of(store.apply(one_turn, FIRST).body()) == "B"


def test_a_model_a_route_names_is_tried_before_anyone_asks(tree: Path) -> None:
    (tree / "routes.yaml").write_text(
        ROUTES.replace("match: {family: claude}", f"match: {{id: {SONNET}}}"), encoding="utf-8"
    )
    with PolicyStore.from_directory(tree) as store:
        good = store.revision
        (tree / "prompts" / "B.txt").write_text("MARKER<B>\n", encoding="utf-8")
        (tree / "team.yaml").write_text(raises_for(SONNET, "B"), encoding="utf-8")
        result = store.reload()
        assert result.rejected and store.revision == good
        assert [e.details["model"] for e in result.errors] == [SONNET]


def test_any_exception_refuses_the_revision_typed(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PolicyStore.from_directory(tree) as store:
        good = store.revision

        def broken(plan: Any, session: Any, step: Any = None) -> Any:
            if session is CANARY_SESSION and plan.model.id == FIRST:
                raise RuntimeError("an engine bug")
            return apply_plan(plan, session, step)

        monkeypatch.setattr(store_module, "apply_plan", broken)
        write_tree(tree, "B")
        result = store.reload()
        assert result.rejected and store.revision == good
        [error] = result.errors
        assert error.code == "store.canary-failed" and error.details["model"] == FIRST
        assert "RuntimeError: an engine bug" in error.message
        assert error.location.file == str(tree / "routes.yaml")  # the route that chose it


def test_the_canary_session_is_a_call_and_its_result() -> None:
    kinds = [[p.type for p in m.parts] for m in CANARY_SESSION.messages]
    assert kinds == [["text"], ["text", "tool"]]
    assert [m.role for m in CANARY_SESSION.messages] == ["user", "assistant"]


def test_a_canary_that_never_ends_is_stopped_and_refuses(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kilo_rules.engine.base import cancel
    from kilo_rules.engine.runtime import apply

    with PolicyStore.from_directory(tree) as store:
        good = store.revision

        def spin(st: Any) -> None:
            while True:  # a stage that would never end, checking in as the engine's loops do
                cancel.checkpoint()

        monkeypatch.setattr(store_module, "CANARY_SECONDS", 0.05)
        monkeypatch.setattr(apply, "STAGES", {**apply.STAGES, "lower": spin})
        write_tree(tree, "B")
        result = store.reload()
        assert result.rejected and store.revision == good
        [error] = result.errors
        assert error.code == "store.canary-failed" and error.details["cause"] == "cancelled"
        assert "took longer than 0.05 s" in error.message
        assert error.location.file == str(tree / "routes.yaml")
