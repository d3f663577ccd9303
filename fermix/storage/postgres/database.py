"""``PgDatabase``: one process's way into a PostgreSQL database, the port of
:class:`fermix.storage.Database`.

Reads run on a ``psycopg_pool`` pool of autocommit connections (each statement sees every
commit made before it, as a SQLite read outside a transaction does); writes run through the
process's group commits (:class:`~fermix.storage.postgres.committer.PgCommitter`), each on a
connection of its own: appends on their conversation's lane (:meth:`PgDatabase.append`,
:data:`WRITERS` lanes by default), every other write on the first, an erasure's steps aside
(:meth:`PgDatabase.write_aside`). Opening migrates the database
(:mod:`fermix.storage.postgres.migrations`), once whichever of several services starting
together gets there first.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from fermix.errors import StorageError
from fermix.model import ConversationKey
from fermix.storage.appending import AppendUnit
from fermix.storage.database import GroupCommitted, unknowing
from fermix.storage.leaders import CommitObserver, CommitStats, GroupCommit
from fermix.storage.passwords import scrubbed
from fermix.storage.port import Inspection, Purge, Writes
from fermix.storage.postgres import health, purging
from fermix.storage.postgres.committer import PgCommitter, stemmed
from fermix.storage.postgres.connection import Conn
from fermix.storage.postgres.migrations import check_version, migrate
from fermix.storage.postgres.session import PgReads
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy

T = TypeVar("T")

WRITERS = 2
"""Group commits the appends of one process run on, side by side (:meth:`PgDatabase.append`)."""


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
        writers: int = WRITERS,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_batch: int = 512,
    ) -> None:
        if writers < 1:
            raise ValueError(f"writers must be at least 1, not {writers}")
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
        self._max_batch = max_batch
        self._lanes: list[PgCommitter | None] = [self._committer] + [None] * (writers - 1)
        """The appends' group commits (:meth:`append`), each on a connection of its own; the
        first is the group commit every other write goes through, the others are made on
        first use."""
        self._aside: PgCommitter | None = None
        """The committer of :meth:`write_aside`, on a connection of its own (made on first use)."""
        self._making = threading.Lock()
        """Held to make the aside committer or a lane, and to set ``_closing``."""
        self._closing = False
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
        db._lanes = [None]
        db._aside = None
        db._closing = False
        db._making = threading.Lock()
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
        with self._making:
            if self._closing:
                raise StorageError("the database writer is closed")
            if self._aside is None:
                self._aside = self._opened_committer(1)
            aside = self._aside
        return aside.run(unknowing(unit), label=label)

    def append(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write` for an append, on its conversation's lane: one of ``writers`` group
        commits, each on a connection of its own (issue 25).

        One group commit runs its batches one after another, each statement waiting for
        the one before and each batch for its ``COMMIT``'s fsync; the server's backends
        would run them side by side, and PostgreSQL already lets one WAL flush carry the
        commits of all the backends waiting for it. So a process's appends are spread over
        lanes by conversation (always the same lane for one conversation: its appends queue
        behind each other, and a batch finds its rows free), as the appends of that many
        services would be: what keeps two batches of two services from deadlocking (the
        committer's module) keeps two lanes from it. A conversation's appends stay in call
        order as before: :class:`~fermix.runtime.writer.Writer` holds the conversation's
        order lock until its append commits. Every other write, and the appends of
        :meth:`append_each`, go through the first lane."""
        return self._lane(unit, label).run(stemmed(unit), label=label)

    def append_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """:meth:`append` of each of ``units``, in order, sharing commits, on the first lane
        (one caller, one thread: the memory server's batch of concurrent requests)."""
        return self._writer("writes").run_many([(stemmed(unit), label) for unit, label in units])

    def _lane(self, unit: Callable[[Writes], T], label: str) -> GroupCommit:
        """The group commit of ``unit``: its conversation's lane for an append, the first
        lane for any other unit (made on first use)."""
        first = self._writer(label)
        lanes = self._lanes
        if len(lanes) == 1 or not isinstance(unit, AppendUnit):
            return first
        index = self.lane_of(unit.new.key)
        lane = lanes[index]
        if lane is None:
            with self._making:
                if self._closing:
                    raise StorageError("the database writer is closed")
                lane = lanes[index]
                if lane is None:
                    lane = lanes[index] = self._opened_committer(self._max_batch)
        return lane

    def lane_of(self, key: ConversationKey) -> int:
        """The lane the appends of ``key`` go to (0 to ``writers`` - 1), in this process."""
        return hash(key) % len(self._lanes)

    def _opened_committer(self, max_batch: int) -> PgCommitter:
        """A group commit on a new connection, told what the first is told (O1)."""
        url = self.url
        committer = PgCommitter(lambda: connect(url), retry=self._retry, max_batch=max_batch)
        committer.observer = self._observer
        return committer

    def _committers(self) -> list[PgCommitter]:
        """The group commits made so far: the lanes, then the aside committer."""
        made = [lane for lane in self._lanes if lane is not None]
        return made if self._aside is None else [*made, self._aside]

    @property
    def commits(self) -> int:
        """Write transactions committed so far, on every lane and aside."""
        return sum(committer.batches for committer in self._committers())

    def observe(self, observer: CommitObserver) -> None:
        """Tell ``observer`` of the retries and failures of every group commit: the lanes
        and the aside committer (O1)."""
        with self._making:
            self._observer = observer
            for committer in self._committers():
                committer.observer = observer

    def commit_stats(self) -> CommitStats:
        """What the lanes and the aside committer (the erasures' steps) did so far, counted
        together, and the writes queued behind them (O1)."""
        stats = super().commit_stats()
        for committer in self._committers()[1:]:
            stats = stats.plus(committer.stats())
        return stats

    def close(self) -> None:
        """Finish the queued writes (the aside committer's and the other lanes' first), then
        close every connection."""
        try:
            with self._making:
                self._closing = True
                others = self._committers()[1:]  # the first closes last, below
                self._aside = None
            for committer in others:
                committer.close()
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
