"""Group commit on PostgreSQL: the concurrent write units of one process share transactions.

The leader/absorb scheme of :mod:`fermix.storage.committer` (the shared
:class:`~fermix.storage.leaders.GroupCommit`), on one psycopg connection per process
(autocommit mode, transactions opened and ended here):

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
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq

from fermix.storage.leaders import GroupCommit, Unit
from fermix.storage.pg.connection import Conn
from fermix.storage.pg.session import PgWrites
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.errors.TransactionRollback,  # 40001 serialization failure, 40P01 deadlock
    psycopg.OperationalError,  # connection lost, admin shutdown, too many connections
)
Work = Callable[[PgWrites], Any]


class PgCommitter(GroupCommit):
    """The group commit on PostgreSQL: one write connection, opened again if it breaks."""

    transient = TRANSIENT_ERRORS
    driver_error = psycopg.Error

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
        super().__init__(retry=retry, max_batch=max_batch)

    def _close_connection(self) -> None:
        self._conn.close()

    def _connection(self) -> Conn:
        """The write connection, opened again if it broke (the server restarted)."""
        if self._conn.closed or self._conn.broken:
            self._conn.close()
            self._conn = self._connect()
            self._session = PgWrites(self._conn)
        return self._conn

    def _commit(self, batch: list[Unit]) -> None:
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
                batch[0].fail(exc, psycopg.Error)
            else:
                self._commit_isolated(batch)
            return
        except BaseException:
            self._rollback()
            raise
        for unit in batch:
            unit.ok = True

    def _commit_isolated(self, batch: list[Unit]) -> None:
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
                unit.fail(value, psycopg.Error)

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
