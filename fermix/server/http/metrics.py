"""What ``fermix server status`` tells about the server: rates and last errors (N7)."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from time import monotonic
from typing import Any

WINDOW_S = 10
"""Seconds over which rates are averaged."""
LAST_ERRORS = 10


@dataclass(frozen=True)
class ErrorSeen:
    """One answer the server gave with a 5xx, or a failure it logged."""

    at: float
    where: str
    message: str


class Metrics:
    """Counters per second over the last :data:`WINDOW_S` seconds, and the last errors.

    Thread-safe: routes run on the event loop and in worker threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, collections.deque[tuple[int, int]]] = {}
        self._totals: collections.Counter[str] = collections.Counter()
        self._errors: collections.deque[ErrorSeen] = collections.deque(maxlen=LAST_ERRORS)

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (``requests``, ``appends``, ...)."""
        second = int(monotonic())
        with self._lock:
            self._totals[name] += n
            buckets = self._buckets.setdefault(name, collections.deque())
            if buckets and buckets[-1][0] == second:
                buckets[-1] = (second, buckets[-1][1] + n)
            else:
                buckets.append((second, n))
                while buckets and buckets[0][0] <= second - WINDOW_S:
                    buckets.popleft()

    def error(self, where: str, message: str) -> None:
        """Remember an error (its message only, never a traceback)."""
        with self._lock:
            self._errors.append(ErrorSeen(time.time(), where, message[:500]))

    def rate(self, name: str) -> float:
        """Counter ``name`` per second, over the last complete :data:`WINDOW_S` seconds."""
        now = int(monotonic())
        with self._lock:
            buckets = self._buckets.get(name, ())
            total = sum(n for second, n in buckets if now - WINDOW_S <= second < now)
        return total / WINDOW_S

    def snapshot(self) -> dict[str, Any]:
        """Totals, rates and last errors, as JSON-ready values."""
        with self._lock:
            totals = dict(self._totals)
            errors = [e.__dict__ for e in self._errors]
        names = sorted(set(totals) | {"requests", "appends"})
        return {
            "totals": {name: totals.get(name, 0) for name in names},
            "per_second": {name: round(self.rate(name), 2) for name in names},
            "rate_window_s": WINDOW_S,
            "last_errors": errors,
        }
