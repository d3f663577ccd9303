"""The Compactor: a mailbox that runs compactions one at a time (K1-K5, A5, M3).

The work itself is the runner's (``fermix.runtime.compacting.Compacting`` in a running
process), handed in at construction: the actor only serializes the attempts it is sent and
turns a storage failure into a failed :class:`~fermix.core.compaction.CompactionResult`.
A process runs a small pool of them under its supervisor (``[fermix_core.compaction]
workers``), a conversation's requests in order on one, so a model call that hangs for one
conversation never holds up another's compaction while a Compactor is free.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from fermix.actors.base import SupervisedActor
from fermix.core.compaction import CompactionResult
from fermix.errors import FermixError
from fermix.model import ConversationKey

log = logging.getLogger(__name__)


class CompactionRunner(Protocol):
    """What the Compactor runs: one compaction attempt of a conversation."""

    def compact(self, key: ConversationKey, *, force: bool) -> CompactionResult:
        """Compact ``key`` if due (``force``: whatever its peak); a model failure is a
        failed result, a storage failure may raise :class:`~fermix.errors.FermixError`."""
        ...


class Compact(NamedTuple):
    """Compact ``key`` if due (``force``: now, as ``/compact``)."""

    key: ConversationKey
    force: bool = False


class Compactor(SupervisedActor):
    """Runs the compactions it is sent one at a time (A5); one of a pool (M3)."""

    # Its work can always be dropped (a claim expires, a backoff passes): a model call
    # still running at shutdown must not keep the process alive.
    use_daemon_thread = True

    def __init__(self, runner: CompactionRunner) -> None:
        super().__init__()
        self._runner = runner

    def on_receive(self, message: Any) -> Any:
        """Run one compaction; storage failures are logged and returned, not raised."""
        match message:
            case Compact(key, force):
                try:
                    return self._runner.compact(key, force=force)
                except FermixError as exc:
                    log.error("compaction of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
                    return CompactionResult(key, "failed", error=str(exc))
        raise TypeError(f"Compactor got an unknown message: {message!r}")
