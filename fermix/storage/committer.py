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
their core and about 10,000/s with the writer on the other). Callers that wake each other
stay on one core; the checkpoints (below) use the other. Absorbing, instead of committing
what was queued when the batch started, fills a batch while it runs: 8 callers share
commits about 6 at a time instead of 3 to 4.

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
``COMMIT`` that crosses 1,000 log pages) is replaced by :mod:`fermix.storage.checkpoint`:
a background thread copies the log back beside the writes, and the committing party only
once the log has grown large.

:meth:`Committer.close` refuses new work, lets the work already queued or running commit,
stops the checkpoint thread and closes the connections.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import apsw
import tenacity

from fermix.errors import StorageError, WriteFailedError
from fermix.storage.checkpoint import CHECKPOINT_INLINE_PAGES, CHECKPOINT_PAGES, WalCheckpoints
from fermix.storage.retry import DEFAULT_RETRY, TRANSIENT_ERRORS, RetryPolicy, retrying

__all__ = [
    "TRANSIENT_ERRORS",
    "Committer",
    "RetryPolicy",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[Any], Any]
"""A unit: a function of the connection, or of the session the committer was given."""


class _Unit:
    """One call of :meth:`Committer.run`: its work and, once committed, its outcome."""

    __slots__ = ("label", "lead", "ok", "value", "wake", "work")

    def __init__(self, work: Work, label: str, *, queued: bool) -> None:
        self.work = work
        self.label = label
        self.ok = False
        self.value: Any = None
        self.lead = not queued
        """Whether this unit's caller holds the connection (it leads the batch)."""
        self.wake: threading.Lock | None = None
        if queued:
            # Held until the outcome is set or the connection is handed over; the caller
            # sleeps acquiring it.
            self.wake = threading.Lock()
            self.wake.acquire()

    def succeed(self, value: Any) -> None:
        self.ok = True
        self.value = value

    def fail(self, error: BaseException) -> None:
        """Give the unit its error: a database error typed (H3), with the apsw one as cause."""
        self.ok = False
        if isinstance(error, apsw.Error):
            typed = WriteFailedError(f"{self.label}: not written: {error}")
            typed.__cause__ = error
            error = typed
        self.value = error

    def outcome(self) -> Any:
        """The unit's result, or its error raised."""
        if self.ok:
            return self.value
        raise self.value


class Committer:
    """Runs units of write work on one connection, batching concurrent callers into one commit."""

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
        self._retry = retry
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        # Everything below is guarded by _mutex, except the connection itself, which only
        # its holder touches.
        self._queue: deque[_Unit] = deque()
        self._held = False
        """A caller holds the connection (the leader)."""
        self._closed = False
        self._released = threading.Condition(self._mutex)
        """Notified when the connection is let go while closing (close() waits on it)."""
        self.batches = 0
        """Transactions committed, for benchmarks and tests."""
        self._checkpoints = WalCheckpoints(
            conn, checkpoint_pages=checkpoint_pages, inline_pages=inline_pages
        )
        self._checkpointer = self._checkpoints.checkpointer
        """The background checkpoints' thread (None when SQLite's own checkpoints stay)."""

    @property
    def _wal_pages(self) -> int:
        """Pages in the log after the last commit, for tests."""
        return self._checkpoints.pages

    def run(self, work: Callable[[Any], T], *, label: str = "write") -> T:
        """Run ``work(conn)`` in a write transaction; return its result once committed.

        ``label`` names the write in logs and errors (e.g. the conversation of an append).
        Raises what ``work`` raised, :class:`WriteFailedError` for a database error, or
        :class:`StorageError` once the committer is closed.
        """
        with self._mutex:
            if self._closed:
                raise StorageError("the database writer is closed")
            unit = _Unit(work, label, queued=self._held)
            if unit.lead:
                self._held = True
            else:
                self._queue.append(unit)
        if not unit.lead:
            self._await(unit)
            if not unit.lead:
                return unit.outcome()  # type: ignore[no-any-return]
        return self._lead(unit)  # type: ignore[no-any-return]

    def run_many(self, works: list[tuple[Work, str]]) -> list[tuple[bool, Any]]:
        """Run each ``(work, label)`` as its own unit, in order; return each one's outcome
        once committed, ``(True, result)`` or ``(False, error)``, never raising for a unit.

        For a caller holding many independent writes at once (the server's appends of
        concurrent requests): they share commits as concurrent callers' units do, with one
        wake-up of this caller instead of one thread per unit. A unit that fails is left
        out alone, as in :meth:`run`.
        """
        units: list[_Unit] = []
        with self._mutex:
            if self._closed:
                raise StorageError("the database writer is closed")
            for work, label in works:
                unit = _Unit(work, label, queued=self._held)
                if unit.lead:
                    self._held = True
                else:
                    self._queue.append(unit)
                units.append(unit)
        for unit in units:
            if unit.wake is not None:
                self._await(unit)  # at once when an earlier unit's batch took it
            if unit.lead:
                self._lead(unit, outcome=False)
        return [(unit.ok, unit.value) for unit in units]

    def close(self) -> None:
        """Refuse new work, commit what is queued or running, then close."""
        with self._mutex:
            self._closed = True
            log.debug("closing the writer, %d writes still to commit", len(self._queue))
            while self._held:
                self._released.wait()
        try:
            self._checkpoints.close()
        finally:
            self._conn.close()

    def _await(self, unit: _Unit) -> None:
        """Sleep until ``unit`` is committed or its caller is handed the connection.

        An interrupt (KeyboardInterrupt in the main thread) does not cut the wait short:
        the connection may be on its way to this caller, and the queue behind it would
        never move. It is raised once the wait, and any batch this caller leads, is over.
        """
        assert unit.wake is not None
        interrupted: BaseException | None = None
        while True:
            try:
                unit.wake.acquire()
                break
            except BaseException as exc:  # noqa: BLE001 - raised below, once it is safe
                interrupted = exc
        if interrupted is not None:
            if unit.lead:
                self._lead(unit, outcome=False)
            raise interrupted

    def _lead(self, unit: _Unit, *, outcome: bool = True) -> Any:
        """Holding the connection: commit ``unit`` and the units queued meanwhile, wake
        their callers, hand the connection on; return ``unit``'s outcome."""
        batch = [unit]
        try:
            self._commit_batch(batch)
        finally:
            with self._mutex:
                if self._queue:
                    successor: _Unit | None = self._queue.popleft()
                    successor.lead = True  # type: ignore[union-attr]
                else:
                    successor = None
                    self._held = False
                    if self._closed:
                        self._released.notify_all()
            # The next leader first: its batch runs while this thread wakes its own
            # batch's callers, each wake a system call that can cost tens of microseconds
            # when the sleeper is on the other core; woken last, it left the connection
            # idle for all of them.
            if successor is not None:
                successor.wake.release()  # type: ignore[union-attr]
            for follower in batch[1:]:
                follower.wake.release()  # type: ignore[union-attr]
        return unit.outcome() if outcome else None

    def _absorb(self, batch: list[_Unit]) -> bool:
        """Move the units queued meanwhile into the running ``batch``, up to ``max_batch``."""
        room = self._max_batch - len(batch)
        if room <= 0:
            return False
        with self._mutex:
            pending = self._queue
            if not pending:
                return False
            if len(pending) <= room:
                batch.extend(pending)
                pending.clear()
            else:
                batch.extend([pending.popleft() for _ in range(room)])
        return True

    def _commit_batch(self, batch: list[_Unit]) -> None:
        """Commit ``batch`` in one transaction, retrying transient errors; set outcomes."""
        try:
            try:
                self._commit(batch)
            except TRANSIENT_ERRORS as first:
                # The common path pays nothing for retries; only a failed batch enters them.
                log.warning("write failed (%s), retrying: %s", _labels(batch), first)
                self._retrying()(self._commit, batch)
        except TRANSIENT_ERRORS as exc:
            log.error(
                "write failed after %d attempts, nothing kept (%s): %s",
                self._retry.attempts,
                _labels(batch),
                exc,
            )
            for unit in batch:
                unit.ok = False
                unit.value = WriteFailedError(
                    f"{unit.label}: not written after {self._retry.attempts} attempts: {exc}"
                )
            return
        except apsw.Error as exc:
            # Persistent database errors (corruption, a read-only file) reach every caller.
            log.error("write failed, nothing kept (%s): %s", _labels(batch), exc)
            for unit in batch:
                unit.ok = False
                unit.value = WriteFailedError(f"{unit.label}: not written: {exc}")
            return
        except BaseException as exc:
            for unit in batch:
                unit.ok = False
                unit.value = exc
            raise
        self.batches += 1

    def _retrying(self) -> tenacity.Retrying:
        """The retries after a first failed attempt: ``attempts - 1`` more, jittered."""
        return retrying(self._retry, attempts=self._retry.attempts - 1)

    def _commit(self, batch: list[_Unit]) -> None:
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
                self._on_reset()  # another connection committed: forget what it may change
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
                batch[0].fail(exc)
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

    def _commit_isolated(self, batch: list[_Unit]) -> None:
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
        for unit, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                unit.succeed(value)
            else:
                unit.fail(value)

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


def _labels(batch: list[_Unit]) -> str:
    labels = sorted({unit.label for unit in batch})
    shown = ", ".join(labels[:5])
    return shown + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
