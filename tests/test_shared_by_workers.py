"""The conftest's shared_by_workers: one worker fills the directory, the others read it."""

from __future__ import annotations

import pytest

from .conftest import shared_by_workers


def test_the_first_caller_fills_and_the_next_reads(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with shared_by_workers(tmp_path_factory, "sharing-test") as (where, first):
        assert first
        (where / "result").write_text("42", encoding="utf-8")
    with shared_by_workers(tmp_path_factory, "sharing-test") as (again, first):
        assert not first and again == where
        assert (again / "result").read_text(encoding="utf-8") == "42"


def test_a_block_that_raises_leaves_the_work_to_the_next_caller(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with (
        pytest.raises(RuntimeError),
        shared_by_workers(tmp_path_factory, "sharing-failed") as (where, first),
    ):
        assert first
        (where / "half").write_text("", encoding="utf-8")
        raise RuntimeError("the computation failed")
    with shared_by_workers(tmp_path_factory, "sharing-failed") as (where, first):
        assert first and not (where / "half").exists()  # started again from empty
