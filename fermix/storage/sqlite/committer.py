"""Group commit: every write of a process goes through one connection, batched (A1, S8).

Callers hand a unit of work (a function of the connection) to :meth:`Committer.run` and get
its result only after the transaction holding it has committed. There is no writer thread:
the connection is held by one caller at a time, the **leader**, which commits on its own
thread.

* A caller that finds the connection free leads: it runs its unit in one
  ``BEGIN IMMEDIATE`` transaction. One conversation appending turn after turn takes this
  path alone: no thread hop, no wake-up.
* A caller that finds it held joins a FIFO queue and sleeps on a lock of its own. The
  leader **absorbs** the queue into its transaction: after the units it has run, it takes
  every unit queued meanwhile (up to ``max_batch`` in all) and runs them too, and commits
  only once nothing more is queued. It then wakes exactly the callers of its batch, each
  through its own lock (no broadcast), and hands the connection to the first caller queued
  after its batch, which leads the next one; with nobody queued, the connection is free.

Why leaders and not a writer thread: under the GIL the units run one at a time whoever runs
them, so a thread of its own buys no parallelism, only hand-offs, and a hand-off to a thread
that the scheduler placed on another core costs tens of microseconds on a virtual machine
(bench/append.py measured the same 8 callers at about 17,000 appends/s with the writer on
their core and about 10,000/s with the writer on the other). So callers that wake each
other are kept on one core: while the writer is contended, each caller's thread is
narrowed to one CPU for the length of its call (:mod:`fermix.storage.affinity`: 11,900
appends/s became 15,500 to 16,500 here); the checkpoints (below) use the other. Absorbing,
instead of committing what was queued when the batch started, fills a batch while it runs:
8 callers share commits about 6 at a time instead of 3 to 4.

A caller's own units commit in the order of its calls (each call returns once committed);
queued units of different callers commit in queue order, after the leader's.

A batch of several units first runs without savepoints, two statements fewer per unit. If a
unit raises, the transaction is rolled back and the batch runs again with a savepoint per
unit, so only the failing unit is left out and its batchmates commit (units may therefore
run twice: they are functions of the connection and nothing else). A unit alone in its
transaction is not run again: its error rolls the transaction back. Either way the failing
unit's caller alone gets the error: a database error of its own (a constraint) as a
:class:`WriteFailedError` whose cause is the apsw error (H3), any other exception as raised.

A transient failure of a transaction (busy, locked, I/O, disk full: see
:mod:`fermix.storage.retry`), whether a unit, ``BEGIN`` or ``COMMIT`` raised it, is retried
with tenacity per the committer's :class:`RetryPolicy` (by default 3 attempts in all, short
jittered waits), each attempt running the whole batch again. After the last attempt every
unit of the batch fails with :class:`WriteFailedError` and nothing of it was committed; any
other database error of ``BEGIN`` or ``COMMIT`` fails the batch the same way, without retry.

**What the process knows, kept honest.** Units are called with the committer's ``session``
(the connection, or the database's one write session), and ``on_reset`` is called, by the
connection's holder, whenever what that session remembers of the database may be stale:
after any rollback (of a transaction or of a unit's savepoint), and at the start of a
transaction when SQLite's data version moved since this connection's last commit (another
connection, in this process or another, committed; one file-control call per transaction).

**Checkpoints off the acknowledged path.** SQLite's own auto-checkpoint (inside the
``COMMIT`` that crosses 1,000 log pages) is replaced by :mod:`fermix.storage.sqlite.checkpoint`:
a background thread copies the log back beside the writes, and the committing party only
once the log has grown large.

:meth:`Committer.close` refuses new work, lets the work already queued or running commit,
stops the checkpoint thread and closes the connections.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import apsw

from fermix.storage.affinity import WriterCpu
from fermix.storage.leaders import GroupCommit, Unit, Work
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy
from fermix.storage.sqlite.checkpoint import (
    CHECKPOINT_INLINE_PAGES,
    CHECKPOINT_PAGES,
    WalCheckpoints,
)
from fermix.storage.sqlite.connection import TRANSIENT_ERRORS

__all__ = [
    "TRANSIENT_ERRORS",
    "Committer",
    "RetryPolicy",
]

log = logging.getLogger(__name__)


class Committer(GroupCommit):
    """The group commit on SQLite: one apsw connection, WAL checkpoints off the commit path."""

    transient = TRANSIENT_ERRORS
    driver_error = apsw.Error

    def __init__(
        self,
        conn: apsw.Connection,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_batch: int = 512,
        checkpoint_pages: int = CHECKPOINT_PAGES,
        inline_pages: int = CHECKPOINT_INLINE_PAGES,
        session: Any = None,
        on_reset: Callable[[], None] | None = None,
        cpu: WriterCpu | None = None,
    ) -> None:
        self._conn = conn
        self._session = conn if session is None else session
        """What each unit is called with: the connection, or a session bound to it."""
        self._on_reset = on_reset
        """Called, by the connection's holder, when what this process knows of the database
        may be stale: after a rollback, and when another connection committed since this
        one's last commit (SQLite's data version moved; checked once per transaction)."""
        self._version = -1
        """The connection's data version after its last commit (-1: none yet)."""
        super().__init__(
            retry=retry,
            max_batch=max_batch,
            cpu=WriterCpu.for_process() if cpu is None else cpu,
        )
        self._checkpoints = WalCheckpoints(
            conn, checkpoint_pages=checkpoint_pages, inline_pages=inline_pages
        )
        self._checkpointer = self._checkpoints.checkpointer
        """The background checkpoints' thread (None when SQLite's own checkpoints stay)."""

    @property
    def _wal_pages(self) -> int:
        """Pages in the log after the last commit, for tests."""
        return self._checkpoints.pages

    def _close_connection(self) -> None:
        try:
            self._checkpoints.close()
        finally:
            self._conn.close()

    def _commit(self, batch: list[Unit]) -> None:
        """One attempt at the batch: each unit's outcome is set once it committed, or once
        its own error is final.

        Units run first without savepoints. If one raises, the transaction is rolled back
        and the batch runs again with a savepoint per unit (a unit alone gets its error at
        once). Transient errors propagate for a retry of the whole batch.
        """
        conn = self._conn
        session = self._session
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._on_reset is not None and conn.data_version() != self._version:
                self._on_reset()  # another connection committed: drop what it may change
            ran = 0
            while True:  # the units queued while these ran join the batch
                for unit in batch[ran:]:
                    unit.value = unit.work(session)  # a result, not an outcome until committed
                ran = len(batch)
                if not (self._queue and self._absorb(batch)):
                    break
            conn.execute("COMMIT")
            if self._on_reset is not None:
                self._version = conn.data_version()
        except TRANSIENT_ERRORS:
            self._rollback()
            raise
        except Exception as exc:  # noqa: BLE001 - a unit failed: isolate it, or hand it back
            self._rollback()
            if len(batch) == 1:
                batch[0].fail(exc, apsw.Error)
            else:
                self._commit_isolated(batch)
            return
        except BaseException:
            self._rollback()
            raise
        for unit in batch:
            unit.ok = True
        checkpoints = self._checkpoints
        if checkpoints.pages >= checkpoints.due_at:
            checkpoints.checkpoint(conn)

    def _commit_isolated(self, batch: list[Unit]) -> None:
        """The batch again, each unit in a savepoint, leaving out the ones that raise."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._on_reset is not None:
                self._on_reset()  # a unit's savepoint may roll back what it did
            outcomes = [self._savepointed(conn, unit.work) for unit in batch]
            conn.execute("COMMIT")
            if self._on_reset is not None:
                self._version = conn.data_version()
        except BaseException:
            self._rollback()
            raise
        self._hand_out(batch, outcomes)

    def _savepointed(self, conn: apsw.Connection, work: Work) -> tuple[bool, Any]:
        conn.execute("SAVEPOINT unit")
        try:
            value = work(self._session)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to this unit's caller, not hidden
            conn.execute("ROLLBACK TO unit")
            conn.execute("RELEASE unit")
            if self._on_reset is not None:
                self._on_reset()
            return (False, exc)
        conn.execute("RELEASE unit")
        return (True, value)

    def _rollback(self) -> None:
        try:
            if not self._conn.get_autocommit():
                self._conn.execute("ROLLBACK")
        finally:
            if self._on_reset is not None:
                self._on_reset()
