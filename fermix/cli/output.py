"""How the CLI prints: rich tables for people, one JSON document with ``--json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def console() -> Console:
    """The console commands print to (standard output, soft-wrapped, no highlighting)."""
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
    out = Table(title=Text(title), title_justify="left", show_lines=False)
    for name in columns:
        out.add_column(Text(name), overflow="fold")
    for row in rows:
        out.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
    return out
