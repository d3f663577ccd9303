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
from collections.abc import Iterator
from pathlib import Path

import apsw

from fermix.errors import StorageError
from fermix.storage.database import GroupCommitted
from fermix.storage.port import Inspection, Purge, Reads
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy
from fermix.storage.sqlite import health, purging
from fermix.storage.sqlite.committer import Committer
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.pool import ReaderPool
from fermix.storage.sqlite.session import SqliteReads, SqliteWrites


class Database(GroupCommitted):
    """The database of one home, opened (and migrated) once per process."""

    _readers: ReaderPool

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
            conn, retry=retry, session=self._writes, on_reset=self._writes.drop_known
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

    @property
    def shared(self) -> bool:
        """A SQLite file is this machine's alone."""
        return False

    @property
    def writes_aside(self) -> bool:
        """One writer at a time: :meth:`write_aside` is :meth:`write`."""
        return False

    def purge(self, *, since_ms: int | None = None) -> Purge:
        """Checkpoint the log and truncate it, then look at Litestream's local files (F3;
        :mod:`~fermix.storage.sqlite.purging`)."""
        if self._committer is None:
            raise StorageError(f"{self.name} is open for inspection only: purge refused")
        return purging.purge(self.path, vfs=self.vfs, since_ms=since_ms)

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
