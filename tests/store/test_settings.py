"""StoreSettings (``KILO_RULES_STORE_*``), sources chosen from settings, and the store on
a real recorded session: the same request as compiling the routed policy directly."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kilo_rules import PolicyStore, StoreError, StoreSettings
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.importers import import_file
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.tools.serving.store import default_cache_dir

from ..runtime.helpers import model
from .helpers import SESSION, marker_of, write_tree

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "trajectories"
REAL = SHARED / "claude-code-opus46-spotter-8463c716.jsonl"


def test_settings_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KILO_RULES_STORE_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("KILO_RULES_STORE_PRELOAD", "anthropic/claude-sonnet-4-5, openai/gpt-5")
    monkeypatch.setenv("KILO_RULES_STORE_POLL_SECONDS", "2.5")
    s = StoreSettings()
    assert s.directory == tmp_path and s.source() == "directory"
    assert s.preload == ("anthropic/claude-sonnet-4-5", "openai/gpt-5")
    assert s.poll_seconds == 2.5 and s.poll_max_seconds == 300.0
    monkeypatch.setenv("KILO_RULES_STORE_PRELOAD", '["a/b"]')
    assert StoreSettings().preload == ("a/b",)


def test_settings_defaults_and_limits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    s = StoreSettings()
    assert s.source() is None
    assert s.cache_dir == tmp_path / "kilo-rules" / "bundles" == default_cache_dir()
    assert (s.poll_seconds, s.poll_max_seconds, s.debounce_seconds) == (10.0, 300.0, 0.2)
    with pytest.raises(ValidationError, match="give one source"):
        StoreSettings(directory=tmp_path, url="https://example.com/b.tar.gz")
    with pytest.raises(ValidationError, match="poll_max_seconds"):
        StoreSettings(poll_seconds=10, poll_max_seconds=5)
    with pytest.raises(ValidationError):
        StoreSettings(poll_seconds=0)
    with pytest.raises(ValidationError):
        s.poll_seconds = 1.0  # type: ignore[misc]  # frozen


def test_from_settings_needs_a_source(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DIRECTORY", "BUNDLE", "URL"):
        monkeypatch.delenv(f"KILO_RULES_STORE_{name}", raising=False)
    with pytest.raises(StoreError) as info:
        PolicyStore.from_settings()
    assert info.value.diagnostic.code == "store.source"


def test_from_settings_opens_a_directory(tmp_path: Path) -> None:
    write_tree(tmp_path / "p", "A")
    settings = StoreSettings(directory=tmp_path / "p", work_dir=tmp_path / "work")
    with PolicyStore.from_settings(settings) as store:
        assert store.work_dir.parent == tmp_path / "work"
        assert store.source == str(tmp_path / "p")
        assert marker_of(store.apply(SESSION, model()).body()) == "A"
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.skipif(not REAL.exists(), reason="the shared trajectories are not checked out")
def test_a_real_session_builds_the_same_request_as_a_direct_compile(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    (root / "routes.yaml").write_text("version: 1\nroutes: []\ndefault: kilo-default\n")
    session = import_file(REAL)
    big = model(limits={"context": 2_000_000, "output": 64_000})
    with PolicyStore.from_directory(root) as store:
        served = store.apply(session, big)
    direct = apply_plan(compile_policy("kilo-default", big), session)
    assert served.request == direct.request
    assert served.decisions == direct.decisions
    assert served.revision is not None and direct.revision is None
