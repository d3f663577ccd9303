"""The shared statements' :class:`~fermix.storage.sql.Sql` on a psycopg connection."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, ClassVar, Final

from psycopg import pq

from fermix.storage.postgres import memories
from fermix.storage.postgres.connection import Conn, execute, fetch_rows, send
from fermix.storage.sql import Dialect, Params, SearchColumns

POSTGRES: Final = Dialect(
    name="postgresql",
    binary_order=' COLLATE "C"',
    json_items="jsonb_array_elements_text(?::jsonb) AS j(value)",
    # memory rows and prompt-file resources
    for_update=" FOR UPDATE",
    # a hash collision only makes two pairs wait for each other
    owner_lock="SELECT pg_advisory_xact_lock(hashtextextended(? || chr(31) || ?, 0))",
    memory_search=SearchColumns(("stems", "stem_count"), ("?::tsvector", "?"), memories.document),
    # an owner id holds no control character: chr(31) names no owner
    retire_counters=(
        "UPDATE memory_versions SET owner_id = chr(31) || 'erasure ' || ?::text,"
        " version = nextval('memory_version_seq')"
        " WHERE owner_id = ? AND (?::text IS NULL OR agent_id = ?)"
    ),
    # conversations
    skip_locked=" FOR UPDATE SKIP LOCKED",
)


@functools.lru_cache(maxsize=1024)
def marked(sql: str) -> str:
    """``sql`` with psycopg's marks: ``?`` becomes ``%s`` and a literal ``%`` ``%%``.

    Shared statements hold no ``?`` but their marks (no JSON ``?`` operator, no ``?`` in a
    string literal), which is what makes this replacement exact."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgSql:
    """``conn`` for the shared statements, their marks made psycopg's."""

    __slots__ = ("_conn",)
    dialect: ClassVar[Dialect] = POSTGRES

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return fetch_rows(self._conn, marked(sql), list(params))

    def value(self, sql: str, params: Params = ()) -> Any:
        rows = fetch_rows(self._conn, marked(sql), list(params))
        return rows[0][0] if rows else None

    def run(self, sql: str, params: Params = ()) -> int:
        return execute(self._conn, marked(sql), list(params))

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """A ``REPEATABLE READ READ ONLY`` transaction outside a transaction; inside a write
        unit the unit's own transaction (READ COMMITTED: each statement sees the commits
        made before it, as the unit's other reads do)."""
        conn = self._conn
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            yield
            return
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def send(self, sql: str, params: Params = ()) -> None:
        send(self._conn, marked(sql), list(params))
