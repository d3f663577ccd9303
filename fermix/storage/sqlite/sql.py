"""The shared statements' :class:`~fermix.storage.sql.Sql` on an apsw connection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar, Final

import apsw

from fermix.storage.sql import Dialect, Params, SearchColumns
from fermix.storage.sqlite.connection import invalid_input

SQLITE: Final = Dialect(
    name="sqlite",
    binary_order="",
    json_items="json_each(?)",
    # memory rows and prompt-file resources
    for_update="",
    owner_lock="",
    memory_search=SearchColumns(),
    retire_counters="",
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
        try:
            return self._conn.execute(sql, params).fetchall()
        except (UnicodeEncodeError, OverflowError) as exc:
            raise invalid_input(exc) from None

    def value(self, sql: str, params: Params = ()) -> Any:
        try:
            row = self._conn.execute(sql, params).fetchone()
        except (UnicodeEncodeError, OverflowError) as exc:
            raise invalid_input(exc) from None
        return None if row is None else row[0]

    def run(self, sql: str, params: Params = ()) -> int:
        self.send(sql, params)
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
        # apsw runs a statement that returns no row within execute(): nothing to fetch (the
        # append's touch goes this way, so it pays no list and no copy of its parameters)
        try:
            self._conn.execute(sql, params)
        except (UnicodeEncodeError, OverflowError) as exc:
            raise invalid_input(exc) from None
