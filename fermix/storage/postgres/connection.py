"""What every PostgreSQL table-family module shares: the connection type, the ways to run
a statement, and the pipeline of a write batch.

Parameters are ``%s`` placeholders bound by psycopg (server-side binding, statements
prepared after a few uses); rows are plain tuples, as on SQLite.

**Pipelined writes.** The group commit runs a batch with a :func:`remote` server in
:func:`pipeline` (psycopg's pipeline mode): a statement whose result nobody reads
(:func:`send`: ``BEGIN``, a conversation's touch) goes out with the next one that is read,
so an append (``BEGIN``, touch, insert, ``COMMIT``) costs two round trips instead of four.
Every read (:func:`fetch_rows`, :func:`execute`) ends with a sync, so within a batch it
behaves as outside one: an error of a statement sent before it is raised by it, the
transaction status is exact afterwards (a read that only flushed would leave libpq
reporting the status of the last sync, *idle*, inside the batch's transaction), and a
statement after a caught error runs. Outside a pipeline (reads, migrations, a server on
this machine) every function runs its statement at once.

Why only a remote server: pipeline mode costs psycopg about 25 us more client work per
append than the two round trips it saves over a Unix socket or the loopback, where a round
trip takes about 16 us (measured here, 2 cores); a round trip over a network (100 us and
more) costs far more than that work.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg.rows import TupleRow

from fermix.errors import InvalidInputError

Conn: TypeAlias = psycopg.Connection[TupleRow]
"""A psycopg connection returning tuples (the adapter's only kind)."""
Params: TypeAlias = tuple[Any, ...] | list[Any]

_pipelines: weakref.WeakKeyDictionary[Conn, psycopg.Pipeline] = weakref.WeakKeyDictionary()
"""The open :func:`pipeline` of each connection in one (the write connection, during a batch)."""
_prepared: weakref.WeakKeyDictionary[Conn, set[str]] = weakref.WeakKeyDictionary()
"""The statements :func:`execute_prepared` prepared on each connection, by name."""


def remote(conn: Conn) -> bool:
    """Whether ``conn`` reaches its server over a network: not a Unix socket (no address)
    nor the loopback."""
    address = conn.info.hostaddr
    return bool(address) and not ipaddress.ip_address(address).is_loopback


@contextlib.contextmanager
def pipeline(conn: Conn) -> Iterator[None]:
    """Run the block's statements in pipeline mode (see the module's docstring); at its end
    every statement sent has been answered. Without pipeline support in the client's libpq
    (before 14) the block runs each statement at once."""
    if not psycopg.Pipeline.is_supported():
        yield
        return
    with conn.pipeline() as open_pipeline:
        _pipelines[conn] = open_pipeline
        try:
            yield
        finally:
            del _pipelines[conn]


def pipelined(conn: Conn) -> bool:
    """Whether ``conn`` is in a :func:`pipeline`: a statement sent before may not have run."""
    return conn in _pipelines


def send(conn: Conn, sql: str, params: Params = ()) -> None:
    """Run one statement whose result is not read. In a :func:`pipeline` it goes out with
    the next statement read, and its error (a constraint, a lock timeout) is raised there
    or by :func:`settle`; otherwise at once."""
    try:
        with _drained_on_error(conn):
            conn.execute(sql, params)
    except psycopg.DataError as exc:
        raise _input_error(exc) from None


def settle(conn: Conn) -> None:
    """Wait until every statement sent on ``conn`` has run (a round trip only when one is
    still unanswered); raise the first one's error."""
    open_pipeline = _pipelines.get(conn)
    if open_pipeline is not None and conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
        open_pipeline.sync()


@contextlib.contextmanager
def _drained_on_error(conn: Conn) -> Iterator[None]:
    """In a :func:`pipeline`, a statement's error can reach the client while a later one is
    being sent (a lock timeout taking longer than the thread took to send the next), and
    is raised there; the later ones were aborted with it, and their results, still to be
    read, would make the pipeline's end raise ``PipelineAborted`` instead of the error
    the caller handles (a lock timeout defers a unit). So their results are read now."""
    try:
        yield
    except psycopg.Error:
        open_pipeline = _pipelines.get(conn)
        if open_pipeline is not None:
            with contextlib.suppress(psycopg.errors.PipelineAborted):
                open_pipeline.sync()
        raise


def _run(conn: Conn, sql: str, params: Params) -> psycopg.Cursor[TupleRow]:
    """Run ``sql`` and wait for its result (and the results of those sent before it)."""
    try:
        with _drained_on_error(conn):
            cursor = conn.execute(sql, params)
        open_pipeline = _pipelines.get(conn)
        if open_pipeline is not None:
            open_pipeline.sync()
    except psycopg.DataError as exc:
        raise _input_error(exc) from None
    return cursor


def fetch_rows(conn: Conn, sql: str, params: Params = ()) -> list[TupleRow]:
    """Every row ``sql`` returns. A value PostgreSQL text cannot hold (NUL) is an
    :class:`InvalidInputError`, as a value that is not valid Unicode is on SQLite."""
    return _run(conn, sql, params).fetchall()


def fetch_value(conn: Conn, sql: str, params: Params = ()) -> Any:
    """The first column of the first row ``sql`` returns (None when it returns no row)."""
    rows = fetch_rows(conn, sql, params)
    return rows[0][0] if rows else None


def execute(conn: Conn, sql: str, params: Params = ()) -> int:
    """Run one statement; return how many rows it changed (SQLite's ``changes()``). When
    the count does not matter, :func:`send` saves the round trip in a pipeline."""
    return _run(conn, sql, params).rowcount


def script(conn: Conn, statements: Sequence[str]) -> list[list[TupleRow]]:
    """Run ``statements`` (SQL without parameters: values quoted by :func:`literal`) as one
    simple query, in one round trip; the rows each returned (none for a statement without
    rows). The first that fails ends the query and is raised; those after it do not run.
    Not in a :func:`pipeline`, which sends no simple query."""
    try:
        cursor = conn.execute("; ".join(statements))  # no parameters: a simple query
    except psycopg.DataError as exc:
        raise _input_error(exc) from None
    results = []
    while True:
        results.append(cursor.fetchall() if cursor.description is not None else [])
        if not cursor.nextset():
            return results


def forget_prepared(conn: Conn) -> None:
    """Forget what :func:`execute_prepared` prepared on ``conn``, which then looks again
    (psycopg sends ``DEALLOCATE ALL`` after a ``ROLLBACK`` or DDL on a connection where it
    prepared statements of its own, and not otherwise)."""
    _prepared.pop(conn, None)


def literal(conn: Conn, value: str) -> str:
    """``value`` as an SQL string literal, quoted by libpq for ``conn``'s server."""
    return bytes(pq.Escaping(conn.pgconn).escape_literal(value.encode())).decode()


def execute_prepared(conn: Conn, name: str, sql: str, param: str) -> str:
    """The statement ``EXECUTE name(param)`` for a :func:`script`, ``sql`` (with one ``%s``)
    prepared as ``name`` on ``conn`` first unless it was: planned once per connection, as
    psycopg prepares a statement it runs often, where a simple query plans each time. To
    be called with no transaction open (a ``PREPARE`` outlives any, and its name must not
    be taken by a rolled-back one). A statement the server no longer has fails with
    ``InvalidSqlStatementName``: then :func:`forget_prepared`, and call again."""
    names = _prepared.setdefault(conn, set())
    if name not in names:
        found = conn.execute("SELECT 1 FROM pg_prepared_statements WHERE name = %s", (name,))
        if found.fetchone() is None:
            conn.execute(f"PREPARE {name} AS {sql.replace('%s', '$1')}".encode())
        names.add(name)
    return f"EXECUTE {name}({literal(conn, param)})"


def rows_param(rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` as one JSON array of arrays, for a statement that reads them with
    ``jsonb_array_elements``. A text PostgreSQL cannot hold (a NUL) fails the statement,
    as it would in its own column; a lone surrogate cannot be sent, as in any parameter."""
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


def _input_error(exc: psycopg.DataError) -> Exception:
    if "NUL" in str(exc):
        return InvalidInputError("a value holds a NUL character, which PostgreSQL text cannot")
    return exc
