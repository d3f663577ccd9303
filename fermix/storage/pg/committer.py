"""Group commit on PostgreSQL: the concurrent write units of one process share transactions.

The leader/absorb scheme of :mod:`fermix.storage.committer`, on one psycopg connection per
process (autocommit mode, transactions opened and ended here):

* a caller that finds the connection free leads: ``BEGIN`` (READ COMMITTED), its unit, and
  every unit queued meanwhile (up to ``max_batch``), then ``COMMIT``; it wakes its batch's
  callers and hands the connection to the first caller queued after them;
* a caller that finds it held queues and sleeps on a lock of its own.

A unit that raises aborts the transaction (a failed statement aborts a PostgreSQL
transaction): it is rolled back and the batch runs again with a ``SAVEPOINT`` per unit, so
only the failing unit is left out and its caller alone gets the error, a database error as
a :class:`~fermix.errors.WriteFailedError` whose cause is psycopg's. A unit alone gets its
error at once, except:

**A unique violation runs the unit once more.** Another transaction (another process)
committed the same unique key between the unit's read and its insert: the insert waited
for that commit, then failed. Under READ COMMITTED the unit's reads, run again, see the
committed row: an append retried under the same client key then answers with the stored
message (N3) instead of failing.

Transient failures (:data:`TRANSIENT_ERRORS`: deadlock, serialization failure, a lost
connection, the server shutting down) retry the whole batch per the :class:`RetryPolicy`,
on a new connection when the old one broke. After the last attempt every unit of the batch
fails with :class:`WriteFailedError`; nothing of it was committed.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors
import tenacity
from psycopg import pq

from fermix.errors import StorageError, WriteFailedError
from fermix.storage.pg.connection import Conn
from fermix.storage.pg.session import PgWrites
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.errors.TransactionRollback,  # 40001 serialization failure, 40P01 deadlock
    psycopg.OperationalError,  # connection lost, admin shutdown, too many connections
)
Work = Callable[[PgWrites], Any]


class _Unit:
    """One call of :meth:`PgCommitter.run`: its work and, once committed, its outcome."""

    __slots__ = ("label", "lead", "ok", "value", "wake", "work")

    def __init__(self, work: Work, label: str, *, queued: bool) -> None:
        self.work = work
        self.label = label
        self.ok = False
        self.value: Any = None
        self.lead = not queued
        self.wake: threading.Lock | None = None
        if queued:
            self.wake = threading.Lock()
            self.wake.acquire()

    def succeed(self, value: Any) -> None:
        self.ok = True
        self.value = value

    def fail(self, error: BaseException) -> None:
        self.ok = False
        if isinstance(error, psycopg.Error):
            typed = WriteFailedError(f"{self.label}: not written: {error}")
            typed.__cause__ = error
            error = typed
        self.value = error

    def outcome(self) -> Any:
        if self.ok:
            return self.value
        raise self.value


class PgCommitter:
    """Runs write units on one connection, batching concurrent callers into one commit."""

    def __init__(
        self,
        connect: Callable[[], Conn],
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_batch: int = 512,
    ) -> None:
        self._connect = connect
        self._conn = connect()
        self._session = PgWrites(self._conn)
        self._retry = retry
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        self._queue: deque[_Unit] = deque()
        self._held = False
        self._closed = False
        self._released = threading.Condition(self._mutex)
        self.batches = 0
        """Transactions committed, for benchmarks and tests."""

    def run(self, work: Work, *, label: str = "write") -> Any:
        """Run ``work(session)`` in a write transaction; return its result once committed."""
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
                return unit.outcome()
        return self._lead(unit)

    def run_many(self, works: list[tuple[Work, str]]) -> list[tuple[bool, Any]]:
        """Run each ``(work, label)`` as its own unit, in order; return each outcome."""
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
                self._await(unit)
            if unit.lead:
                self._lead(unit, outcome=False)
        return [(unit.ok, unit.value) for unit in units]

    def close(self) -> None:
        """Refuse new work, commit what is queued or running, then close the connection."""
        with self._mutex:
            self._closed = True
            while self._held:
                self._released.wait()
        self._conn.close()

    def _await(self, unit: _Unit) -> None:
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
        batch = [unit]
        try:
            self._commit_batch(batch)
        finally:
            with self._mutex:
                successor: _Unit | None = None
                if self._queue:
                    successor = self._queue.popleft()
                    successor.lead = True
                else:
                    self._held = False
                    if self._closed:
                        self._released.notify_all()
            if successor is not None:
                assert successor.wake is not None
                successor.wake.release()
            for follower in batch[1:]:
                assert follower.wake is not None
                follower.wake.release()
        return unit.outcome() if outcome else None

    def _absorb(self, batch: list[_Unit]) -> bool:
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
        try:
            try:
                self._commit(batch)
            except TRANSIENT_ERRORS as first:
                log.warning("write failed (%s), retrying: %s", _labels(batch), first)
                self._retrying()(self._commit, batch)
        except TRANSIENT_ERRORS as exc:
            log.error(
                "write failed after %d attempts (%s): %s", self._retry.attempts, _labels(batch), exc
            )
            for unit in batch:
                unit.ok = False
                unit.value = WriteFailedError(
                    f"{unit.label}: not written after {self._retry.attempts} attempts: {exc}"
                )
            return
        except psycopg.Error as exc:
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
        policy = self._retry
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TRANSIENT_ERRORS),
            stop=tenacity.stop_after_attempt(max(1, policy.attempts - 1)),
            wait=tenacity.wait_random_exponential(
                multiplier=policy.initial_wait_s, max=policy.max_wait_s
            ),
            reraise=True,
        )

    def _connection(self) -> Conn:
        """The write connection, opened again if it broke (the server restarted)."""
        if self._conn.closed or self._conn.broken:
            self._conn.close()
            self._conn = self._connect()
            self._session = PgWrites(self._conn)
        return self._conn

    def _commit(self, batch: list[_Unit]) -> None:
        """One attempt at the batch; transient errors propagate for a retry of all of it."""
        conn = self._connection()
        session = self._session
        conn.execute("BEGIN")
        try:
            session.forget()
            ran = 0
            while True:  # the units queued while these ran join the batch
                for unit in batch[ran:]:
                    unit.value = unit.work(session)
                ran = len(batch)
                if not (self._queue and self._absorb(batch)):
                    break
            conn.execute("COMMIT")
        except TRANSIENT_ERRORS:
            self._rollback()
            raise
        except Exception as exc:  # noqa: BLE001 - a unit failed: isolate it, or hand it back
            self._rollback()
            if len(batch) == 1 and not isinstance(exc, psycopg.errors.UniqueViolation):
                batch[0].fail(exc)
            else:
                self._commit_isolated(batch)
            return
        except BaseException:
            self._rollback()
            raise
        for unit in batch:
            unit.ok = True

    def _commit_isolated(self, batch: list[_Unit]) -> None:
        """The batch again, each unit in a savepoint, leaving out the ones that raise."""
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            self._session.forget()
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

    def _savepointed(self, conn: Conn, work: Work) -> tuple[bool, Any]:
        for attempt in range(2):
            conn.execute("SAVEPOINT unit")
            try:
                value = work(self._session)
            except TRANSIENT_ERRORS:
                raise
            except Exception as exc:  # noqa: BLE001 - handed to this unit's caller
                conn.execute("ROLLBACK TO SAVEPOINT unit")
                conn.execute("RELEASE SAVEPOINT unit")
                self._session.forget()
                if attempt == 0 and isinstance(exc, psycopg.errors.UniqueViolation):
                    continue  # another transaction committed the key: read it this time
                return (False, exc)
            conn.execute("RELEASE SAVEPOINT unit")
            return (True, value)
        raise AssertionError("unreachable")

    def _rollback(self) -> None:
        try:
            conn = self._conn
            if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.OperationalError:
            self._conn.close()  # broken: the next attempt connects again
        finally:
            self._session.forget()


def _labels(batch: list[_Unit]) -> str:
    labels = sorted({unit.label for unit in batch})
    shown = ", ".join(labels[:5])
    return shown + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
