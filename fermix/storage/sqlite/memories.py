"""The ``memories`` table: scoped key-value facts with their FTS5 mirror (S5, S7).

Rows are archived, never deleted, by the memory pipeline; restore clears the archive
fields. Reads take an explicit set of scopes so a caller only ever sees the rows it is
entitled to (SC3): the scope filter is part of every query, not applied afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import apsw

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import MemoryRow, Provenance, Scope
from fermix.storage import fulltext as fts
from fermix.storage.memories import (
    COLUMNS,
    check_replacement,
    replacement_values,
    row_of,
    upsert_values,
)
from fermix.storage.sqlite.connection import fetch_rows, fetch_value

_SELECT = ", ".join(COLUMNS)


def upsert(
    conn: apsw.Connection,
    *,
    agent_id: str,
    owner_id: str,
    scope: Scope,
    category: str,
    key: str,
    value: str,
    promote_target: str | None,
    confidence: float = 1.0,
    provenance: Provenance = Provenance(),
    now: int | None = None,
) -> MemoryRow:
    """Insert a row, or update the one with the same unique key (S5), in the caller's transaction.

    Updating an archived row brings it back: writing a fact again means it holds again.
    """
    values = upsert_values(
        agent_id=agent_id,
        owner_id=owner_id,
        scope=scope,
        category=category,
        key=key,
        value=value,
        promote_target=promote_target,
        confidence=confidence,
        provenance=provenance,
        now=now,
    )
    rows = fetch_rows(
        conn,
        "INSERT INTO memories (agent_id, owner_id, scope_type, scope_id, category, key, value,"
        " confidence, promote_target, source_id, source_type, source_name, source_description,"
        " session_id, run_id, source_message_id, created_at, updated_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
        " ON CONFLICT (agent_id, owner_id, scope_type, scope_id, key) DO UPDATE SET"
        " category = excluded.category, value = excluded.value,"
        " confidence = excluded.confidence, promote_target = excluded.promote_target,"
        " source_id = excluded.source_id, source_type = excluded.source_type,"
        " source_name = excluded.source_name, source_description = excluded.source_description,"
        " session_id = excluded.session_id, run_id = excluded.run_id,"
        " source_message_id = excluded.source_message_id, archived_at = NULL,"
        " archived_by = NULL, archive_reason = NULL, updated_at = excluded.updated_at"
        f" RETURNING {_SELECT}",
        values,
    )
    return row_of(rows[0])


def replace_value(
    conn: apsw.Connection,
    memory_id: int,
    *,
    value: str,
    key: str | None = None,
    category: str | None = None,
    provenance: Provenance | None = None,
    now: int | None = None,
) -> MemoryRow:
    """Update a row's value (and optionally key and category) by id, in the caller's transaction."""
    check_replacement(value=value, key=key, category=category)
    current = require(conn, memory_id)
    values = replacement_values(
        current, value=value, key=key, category=category, provenance=provenance, now=now
    )
    try:
        rows = fetch_rows(
            conn,
            "UPDATE memories SET value = ?, key = ?, category = ?, source_id = ?,"
            " source_type = ?, source_name = ?, source_description = ?, session_id = ?,"
            " run_id = ?, source_message_id = ?, archived_at = NULL, archived_by = NULL,"
            f" archive_reason = NULL, updated_at = ? WHERE id = ? RETURNING {_SELECT}",
            (*values, memory_id),
        )
    except apsw.ConstraintError:
        raise InvalidInputError(f"another row in the same scope already has key {key!r}") from None
    return row_of(rows[0])


def get(conn: apsw.Connection, memory_id: int) -> MemoryRow | None:
    """The row with ``memory_id``, archived or not, or None."""
    rows = fetch_rows(conn, f"SELECT {_SELECT} FROM memories WHERE id = ?", (memory_id,))
    return row_of(rows[0]) if rows else None


def require(conn: apsw.Connection, memory_id: int) -> MemoryRow:
    """The row with ``memory_id``, or :class:`NotFoundError`."""
    row = get(conn, memory_id)
    if row is None:
        raise NotFoundError(f"no memory row with id {memory_id}")
    return row


def get_by_key(
    conn: apsw.Connection, *, agent_id: str, owner_id: str, scope: Scope, key: str
) -> MemoryRow | None:
    """The row with this unique key, or None."""
    rows = fetch_rows(
        conn,
        f"SELECT {_SELECT} FROM memories WHERE agent_id = ? AND owner_id = ? AND scope_type = ?"
        " AND scope_id = ? AND key = ?",
        (agent_id, owner_id, scope.type, scope.id, key),
    )
    return row_of(rows[0]) if rows else None


def _filters(
    *,
    agent_id: str | None,
    owner_id: str | None,
    scopes: Iterable[Scope] | None,
    scope_type: str | None,
    category: str | None,
    archived: bool | None,
    key: str | None = None,
    prefix: str = "",
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if agent_id is not None:
        where.append(f"{prefix}agent_id = ?")
        params.append(agent_id)
    if owner_id is not None:
        where.append(f"{prefix}owner_id = ?")
        params.append(owner_id)
    if scopes is not None:
        scope_list = list(scopes)
        if not scope_list:
            where.append("0")
        else:
            where.append(
                "("
                + " OR ".join(
                    f"({prefix}scope_type = ? AND {prefix}scope_id = ?)" for _ in scope_list
                )
                + ")"
            )
            for scope in scope_list:
                params.extend((scope.type, scope.id))
    if scope_type is not None:
        where.append(f"{prefix}scope_type = ?")
        params.append(scope_type)
    if category is not None:
        where.append(f"{prefix}category = ?")
        params.append(category)
    if archived is not None:
        where.append(f"{prefix}archived_at IS {'NOT ' if archived else ''}NULL")
    if key is not None:
        where.append(f"{prefix}key = ?")
        params.append(key)
    return where, params


def list_rows(
    conn: apsw.Connection,
    *,
    agent_id: str | None = None,
    owner_id: str | None = None,
    scopes: Iterable[Scope] | None = None,
    scope_type: str | None = None,
    category: str | None = None,
    archived: bool | None = False,
    key: str | None = None,
    limit: int | None = None,
) -> list[MemoryRow]:
    """Rows matching every given filter, most recently updated first.

    ``archived``: False (default) live rows only, True archived only, None both.
    ``scopes``: when given, only rows in one of these scopes (an empty list matches nothing).
    """
    where, params = _filters(
        agent_id=agent_id,
        owner_id=owner_id,
        scopes=scopes,
        scope_type=scope_type,
        category=category,
        archived=archived,
        key=key,
    )
    sql = f"SELECT {_SELECT} FROM memories"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY updated_at DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [row_of(r) for r in fetch_rows(conn, sql, params)]


def search(
    conn: apsw.Connection,
    text: str,
    *,
    agent_id: str | None = None,
    owner_id: str | None = None,
    scopes: Iterable[Scope] | None = None,
    scope_type: str | None = None,
    category: str | None = None,
    archived: bool | None = False,
    limit: int = 10,
) -> list[MemoryRow]:
    """Rows whose key or value matches any text, best first, within the given filters."""
    match = fts.build_query(text)
    if match is None or limit <= 0:
        return []
    where, params = _filters(
        agent_id=agent_id,
        owner_id=owner_id,
        scopes=scopes,
        scope_type=scope_type,
        category=category,
        archived=archived,
        prefix="m.",
    )
    columns = ", ".join(f"m.{c}" for c in COLUMNS)
    sql = (
        f"SELECT {columns} FROM memories_fts JOIN memories AS m ON m.id = memories_fts.rowid"
        " WHERE memories_fts MATCH ?"
    )
    sql += "".join(f" AND {clause}" for clause in where)
    sql += " ORDER BY bm25(memories_fts) LIMIT ?"
    return [row_of(r) for r in conn.execute(sql, [match, *params, limit])]


def archive(
    conn: apsw.Connection, memory_id: int, *, by: str, reason: str, now: int | None = None
) -> MemoryRow:
    """Mark a row archived with who and why (S7); archiving an archived row keeps its record."""
    validate.identifier("archived_by", by)
    validate.text("archive_reason", reason, max_chars=1000)
    row = require(conn, memory_id)
    if row.archived:
        return row
    rows = fetch_rows(
        conn,
        "UPDATE memories SET archived_at = ?, archived_by = ?, archive_reason = ?"
        f" WHERE id = ? RETURNING {_SELECT}",
        (now_ms() if now is None else now, by, reason, memory_id),
    )
    return row_of(rows[0])


def restore(conn: apsw.Connection, memory_id: int, *, now: int | None = None) -> MemoryRow:
    """Clear a row's archive fields (S7)."""
    require(conn, memory_id)
    rows = fetch_rows(
        conn,
        "UPDATE memories SET archived_at = NULL, archived_by = NULL, archive_reason = NULL,"
        f" updated_at = ? WHERE id = ? RETURNING {_SELECT}",
        (now_ms() if now is None else now, memory_id),
    )
    return row_of(rows[0])


def change_counter(
    conn: apsw.Connection, agent_id: str | None = None, owner_id: str | None = None
) -> int:
    """A number that changes whenever a memory row is written, by any process (A3).

    With ``agent_id`` (and ``owner_id``), it changes at least whenever a row of that agent
    (that shows in that owner's prompt files) is written; SQLite keeps one counter for the
    whole table, so it also changes on other writes (a cache only reloads more often). The
    PostgreSQL adapter keeps one per (agent, owner).
    """
    if agent_id is None and owner_id is not None:
        raise InvalidInputError("memory_version: owner_id needs agent_id")
    return int(fetch_value(conn, "SELECT counter FROM memory_changes WHERE id = 1"))


def agents(conn: apsw.Connection) -> list[str]:
    """Every agent with memory rows or prompt-file resources, sorted."""
    sql = "SELECT agent_id FROM memories UNION SELECT agent_id FROM resources ORDER BY 1"
    return [str(agent) for (agent,) in fetch_rows(conn, sql)]


def owners(conn: apsw.Connection, agent_id: str) -> list[str]:
    """Every owner of ``agent_id`` with memory rows or prompt-file resources, ``""`` first."""
    found = {
        str(owner)
        for (owner,) in fetch_rows(
            conn,
            "SELECT owner_id FROM memories WHERE agent_id = ?"
            " UNION SELECT owner_id FROM resources WHERE agent_id = ?",
            (agent_id, agent_id),
        )
    }
    return ["", *sorted(found - {""})]
