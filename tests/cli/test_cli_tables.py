"""Tables fitted to the terminal (``blockx_cli.tables``) and the console that never
wraps off a terminal (``blockx_cli.output.CliConsole``)."""

from __future__ import annotations

import io

import pytest
from rich.text import Text

from blockx_cli.output import CliConsole, print_whole
from blockx_cli.tables import Column, Measured, fit_widths, fitted_table

COLUMNS = (
    Column(header="id", rank=0),
    Column(header="text", rank=1, narrowest=10),
    Column(header="when", rank=2),
    Column(header="where", rank=3),
)
# natural widths 8, 40, 6, 15; the frame of n columns is 3n + 1.
MEASURED = (Measured(8, False), Measured(40, False), Measured(6, False), Measured(15, False))

FITS = [
    # (available, widths)
    (200, [8, 40, 6, 15]),  # every column at its natural width: 69 + 13
    (82, [8, 40, 6, 15]),
    (81, [8, 39, 6, 15]),  # the text column gives first, wrapping
    (52, [8, 10, 6, 15]),  # down to its narrowest
    (51, [8, 27, 6, None]),  # then the least ranked goes, its room the text's
    (34, [8, 10, 6, None]),
    (33, [8, 18, None, None]),
    (25, [8, 10, None, None]),
    (24, [8, None, None, None]),
    (5, [8, None, None, None]),  # rank 0 stays, whatever the width
]


@pytest.mark.parametrize(("available", "widths"), FITS)
def test_columns_narrow_then_go_by_rank(available: int, widths: list[int | None]) -> None:
    assert fit_widths(COLUMNS, MEASURED, available) == widths


def test_an_empty_column_goes_before_any_other() -> None:
    measured = (Measured(8, False), Measured(4, True), Measured(6, False), Measured(15, False))
    assert fit_widths(COLUMNS, measured, 39) == [8, None, 6, 15]


def _render(width: int, *, terminal: bool) -> str:
    out = io.StringIO()
    console = CliConsole(file=out, width=width, force_terminal=terminal, color_system=None)
    rows = [
        [Text("task-1"), Text("a failure that says a lot " * 3), Text("3 s"), Text("10.0.0.1:9090")]
    ]
    console.print(fitted_table(console, COLUMNS, rows, title="tasks"))
    return out.getvalue()


def test_on_a_narrow_terminal_no_header_is_empty_and_the_caption_says_what_went() -> None:
    shown = _render(40, terminal=True)
    lines = shown.splitlines()
    assert all(len(line) <= 40 for line in lines), shown
    header = next(line for line in lines if "┃" in line and "id" in line)
    cells = [c.strip() for c in header.strip("┃").split("┃")]
    assert cells == ["id", "text", "when"], shown
    assert "not shown at 40 columns: where" in " ".join(shown.split())


def test_off_a_terminal_nothing_wraps_whatever_the_width_says() -> None:
    shown = _render(40, terminal=False)
    [row] = [line for line in shown.splitlines() if "task-1" in line]
    assert ("a failure that says a lot " * 3).strip() in row
    assert "10.0.0.1:9090" in row
    assert "not shown" not in shown


def test_a_line_to_copy_is_never_broken_by_rich() -> None:
    out = io.StringIO()
    console = CliConsole(file=out, width=30, force_terminal=True, color_system=None)
    line = "watch it: blockx watch 8e8afb90-da1f-48cb-8780-4075910767c4 --worker 10.0.0.1:9090"
    print_whole(console, line, style="dim")
    assert out.getvalue() == line + "\n"
