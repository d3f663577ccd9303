"""The ``memories`` table: scoped key-value facts (S5, S7, SC3), written once for both
adapters (:class:`~fermix.storage.sql.Sql`).

Rows are archived, never deleted, by the memory pipeline; restore clears the archive
fields. Reads take an explicit set of scopes so a caller only ever sees the rows it is
entitled to (SC3): the scope filter is part of every query, not applied afterwards.

What differs is named in the :class:`~fermix.storage.sql.Dialect`: the columns a row stores
for its adapter's search (PostgreSQL's stems; SQLite's FTS5 mirror keeps itself by
triggers), and the row lock a :func:`replace_value` takes before it reads what it keeps
(PostgreSQL's ``FOR UPDATE``; SQLite's single writer holds every row already). What SQLite's
single writer gave for free is explicit for both:

- :func:`archive` archives only a live row (``WHERE archived_at IS NULL``): of two services
  archiving one row at once, the first one's record stays.
- :func:`replace_value` looks for a row holding the new key before it writes, so a key
  taken is an :class:`InvalidInputError` and the transaction stays usable.

Ids are each adapter's own (PostgreSQL's identity column draws one for an upsert that
updates too), increasing in insertion order on both. The search of rows by text and their
change counters are each adapter's (``memory_relevance.py``, ``memories.py`` in each).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import PROMOTE_TARGETS, MemoryRow, Provenance, Scope, check_category
from fermix.storage.sql import Sql
from fermix.storage.vectors import MEMORY_TEXTS, pending_memories, uncount, uncount_memories

MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 10_000


COLUMNS = (
    "id",
    "agent_id",
    "owner_id",
    "scope_type",
    "scope_id",
    "category",
    "key",
    "value",
    "confidence",
    "promote_target",
    "source_id",
    "source_type",
    "source_name",
    "source_description",
    "session_id",
    "run_id",
    "source_message_id",
    "archived_at",
    "archived_by",
    "archive_reason",
    "created_at",
    "updated_at",
)
"""The columns of a memory row, in :class:`~fermix.model.MemoryRow`'s order."""


SELECT = ", ".join(COLUMNS)
"""The columns of a memory row, for a ``SELECT`` of :func:`row_of`."""


SELECT_M = ", ".join(f"m.{c}" for c in COLUMNS)
"""The columns of a memory row of ``memories AS m``, for a ``SELECT`` of :func:`row_of`."""


def row_of(values: Sequence[Any]) -> MemoryRow:
    """The row of one ``SELECT`` of :data:`COLUMNS`."""
    return MemoryRow(*values)


def upsert(
    sql: Sql,
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
    """Insert a row, or update the one with the same unique key (S5), in the caller's
    transaction.

    Updating an archived row brings it back: writing a fact again means it holds again. A
    row no adapter stores is an :class:`InvalidInputError`, before anything is written.
    """
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    check_category(category)
    validate.text("key", key, max_chars=MAX_KEY_CHARS, allow_empty=False)
    validate.text("value", value, max_chars=MAX_VALUE_CHARS, allow_empty=False)
    if promote_target is not None and promote_target not in PROMOTE_TARGETS:
        raise InvalidInputError(f"promote_target must be one of {PROMOTE_TARGETS} or None")
    if not 0.0 <= confidence <= 1.0:
        raise InvalidInputError(f"confidence must be between 0 and 1, not {confidence}")
    ts = now_ms() if now is None else now
    scoped = (agent_id, owner_id, scope.type, scope.id, category, key, value)
    values = (*scoped, confidence, promote_target, *_sources(provenance), ts, ts)
    search = sql.dialect.memory_search
    same = sql.rows(  # the row updated below, if it has a vector (memory_vectors_au drops it)
        f"{MEMORY_TEXTS} WHERE m.agent_id = ? AND m.owner_id = ? AND m.scope_type = ?"
        " AND m.scope_id = ? AND m.key = ?",
        (agent_id, owner_id, scope.type, scope.id, key),
    )
    uncount(sql, pending_memories(same))
    rows = sql.rows(
        "INSERT INTO memories (agent_id, owner_id, scope_type, scope_id, category, key, value,"
        " confidence, promote_target, source_id, source_type, source_name, source_description,"
        f" session_id, run_id, source_message_id, created_at, updated_at{_listed(search.names)})"
        f" VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?{_listed(search.marks)})"
        " ON CONFLICT (agent_id, owner_id, scope_type, scope_id, key) DO UPDATE SET"
        " category = excluded.category, value = excluded.value,"
        " confidence = excluded.confidence, promote_target = excluded.promote_target,"
        " source_id = excluded.source_id, source_type = excluded.source_type,"
        " source_name = excluded.source_name, source_description = excluded.source_description,"
        " session_id = excluded.session_id, run_id = excluded.run_id,"
        " source_message_id = excluded.source_message_id, archived_at = NULL,"
        " archived_by = NULL, archive_reason = NULL, updated_at = excluded.updated_at"
        f"{_set(search.names, [f'excluded.{name}' for name in search.names])}"
        f" RETURNING {SELECT}",
        (*values, *search.values(key, value)),
    )
    return row_of(rows[0])


def replace_value(
    sql: Sql,
    memory_id: int,
    *,
    value: str,
    key: str | None = None,
    category: str | None = None,
    provenance: Provenance | None = None,
    now: int | None = None,
) -> MemoryRow:
    """Update a row's value (and optionally key and category) by id, in the caller's
    transaction; a key another row of the scope holds is an :class:`InvalidInputError`.

    What is not given is kept, the provenance too; nothing is read before the new values
    are checked."""
    validate.text("value", value, max_chars=MAX_VALUE_CHARS, allow_empty=False)
    if key is not None:
        validate.text("key", key, max_chars=MAX_KEY_CHARS, allow_empty=False)
    if category is not None:
        check_category(category)
    # Locked first, so no other service changes what this keeps until the commit.
    found = sql.rows(
        f"SELECT {SELECT_M}, EXISTS (SELECT 1 FROM memories AS o"
        " WHERE o.agent_id = m.agent_id AND o.owner_id = m.owner_id"
        " AND o.scope_type = m.scope_type AND o.scope_id = m.scope_id AND o.key = ?"
        f" AND o.id <> m.id) FROM memories AS m WHERE m.id = ?{sql.dialect.for_update}",
        (key, memory_id),
    )
    if not found:
        raise NotFoundError(f"no memory row with id {memory_id}")
    current = row_of(found[0][:-1])
    if found[0][-1]:
        raise InvalidInputError(f"another row in the same scope already has key {key!r}")
    new_key = current.key if key is None else key
    sources = _sources(current if provenance is None else provenance)
    values = (value, new_key, current.category if category is None else category, *sources)
    search = sql.dialect.memory_search
    uncount_memories(sql, [memory_id])  # the update drops its vector (memory_vectors_au)
    rows = sql.rows(
        "UPDATE memories SET value = ?, key = ?, category = ?, source_id = ?,"
        " source_type = ?, source_name = ?, source_description = ?, session_id = ?,"
        " run_id = ?, source_message_id = ?, archived_at = NULL, archived_by = NULL,"
        f" archive_reason = NULL, updated_at = ?{_set(search.names, search.marks)}"
        f" WHERE id = ? RETURNING {SELECT}",
        (*values, now_ms() if now is None else now, *search.values(new_key, value), memory_id),
    )
    return row_of(rows[0])


def get(sql: Sql, memory_id: int) -> MemoryRow | None:
    """The row with ``memory_id``, archived or not, or None."""
    rows = sql.rows(f"SELECT {SELECT} FROM memories WHERE id = ?", (memory_id,))
    return row_of(rows[0]) if rows else None


def require(sql: Sql, memory_id: int) -> MemoryRow:
    """The row with ``memory_id``, or :class:`NotFoundError`."""
    row = get(sql, memory_id)
    if row is None:
        raise NotFoundError(f"no memory row with id {memory_id}")
    return row


def get_by_key(
    sql: Sql, *, agent_id: str, owner_id: str, scope: Scope, key: str
) -> MemoryRow | None:
    """The row with this unique key, or None."""
    rows = sql.rows(
        f"SELECT {SELECT} FROM memories WHERE agent_id = ? AND owner_id = ? AND scope_type = ?"
        " AND scope_id = ? AND key = ?",
        (agent_id, owner_id, scope.type, scope.id, key),
    )
    return row_of(rows[0]) if rows else None


def filters(
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
    """The SQL conditions (on columns behind ``prefix``, with ``?`` marks) and parameters of
    the filters of :func:`list_rows` and of each adapter's search of rows by text."""
    where: list[str] = []
    params: list[Any] = []
    for column, wanted in (
        ("agent_id", agent_id),
        ("owner_id", owner_id),
        ("scope_type", scope_type),
        ("category", category),
        ("key", key),
    ):
        if wanted is not None:
            where.append(f"{prefix}{column} = ?")
            params.append(wanted)
    if scopes is not None:
        scope_list = list(scopes)
        if not scope_list:
            where.append("false")
        else:
            pairs = f"({prefix}scope_type = ? AND {prefix}scope_id = ?)"
            where.append("(" + " OR ".join([pairs] * len(scope_list)) + ")")
            for scope in scope_list:
                params.extend((scope.type, scope.id))
    if archived is not None:
        where.append(f"{prefix}archived_at IS {'NOT ' if archived else ''}NULL")
    return where, params


def list_rows(
    sql: Sql,
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
    A negative ``limit`` is no limit (as SQLite takes it).
    """
    where, params = filters(
        agent_id=agent_id,
        owner_id=owner_id,
        scopes=scopes,
        scope_type=scope_type,
        category=category,
        archived=archived,
        key=key,
    )
    statement = f"SELECT {SELECT} FROM memories"
    if where:
        statement += " WHERE " + " AND ".join(where)
    statement += " ORDER BY updated_at DESC, id DESC"
    if limit is not None and limit >= 0:
        statement += " LIMIT ?"
        params.append(limit)
    return [row_of(r) for r in sql.rows(statement, params)]


def archive(sql: Sql, memory_id: int, *, by: str, reason: str, now: int | None = None) -> MemoryRow:
    """Mark a row archived with who and why (S7); archiving an archived row keeps its
    record, whichever service archived it first."""
    validate.identifier("archived_by", by)
    validate.text("archive_reason", reason, max_chars=1000)
    rows = sql.rows(
        "UPDATE memories SET archived_at = ?, archived_by = ?, archive_reason = ?"
        f" WHERE id = ? AND archived_at IS NULL RETURNING {SELECT}",
        (now_ms() if now is None else now, by, reason, memory_id),
    )
    return row_of(rows[0]) if rows else require(sql, memory_id)


def restore(sql: Sql, memory_id: int, *, now: int | None = None) -> MemoryRow:
    """Clear a row's archive fields (S7)."""
    rows = sql.rows(
        "UPDATE memories SET archived_at = NULL, archived_by = NULL, archive_reason = NULL,"
        f" updated_at = ? WHERE id = ? RETURNING {SELECT}",
        (now_ms() if now is None else now, memory_id),
    )
    if not rows:
        raise NotFoundError(f"no memory row with id {memory_id}")
    return row_of(rows[0])


def agents(sql: Sql) -> list[str]:
    """Every agent with memory rows or prompt-file resources, sorted (by code point)."""
    found = sql.rows("SELECT agent_id FROM memories UNION SELECT agent_id FROM resources")
    return sorted(str(agent) for (agent,) in found)


def owners(sql: Sql, agent_id: str) -> list[str]:
    """Every owner of ``agent_id`` with memory rows or prompt-file resources, ``""`` first."""
    found = sql.rows(
        "SELECT owner_id FROM memories WHERE agent_id = ?"
        " UNION SELECT owner_id FROM resources WHERE agent_id = ?",
        (agent_id, agent_id),
    )
    return ["", *sorted({str(owner) for (owner,) in found} - {""})]


def _sources(of: Provenance | MemoryRow) -> tuple[Any, ...]:
    """The source columns of a provenance, or a row's, in the order of the table's columns."""
    return (
        of.source_id,
        of.source_type,
        of.source_name,
        of.source_description,
        of.session_id,
        of.run_id,
        of.source_message_id,
    )


def _listed(items: Sequence[str]) -> str:
    """``items`` to follow others in a list of columns or marks."""
    return "".join(f", {item}" for item in items)


def _set(names: Sequence[str], to: Sequence[str]) -> str:
    """Assignments of ``names`` to ``to`` to follow others in a ``SET``."""
    return "".join(f", {name} = {value}" for name, value in zip(names, to, strict=True))
