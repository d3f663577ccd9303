"""SQLite's schema migrations, read from ``fermix/storage/sqlite/schema.sql`` (S2), run by
:class:`fermix.storage.migrations.Runner`: each in a write transaction (``BEGIN
IMMEDIATE``: one process at a time), the version kept in ``PRAGMA user_version``.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from typing import Final

import apsw

from fermix.errors import StorageError
from fermix.storage.migrations import Migration, Runner, parse, record
from fermix.storage.retry import retrying
from fermix.storage.sqlite.connection import (
    TRANSIENT_ERRORS,
    apply_settings,
    fetch_value,
    raw_connect,
    transaction,
)
from fermix.storage.sqlite.sql import SqliteSql


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this fermix, in order."""
    text = (
        resources.files("fermix.storage.sqlite").joinpath("schema.sql").read_text(encoding="utf-8")
    )
    return parse(text, "schema.sql")


def current_version(conn: apsw.Connection) -> int:
    """The schema version recorded in the database file (0 for a new file)."""
    return int(fetch_value(conn, "PRAGMA user_version"))


def _apply(conn: apsw.Connection, migration: Migration) -> None:
    for _ in conn.execute(migration.sql):
        pass
    record(SqliteSql(conn), migration)
    conn.execute(f"PRAGMA user_version = {migration.version}")


# ``migrations`` is looked up at each call, so a stand-in for it ships fewer migrations.
_RUNNER: Final = Runner(
    lambda: migrations(), version=current_version, unit=transaction, apply=_apply
)
latest_version = _RUNNER.latest_version
check_version = _RUNNER.check_version
pending = _RUNNER.pending
pending_count = _RUNNER.pending_count
migrate = _RUNNER.migrate


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
