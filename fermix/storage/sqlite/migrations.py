"""Numbered schema migrations read from ``fermix/schema.sql`` (S2).

Each block runs in its own transaction together with its record, so a crash leaves the
database either before or after a migration, never halfway. Applying them again changes
nothing; a database whose version is newer than this code knows is refused untouched.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from functools import cache
from importlib import resources

import apsw

from fermix.errors import SchemaTooNewError, StorageError
from fermix.storage.retry import retrying
from fermix.storage.sqlite.connection import (
    TRANSIENT_ERRORS,
    apply_settings,
    fetch_value,
    raw_connect,
    transaction,
)

_HEADER = re.compile(r"^-- migration (\d+): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    """One numbered block of schema.sql."""

    version: int
    name: str
    sql: str


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this fermix, in order."""
    text = (
        resources.files("fermix.storage.sqlite").joinpath("schema.sql").read_text(encoding="utf-8")
    )
    heads = list(_HEADER.finditer(text))
    found = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        found.append(Migration(int(head.group(1)), head.group(2).strip(), text[head.end() : end]))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise StorageError(f"schema.sql migrations are not numbered 1..N: {versions}")
    return tuple(found)


def latest_version() -> int:
    """The schema version this fermix writes."""
    return migrations()[-1].version


def current_version(conn: apsw.Connection) -> int:
    """The schema version recorded in the database file (0 for a new file)."""
    return int(fetch_value(conn, "PRAGMA user_version"))


def check_version(conn: apsw.Connection) -> None:
    """Raise :class:`SchemaTooNewError` if the database is newer than this code (reads only)."""
    found = current_version(conn)
    if found > latest_version():
        raise SchemaTooNewError(
            f"database schema version {found} is newer than this fermix supports "
            f"({latest_version()}); upgrade fermix. The database was not modified."
        )


def pending(conn: apsw.Connection) -> list[Migration]:
    """Migrations not yet applied to ``conn``."""
    version = current_version(conn)
    return [m for m in migrations() if m.version > version]


def migrate(conn: apsw.Connection) -> list[int]:
    """Apply every pending migration, each in its own transaction; return the versions run."""
    check_version(conn)
    applied = []
    for migration in pending(conn):
        with transaction(conn):
            # Re-read inside the write lock: another process may have migrated meanwhile.
            if current_version(conn) >= migration.version:
                continue
            for _ in conn.execute(migration.sql):
                pass
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, int(time.time() * 1000)),
            )
            conn.execute(f"PRAGMA user_version = {migration.version}")
        applied.append(migration.version)
    return applied


def open_database(path: str | os.PathLike[str], *, vfs: str | None = None) -> apsw.Connection:
    """Open ``path``, refuse it if it is newer than this fermix, then apply migrations.

    A missing file is created owner-only (0600, M10) by :func:`raw_connect` first.
    """
    conn = raw_connect(path, vfs=vfs)
    try:
        # A fault that can pass (another process's lock, a disk hiccup) is retried: each
        # step is idempotent, and a migration commits whole or not at all (S2).
        for attempt in retrying(transient=TRANSIENT_ERRORS):
            with attempt:
                check_version(conn)
                apply_settings(conn)
                migrate(conn)
    except apsw.Error as exc:
        conn.close()
        raise StorageError(f"cannot open {path} as a fermix database: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn
