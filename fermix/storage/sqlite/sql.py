"""The shared statements' :class:`~fermix.storage.sql.Sql` on an apsw connection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar, Final

import apsw

from fermix.storage.sql import Dialect, Params, SearchColumns
from fermix.storage.sqlite.connection import fetch_rows

SQLITE: Final = Dialect(
    name="sqlite",
    binary_order="",
    json_items="json_each(?)",
    # memory rows and prompt-file resources
    for_update="",
    owner_lock="",
    memory_search=SearchColumns(),
    # conversations
    skip_locked="",
)


class SqliteSql:
    """``conn`` for the shared statements: their ``?`` marks are SQLite's own."""

    __slots__ = ("_conn",)
    dialect: ClassVar[Dialect] = SQLITE

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return fetch_rows(self._conn, sql, tuple(params))

    def value(self, sql: str, params: Params = ()) -> Any:
        rows = fetch_rows(self._conn, sql, tuple(params))
        return rows[0][0] if rows else None

    def run(self, sql: str, params: Params = ()) -> int:
        fetch_rows(self._conn, sql, tuple(params))
        return int(self._conn.changes())

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        # A savepoint is a read transaction outside a write, and nests inside one.
        self._conn.execute("SAVEPOINT snapshot")
        try:
            yield
        finally:
            self._conn.execute("RELEASE snapshot")

    def send(self, sql: str, params: Params = ()) -> None:
        fetch_rows(self._conn, sql, tuple(params))
