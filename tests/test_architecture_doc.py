"""docs/architecture.md draws the layout from the code: its table of rooms lists every
module of every room, its rows are the import-linter contracts, and no module of the
package imports itself back through a chain."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kilo_rules"


def table() -> list[tuple[str, int, list[str], list[list[str]]]]:
    """(wing, row, rooms, the modules of each room) for each row of the layout table."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        m = re.match(r"\| (engine|tools) \| (\d+) \| (.+?) \| (.+?) \| .+ \|$", line)
        if not m:
            continue
        rooms = [r.strip().strip("`") for r in m.group(3).split("\\|")]
        modules = [group.strip().strip("`").split() for group in m.group(4).split("·")]
        assert len(rooms) == len(modules), line
        rows.append((m.group(1), int(m.group(2)), rooms, modules))
    return rows


def contents(room: Path) -> list[str]:
    """A room's modules, and its subpackages with a trailing slash."""
    names = [p.stem for p in room.glob("*.py") if p.name != "__init__.py"]
    names += [f"{p.name}/" for p in room.iterdir() if (p / "__init__.py").is_file()]
    return sorted(names)


def test_every_room_is_drawn_with_every_module_it_holds() -> None:
    drawn: dict[str, list[str]] = {}
    for wing, _, rooms, modules in table():
        for room, names in zip(rooms, modules, strict=True):
            drawn[f"{wing}/{room}"] = sorted(names)
    on_disk = {
        f"{wing.name}/{room.name}": contents(room)
        for wing in (PACKAGE / "engine", PACKAGE / "tools")
        for room in wing.iterdir()
        if (room / "__init__.py").is_file()
    }
    assert drawn == on_disk
    # Nothing else beside the two wings at the top of the package.
    assert contents(PACKAGE) == ["__main__", "engine/", "tools/"]


def test_the_rows_drawn_are_the_layer_contracts() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = {tuple(c["containers"]): c["layers"] for c in contracts if c["type"] == "layers"}
    assert layers[("kilo_rules",)] == ["tools", "engine"]
    for wing in ("engine", "tools"):
        rows = sorted((row, rooms) for w, row, rooms, _ in table() if w == wing)
        assert [row for row, _ in rows] == list(range(1, len(rows) + 1))
        assert layers[(f"kilo_rules.{wing}",)] == [" | ".join(rooms) for _, rooms in rows]
    independent = [c["modules"] for c in contracts if c["type"] == "independence"]
    assert ["kilo_rules.tools.serving", "kilo_rules.tools.simulation"] in independent


def test_no_module_imports_itself_back() -> None:
    graph = grimp.build_graph("kilo_rules")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                cycles.append((module, imported))
    assert cycles == []


def test_no_room_imports_the_public_package_above_it() -> None:
    # kilo_rules/__init__.py sits above both wings: a room that imported it would point up.
    graph = grimp.build_graph("kilo_rules")
    assert sorted(graph.find_modules_that_directly_import("kilo_rules")) == []


def test_every_folder_of_the_package_ships_in_the_wheel() -> None:
    # setuptools lists packages by hand (policies/ and schemas/ are mapped in from the top
    # level): a room or data folder left out of the list would be missing from the wheel.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(d.relative_to(ROOT).parts)
        for d in [PACKAGE, *PACKAGE.rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(f.is_file() for f in d.iterdir())
    }
    assert folders <= listed, sorted(folders - listed)
