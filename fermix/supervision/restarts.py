"""When a supervisor restarts a child, which children, and how often (A6, after Erlang/OTP).

A child's :class:`Restart` type says whether it is started again after it ends
(:func:`should_restart`), the supervisor's :class:`Strategy` which children a restart
replaces, and its :class:`Intensity` how many restarts it allows in a period before it gives
up (:func:`record_restart`). Plain data and pure functions: no thread, no actor.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from fermix.errors import InvalidInputError

__all__ = ["Intensity", "Restart", "Strategy", "record_restart", "should_restart"]


class Restart(enum.Enum):
    """Whether a child that ended is started again (OTP restart types).

    PERMANENT always; TRANSIENT only after an abnormal exit (an exception); TEMPORARY
    never, and it is forgotten once it ends.
    """

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class Strategy(enum.Enum):
    """Which children a restart replaces (OTP restart strategies).

    ONE_FOR_ONE only the child that ended; ONE_FOR_ALL all of them; REST_FOR_ONE the child
    that ended and those started after it. Those of them still running are stopped in
    reverse start order, then started again in order, all but a temporary one, which is
    forgotten; one that was not running (a transient child that ended normally) stays down.
    """

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


@dataclass(frozen=True)
class Intensity:
    """More than ``max_restarts`` restarts within ``period_s`` seconds (of the supervisor's
    monotonic clock), and the supervisor stops its children and gives up."""

    max_restarts: int = 3
    period_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.period_s <= 0:
            msg = f"restart intensity needs max_restarts >= 0 and period_s > 0, got {self}"
            raise InvalidInputError(msg)


def should_restart(restart: Restart, reason: BaseException | None) -> bool:
    """Whether a ``restart`` child that ended for ``reason`` (None: normally) starts again."""
    return restart is Restart.PERMANENT or (restart is Restart.TRANSIENT and reason is not None)


def record_restart(history: deque[float], now: float, intensity: Intensity) -> bool:
    """Add a restart at ``now`` to ``history``, forget those more than the period ago, and
    say whether those left are within ``intensity``."""
    history.append(now)
    while now - history[0] > intensity.period_s:
        history.popleft()
    return len(history) <= intensity.max_restarts
