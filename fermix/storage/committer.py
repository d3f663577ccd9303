"""Group commit: every write of a process goes through one connection, batched (A1, S8).

Callers hand a unit of work (a function of the connection) to :meth:`Committer.run` and get
its result only after the transaction holding it has committed. A unit takes one of two
ways to the connection:

* **Alone, on the caller's thread.** A caller that finds the connection free and no other
  write in flight (nor any contention in its last :data:`QUEUE_AFTER_CONTENTION` calls)
  runs its unit itself in one ``BEGIN IMMEDIATE`` transaction: no thread hop, no wake-up.
  This is the path of one conversation appending turn after turn.
* **Queued, for the writer thread.** Otherwise the unit joins a FIFO queue and its caller
  sleeps on a lock of its own. The writer thread (started at the first queued unit) takes
  everything queued, up to ``max_batch``, commits it in one transaction and wakes exactly
  the callers of that batch, each through its own lock: no broadcast, no hand-over of a
  lead. While one batch commits, the next queues. Under concurrency this is the path that
  batches: a caller that committed alone whenever the connection was free for a moment
  would slip in between batches and commit one row at a time.

  When the next batch is already queued, the writer wakes the callers of the last one only
  right before the next batch's ``COMMIT``, not before its units run: woken callers compete
  for the GIL, and the writer, whose units release and retake it around every SQLite call,
  would wait behind them (bench/append.py measured about 10% more concurrent appends per
  second this way). Their results are committed either way; only the wake-up moves.

One party holds the connection at a time (a caller alone, or the writer), and queued work is
never left without one: a caller that committed alone hands the connection to the writer if
units queued meanwhile. A caller's own units commit in the order of its calls (each call
returns once committed); queued units of different callers commit in queue order.

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

**Checkpoints off the acknowledged path.** SQLite's own auto-checkpoint (inside the
``COMMIT`` that crosses 1,000 log pages) is replaced by :mod:`fermix.storage.checkpoint`:
a background thread copies the log back beside the writes, and the committing party only
once the log has grown large.

:meth:`Committer.close` refuses new work, lets the work already queued or running commit,
stops the writer and checkpoint threads and closes the connections.
"""

from __future__ import annotations

import logging
import queue
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
    "QUEUE_AFTER_CONTENTION",
    "TRANSIENT_ERRORS",
    "Committer",
    "RetryPolicy",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[apsw.Connection], Any]

QUEUE_AFTER_CONTENTION = 64
"""Calls that go through the queue after a call found another write in flight; a caller
that finds none this many calls in a row commits alone again."""


class _Unit:
    """One call of :meth:`Committer.run`: its work and, once committed, its outcome."""

    __slots__ = ("label", "ok", "value", "wake", "work")

    def __init__(self, work: Work, label: str, *, queued: bool) -> None:
        self.work = work
        self.label = label
        self.ok = False
        self.value: Any = None
        self.wake: threading.Lock | None = None
        if queued:
            # Held until the outcome is set; the caller sleeps acquiring it.
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
    ) -> None:
        self._conn = conn
        self._retry = retry
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        # Everything below is guarded by _mutex, except the connection itself, which only
        # its holder touches.
        self._queue: deque[_Unit] = deque()
        self._held = False
        """Someone holds the connection: a caller alone, or the writer."""
        self._writer_holds = False
        self._in_flight = 0
        """Calls not yet answered: committing alone, queued, or in the writer's batch."""
        self._queue_next = 0
        """Calls still to queue since the last contention (:data:`QUEUE_AFTER_CONTENTION`)."""
        self._closed = False
        self._writer: threading.Thread | None = None
        self._to_wake: list[_Unit] = []
        """Callers of the writer's last batch, committed but not yet woken (writer only)."""
        self._writer_turn: queue.SimpleQueue[None] = queue.SimpleQueue()
        """Where the writer sleeps until it is handed the connection or closed."""
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

    def run(self, work: Callable[[apsw.Connection], T], *, label: str = "write") -> T:
        """Run ``work(conn)`` in a write transaction; return its result once committed.

        ``label`` names the write in logs and errors (e.g. the conversation of an append).
        Raises what ``work`` raised, :class:`WriteFailedError` for a database error, or
        :class:`StorageError` once the committer is closed.
        """
        with self._mutex:
            if self._closed:
                raise StorageError("the database writer is closed")
            if self._in_flight:
                self._queue_next = QUEUE_AFTER_CONTENTION
            elif self._queue_next:
                self._queue_next -= 1
            self._in_flight += 1
            alone = not self._held and not self._queue_next
            if alone:
                self._held = True
            else:
                unit = _Unit(work, label, queued=True)
                self._queue.append(unit)
                if not self._held:
                    self._hand_to_writer()
        if alone:
            return self._run_alone(work, label)
        assert unit.wake is not None
        unit.wake.acquire()
        result: T = unit.outcome()
        return result

    def close(self) -> None:
        """Refuse new work, commit what is queued or running, stop the writer, close."""
        with self._mutex:
            self._closed = True
            log.debug("closing the writer, %d writes still to commit", self._in_flight)
            if self._held and self._writer is None:
                self._start_writer()  # it waits for the caller committing alone, then ends
            writer = self._writer
            self._writer_turn.put(None)
        if writer is not None:
            writer.join()
        try:
            self._checkpoints.close()
        finally:
            self._conn.close()

    def _start_writer(self) -> None:
        self._writer = threading.Thread(
            target=self._write_loop, name="fermix-committer", daemon=True
        )
        self._writer.start()

    def _hand_to_writer(self) -> None:
        """Give the connection to the writer thread, starting it if needed (under _mutex)."""
        self._held = self._writer_holds = True
        if self._writer is None:
            self._start_writer()
        self._writer_turn.put(None)

    def _run_alone(self, work: Callable[[apsw.Connection], T], label: str) -> T:
        """Commit one unit on the caller's thread, then hand the connection on."""
        unit = _Unit(work, label, queued=False)
        try:
            self._commit_batch([unit])
        finally:
            with self._mutex:
                self._in_flight -= 1
                if self._queue:
                    self._hand_to_writer()
                else:
                    self._held = False
                    if self._closed:
                        self._writer_turn.put(None)  # close() may be waiting on the writer
        if unit.ok:
            result: T = unit.value
            return result
        raise unit.value

    def _write_loop(self) -> None:
        """The writer thread: commit queued batches while it holds the connection."""
        done: list[_Unit] = []
        while True:
            batch: list[_Unit] | None = None
            with self._mutex:
                # Answered before they are woken: a caller's next call must not count its
                # own committed unit as contention.
                self._in_flight -= len(done)
                if self._writer_holds:
                    if self._queue:
                        batch = self._take_batch()
                    else:
                        self._writer_holds = self._held = False
            if batch is None:
                self._wake(done)
                while batch is None:
                    with self._mutex:
                        if self._writer_holds:
                            batch = self._take_batch()
                        elif self._closed and not self._held:
                            return
                    if batch is None:
                        self._writer_turn.get()
            else:
                self._to_wake = done  # woken by _commit, right before the batch's COMMIT
            try:
                self._commit_batch(batch)
            except BaseException:  # each unit of the batch holds it already; the writer goes on
                log.exception("a write unit raised past the committer (%s)", _labels(batch))
            self._wake(self._to_wake)  # if the batch never reached its COMMIT
            done = batch

    def _wake(self, units: list[_Unit]) -> None:
        """Wake the callers of ``units``, whose outcomes are set."""
        self._to_wake = []
        for unit in units:
            assert unit.wake is not None
            unit.wake.release()

    def _take_batch(self) -> list[_Unit]:
        """Everything queued, up to ``max_batch`` units (under _mutex)."""
        pending = self._queue
        if len(pending) <= self._max_batch:
            batch = list(pending)
            pending.clear()
            return batch
        return [pending.popleft() for _ in range(self._max_batch)]

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
        conn.execute("BEGIN IMMEDIATE")
        try:
            for unit in batch:
                unit.value = unit.work(conn)  # a result, but not an outcome until committed
            if self._to_wake:
                self._wake(self._to_wake)
            conn.execute("COMMIT")
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
            outcomes = [self._savepointed(conn, unit.work) for unit in batch]
            conn.execute("COMMIT")
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
            value = work(conn)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to this unit's caller, not hidden
            conn.execute("ROLLBACK TO unit")
            conn.execute("RELEASE unit")
            return (False, exc)
        conn.execute("RELEASE unit")
        return (True, value)

    def _rollback(self) -> None:
        if not self._conn.get_autocommit():
            self._conn.execute("ROLLBACK")


def _labels(batch: list[_Unit]) -> str:
    labels = sorted({unit.label for unit in batch})
    shown = ", ".join(labels[:5])
    return shown + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
