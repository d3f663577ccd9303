"""What every PostgreSQL table-family module shares: the connection type and two fetches.

Parameters are ``%s`` placeholders bound by psycopg (server-side binding, statements
prepared after a few uses); rows are plain tuples, as on SQLite.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import psycopg
from psycopg.rows import TupleRow

from fermix.errors import InvalidInputError

Conn: TypeAlias = psycopg.Connection[TupleRow]
"""A psycopg connection returning tuples (the adapter's only kind)."""


def fetch_rows(conn: Conn, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[TupleRow]:
    """Every row ``sql`` returns. A value PostgreSQL text cannot hold (NUL) is an
    :class:`InvalidInputError`, as a value that is not valid Unicode is on SQLite."""
    try:
        return conn.execute(sql, params).fetchall()
    except psycopg.DataError as exc:
        raise _input_error(exc) from None


def fetch_value(conn: Conn, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
    """The first column of the first row ``sql`` returns (None when it returns no row)."""
    rows = fetch_rows(conn, sql, params)
    return rows[0][0] if rows else None


def execute(conn: Conn, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> int:
    """Run one statement; return how many rows it changed (SQLite's ``changes()``)."""
    try:
        return conn.execute(sql, params).rowcount
    except psycopg.DataError as exc:
        raise _input_error(exc) from None


def _input_error(exc: psycopg.DataError) -> Exception:
    if "NUL" in str(exc):
        return InvalidInputError("a value holds a NUL character, which PostgreSQL text cannot")
    return exc
