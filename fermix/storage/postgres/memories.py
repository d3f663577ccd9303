"""The ``memories`` table on PostgreSQL: the operations of :mod:`fermix.storage.sqlite.memories`,
with the same results (S5, S7, SC3).

A row is stored with its search stems (:func:`document`): the SQLite FTS5 tokenizer's
tokens of its key, then of its value, one position apart so that no phrase spans the two
(FTS5 matches a phrase within one column), and how many tokens the two hold (FTS5's column
sizes, for its ``bm25()``: :mod:`fermix.storage.postgres.memory_relevance`). Memory rows carry
no scope lexemes: SQLite's ``memories_fts`` has none.

What SQLite's single writer gave for free is explicit here:

- :func:`archive` archives only a live row (``WHERE archived_at IS NULL``): of two services
  archiving one row at once, the first one's record stays, as on SQLite.
- :func:`replace_value` locks the row before it reads the values it keeps, and looks for a
  row holding the new key first, so a key taken is the same :class:`InvalidInputError` as on
  SQLite and the transaction stays usable.
- Change counters are per (agent, owner) (``memory_versions``, moved by a trigger), not one
  row every memory write of every service would queue on: :func:`change_counter`.

Ids come from an identity column: an upsert that updates draws one too, so ids are not
those SQLite would give (each adapter's own, increasing in insertion order on both).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import MemoryRow, Provenance, Scope
from fermix.storage.memories import (
    COLUMNS,
    check_replacement,
    replacement_values,
    row_of,
    upsert_values,
)
from fermix.storage.postgres import stems
from fermix.storage.postgres.connection import Conn, fetch_rows, fetch_value

_SELECT = ", ".join(COLUMNS)
_UNIQUE = "agent_id = %s AND owner_id = %s AND scope_type = %s AND scope_id = %s AND key = %s"


def document(key: str, value: str) -> tuple[str, int]:
    """The ``tsvector`` literal of a row's key and value, and how many tokens they hold.

    The key's tokens take positions 1 to k, the value's k + 2 onwards; the limits of
    :mod:`fermix.storage.postgres.stems` apply (a memory row within fermix's caps never meets
    them). The count is every token of both, as FTS5 counts a row's size.
    """
    tokenize = stems.tokenizer()
    key_tokens = tokenize(key)
    value_tokens = tokenize(value)
    positions: dict[str, list[int]] = {}
    late: dict[str, None] = {}
    numbered = [
        *enumerate(key_tokens, 1),
        *enumerate(value_tokens, len(key_tokens) + 2),
    ]
    for position, token in numbered:
        if position <= stems.MAX_POSITION:
            found = positions.setdefault(token, [])
            if len(found) < stems.MAX_POSITIONS_PER_LEXEME:
                found.append(position)
        elif token not in positions:
            late[token] = None
    parts = []
    budget = stems.MAX_VECTOR_BYTES
    for token, at in [*positions.items(), *((t, []) for t in late)]:
        size = len(token.encode("utf-8"))
        cost = size + 8 + 2 * len(at)
        if size > stems.MAX_LEXEME_BYTES or cost > budget:
            continue
        budget -= cost
        parts.append(stems.lexeme(token) + (":" + ",".join(map(str, at)) if at else ""))
    return " ".join(parts), len(key_tokens) + len(value_tokens)


def upsert(
    conn: Conn,
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
    transaction. Updating an archived row brings it back."""
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
    vector, count = document(key, value)
    rows = fetch_rows(
        conn,
        "INSERT INTO memories (agent_id, owner_id, scope_type, scope_id, category, key, value,"
        " confidence, promote_target, source_id, source_type, source_name, source_description,"
        " session_id, run_id, source_message_id, created_at, updated_at, stems, stem_count)"
        " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s::tsvector,%s)"
        " ON CONFLICT (agent_id, owner_id, scope_type, scope_id, key) DO UPDATE SET"
        " category = excluded.category, value = excluded.value,"
        " confidence = excluded.confidence, promote_target = excluded.promote_target,"
        " source_id = excluded.source_id, source_type = excluded.source_type,"
        " source_name = excluded.source_name, source_description = excluded.source_description,"
        " session_id = excluded.session_id, run_id = excluded.run_id,"
        " source_message_id = excluded.source_message_id, archived_at = NULL,"
        " archived_by = NULL, archive_reason = NULL, updated_at = excluded.updated_at,"
        " stems = excluded.stems, stem_count = excluded.stem_count"
        f" RETURNING {_SELECT}",
        (*values, vector, count),
    )
    return row_of(rows[0])


def replace_value(
    conn: Conn,
    memory_id: int,
    *,
    value: str,
    key: str | None = None,
    category: str | None = None,
    provenance: Provenance | None = None,
    now: int | None = None,
) -> MemoryRow:
    """Update a row's value (and optionally key and category) by id, in the caller's
    transaction; a key another row of the scope holds is an :class:`InvalidInputError`."""
    check_replacement(value=value, key=key, category=category)
    # Locked first, so no other service changes what this keeps until the commit.
    found = fetch_rows(
        conn,
        f"SELECT {', '.join(f'm.{c}' for c in COLUMNS)}, EXISTS (SELECT 1 FROM memories AS o"
        " WHERE o.agent_id = m.agent_id AND o.owner_id = m.owner_id"
        " AND o.scope_type = m.scope_type AND o.scope_id = m.scope_id AND o.key = %s"
        " AND o.id <> m.id) FROM memories AS m WHERE m.id = %s FOR UPDATE OF m",
        (key, memory_id),
    )
    if not found:
        raise NotFoundError(f"no memory row with id {memory_id}")
    current = row_of(found[0][:-1])
    if found[0][-1]:
        raise InvalidInputError(f"another row in the same scope already has key {key!r}")
    values = replacement_values(
        current, value=value, key=key, category=category, provenance=provenance, now=now
    )
    vector, count = document(current.key if key is None else key, value)
    rows = fetch_rows(
        conn,
        "UPDATE memories SET value = %s, key = %s, category = %s, source_id = %s,"
        " source_type = %s, source_name = %s, source_description = %s, session_id = %s,"
        " run_id = %s, source_message_id = %s, archived_at = NULL, archived_by = NULL,"
        " archive_reason = NULL, updated_at = %s, stems = %s::tsvector, stem_count = %s"
        f" WHERE id = %s RETURNING {_SELECT}",
        (*values, vector, count, memory_id),
    )
    return row_of(rows[0])


def get(conn: Conn, memory_id: int) -> MemoryRow | None:
    """The row with ``memory_id``, archived or not, or None."""
    rows = fetch_rows(conn, f"SELECT {_SELECT} FROM memories WHERE id = %s", (memory_id,))
    return row_of(rows[0]) if rows else None


def require(conn: Conn, memory_id: int) -> MemoryRow:
    """The row with ``memory_id``, or :class:`NotFoundError`."""
    row = get(conn, memory_id)
    if row is None:
        raise NotFoundError(f"no memory row with id {memory_id}")
    return row


def get_by_key(
    conn: Conn, *, agent_id: str, owner_id: str, scope: Scope, key: str
) -> MemoryRow | None:
    """The row with this unique key, or None."""
    rows = fetch_rows(
        conn,
        f"SELECT {_SELECT} FROM memories WHERE {_UNIQUE}",
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
    """The SQL conditions (on columns behind ``prefix``) and parameters of the filters of
    :func:`list_rows` and :func:`~fermix.storage.postgres.memory_relevance.search`."""
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
            where.append(f"{prefix}{column} = %s")
            params.append(wanted)
    if scopes is not None:
        scope_list = list(scopes)
        if not scope_list:
            where.append("false")
        else:
            pairs = f"({prefix}scope_type = %s AND {prefix}scope_id = %s)"
            where.append("(" + " OR ".join([pairs] * len(scope_list)) + ")")
            for scope in scope_list:
                params.extend((scope.type, scope.id))
    if archived is not None:
        where.append(f"{prefix}archived_at IS {'NOT ' if archived else ''}NULL")
    return where, params


def list_rows(
    conn: Conn,
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
    """Rows matching every given filter, most recently updated first (``archived``: False
    live rows only, True archived only, None both; ``scopes``: an empty list matches
    nothing). A negative ``limit`` is no limit, as on SQLite."""
    where, params = filters(
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
    if limit is not None and limit >= 0:
        sql += " LIMIT %s"
        params.append(limit)
    return [row_of(r) for r in fetch_rows(conn, sql, params)]


def archive(
    conn: Conn, memory_id: int, *, by: str, reason: str, now: int | None = None
) -> MemoryRow:
    """Mark a row archived with who and why (S7); archiving an archived row keeps its
    record, whichever service archived it first."""
    validate.identifier("archived_by", by)
    validate.text("archive_reason", reason, max_chars=1000)
    rows = fetch_rows(
        conn,
        "UPDATE memories SET archived_at = %s, archived_by = %s, archive_reason = %s"
        f" WHERE id = %s AND archived_at IS NULL RETURNING {_SELECT}",
        (now_ms() if now is None else now, by, reason, memory_id),
    )
    return row_of(rows[0]) if rows else require(conn, memory_id)


def restore(conn: Conn, memory_id: int, *, now: int | None = None) -> MemoryRow:
    """Clear a row's archive fields (S7)."""
    rows = fetch_rows(
        conn,
        "UPDATE memories SET archived_at = NULL, archived_by = NULL, archive_reason = NULL,"
        f" updated_at = %s WHERE id = %s RETURNING {_SELECT}",
        (now_ms() if now is None else now, memory_id),
    )
    if not rows:
        raise NotFoundError(f"no memory row with id {memory_id}")
    return row_of(rows[0])


def change_counter(conn: Conn, agent_id: str | None = None, owner_id: str | None = None) -> int:
    """A number that changes whenever a memory row is written, by any service (A3).

    With ``agent_id`` and ``owner_id``: whenever a row that shows in that owner's prompt
    files is written (the owner's rows and the agent's shared rows, owner ``''``); with
    ``agent_id`` alone, any row of the agent; without, any row. The counters are per
    (agent, owner), moved by the ``memories_count`` trigger, and only ever grow.
    """
    params: tuple[str, ...]
    if agent_id is None:
        if owner_id is not None:
            raise InvalidInputError("memory_version: owner_id needs agent_id")
        sql, params = "SELECT coalesce(sum(version), 0) FROM memory_versions", ()
    elif owner_id is None:
        sql = "SELECT coalesce(sum(version), 0) FROM memory_versions WHERE agent_id = %s"
        params = (agent_id,)
    else:
        sql = (
            "SELECT coalesce(sum(version), 0) FROM memory_versions"
            " WHERE agent_id = %s AND owner_id IN (%s, '')"
        )
        params = (agent_id, owner_id)
    return int(fetch_value(conn, sql, params))


def agents(conn: Conn) -> list[str]:
    """Every agent with memory rows or prompt-file resources, sorted (by code point)."""
    found = fetch_rows(conn, "SELECT agent_id FROM memories UNION SELECT agent_id FROM resources")
    return sorted(str(agent) for (agent,) in found)


def owners(conn: Conn, agent_id: str) -> list[str]:
    """Every owner of ``agent_id`` with memory rows or prompt-file resources, ``""`` first."""
    found = {
        str(owner)
        for (owner,) in fetch_rows(
            conn,
            "SELECT owner_id FROM memories WHERE agent_id = %s"
            " UNION SELECT owner_id FROM resources WHERE agent_id = %s",
            (agent_id, agent_id),
        )
    }
    return ["", *sorted(found - {""})]
