"""Group commit: every write of a process goes through one connection, batched (A1, S8).

Callers hand a unit of work (a function of the connection) to :meth:`Committer.run` and get
its result only after the transaction holding it has committed. A caller that finds no
leader becomes the leader: it takes every unit queued so far, runs them in one
``BEGIN IMMEDIATE`` transaction (each in its own savepoint, so one unit's error rolls back
only that unit) and commits once for all of them, then goes on while others keep queueing
(a few rounds past its own unit) before it hands the lead on. The others wait on a
condition, wake when a batch is done, and return their result. Under concurrency many
appends share one commit; alone, a caller pays one transaction and no thread hop.

A transient failure of the batch (busy, locked, I/O, disk full: see
:mod:`fermix.storage.retry`) is retried with tenacity: 3 attempts, short jittered waits,
re-raising nothing silently. After the last attempt every unit of the batch fails with
:class:`WriteFailedError`, and nothing of it was committed. Every database error reaches a
caller as a :class:`WriteFailedError` (H3), a unit's own one (a constraint) included.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import apsw
import tenacity

from fermix.errors import StorageError, WriteFailedError
from fermix.storage.retry import DEFAULT_RETRY, TRANSIENT_ERRORS, RetryPolicy, retrying

__all__ = ["TRANSIENT_ERRORS", "Committer", "RetryPolicy"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[apsw.Connection], Any]

MAX_EXTRA_ROUNDS = 4
"""Batches a leader commits for others after its own, before it hands the lead on."""


class Committer:
    """Runs units of write work on one connection, batching concurrent callers into one commit."""

    def __init__(
        self,
        conn: apsw.Connection,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_batch: int = 512,
    ) -> None:
        self._conn = conn
        self._retry = retry
        self._max_batch = max_batch
        self._queue: deque[tuple[Work, Future[Any], str]] = deque()
        # One condition guards the queue and who leads; followers wait on it, not on a
        # write lock, so a finished batch wakes them together instead of one by one.
        self._changed = threading.Condition(threading.Lock())
        self._leading = False
        self._closed = False
        self.batches = 0
        """Transactions committed, for benchmarks and tests."""

    def run(self, work: Callable[[apsw.Connection], T], *, label: str = "write") -> T:
        """Run ``work(conn)`` in a write transaction; return its result once committed.

        ``label`` names the write in logs (e.g. the conversation key of an append).
        """
        future: Future[Any] = Future()
        with self._changed:
            if self._closed:
                raise StorageError("the database writer is closed")
            self._queue.append((work, future, label))
            while not future.done() and self._leading:
                self._changed.wait()
            if future.done():
                result: T = future.result()
                return result
            self._leading = True
        self._lead_until_done(future)
        result = future.result()
        return result

    def _lead_until_done(self, own: Future[Any]) -> None:
        """Commit batches until this caller's unit is done and, for a few more rounds,
        while others keep queueing; then hand the lead to a waiting caller."""
        extra_rounds = MAX_EXTRA_ROUNDS
        try:
            while True:
                batch = self._take_batch()
                if batch:
                    self._lead(batch)
                with self._changed:
                    self._changed.notify_all()
                    if not self._queue or (own.done() and extra_rounds <= 0):
                        return
                if own.done():
                    extra_rounds -= 1
        finally:
            with self._changed:
                self._leading = False
                self._changed.notify_all()

    def close(self) -> None:
        """Refuse new work, wait for the batch in flight, and close the connection."""
        with self._changed:
            self._closed = True
            while self._leading:
                self._changed.wait()
            self._leading = True
        try:
            while batch := self._take_batch():
                self._lead(batch)
        finally:
            with self._changed:
                self._leading = False
                self._changed.notify_all()
            self._conn.close()

    def _take_batch(self) -> list[tuple[Work, Future[Any], str]]:
        with self._changed:
            batch: list[tuple[Work, Future[Any], str]] = []
            while self._queue and len(batch) < self._max_batch:
                batch.append(self._queue.popleft())
            return batch

    def _lead(self, batch: list[tuple[Work, Future[Any], str]]) -> None:
        try:
            try:
                outcomes = self._commit(batch)
            except TRANSIENT_ERRORS as first:
                # The common path pays nothing for retries; only a failed batch enters them.
                log.warning("write failed (%s), retrying: %s", _labels(batch), first)
                outcomes = self._retrying()(self._commit, batch)
        except TRANSIENT_ERRORS as exc:
            log.error(
                "write failed after %d attempts, nothing kept (%s): %s",
                self._retry.attempts,
                _labels(batch),
                exc,
            )
            for _, future, label in batch:
                future.set_exception(
                    WriteFailedError(
                        f"{label}: not written after {self._retry.attempts} attempts: {exc}"
                    )
                )
            return
        except apsw.Error as exc:
            # Persistent database errors (disk full, corruption) reach every caller, typed.
            log.error("write failed, nothing kept (%s): %s", _labels(batch), exc)
            for _, future, label in batch:
                future.set_exception(WriteFailedError(f"{label}: not written: {exc}"))
            return
        except BaseException as exc:
            for _, future, _label in batch:
                future.set_exception(exc)
            raise
        self.batches += 1
        for (_, future, label), (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                future.set_result(value)
            elif isinstance(value, apsw.Error):
                # A unit's own database error (a constraint it broke) is still a database
                # error: its caller gets it typed (H3), with the apsw error as the cause.
                error = WriteFailedError(f"{label}: not written: {value}")
                error.__cause__ = value
                future.set_exception(error)
            else:
                future.set_exception(value)

    def _retrying(self) -> tenacity.Retrying:
        """The retries after a first failed attempt: ``attempts - 1`` more, jittered."""
        return retrying(self._retry, attempts=self._retry.attempts - 1)

    def _commit(self, batch: list[tuple[Work, Future[Any], str]]) -> list[tuple[bool, Any]]:
        """Commit the batch in one transaction; each unit's own error goes to its caller.

        Units run first without savepoints (two statements fewer per unit). If one raises,
        the transaction is rolled back and the batch runs again with a savepoint per unit,
        so only the failing unit is left out. Transient errors propagate for a retry.
        """
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            outcomes = [(True, work(conn)) for work, _, _ in batch]
            conn.execute("COMMIT")
        except TRANSIENT_ERRORS:
            self._rollback()
            raise
        except Exception as exc:  # noqa: BLE001 - a unit failed: isolate it, or hand it back
            self._rollback()
            if len(batch) == 1:
                return [(False, exc)]
            return self._commit_isolated(batch)
        except BaseException:
            self._rollback()
            raise
        return outcomes

    def _commit_isolated(
        self, batch: list[tuple[Work, Future[Any], str]]
    ) -> list[tuple[bool, Any]]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            outcomes = [self._unit(conn, work) for work, _, _ in batch]
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return outcomes

    def _unit(self, conn: apsw.Connection, work: Work) -> tuple[bool, Any]:
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


def _labels(batch: list[tuple[Work, Future[Any], str]]) -> str:
    labels = sorted({label for _, _, label in batch})
    shown = ", ".join(labels[:5])
    return shown + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
