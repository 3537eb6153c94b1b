"""The version of kilo-rules, one value for the package and every output that records it
(SARIF drivers, bundle manifests, the sidecar)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

__all__ = ["__version__"]

#: The checkout's pyproject, read only when the distribution was never installed.
_PYPROJECT = Path(__file__).resolve().parents[__name__.count(".")] / "pyproject.toml"


def _version() -> str:
    """The installed distribution's version; from a source tree that was never installed,
    the version its ``pyproject.toml`` declares."""
    try:
        return importlib.metadata.version("kilo-rules")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with _PYPROJECT.open("rb") as f:
            project = tomllib.load(f)["project"]
        if project["name"] == "kilo-rules":  # not the pyproject of a project vendoring us
            return str(project["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    return "0+unknown"


__version__ = _version()
