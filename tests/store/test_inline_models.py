"""What a caller sends never decides what the operator can deploy: a model described inline
is compiled for that caller's request only (its failure is that request's error), while a
revision is checked against the models the operator declared: the catalog models its routes
serve or name, the preloaded ones and the catalog models in use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilo_rules import PolicyStore, StoreSettings
from kilo_rules.engine.base.errors import CatalogError, ModelUnservableError
from kilo_rules.engine.formats.catalog import ModelInfo, bundled_catalog, model_from_data
from kilo_rules.engine.formats.session import dump_session

from .helpers import (
    FIRST,
    ROUTES,
    SESSION,
    SONNET,
    Compiles,
    compiles,
    marker_of,
    write_tree,
)

__all__ = ["compiles"]  # the fixture, imported for pytest

#: A model with a 4,000-token window, as a caller describes it in a request.
TINY: dict[str, Any] = {
    "id": "caller/tiny",
    "provider": "ollama",
    "family": "qwen",
    "api_id": "tiny:1b",
    "api": "openai-compatible",
    "limits": {"context": 4000, "output": 1000},
}


def tiny(**changes: Any) -> ModelInfo:
    return model_from_data({**TINY, **changes})


def fails_for_window(window: int) -> str:
    """A policy section that compiles for every window but ``window`` (a division by zero
    in a value decided once per model)."""
    return f"prune:\n  protect_tokens: floor(1000000 / (model.limits.context - {window}))\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    write_tree(root, "A")
    return root


def test_an_inline_model_never_holds_back_the_next_revision(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        assert marker_of(store.apply(SESSION, tiny()).body()) == "A"
        write_tree(tree, "B")
        with (tree / "team.yaml").open("a", encoding="utf-8") as fh:
            fh.write(fails_for_window(4000))
        result = store.reload()
        assert result.swapped, result.reason
        assert store.stats().rejected == 0
        # Everyone else gets the new revision ...
        assert marker_of(store.apply(SESSION, SONNET).body()) == "B"
        # ... and the caller's model is that caller's error, typed and located.
        with pytest.raises(ModelUnservableError) as info:
            store.apply(SESSION, tiny())
        diag = info.value.diagnostic
        assert isinstance(info.value, CatalogError)
        assert diag.code == "model.unservable"
        assert "'caller/tiny'" in diag.message and "division by zero" in diag.message
        assert diag.location.file == str(tree / "team.yaml")
        lines = (tree / "team.yaml").read_text(encoding="utf-8").splitlines()
        assert lines[diag.location.line - 1].lstrip().startswith("protect_tokens:")
        assert diag.details["causes"][0]["location"]["file"] == str(tree / "team.yaml")
        assert str(store.work_dir) not in json.dumps(diag.to_json())


def test_inline_plans_are_cached_apart_and_bounded(tree: Path, compiles: Compiles) -> None:
    settings = StoreSettings(max_models=2)
    with PolicyStore.from_directory(tree, settings=settings) as store:
        store.plan_for(SONNET)
        assert compiles.calls == [FIRST, SONNET]
        first = store.plan_for(tiny())
        assert store.plan_for(tiny()) is first  # cached for the revision
        for i in range(5):
            store.plan_for(tiny(id=f"caller/m{i}"))
        assert compiles.calls[2:] == ["caller/tiny", *(f"caller/m{i}" for i in range(5))]
        # A flood of descriptors did not push the operator's model out of the cache ...
        before = compiles.count
        store.plan_for(SONNET)
        assert compiles.count == before
        # ... and none of them is compiled before the next swap.
        write_tree(tree, "B")
        assert store.reload().swapped
        assert compiles.calls[before:] == [FIRST, SONNET]


def test_a_policy_that_compiles_for_no_model_is_refused_before_anyone_asks(tree: Path) -> None:
    with PolicyStore.from_directory(tree) as store:
        good = store.revision
        (tree / "team.yaml").write_text(
            'version: 1\nname: team\ncache:\n  when: "session.turns > 3"\n', encoding="utf-8"
        )
        result = store.reload()
        assert result.rejected and store.revision == good
        assert [d.code for d in result.errors] == ["plan.dynamic"]
        assert result.errors[0].location.file == str(tree / "team.yaml")


def test_a_catalog_model_a_route_names_is_checked_before_anyone_asks(tree: Path) -> None:
    sonnet = bundled_catalog().get(SONNET)
    routes = ROUTES.replace("match: {family: claude}", f"match: {{id: {SONNET}}}")
    (tree / "routes.yaml").write_text(routes, encoding="utf-8")
    with PolicyStore.from_directory(tree) as store:
        good = store.revision
        with (tree / "team.yaml").open("a", encoding="utf-8") as fh:
            fh.write(fails_for_window(sonnet.limits.context))
        result = store.reload()
        assert result.rejected and store.revision == good
        assert "division by zero" in result.errors[0].message
        assert result.errors[0].location.file == str(tree / "team.yaml")


# -- through the sidecar, in process -------------------------------------------------------


def _post(app: Any, body: dict[str, Any]) -> Any:
    import anyio
    import httpx

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/v1/build", json=body)

    return anyio.run(send)


def test_one_unauthenticated_caller_cannot_block_a_rollout_of_the_sidecar(tree: Path) -> None:
    pytest.importorskip("fastapi")
    from kilo_rules.tools.serving.sidecar import create_app

    session = json.loads(dump_session(SESSION))
    with PolicyStore.from_directory(tree) as store:
        app = create_app(store, no_auth=True)
        first = _post(app, {"session": session, "model": TINY})
        assert first.status_code == 200, first.text
        write_tree(tree, "B")
        with (tree / "team.yaml").open("a", encoding="utf-8") as fh:
            fh.write(fails_for_window(4000))
        assert store.reload().swapped
        theirs = _post(app, {"session": session, "model": TINY})
        ours = _post(app, {"session": session, "model": SONNET})
    assert ours.status_code == 200, ours.text
    assert ours.json()["revision"] == store.revision
    assert marker_of(json.dumps(ours.json()["request"])) == "B"
    assert theirs.status_code == 422, theirs.text
    error = theirs.json()["error"]
    assert error["code"] == "model.unservable"
    assert "division by zero" in error["message"]
    assert error["diagnostics"][0]["details"]["path"] == ["model"]
