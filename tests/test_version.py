"""``kilo_rules.__version__`` comes from the package metadata, and from ``pyproject.toml``
in a source tree that was never installed."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from kilo_rules.engine.base.version import _version
from kilo_rules.tools.cli import EXIT_OK, main

ROOT = Path(__file__).resolve().parent.parent


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"kilo-rules {importlib.metadata.version('kilo-rules')}\n"


def test_a_source_tree_never_installed_reads_its_version_from_pyproject(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with (ROOT / "pyproject.toml").open("rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert _version() == declared
