"""Timing helpers shared by the benchmarks: percentiles, and timing functions where they run."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between the closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Stopwatch:
    """Times the calls of a few functions where they run, by wrapping them for a while."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.calls: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = defaultdict(list)

    @contextmanager
    def wrapping(
        self,
        owner: object,
        attr: str,
        name: str,
        when: Callable[..., bool] = lambda *args, **kwargs: True,
    ) -> Iterator[None]:
        """Time ``owner.attr`` as ``name`` (the calls ``when`` accepts, keeping their
        arguments) until the block ends."""
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not when(*args, **kwargs):
                return original(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.ms[name].append((time.perf_counter() - started) * 1000)
                self.calls[name].append((args, kwargs))

        setattr(owner, attr, timed)
        try:
            yield
        finally:
            setattr(owner, attr, original)

    def mark(self) -> dict[str, int]:
        """How many calls of each name were timed so far, for :meth:`since`."""
        return {name: len(values) for name, values in self.ms.items()}

    def since(self, mark: dict[str, int], name: str) -> float:
        """Milliseconds spent in ``name`` since ``mark``."""
        return sum(self.ms[name][mark.get(name, 0) :])

    def last(self, name: str) -> float:
        """Milliseconds of the last timed call of ``name`` (0 if none)."""
        return self.ms[name][-1] if self.ms[name] else 0.0


def paired_ms(
    first: Callable[[], object],
    second: Callable[[], object],
    repeats: int,
    *,
    before: Callable[[], object] | None = None,
) -> tuple[list[float], list[float]]:
    """Milliseconds of ``repeats`` calls of ``first`` and of ``second``, timed in pairs.

    The two alternate, in a rotating order (first-second, then second-first), so that a
    change in the machine's load hits both alike; one warm-up pair is not counted.
    ``before``, when given, runs untimed before every call (to put the state back, say).
    """
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        order = ((0, first), (1, second)) if i % 2 == 0 else ((1, second), (0, first))
        for slot, fn in order:
            if before is not None:
                before()
            started = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - started) * 1000
            if i:
                times[slot].append(elapsed)
    return times


def repeated_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls of ``fn``, after one warm-up call not counted."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return times
