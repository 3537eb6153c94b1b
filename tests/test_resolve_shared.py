"""Policies that extend one base share its parse and its merge, never its data."""

from __future__ import annotations

from pathlib import Path

from kilo_rules.engine.frontend.resolve import resolve_policy

CHILD = """\
version: 1
name: child-{i}
extends: kilo-default
compaction:
  tail_turns: {i}
"""


def _write(tmp_path: Path, i: int) -> Path:
    path = tmp_path / f"child-{i}.yaml"
    path.write_text(CHILD.format(i=i), encoding="utf-8")
    return path


def test_each_resolution_owns_its_data(tmp_path: Path) -> None:
    first = resolve_policy(_write(tmp_path, 1))
    first.data["compaction"]["tail_turns"] = 99
    first.data["system"]["layers"].clear()
    first.data["budget"]["new"] = 1
    second = resolve_policy(_write(tmp_path, 2))
    base = resolve_policy("kilo-default")
    assert second.data["compaction"]["tail_turns"] == 2
    assert second.data["system"]["layers"] == base.data["system"]["layers"] != []
    assert "new" not in second.data["budget"]
    assert "new" not in base.data["budget"]


def test_origins_point_at_the_file_that_wrote_each_value(tmp_path: Path) -> None:
    path = _write(tmp_path, 3)
    policy = resolve_policy(path)
    assert policy.locate(("compaction", "tail_turns")).file == str(path)
    assert policy.locate(("compaction", "tail_turns")).line == 5
    assert policy.locate(("system", "layers", 0)).file.endswith("kilo-default.yaml")
    again = resolve_policy(path)
    assert again.origin == policy.origin
    assert again.origin is not policy.origin
