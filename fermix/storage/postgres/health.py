"""What ``fermix doctor`` asks of a PostgreSQL database: the operations of
:mod:`fermix.storage.sqlite.health` (S1, S2, S4, S5), with what they mean here.

- Schema: the versions recorded in ``schema_migrations``
(:mod:`fermix.storage.postgres.migrations`).
- Integrity: PostgreSQL checks its own pages; what is left is an index that disagrees with
  its table. With the ``amcheck`` extension installed (:func:`enable_amcheck`, tried where
  the database is opened to write, never to inspect), :func:`integrity_problems` runs
  ``bt_index_check`` over every B-tree index of fermix's tables (``heapallindexed`` too
  with ``full``: every row must be in each index). Without it there is nothing to run and
  no problem to report.
- Search: there is no mirror table, each row holds its own ``stems`` (the SQLite FTS5
  tokenizer's, :mod:`fermix.storage.postgres.stems`), computed by its writer. A writer other
  than fermix can store wrong ones; :func:`fts_problem` recomputes a sample of rows'
  stems (every row with ``full``) and compares, and :func:`rebuild_fts` recomputes them in
  batches of :data:`BATCH_ROWS`. The mirror names of SQLite stay the names asked for
  (``messages_fts`` means the stems of ``messages``), so the doctor's checks run as they are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import psycopg
import psycopg.errors
from psycopg import sql

from fermix.errors import InvalidInputError
from fermix.model import ConversationKey
from fermix.storage.integrity import FTS_MIRRORS, FTS_TABLES, MAX_PROBLEMS
from fermix.storage.postgres import memories, messages, migrations
from fermix.storage.postgres.connection import Conn, execute, fetch_rows, fetch_value

log = logging.getLogger(__name__)

BATCH_ROWS: Final = 1_000
"""Rows whose stems are recomputed per statement (a check's comparison, a rebuild's update)."""
SAMPLE_ROWS: Final = 500
"""A quick check's rows of each kind: the newest, and as many spread over the table."""


# -- integrity -----------------------------------------------------------------------


def integrity_check_name(conn: Conn, *, full: bool) -> str:
    """The name of the check :func:`integrity_problems` runs, for people."""
    return "amcheck (where installed)"


def enable_amcheck(conn: Conn) -> bool:
    """Install ``amcheck`` if this server ships it and the role may create it; return
    whether it is installed. A write: called where the database is opened to migrate.

    ``conn`` is in autocommit mode. A role that may not create it (amcheck is not a
    trusted extension: a superuser's to create) is not made to try.
    """
    rows = fetch_rows(
        conn,
        "SELECT e.installed_version IS NOT NULL,"
        " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
        " OR (v.trusted AND has_database_privilege(current_database(), 'CREATE'))"
        " FROM pg_available_extensions AS e JOIN pg_available_extension_versions AS v"
        " ON v.name = e.name AND v.version = e.default_version WHERE e.name = 'amcheck'",
    )
    if not rows:
        return False  # this server does not ship it
    installed, may_create = rows[0]
    if installed or not may_create:
        return bool(installed)
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    except (
        psycopg.errors.InsufficientPrivilege,
        psycopg.errors.UniqueViolation,  # another service created it at the same moment
        psycopg.errors.DuplicateObject,
        psycopg.errors.UndefinedFile,
    ) as exc:
        log.info("amcheck not installed, integrity checks skipped: %s", exc)
        return False
    return True


def integrity_problems(conn: Conn, *, full: bool = False) -> list[str]:
    """What ``amcheck`` finds wrong with the B-tree indexes of fermix's tables (empty when
    nothing, and when ``amcheck`` is not installed or not this role's to run).

    ``full`` checks that every row is in each index (``heapallindexed``), otherwise only
    each index's own structure and order. At most :data:`MAX_PROBLEMS` are listed.
    """
    rows = fetch_rows(
        conn,
        "SELECT n.nspname, has_function_privilege("
        " format('%%I.bt_index_check(regclass, boolean)', n.nspname), 'EXECUTE')"
        " FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'amcheck'",
    )
    if not rows or not rows[0][1]:
        return []
    check = sql.SQL("SELECT {}.bt_index_check(%s::regclass, %s)").format(sql.Identifier(rows[0][0]))
    indexes = fetch_rows(
        conn,
        "SELECT i.indexrelid::regclass::text FROM pg_index AS i"
        " JOIN pg_class AS t ON t.oid = i.indrelid"
        " JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_am AS a ON a.oid = c.relam"
        " WHERE t.relnamespace = current_schema()::regnamespace AND a.amname = 'btree'"
        " AND t.relname = ANY(%s) ORDER BY 1",
        (list(_fermix_tables()),),
    )
    problems = []
    for (index,) in indexes:
        try:
            with conn.transaction():  # a savepoint inside a write unit
                conn.execute(check, (index, full))
        except (psycopg.InternalError, psycopg.errors.DataCorrupted) as exc:
            problems.append(f"index {index}: {exc.diag.message_primary or exc}")
            if len(problems) >= MAX_PROBLEMS:
                break
    return problems


def _fermix_tables() -> tuple[str, ...]:
    """The tables fermix's migrations create, and ``schema_migrations``."""
    made = re.compile(r"^CREATE TABLE (\w+)", re.MULTILINE | re.IGNORECASE)
    found = {"schema_migrations"}
    for migration in migrations.migrations():
        found.update(made.findall(migration.sql))
    return tuple(sorted(found))


# -- search stems --------------------------------------------------------------------


@dataclass(frozen=True)
class _Stemmed:
    """A table whose rows hold their own stems, and how to compute them from a row."""

    table: str
    columns: str
    """The columns the stems are made of, after ``id``."""
    stored: tuple[tuple[str, str], ...]
    """The columns computed from them, and each one's SQL type."""
    compute: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    """The values of ``stored`` for a row of ``columns`` (a ``tsvector`` as its literal)."""

    def joined(self) -> str:
        """``unnest(...) AS e(id, ...)``: the recomputed values of a batch of rows."""
        arrays = ", ".join(f"%s::{'text' if t == 'tsvector' else t}[]" for _, t in self.stored)
        names = ", ".join(name for name, _ in self.stored)
        return f"unnest(%s::bigint[], {arrays}) AS e(id, {names})"

    def differs(self) -> str:
        """True for a row of ``t`` whose stored values are not the recomputed ``e``."""
        mine = ", ".join(f"t.{name}" for name, _ in self.stored)
        theirs = ", ".join(f"e.{name}::{t}" for name, t in self.stored)
        return f"ROW({mine}) IS DISTINCT FROM ROW({theirs})"

    def assignments(self) -> str:
        """``SET`` clauses storing the recomputed ``e`` into the row."""
        return ", ".join(f"{name} = e.{name}::{t}" for name, t in self.stored)


def _message_stems(row: tuple[Any, ...]) -> tuple[str]:
    content, agent_id, owner_id, channel, chat_id, thread_scope = row
    return (
        messages.document(
            content, ConversationKey(agent_id, channel, chat_id, thread_scope), owner_id
        ),
    )


_STEMMED: Final = {
    "messages": _Stemmed(
        "messages",
        "content, agent_id, owner_id, channel, chat_id, thread_scope",
        (("stems", "tsvector"),),
        _message_stems,
    ),
    "memories": _Stemmed(
        "memories",
        "key, value",
        (("stems", "tsvector"), ("stem_count", "integer")),
        lambda row: memories.document(row[0], row[1]),
    ),
}


def fts_problem(
    conn: Conn, table: str, *, full: bool = False, structure_checked: bool = False
) -> str | None:
    """Why the stems held by FTS mirror ``table``'s content table disagree with its text,
    or None when they agree (and when that table does not exist yet).

    Quick: the :data:`SAMPLE_ROWS` newest rows and as many spread over the table (pages
    sampled at random). Full: every row. ``structure_checked`` changes nothing here: a
    ``tsvector`` has no structure of its own to damage apart from its row.
    """
    spec = _spec(conn, table)
    if spec is None:
        return None
    checked = drifted = 0
    first: int | None = None
    for rows in _every_row(conn, spec) if full else _sample(conn, spec):
        checked += len(rows)
        ids = _drifted(conn, spec, rows)
        drifted += len(ids)
        if ids and first is None:
            first = ids[0]
    if not drifted:
        return None
    how = "of all" if full else "sampled from"
    return (
        f"{drifted} of {checked} row(s) {how} {spec.table} hold stems that differ from their"
        f" text (id {first}...)"
    )


def rebuild_fts(conn: Conn, table: str) -> None:
    """Recompute the stems of FTS mirror ``table``'s content table, :data:`BATCH_ROWS` rows
    a statement, writing only the rows whose stems differ (caller's transaction)."""
    spec = _spec(conn, table)
    if spec is None:
        return
    update = (
        f"UPDATE {spec.table} AS t SET {spec.assignments()} FROM {spec.joined()}"
        f" WHERE t.id = e.id AND {spec.differs()}"
    )
    for rows in _every_row(conn, spec):
        execute(conn, update, _recomputed(spec, rows))


def _spec(conn: Conn, table: str) -> _Stemmed | None:
    """The stemmed content table of FTS mirror ``table``; None while it does not exist."""
    if table not in FTS_MIRRORS:
        raise InvalidInputError(f"not an FTS mirror: {table!r} (one of {FTS_TABLES})")
    content = FTS_MIRRORS[table]
    if fetch_value(conn, "SELECT to_regclass(%s) IS NOT NULL", (content,)) is not True:
        return None
    return _STEMMED[content]


def _every_row(conn: Conn, spec: _Stemmed) -> Iterator[list[tuple[Any, ...]]]:
    """Every row of ``spec.table`` (``id`` and the stems' columns), in id order, in batches."""
    select = f"SELECT id, {spec.columns} FROM {spec.table}"
    rows = fetch_rows(conn, f"{select} ORDER BY id LIMIT %s", (BATCH_ROWS,))
    while rows:
        yield rows
        if len(rows) < BATCH_ROWS:
            return
        rows = fetch_rows(
            conn, f"{select} WHERE id > %s ORDER BY id LIMIT %s", (rows[-1][0], BATCH_ROWS)
        )


def _sample(conn: Conn, spec: _Stemmed) -> Iterator[list[tuple[Any, ...]]]:
    """The newest :data:`SAMPLE_ROWS` rows, then up to as many others from pages taken at
    random, sized by the table's row estimate (every page while it has none)."""
    select = f"SELECT id, {spec.columns} FROM {spec.table}"
    newest = fetch_rows(conn, f"{select} ORDER BY id DESC LIMIT %s", (SAMPLE_ROWS,))
    yield newest
    if len(newest) < SAMPLE_ROWS:
        return
    estimate = fetch_value(
        conn, "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (spec.table,)
    )
    percent = 100.0 if not estimate or estimate <= 0 else min(100.0, 200.0 * SAMPLE_ROWS / estimate)
    seen = {row[0] for row in newest}
    spread = fetch_rows(
        conn, f"{select} TABLESAMPLE SYSTEM (%s::real) LIMIT %s", (percent, 2 * SAMPLE_ROWS)
    )
    yield [row for row in spread if row[0] not in seen][:SAMPLE_ROWS]


def _recomputed(spec: _Stemmed, rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """The batch's ids, then each stored column's recomputed values: ``joined()``'s arrays."""
    values = [spec.compute(row[1:]) for row in rows]
    return [[row[0] for row in rows], *(list(column) for column in zip(*values, strict=True))]


def _drifted(conn: Conn, spec: _Stemmed, rows: list[tuple[Any, ...]]) -> list[int]:
    """The ids among ``rows`` whose stored stems are not the ones their columns give."""
    if not rows:
        return []
    found = fetch_rows(
        conn,
        f"SELECT t.id FROM {spec.table} AS t JOIN {spec.joined()} ON t.id = e.id"
        f" WHERE {spec.differs()} ORDER BY t.id",
        _recomputed(spec, rows),
    )
    return [int(row[0]) for row in found]
