"""What ``fermix doctor`` asks of ``memory.db``: schema version, integrity, FTS mirrors
(S1, S2, S4, S5).

The SQL of the health checks is written here, like every other query. Each function takes
an open connection; the sessions offer them (``r.integrity_problems()``, ``r.fts_problem(t)``,
``w.rebuild_fts(t)``...), and :meth:`~fermix.storage.sqlite.database.Database.inspect` opens a file
for them without creating, migrating or writing it (:func:`open_to_inspect`).

Two depths, chosen by ``full``:

- quick (the default): ``PRAGMA quick_check`` reads every page of the file and checks each
  FTS5 index's structure; each FTS mirror's set of rowids is compared with its content
  table's, so a ghost row or a missing one is found. It skips what costs a lookup per row:
  that every index entry matches its table row, UNIQUE, and that the terms of each FTS row
  are those of its content row (only a writer that bypassed the triggers could break that);
- full: ``PRAGMA integrity_check``, and FTS5 ``integrity-check`` with rank 1, which
  tokenizes every content row and compares it with the index.
"""

from __future__ import annotations

import os
from pathlib import Path

import apsw

from fermix.errors import StorageError
from fermix.storage.integrity import FTS_MIRRORS, MAX_PROBLEMS, mirror
from fermix.storage.sqlite import migrations
from fermix.storage.sqlite.connection import apply_settings, fetch_rows, set_busy_timeout


def open_to_inspect(path: str | os.PathLike[str], *, vfs: str | None = None) -> None:
    """Check that ``path`` is a fermix database this code can read, changing nothing in it.

    The file is not created; its schema version is read before anything else, so a newer
    one is a :class:`~fermix.errors.SchemaTooNewError` and the file is left as it was. Any
    other reason it cannot be read is a :class:`~fermix.errors.StorageError`. Then the
    connection settings are applied (WAL, as every connection does) and it is closed.
    """
    name = Path(path).name
    try:
        if vfs is None:
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
        else:
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE, vfs=vfs)
    except apsw.Error as exc:
        raise StorageError(f"{name} cannot be opened: {exc}") from exc
    try:
        set_busy_timeout(conn)
        migrations.check_version(conn)
        apply_settings(conn)
    except apsw.Error as exc:
        raise StorageError(f"{name} cannot be read: {exc}") from exc
    finally:
        conn.close()


# -- integrity -----------------------------------------------------------------------


def integrity_check_name(conn: apsw.Connection, *, full: bool) -> str:
    """The name of the SQLite check :func:`integrity_problems` runs."""
    return "integrity_check" if full else "quick_check"


def integrity_problems(conn: apsw.Connection, *, full: bool = False) -> list[str]:
    """What SQLite's integrity check finds wrong with the file (empty when nothing).

    ``full`` runs ``PRAGMA integrity_check``, otherwise ``PRAGMA quick_check`` (see the
    module's docstring for what that leaves out). Both check the FTS5 indexes' structure:
    a problem of that kind starts with ``fts5:`` (:func:`fts_damage` picks them out).
    """
    pragma = integrity_check_name(conn, full=full)
    problems = [str(row[0]) for row in fetch_rows(conn, f"PRAGMA {pragma}({MAX_PROBLEMS})")]
    return [] if problems == ["ok"] else problems


# -- FTS mirrors ---------------------------------------------------------------------


def fts_problem(
    conn: apsw.Connection, table: str, *, full: bool = False, structure_checked: bool = False
) -> str | None:
    """Why FTS mirror ``table`` disagrees with its content table, or None when it agrees.

    Quick: the rowids of the index (its ``_docsize`` table) and of the content table are
    the same set, and the index's structure is sound (skipped when ``structure_checked``:
    :func:`integrity_problems` checked it already). Full: FTS5 ``integrity-check`` with
    rank 1, which also compares every row's terms with the index.
    """
    content = FTS_MIRRORS[mirror(table)]
    if not full:
        ghosts, ghost = _rowids_missing(conn, f"{table}_docsize", content)
        missing, absent = _rowids_missing(conn, content, f"{table}_docsize")
        found = []
        if ghosts:
            found.append(f"{ghosts} row(s) only in the index (rowid {ghost}...)")
        if missing:
            found.append(f"{missing} row(s) of {content} missing from it (id {absent}...)")
        if found:
            return ", ".join(found)
        if structure_checked:
            return None
    rank = ", 1" if full else ", 0"
    try:
        conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check'{rank})")
    except apsw.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _rowids_missing(conn: apsw.Connection, table: str, other: str) -> tuple[int, int | None]:
    """How many ids of ``table`` are not in ``other``, and the smallest of them."""
    sql = f"SELECT count(*), min(id) FROM (SELECT id FROM {table} EXCEPT SELECT id FROM {other})"
    count, first = fetch_rows(conn, sql)[0]
    return int(count), first


def rebuild_fts(conn: apsw.Connection, table: str) -> None:
    """Rebuild FTS mirror ``table`` from its content table (caller's transaction)."""
    table = mirror(table)
    conn.execute(f"INSERT INTO {table} ({table}) VALUES ('rebuild')")
