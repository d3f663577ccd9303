"""Which config keys a running process applies without a restart, and the config it then
runs with (W1: the console's setup).

The reviewers, the compactors and the retention sweep read their section once per review,
compaction or sweep (:meth:`~fermix.runtime.engine.Runtime.reconfigure` swaps it whole), and
the model route is built again from ``[fermix_core.model]``; ``Memory`` reads
``[fermix_core.realtime]`` on each transcript. What is fixed when the process starts stays
until the next one: the storage backend, the server's address and limits, the pool sizes,
the sweep's period, the history cap of live conversation actors, embedding and tracing.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from fermix.config import KEYS, Config

LIVE_SECTIONS: Final[dict[str, frozenset[str] | None]] = {
    "memory": frozenset(
        {
            "review_interval_hours",
            "review_max_messages",
            "review_input_token_budget",
            "review_failure_backoff_ms",
            "review_rows_token_budget",
        }
    ),
    "compaction": frozenset({"enabled", "threshold", "reasoning_effort"}),
    "model": None,
    "retention": None,
    "realtime": None,
}
"""By section, the keys a running process applies (None: every key of the section)."""

LIVE_KEYS: Final = frozenset(
    dotted
    for dotted in KEYS
    if (names := LIVE_SECTIONS.get(dotted.split(".")[1], frozenset())) is None
    or dotted.split(".")[2] in names
)
"""The dotted keys (``fermix_core.memory.review_interval_hours``, ...) applied live."""


def applied(current: Config, new: Config) -> Config:
    """The config a running process runs with once ``new`` is written: ``new``'s values of
    :data:`LIVE_KEYS`, ``current``'s of every other key (they wait for the next start)."""
    changes = {}
    for section, names in LIVE_SECTIONS.items():
        was, now = getattr(current, section), getattr(new, section)
        if names is None:
            changes[section] = now
        else:
            changes[section] = dataclasses.replace(
                was, **{name: getattr(now, name) for name in names}
            )
    return dataclasses.replace(current, **changes)
