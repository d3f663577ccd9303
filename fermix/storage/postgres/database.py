"""``PgDatabase``: one process's way into a PostgreSQL database, the port of
:class:`fermix.storage.Database`.

Reads run on a ``psycopg_pool`` pool of autocommit connections (each statement sees every
commit made before it, as a SQLite read outside a transaction does); writes run through the
process's group commit (:class:`~fermix.storage.postgres.committer.PgCommitter`) on a connection
of its own. Opening migrates the database (:mod:`fermix.storage.postgres.migrations`), once
whichever of several services starting together gets there first.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from fermix.errors import StorageError
from fermix.storage.database import GroupCommitted, unknowing
from fermix.storage.leaders import CommitObserver, CommitStats
from fermix.storage.passwords import scrubbed
from fermix.storage.port import Inspection, Purge, Writes
from fermix.storage.postgres import health, purging
from fermix.storage.postgres.committer import PgCommitter
from fermix.storage.postgres.connection import Conn
from fermix.storage.postgres.migrations import check_version, migrate
from fermix.storage.postgres.session import PgReads
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy

T = TypeVar("T")


def connect(url: str) -> Conn:
    """A connection in autocommit mode (transactions are opened explicitly)."""
    return psycopg.connect(url, autocommit=True)


class PgDatabase(GroupCommitted):
    """A PostgreSQL database shared by any number of fermix processes (issue 15)."""

    _committer: PgCommitter | None

    def __init__(
        self,
        url: str,
        *,
        readers: int = 4,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_batch: int = 512,
    ) -> None:
        self.url = url
        self.name = describe(url)
        try:
            conn = connect(url)
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {self.name}: {scrubbed(url, exc)}") from exc
        try:
            migrate(conn)
            health.enable_amcheck(conn)
        except psycopg.Error as exc:
            raise StorageError(f"cannot migrate {self.name}: {scrubbed(url, exc)}") from exc
        finally:
            conn.close()
        self._committer = PgCommitter(lambda: connect(url), retry=retry, max_batch=max_batch)
        self._retry = retry
        self._aside: PgCommitter | None = None
        """The committer of :meth:`write_aside`, on a connection of its own (made on first use)."""
        self._aside_lock = threading.Lock()
        self._observer: CommitObserver | None = None
        self._readers: ConnectionPool[Conn] = ConnectionPool(
            url,
            min_size=1,
            max_size=readers,
            kwargs={"autocommit": True},
            name="fermix-reads",
            open=True,
        )

    @classmethod
    def inspect(cls, url: str) -> PgDatabase:
        """Open the database ``url`` names to look at it (``fermix doctor``), never to change it.

        Nothing is migrated or created (``r.schema_version()`` and ``r.pending_migrations()``
        say where it stands); every read connection is read-only
        (``default_transaction_read_only``), and :meth:`write` refuses. A schema newer than
        this fermix is a :class:`~fermix.errors.SchemaTooNewError`; a server that cannot be
        reached, or a database that cannot be read, a :class:`~fermix.errors.StorageError`
        naming the database without its password.
        """
        name = describe(url)
        try:
            conn = connect(url)
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {name}: {scrubbed(url, exc)}") from exc
        try:
            _read_only(conn)
            check_version(conn)
        except psycopg.Error as exc:
            raise StorageError(f"cannot read {name}: {scrubbed(url, exc)}") from exc
        finally:
            conn.close()
        db = cls.__new__(cls)
        db.url = url
        db.name = name
        db._committer = None
        db._aside = None
        db._aside_lock = threading.Lock()
        db._observer = None
        db._readers = ConnectionPool(
            url,
            min_size=1,
            max_size=1,
            kwargs={"autocommit": True},
            configure=_read_only,
            name="fermix-inspect",
            open=True,
        )
        return db

    @property
    def key(self) -> str:
        """The URL without its password: one key per database in every process."""
        return redacted(self.url)

    @property
    def shared(self) -> bool:
        """Always: services on other machines may write the same database."""
        return True

    def purge(self, *, since_ms: int | None = None) -> Purge:
        """Vacuum the dead tuples erasures left (F3; :mod:`~fermix.storage.postgres.purging`)."""
        if self._committer is None:
            raise StorageError(f"{self.name} is open for inspection only: purge refused")
        url = self.url
        return purging.purge(lambda: connect(url))  # no copy beside the tables: since_ms unused

    @property
    def writes_aside(self) -> bool:
        """:meth:`write_aside` commits on a connection of its own."""
        return True

    def write_aside(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """Run ``unit`` in a transaction of its own, on a connection beside the group
        commit's: the appends queued there do not wait for it, as they would not for another
        service's unit. Its locks are taken as every unit's are (rows in a fixed order), so
        it waits only for the rows it shares with them; a deadlock or serialization failure
        is retried as the group commit's are."""
        self._writer(label)  # refused when opened for inspection
        with self._aside_lock:
            if self._aside is None:
                url = self.url
                self._aside = PgCommitter(lambda: connect(url), retry=self._retry, max_batch=1)
                self._aside.observer = self._observer
            aside = self._aside
        return aside.run(unknowing(unit), label=label)

    def observe(self, observer: CommitObserver) -> None:
        """Tell ``observer`` of the retries and failures of the group commit and of the
        aside committer (O1)."""
        super().observe(observer)
        with self._aside_lock:
            self._observer = observer
            if self._aside is not None:
                self._aside.observer = observer

    def commit_stats(self) -> CommitStats:
        """What the group commit and the aside committer (the erasures' steps) did so far,
        counted together, and the writes queued behind them (O1)."""
        stats = super().commit_stats()
        aside = self._aside
        return stats if aside is None else stats.plus(aside.stats())

    def close(self) -> None:
        """Finish the queued writes (the aside committer's first), then close every
        connection."""
        try:
            with self._aside_lock:
                aside, self._aside = self._aside, None
            if aside is not None:
                aside.close()
        finally:
            super().close()

    def read(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[PgReads]:
        """A read unit: the block's reads run on one pooled connection. A database error is
        a :class:`~fermix.errors.StorageError` naming the database."""
        return self._session(timeout)

    def inspection(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[Inspection]:
        """A read unit for ``fermix doctor``: the session offers the health checks too."""
        return self._session(timeout)

    @contextlib.contextmanager
    def _session(self, timeout: float) -> Iterator[PgReads]:
        """A read unit: the block's reads run on one pooled connection. A database error is
        a :class:`~fermix.errors.StorageError` naming the database."""
        try:
            connection = self._readers.connection(timeout)
            conn = connection.__enter__()
        except PoolTimeout:
            raise StorageError(f"no read connection free after {timeout} s") from None
        try:
            yield PgReads(conn)
        except psycopg.Error as exc:
            connection.__exit__(type(exc), exc, exc.__traceback__)
            raise StorageError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except BaseException as exc:
            connection.__exit__(type(exc), exc, exc.__traceback__)
            raise
        connection.__exit__(None, None, None)


def redacted(url: str) -> str:
    """``url`` without its password (a registry key that may be logged)."""
    try:
        params: dict[str, Any] = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql:?"
    params.pop("password", None)
    return "postgresql:" + " ".join(f"{k}={params[k]}" for k in sorted(params))


def describe(url: str) -> str:
    """The database ``url`` names, without its password (for messages and logs)."""
    try:
        params: dict[str, Any] = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "a PostgreSQL database"
    host = params.get("host", "")
    return f"PostgreSQL database {params.get('dbname', '?')!r}" + (f" on {host}" if host else "")


def _read_only(conn: Conn) -> None:
    """Make every transaction of ``conn`` read-only (an inspecting connection)."""
    conn.execute("SET default_transaction_read_only = on")
