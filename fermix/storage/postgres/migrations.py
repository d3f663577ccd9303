"""PostgreSQL's schema migrations, read from ``fermix/storage/postgres/schema.sql``, run by
:class:`fermix.storage.migrations.Runner`.

Each block runs in its own transaction after a transaction-level advisory lock
(:data:`MIGRATION_LOCK`): several services starting at once on one database migrate it
once; the others wait for the lock, then find the version recorded and skip the block. DDL
is transactional in PostgreSQL, so a crash leaves the database before or after a migration,
never halfway. The version is the newest row of ``schema_migrations`` (``migrate`` takes a
connection in autocommit mode).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Final

from fermix.storage.migrations import Migration, Runner, parse, record
from fermix.storage.postgres.connection import Conn
from fermix.storage.postgres.sql import PgSql

MIGRATION_LOCK = 8210815
"""The advisory lock key every fermix service takes to migrate (one constant)."""

_RECORDS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version bigint PRIMARY KEY, name text NOT NULL, applied_at bigint NOT NULL)"
)


@cache
def migrations() -> tuple[Migration, ...]:
    """Every PostgreSQL migration shipped with this fermix, in order."""
    text = resources.files("fermix.storage.postgres").joinpath("schema.sql").read_text("utf-8")
    return parse(text, "postgres/schema.sql")


def current_version(conn: Conn) -> int:
    """The version recorded in the database (0 for an empty one); reads only."""
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    found = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(found[0]) if found is not None else 0


@contextmanager
def _locked(conn: Conn) -> Iterator[None]:
    """A transaction under :data:`MIGRATION_LOCK`, with the table that records versions."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(_RECORDS)
        yield


def _apply(conn: Conn, migration: Migration) -> None:
    conn.execute(migration.sql.encode("utf-8"))
    record(PgSql(conn), migration)


# ``migrations`` is looked up at each call, so a stand-in for it ships fewer migrations.
_RUNNER: Final = Runner(lambda: migrations(), version=current_version, unit=_locked, apply=_apply)
latest_version = _RUNNER.latest_version
check_version = _RUNNER.check_version
pending = _RUNNER.pending
pending_count = _RUNNER.pending_count
migrate = _RUNNER.migrate
