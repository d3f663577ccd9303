"""How the CLI prints: rich tables for people, one JSON document with ``--json``.

Everything goes through :func:`console`, which rich sizes from the terminal, or from the
``COLUMNS`` environment variable when it is set (how tests render at a given width).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text


def console() -> Console:
    """The console commands print to (standard output, soft-wrapped, no highlighting).

    Its width is the terminal's, or ``COLUMNS`` when set; a test sets that to render a
    command's output at a known width.
    """
    return Console(highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    """Print ``data`` as one JSON document on standard output."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, default=str) + "\n")


def when(ms: int | None) -> str:
    """A stored millisecond time as a short UTC timestamp (empty for None)."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")


def clip(text: str, width: int = 60) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """A rich table with ``columns`` and ``rows`` rendered as plain text.

    Cells and the title are :class:`rich.text.Text`, never markup: stored values such as
    ``[/INST]`` or ``[bold]`` are shown as they are and cannot break the output.
    """
    out = Table(
        title=Text(title),
        title_justify="left",
        show_lines=False,
        show_header=any(columns),  # a key / value table needs no empty header row
    )
    for name in columns:
        out.add_column(Text(name), overflow="fold")
    for row in rows:
        out.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
    return out


GAP = 2
"""Spaces between the columns of a :class:`FittedTable`."""
CUT_MAX = 24
"""The widest a ``cut`` column gets; a longer cell ends in an ellipsis."""
WRAP_FLOOR = 16
"""How narrow a ``wrap`` column gets before ``cut`` columns give up width."""
CUT_FLOOR = 10
"""How narrow a ``cut`` column gets before every elastic column shrinks to its header."""


class FittedTable:
    """A table that fits the console's width without breaking a short cell mid-word.

    Like :func:`table`, every cell is plain text. Columns are of three kinds:

    - ``wrap`` (long free text): wraps at spaces, a word longer than the column folded;
    - ``cut`` (identifiers of any length): one line, an ellipsis past :data:`CUT_MAX` or
      when the width runs short;
    - every other column (ids, names, timestamps): one line at its full width, always.

    The widths are worked out at render time, for the width rich renders at: the wrap
    columns give up width first (down to :data:`WRAP_FLOOR`), then the cut columns (down to
    :data:`CUT_FLOOR`), then both down to their headers' length. Headers never wrap. The
    table has no vertical rules, only a line under the headers, to leave room for the text.
    """

    def __init__(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[object]],
        *,
        wrap: Collection[str] = (),
        cut: Collection[str] = (),
    ) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows = [["" if cell is None else str(cell) for cell in row] for row in rows]
        self.wrap = set(wrap)
        self.cut = set(cut)

    def widths(self, max_width: int) -> list[int]:
        """Each column's content width when the table is rendered ``max_width`` wide."""
        natural = [
            max([cell_len(name), *(_widest_line(row[i]) for row in self.rows)])
            for i, name in enumerate(self.columns)
        ]
        widths = [
            min(width, max(CUT_MAX, cell_len(name))) if name in self.cut else width
            for width, name in zip(natural, self.columns, strict=True)
        ]
        excess = sum(widths) + GAP * (len(widths) - 1) - max_width

        def shrink(kinds: set[str], floor: int) -> None:
            nonlocal excess
            floors = {
                i: max(cell_len(name), min(natural[i], floor))
                for i, name in enumerate(self.columns)
                if name in kinds
            }
            while excess > 0:
                room = [i for i in floors if widths[i] > floors[i]]
                if not room:
                    return
                widest = max(room, key=lambda i: widths[i])
                widths[widest] -= 1
                excess -= 1

        shrink(self.wrap, WRAP_FLOOR)
        shrink(self.cut, CUT_FLOOR)
        shrink(self.wrap | self.cut, 0)
        return widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        out = Table(
            title=Text(self.title),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, GAP - 1, 0, 0),
        )
        for name, width in zip(self.columns, self.widths(options.max_width), strict=True):
            out.add_column(
                Text(name, overflow="ellipsis"),
                width=width,
                no_wrap=name not in self.wrap,
                overflow="fold" if name in self.wrap else "ellipsis",
            )
        for row in self.rows:
            out.add_row(*(Text(cell) for cell in row))
        yield out


def _widest_line(text: str) -> int:
    return max(cell_len(line) for line in text.split("\n"))
