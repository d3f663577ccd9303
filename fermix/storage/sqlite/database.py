"""``Database``: one process's way into ``memory.db`` (S1, S8).

Reads run on a small pool of read connections beside the writer (WAL); writes run through
the process's one group-commit writer (:class:`~fermix.storage.sqlite.committer.Committer`). Both
hand the caller a session (:mod:`fermix.storage.sqlite.session`), never a connection.
:meth:`Database.inspect` opens a file only to look at it (``fermix doctor``): not created,
not migrated, never written.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import apsw

from fermix.errors import StorageError
from fermix.storage.port import Inspection, Reads, Repair, Storage, Writes
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy
from fermix.storage.sqlite import health
from fermix.storage.sqlite.committer import Committer
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.pool import ReaderPool
from fermix.storage.sqlite.session import SqliteReads, SqliteWrites

T = TypeVar("T")
W = TypeVar("W", bound=Writes)


class Database(Storage):
    """The database of one home, opened (and migrated) once per process."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        vfs: str | None = None,
        readers: int = 4,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.vfs = vfs
        conn = open_database(path, vfs=vfs)
        # One session for every unit of the write connection: its operations are bound once,
        # and it keeps what this process wrote of the conversation rows (touch_known).
        self._writes = SqliteWrites(conn)
        self._committer: Committer | None = Committer(
            conn, retry=retry, session=self._writes, on_reset=self._writes.forget
        )
        self._readers = ReaderPool(path, size=readers, vfs=vfs)

    @classmethod
    def inspect(cls, path: str | os.PathLike[str], *, vfs: str | None = None) -> Database:
        """Open an existing ``memory.db`` to look at it (``fermix doctor``), never to change it.

        The file is not created and not migrated (``r.schema_version()`` and
        ``r.pending_migrations()`` say where it stands), and :meth:`write` refuses. A schema
        newer than this fermix is a :class:`~fermix.errors.SchemaTooNewError`, a file that
        is not a readable database a :class:`~fermix.errors.StorageError`; both leave the
        file as it was. A database error inside a read unit is a ``StorageError`` too.
        """
        health.open_to_inspect(path, vfs=vfs)
        db = cls.__new__(cls)
        db.path = Path(path)
        db.name = db.path.name
        db.vfs = vfs
        db._committer = None
        db._readers = ReaderPool(path, size=1, vfs=vfs)
        return db

    @property
    def key(self) -> str:
        """The file's absolute path: one key per file in every process."""
        return os.path.abspath(self.path)

    @contextlib.contextmanager
    def read(self, timeout: float = 30.0) -> Iterator[Reads]:
        """A read unit: the block's reads run on one pooled read connection.

        A database error (busy past the timeout, I/O, corruption) is a
        :class:`~fermix.errors.StorageError` naming the file, never a driver's own error.
        """
        with self._readers.connection(timeout) as conn:
            try:
                yield SqliteReads(conn)
            except apsw.Error as exc:
                raise StorageError(f"{self.path.name}: {type(exc).__name__}: {exc}") from exc

    def write(self, unit: Callable[[Writes], T], *, label: str = "write") -> T:
        """Run ``unit`` in a write transaction; return its result once committed.

        Concurrent units share commits. A unit's own error reaches only its caller and
        leaves nothing of that unit; a database error is a
        :class:`~fermix.errors.WriteFailedError` after the writer's retries.
        """
        if self._committer is None:
            raise StorageError(f"{self.path.name} is open for inspection only: {label} refused")
        return self._committer.run(_forgetting(unit), label=label)

    def append(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write` for a unit that changes no conversation's owner or trust but through
        :meth:`Writes.touch_known` (an append): what this process knows of those stays."""
        if self._committer is None:
            raise StorageError(f"{self.path.name} is open for inspection only: {label} refused")
        return self._committer.run(unit, label=label)

    def write_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """Run each ``(unit, label)`` as :meth:`write` would, in order, sharing commits;
        return each outcome, ``(True, result)`` or ``(False, error)``, once committed.

        One caller, many independent writes: a server batching its concurrent requests.
        """
        if self._committer is None:
            raise StorageError(f"{self.path.name} is open for inspection only: writes refused")
        return self._committer.run_many([(_forgetting(unit), label) for unit, label in units])

    def append_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """:meth:`write_each` for appends, as :meth:`append` is :meth:`write` for one."""
        if self._committer is None:
            raise StorageError(f"{self.path.name} is open for inspection only: writes refused")
        return self._committer.run_many(list(units))

    @property
    def shared(self) -> bool:
        """A SQLite file is this machine's alone."""
        return False

    def inspection(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[Inspection]:
        """A read unit for ``fermix doctor``: the session offers the health checks too."""
        return self._read_as_inspection(timeout)

    @contextlib.contextmanager
    def _read_as_inspection(self, timeout: float) -> Iterator[Inspection]:
        with self._readers.connection(timeout) as conn:
            try:
                yield SqliteReads(conn)
            except apsw.Error as exc:
                raise StorageError(f"{self.path.name}: {type(exc).__name__}: {exc}") from exc

    def repair(self, unit: Callable[[Repair], T], *, label: str = "repair") -> T:
        """:meth:`write` for ``fermix doctor --fix``: the unit may rebuild an FTS mirror."""
        if self._committer is None:
            raise StorageError(f"{self.path.name} is open for inspection only: {label} refused")
        return self._committer.run(_forgetting(unit), label=label)

    @property
    def commits(self) -> int:
        """Write transactions committed so far (for benchmarks and tests)."""
        return 0 if self._committer is None else self._committer.batches

    def close(self) -> None:
        """Finish the queued writes, then close every connection."""
        try:
            if self._committer is not None:
                self._committer.close()
        finally:
            self._readers.close()


def _forgetting(unit: Callable[[W], T]) -> Callable[[W], T]:
    """``unit``, first making its session forget the conversation rows it knows: any unit
    but an append may change an owner or a trust."""

    def run(writes: W) -> T:
        writes.forget()
        return unit(writes)

    return run
