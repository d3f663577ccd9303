"""The retry policy of every write: which errors can pass, and how long to try (A1, S8).

One policy for the group committer, migrations and prompt-file rebuilds, so a disk hiccup
or another process's lock is absorbed the same way on every write path, and a fault that
persists reaches the caller as a typed error after the same bounded number of attempts.
"""

from __future__ import annotations

from dataclasses import dataclass

import tenacity


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed write is retried: ``attempts`` in all, waits jittered up to ``max_wait_s``."""

    attempts: int = 3
    initial_wait_s: float = 0.01
    max_wait_s: float = 0.1


DEFAULT_RETRY = RetryPolicy()
"""The policy of every write unless a caller (a test, a benchmark) passes its own."""


def retrying(
    policy: RetryPolicy = DEFAULT_RETRY,
    *,
    attempts: int | None = None,
    transient: tuple[type[BaseException], ...],
) -> tenacity.Retrying:
    """A tenacity loop over ``policy`` that retries only ``transient`` errors (each
    adapter's own: its lock and I/O errors) and re-raises the last one; ``attempts``
    overrides the policy's count."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(transient),
        stop=tenacity.stop_after_attempt(max(1, policy.attempts if attempts is None else attempts)),
        wait=tenacity.wait_random_exponential(
            multiplier=policy.initial_wait_s, max=policy.max_wait_s
        ),
        reraise=True,
    )
