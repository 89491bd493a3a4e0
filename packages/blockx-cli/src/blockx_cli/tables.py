"""Tables that fit the terminal: columns narrowed, then dropped, by priority.

Rich shrinks every column of a table wider than the terminal alike, down to zero
width and an empty header. Here each column says how far it may narrow (a text
column wraps, an id or a number never does) and how much it matters; when the
narrowest useful table is still too wide, the columns that matter least go first
(a column empty in every row before any other), and the caption names what was
left out. Off a terminal the console is as wide as the widest line
(``output.CliConsole``), so nothing is narrowed nor dropped.

``fit_widths`` is the decision, a pure function; ``fitted_table`` measures the
cells and builds the rich Table from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# What a boxed table adds to its cells: one space of padding on each side of every
# column, a rule between two columns, and the two edges.
_PADDING = 2
_EDGES = 2


def _frame(columns: int) -> int:
    return columns * _PADDING + max(columns - 1, 0) + _EDGES


@dataclass(frozen=True, kw_only=True)
class Column:
    """``rank``: 0 is kept whatever the width; a higher rank is dropped sooner.
    ``narrowest``: the width its text may wrap to; None never narrows (ids,
    addresses, numbers: cut, they would mislead)."""

    header: str
    rank: int
    narrowest: int | None = None


@dataclass(frozen=True)
class Measured:
    """A column's content: ``natural`` is its widest cell or header, ``empty``
    that no row has anything in it."""

    natural: int
    empty: bool


def _narrowest(column: Column, measured: Measured) -> int:
    if column.narrowest is None:
        return measured.natural
    return min(measured.natural, max(column.narrowest, len(column.header)))


def fit_widths(
    columns: Sequence[Column], measured: Sequence[Measured], available: int
) -> list[int | None]:
    """Each column's width within ``available`` cells (frame included), or None
    for a column dropped. Columns are dropped, empty ones first and then by rank,
    until the narrowest widths fit; the room left goes to the kept columns by rank,
    each up to its natural width. Rank-0 columns are never dropped."""
    kept = set(range(len(columns)))
    droppable = sorted(
        (i for i in kept if columns[i].rank > 0),
        key=lambda i: (not measured[i].empty, -columns[i].rank, -i),
    )
    narrowest = [_narrowest(c, m) for c, m in zip(columns, measured, strict=True)]
    while droppable and _frame(len(kept)) + sum(narrowest[i] for i in kept) > available:
        kept.discard(droppable.pop(0))
    widths: list[int | None] = [narrowest[i] if i in kept else None for i in range(len(columns))]
    room = available - _frame(len(kept)) - sum(narrowest[i] for i in kept)
    for i in sorted(kept, key=lambda i: (columns[i].rank, i)):
        width = widths[i]
        assert width is not None
        grow = max(0, min(room, measured[i].natural - width))
        widths[i] = width + grow
        room -= grow
    return widths


def fitted_table(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Text]],
    *,
    title: str | None = None,
    caption: str | None = None,
) -> Table:
    """A table of ``rows`` (one Text per column) fitted to ``console``'s width;
    the caption says which columns were left out for want of room."""
    unbounded = console.options.update_width(1 << 20)

    def width(cell: Text | str) -> int:
        return Measurement.get(console, unbounded, cell).maximum

    measured = [
        Measured(
            natural=max([width(column.header), *(width(row[i]) for row in rows)]),
            empty=all(not row[i].plain.strip() for row in rows),
        )
        for i, column in enumerate(columns)
    ]
    widths = fit_widths(columns, measured, console.width)
    left_out = [c.header for c, w in zip(columns, widths, strict=True) if w is None]
    if left_out:
        note = f"[dim]not shown at {console.width} columns: {', '.join(left_out)}[/]"
        caption = f"{caption}\n{note}" if caption else note
    table = Table(title=title, caption=caption)
    shown = [i for i, w in enumerate(widths) if w is not None]
    for i in shown:
        column = columns[i]
        table.add_column(
            column.header,
            width=widths[i],
            no_wrap=column.narrowest is None,
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table
