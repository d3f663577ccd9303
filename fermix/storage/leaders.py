"""The leaders of a group commit: concurrent callers' writes share one transaction (A1, S8).

Backend-independent: the queue, who leads, absorbing, waking and handing the connection on.
:class:`GroupCommit` is subclassed once per database (:class:`fermix.storage.sqlite.committer.
Committer` for SQLite, :class:`fermix.storage.postgres.committer.PgCommitter` for PostgreSQL),
which say how one attempt at a batch runs (:meth:`GroupCommit._commit`), which of their
driver's errors may pass (``transient``) and which are the driver's (``driver_error``), and
how the connection closes. The protocol itself is described in
:mod:`fermix.storage.sqlite.committer`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import tenacity

from fermix.errors import StorageError, WriteFailedError
from fermix.storage.affinity import WriterCpu
from fermix.storage.retry import RetryPolicy, retrying

log = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[Any], Any]
"""A unit: a function of the connection, or of the session the committer was given."""


SIZE_SLOTS = 10
"""Batch sizes are counted in slots of powers of two: slot ``i`` holds the batches of at
most ``2 ** i`` writes (1, 2, 4, ... 512), the slot past them every larger one."""


@dataclass(frozen=True)
class CommitStats:
    """What a group commit did so far (O1): read at a scrape, counted by the leader alone."""

    commits: int
    """Transactions committed."""
    units: int
    """Writes those transactions committed."""
    sizes: tuple[int, ...]
    """Transactions per slot of batch size (see :data:`SIZE_SLOTS`)."""
    queued: int
    """Writes waiting behind the batch that runs now."""

    def plus(self, other: CommitStats) -> CommitStats:
        """These and ``other``'s counts together: two committers of one database."""
        return CommitStats(
            self.commits + other.commits,
            self.units + other.units,
            tuple(a + b for a, b in zip(self.sizes, other.sizes, strict=True)),
            self.queued + other.queued,
        )


class CommitObserver(Protocol):
    """What a group commit tells of its failures, for the runtime's metrics (O1): the
    composition root passes one in (:meth:`fermix.storage.port.Storage.observe`), so that
    storage imports nothing of them. Committed batches are not told: the committer counts
    them itself (:class:`CommitStats`), at no cost to a commit but an addition."""

    def retried(self) -> None:
        """A batch failed with an error that can pass and is being tried again."""
        ...

    def failed(self, units: int) -> None:
        """A batch of ``units`` writes failed for good (after the retries, or persistently)."""
        ...


class Unit:
    """One call of :meth:`GroupCommit.run`: its work and, once committed, its outcome."""

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

    def fail(self, error: BaseException, driver_error: type[BaseException]) -> None:
        """Give the unit its error: a database error (a ``driver_error``) typed (H3), with
        the driver's own as its cause."""
        self.ok = False
        if isinstance(error, driver_error):
            typed = WriteFailedError(f"{self.label}: not written: {error}")
            typed.__cause__ = error
            error = typed
        self.value = error

    def outcome(self) -> Any:
        """The unit's result, or its error raised."""
        if self.ok:
            return self.value
        raise self.value


class GroupCommit:
    """Runs units of write work on one connection, batching concurrent callers into one
    commit; a subclass runs the transactions (see the module's docstring)."""

    transient: ClassVar[tuple[type[BaseException], ...]]
    """The driver's errors a retry of the whole batch may get past."""
    driver_error: ClassVar[type[BaseException]]
    """The driver's base error: a unit's is typed as :class:`WriteFailedError`."""

    def __init__(self, *, retry: RetryPolicy, max_batch: int, cpu: WriterCpu | None = None) -> None:
        self._retry = retry
        self._max_batch = max_batch
        self._cpu = WriterCpu(None) if cpu is None else cpu
        """Where a contended caller's thread runs while in :meth:`run` (see
        :mod:`fermix.storage.affinity`)."""
        self._mutex = threading.Lock()
        # Everything below is guarded by _mutex, except the connection itself, which only
        # its holder touches.
        self._queue: deque[Unit] = deque()
        self._held = False
        """A caller holds the connection (the leader)."""
        self._contended = False
        """A caller queued since the last batch that committed alone."""
        self._closed = False
        self._released = threading.Condition(self._mutex)
        """Notified when the connection is let go while closing (close() waits on it)."""
        self.batches = 0
        """Transactions committed, for benchmarks and tests."""
        self.observer: CommitObserver | None = None
        """Told of retries and failures (O1); None: no one is."""
        self._units = 0
        self._sizes = [0] * (SIZE_SLOTS + 1)
        # batches, _units and _sizes change only in the leader's thread, which holds the
        # connection alone: no lock; a scrape reads them as they are.

    def stats(self) -> CommitStats:
        """The commits so far, their writes and sizes, and the writes queued now (O1)."""
        return CommitStats(self.batches, self._units, tuple(self._sizes), len(self._queue))

    def run(self, work: Callable[[Any], T], *, label: str = "write") -> T:
        """Run ``work(conn)`` in a write transaction; return its result once committed.

        ``label`` names the write in logs and errors (e.g. the conversation of an append).
        Raises what ``work`` raised, :class:`WriteFailedError` for a database error, or
        :class:`StorageError` once the committer is closed.
        """
        with self._mutex:
            if self._closed:
                raise StorageError("the database writer is closed")
            unit = Unit(work, label, queued=self._held)
            if unit.lead:
                self._held = True
            else:
                self._queue.append(unit)
                self._contended = True
            contended = self._contended
        own = self._cpu.narrow() if contended else None
        try:
            if not unit.lead:
                self._await(unit)
                if not unit.lead:
                    return unit.outcome()  # type: ignore[no-any-return]
            return self._lead(unit)  # type: ignore[no-any-return]
        finally:
            if own is not None:
                self._cpu.restore(own)

    def run_many(self, works: list[tuple[Work, str]]) -> list[tuple[bool, Any]]:
        """Run each ``(work, label)`` as its own unit, in order; return each one's outcome
        once committed, ``(True, result)`` or ``(False, error)``, never raising for a unit.

        For a caller holding many independent writes at once (the server's appends of
        concurrent requests): they share commits as concurrent callers' units do, with one
        wake-up of this caller instead of one thread per unit. A unit that fails is left
        out alone, as in :meth:`run`.
        """
        units: list[Unit] = []
        with self._mutex:
            if self._closed:
                raise StorageError("the database writer is closed")
            for work, label in works:
                unit = Unit(work, label, queued=self._held)
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
        self._close_connection()

    def _await(self, unit: Unit) -> None:
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

    def _lead(self, unit: Unit, *, outcome: bool = True) -> Any:
        """Holding the connection: commit ``unit`` and the units queued meanwhile, wake
        their callers, hand the connection on; return ``unit``'s outcome."""
        batch = [unit]
        try:
            self._commit_batch(batch)
        finally:
            with self._mutex:
                if self._queue:
                    successor: Unit | None = self._queue.popleft()
                    successor.lead = True  # type: ignore[union-attr]
                else:
                    successor = None
                    self._held = False
                    if len(batch) == 1:
                        self._contended = False
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

    def _absorb(self, batch: list[Unit]) -> bool:
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

    def _commit_batch(self, batch: list[Unit]) -> None:
        """Commit ``batch`` in one transaction, retrying transient errors; set outcomes."""
        observer = self.observer
        try:
            try:
                self._commit(batch)
            except self.transient as first:
                # The common path pays nothing for retries; only a failed batch enters them.
                if self._retry.attempts <= 1:
                    raise
                log.warning("write failed (%s), retrying: %s", labels(batch), first)
                if observer is not None:
                    observer.retried()
                self._retrying()(self._commit, batch)
        except self.transient as exc:
            log.error(
                "write failed after %d attempts, nothing kept (%s): %s",
                self._retry.attempts,
                labels(batch),
                exc,
            )
            for unit in batch:
                unit.ok = False
                unit.value = WriteFailedError(
                    f"{unit.label}: not written after {self._retry.attempts} attempts: {exc}"
                )
            if observer is not None:
                observer.failed(len(batch))
            return
        except self.driver_error as exc:
            # Persistent database errors (corruption, a read-only file) reach every caller.
            log.error("write failed, nothing kept (%s): %s", labels(batch), exc)
            for unit in batch:
                unit.ok = False
                unit.value = WriteFailedError(f"{unit.label}: not written: {exc}")
            if observer is not None:
                observer.failed(len(batch))
            return
        except BaseException as exc:
            for unit in batch:
                unit.ok = False
                unit.value = exc
            raise
        self.batches += 1
        units = len(batch)
        self._units += units
        self._sizes[min((units - 1).bit_length(), SIZE_SLOTS)] += 1

    def _hand_out(self, batch: list[Unit], outcomes: list[tuple[bool, Any]]) -> None:
        """After the commit, give each unit of ``batch`` its outcome: its result, or its own
        error (a driver's typed as :class:`WriteFailedError`)."""
        for unit, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                unit.succeed(value)
            else:
                unit.fail(value, self.driver_error)

    def _retrying(self) -> tenacity.Retrying:
        """The retries after a first failed attempt: ``attempts - 1`` more, jittered."""
        return retrying(self._retry, attempts=self._retry.attempts - 1, transient=self.transient)

    def _commit(self, batch: list[Unit]) -> None:
        """One attempt at ``batch``: each unit's outcome set once it committed, or once its
        own error is final; errors in ``transient`` propagate for a retry of all of it."""
        raise NotImplementedError

    def _close_connection(self) -> None:
        """Close the connection (and what serves it), once no caller holds it."""
        raise NotImplementedError


def labels(batch: list[Unit]) -> str:
    labels = sorted({unit.label for unit in batch})
    shown = ", ".join(labels[:5])
    return shown + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
