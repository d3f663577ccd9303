"""Numbered PostgreSQL migrations read from ``fermix/storage/pg/schema.sql``.

Each block runs in its own transaction together with its row in ``schema_migrations``,
after a transaction-level advisory lock (:data:`MIGRATION_LOCK`): several services starting
at once on one database migrate it once; the others wait for the lock, then find the
version recorded and skip the block. DDL is transactional in PostgreSQL, so a crash leaves
the database before or after a migration, never halfway. A database newer than this fermix
is refused untouched (:class:`~fermix.errors.SchemaTooNewError`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from functools import cache
from importlib import resources

from fermix.errors import SchemaTooNewError, StorageError
from fermix.storage.postgres.connection import Conn

MIGRATION_LOCK = 8210815
"""The advisory lock key every fermix service takes to migrate (one constant)."""

_HEADER = re.compile(r"^-- migration (\d+): (.+)$", re.MULTILINE)
_RECORDS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version bigint PRIMARY KEY, name text NOT NULL, applied_at bigint NOT NULL)"
)


@dataclass(frozen=True)
class Migration:
    """One numbered block of the PostgreSQL schema."""

    version: int
    name: str
    sql: str


@cache
def migrations() -> tuple[Migration, ...]:
    """Every PostgreSQL migration shipped with this fermix, in order."""
    text = resources.files("fermix.storage.postgres").joinpath("schema.sql").read_text("utf-8")
    heads = list(_HEADER.finditer(text))
    found = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        found.append(Migration(int(head.group(1)), head.group(2).strip(), text[head.end() : end]))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise StorageError(f"pg/schema.sql migrations are not numbered 1..N: {versions}")
    return tuple(found)


def latest_version() -> int:
    """The PostgreSQL schema version this fermix writes."""
    return migrations()[-1].version


def current_version(conn: Conn) -> int:
    """The version recorded in the database (0 for an empty one); reads only."""
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    found = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(found[0]) if found is not None else 0


def check_version(conn: Conn) -> None:
    """Raise :class:`SchemaTooNewError` if the database is newer than this code (reads only)."""
    found = current_version(conn)
    if found > latest_version():
        raise SchemaTooNewError(
            f"database schema version {found} is newer than this fermix supports "
            f"({latest_version()}); upgrade fermix. The database was not modified."
        )


def pending(conn: Conn) -> list[Migration]:
    """Migrations not yet applied."""
    version = current_version(conn)
    return [m for m in migrations() if m.version > version]


def migrate(conn: Conn) -> list[int]:
    """Apply every pending migration, each in its own transaction under the advisory lock;
    return the versions this call ran. ``conn`` must be in autocommit mode."""
    check_version(conn)
    applied = []
    for migration in pending(conn):
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(_RECORDS)
            # Read again under the lock: another service may have migrated meanwhile.
            check_version(conn)
            if current_version(conn) >= migration.version:
                continue
            conn.execute(migration.sql.encode("utf-8"))
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                (migration.version, migration.name, int(time.time() * 1000)),
            )
        applied.append(migration.version)
    return applied
