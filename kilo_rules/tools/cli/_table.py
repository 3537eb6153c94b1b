"""The one table layout of the command line, and the one way to cut a long value short."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

ELLIPSIS = "…"

#: The line printed under a table whose values were cut short.
FULL_HINT = f"(values ending in {ELLIPSIS} are cut short: --full shows them whole)"


def shorten(text: str, width: int | None) -> str:
    """``text`` in at most ``width`` characters, ending in an ellipsis when it was cut;
    ``width`` None keeps it whole."""
    if width is None or len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + ELLIPSIS


def render_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    right: Collection[int] = (),
    indent: str = "",
) -> str:
    """Columns two spaces apart under their headers and a rule of dashes; the columns
    numbered in ``right`` (numbers) right-aligned, the others left-aligned. No cell is cut:
    the widest one sets its column's width."""
    table = [list(headers), *(list(row) for row in rows)]
    for n, row in enumerate(table):
        if len(row) != len(headers):
            raise ValueError(f"row {n} has {len(row)} cells for {len(headers)} columns")
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return (indent + "  ".join(padded)).rstrip()

    lines = [line(table[0]), line(["-" * w for w in widths])]
    lines.extend(line(row) for row in table[1:])
    return "\n".join(lines)
