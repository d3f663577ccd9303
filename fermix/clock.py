"""Wall-clock time as integer milliseconds since the epoch, the unit of every stored time.

fermix has two kinds of time and names them apart: ``now_ms`` (this module: epoch
milliseconds, for anything stored or compared across processes) and ``monotonic``
(``time.monotonic`` float seconds, for timeouts and intervals inside one process).
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """The current wall-clock time in milliseconds."""
    return time.time_ns() // 1_000_000
