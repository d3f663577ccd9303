"""Opening the database: one small named function per connection setting (S8).

WAL lets readers run beside the one writer; the busy timeout lets several processes (a
host, the CLI) share the file; foreign keys hold references; ``synchronous=NORMAL`` is
durable across process crashes in WAL mode (a power cut may lose the last commits, never
corrupt the file).

The database file is created here, owner-only (0600) whatever the umask, before SQLite
opens it (M10): SQLite would create it 0644 minus the umask, and it gives the ``-wal`` and
``-shm`` files it creates later the database file's own permission bits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw

from fermix.errors import InvalidInputError, StorageError
from fermix.home import create_private_file, make_private_dir

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    apsw.BusyError,
    apsw.LockedError,
    apsw.IOError,
    apsw.FullError,
)
"""Errors that can pass: another writer holds the lock, the disk hiccupped or was full for a
moment (a checkpoint or another program frees space). Anything else is not retried."""

BUSY_TIMEOUT_MS = 5_000
SYNCHRONOUS = "NORMAL"
MMAP_BYTES = 1 << 30
"""How much of the database file SQLite reads through a memory map (address space, not
memory: the mapped pages are the operating system's own cache)."""


def set_wal(conn: apsw.Connection) -> None:
    """Put the database in write-ahead-log mode (persistent, so a no-op after the first)."""
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
    if str(mode).lower() != "wal":
        raise StorageError(f"could not switch the database to WAL mode (got {mode!r})")


def set_busy_timeout(conn: apsw.Connection, ms: int = BUSY_TIMEOUT_MS) -> None:
    """Wait up to ``ms`` for another connection's lock instead of failing at once."""
    conn.set_busy_timeout(ms)


def set_foreign_keys(conn: apsw.Connection) -> None:
    """Enforce REFERENCES clauses (off by default in SQLite)."""
    conn.execute("PRAGMA foreign_keys = ON")


def set_synchronous(conn: apsw.Connection, level: str = SYNCHRONOUS) -> None:
    """Set how often SQLite fsyncs; NORMAL is safe against process crashes under WAL."""
    conn.execute(f"PRAGMA synchronous = {level}")


def set_secure_delete(conn: apsw.Connection) -> None:
    """Overwrite deleted content with zeros, in the database file and its log (F3): a
    deleted row's text leaves the file with its cell, not when its page is reused."""
    conn.execute("PRAGMA secure_delete = ON")


def set_mmap(conn: apsw.Connection, size: int = MMAP_BYTES) -> None:
    """Read the first ``size`` bytes of the file through a memory map.

    A search reads a few hundred pages scattered over the file (an owner's messages, their
    vectors, the words' doclists); mapped, SQLite reads them in place instead of copying
    each into its page cache: bench/recall.py's owner search at 1,000,000 messages spends
    about 0.7 ms less CPU in SQLite (of 4.5 ms there). Writes still go through the file.
    The database is a local file (the home directory, M10): an I/O error on a mapped page
    would be a signal rather than an error, which SQLite's documentation names as the
    cost, on a network file system more than on a local disk."""
    conn.execute(f"PRAGMA mmap_size = {int(size)}").fetchall()


def refuse_double_quoted_strings(conn: apsw.Connection) -> None:
    """Make ``"text"`` an identifier only, never a string literal (catches typos early)."""
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)


def connect(path: str | os.PathLike[str], *, vfs: str | None = None) -> apsw.Connection:
    """Open ``path`` with every setting applied, without touching the schema."""
    conn = raw_connect(path, vfs=vfs)
    apply_settings(conn)
    return conn


def raw_connect(path: str | os.PathLike[str], *, vfs: str | None = None) -> apsw.Connection:
    """Open ``path`` with only the busy timeout set: the version check reads before it writes.

    A missing database file (and its folder) is created owner-only first (M10).
    """
    create_database_file(path)
    flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    try:
        if vfs is None:
            conn = apsw.Connection(str(path), flags=flags)
        else:
            conn = apsw.Connection(str(path), flags=flags, vfs=vfs)
    except apsw.Error as exc:
        raise StorageError(f"cannot open database {path}: {exc}") from exc
    # Even the first read (of the schema version) may meet another process's lock.
    set_busy_timeout(conn)
    return conn


def create_database_file(path: str | os.PathLike[str]) -> bool:
    """Create the database file ``path`` empty and 0600 (its folder 0700) unless it exists.

    SQLite takes an empty file for a new database. Its ``-wal`` and ``-shm`` files get this
    file's permission bits, so they are owner-only too (M10). Returns whether it was made.
    """
    if os.fspath(path) in ("", ":memory:"):
        return False
    try:
        make_private_dir(Path(path).parent)
        return create_private_file(path)
    except OSError as exc:
        raise StorageError(f"cannot create database {path}: {exc}") from exc


def apply_settings(conn: apsw.Connection) -> None:
    """Apply every connection setting, in a fixed order."""
    refuse_double_quoted_strings(conn)
    set_wal(conn)
    set_foreign_keys(conn)
    set_synchronous(conn)
    set_secure_delete(conn)
    set_mmap(conn)


@contextlib.contextmanager
def transaction(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """Run the block as one write transaction, taking the write lock up front.

    ``BEGIN IMMEDIATE`` waits (up to the busy timeout) for other writers instead of
    failing later when a read would have to upgrade to a write. On any error the
    transaction is rolled back and the original error propagates unchanged.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def fetch_value(conn: apsw.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row ``sql`` returns (None when it returns no row)."""
    rows = fetch_rows(conn, sql, params)
    return rows[0][0] if rows else None


def fetch_rows(
    conn: apsw.Connection, sql: str, params: tuple[Any, ...] | list[Any] = ()
) -> list[tuple[Any, ...]]:
    """Every row ``sql`` returns, as plain tuples.

    A parameter that is not valid Unicode (a lone surrogate from a terminal or a model) is
    an :class:`InvalidInputError`, not an encoding crash.
    """
    try:
        return [tuple(row) for row in conn.execute(sql, params)]
    except (UnicodeEncodeError, OverflowError) as exc:
        raise invalid_input(exc) from None


def invalid_input(error: UnicodeEncodeError | OverflowError) -> InvalidInputError:
    """The typed error of a parameter SQLite cannot take: text that is not valid Unicode (a
    lone surrogate from a terminal or a model), or an integer past 64 bits."""
    if isinstance(error, UnicodeEncodeError):
        return InvalidInputError(f"a value is not valid Unicode text ({error.reason})")
    return InvalidInputError("a number is too large for SQLite (64-bit integers)")
