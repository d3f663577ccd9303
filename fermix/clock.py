"""Wall-clock time as integer milliseconds since the epoch, the unit of every stored time."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def now_ms() -> int:
    """The current wall-clock time in milliseconds."""
    return time.time_ns() // 1_000_000
