"""Vectors of messages and memory rows, and the token counts their pooling needs (Q2, Q4).

Schema migration 8: ``message_vectors`` and ``memory_vectors`` hold one int8 BLOB per row,
beside the row (deleted with it, dropped when its text changes); ``embedding_tokens`` counts
the tokens of each scope's embedded texts (``embedding_scopes`` names the scopes);
``embedding_model`` records the model and dimension every stored vector is of.

The background embedder (:mod:`fermix.runtime.indexing`) finds the rows without a vector
(:func:`messages_to_embed`, :func:`memories_to_embed`), oldest first, and stores a batch
(:func:`store_message_vectors`, :func:`store_memory_vectors`) in one write; a search reads
the vectors of the scope it searches only (:func:`scope_vectors`: a conversation by its
index, an owner's messages by their FTS5 scope token).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.model import ConversationKey
from fermix.storage.port import (
    MAX_SCOPE_ROWS,
    NEAREST_ROWS,
    Coverage,
    PendingText,
    ScopeRows,
    StoredVector,
)
from fermix.storage.sqlite.connection import fetch_value
from fermix.storage.sqlite.messages import SearchScope
from fermix.storage.vectors import (
    SCOPE_COLUMNS,
    TOTAL,
    VECTOR_JOIN,
    pending_memories,
    pending_messages,
    scope_rows,
    split_total,
    tally,
)

# -- the recorded model ------------------------------------------------------------------


def model(conn: apsw.Connection) -> tuple[str, int] | None:
    """The model and dimension of the stored vectors, or None before any."""
    sql = "SELECT model, dim FROM embedding_model WHERE id = 1"
    rows: list[tuple[Any, ...]] = conn.execute(sql).fetchall()
    return (str(rows[0][0]), int(rows[0][1])) if rows else None


def record_model(conn: apsw.Connection, name: str, dim: int, *, now: int | None = None) -> bool:
    """Record ``name`` and ``dim`` as the vectors' model; when another was recorded, every
    vector and token count is dropped first (they are all computed again). Returns whether
    anything changed."""
    if model(conn) == (name, dim):
        return False
    reset(conn)
    conn.execute(
        "INSERT OR REPLACE INTO embedding_model (id, model, dim, recorded_at) VALUES (1, ?, ?, ?)",
        (name, dim, now_ms() if now is None else now),
    )
    return True


def reset(conn: apsw.Connection) -> None:
    """Drop every vector and token count (``fermix index rebuild``, a model change)."""
    for table in ("message_vectors", "memory_vectors", "embedding_tokens", "embedding_scopes"):
        conn.execute(f"DELETE FROM {table}")


# -- the background embedder's work -------------------------------------------------------


def messages_to_embed(conn: apsw.Connection, *, after_id: int, limit: int) -> list[PendingText]:
    """Messages with id > ``after_id`` that have no vector, oldest first."""
    rows = conn.execute(
        "SELECT m.id, m.agent_id, m.channel, m.chat_id, m.thread_scope, m.content"
        " FROM messages AS m WHERE m.id > ?"
        " AND NOT EXISTS (SELECT 1 FROM message_vectors AS v WHERE v.message_id = m.id)"
        " ORDER BY m.id LIMIT ?",
        (after_id, limit),
    )
    return pending_messages(rows)


def memories_to_embed(conn: apsw.Connection, *, after_id: int, limit: int) -> list[PendingText]:
    """Live memory rows with id > ``after_id`` that have no vector, oldest first."""
    rows = conn.execute(
        "SELECT m.id, m.agent_id, m.key, m.value FROM memories AS m"
        " WHERE m.id > ? AND m.archived_at IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM memory_vectors AS v WHERE v.memory_id = m.id)"
        " ORDER BY m.id LIMIT ?",
        (after_id, limit),
    )
    return pending_memories(rows)


def _scope_id(conn: apsw.Connection, name: str) -> int:
    conn.execute("INSERT OR IGNORE INTO embedding_scopes (name) VALUES (?)", (name,))
    return int(fetch_value(conn, "SELECT id FROM embedding_scopes WHERE name = ?", (name,)))


def _store(
    conn: apsw.Connection, table: str, column: str, parent: str, items: Iterable[StoredVector]
) -> int:
    insert = (
        f"INSERT OR IGNORE INTO {table} ({column}, vector)"
        f" SELECT ?, ? WHERE EXISTS (SELECT 1 FROM {parent} WHERE id = ?)"
    )
    stored: list[StoredVector] = []
    for item in items:
        conn.execute(insert, (item.id, item.vector, item.id))
        if conn.changes() == 1:  # else gone meanwhile, or another process stored it first
            stored.append(item)
    upsert = (
        "INSERT INTO embedding_tokens (scope_id, token, count) VALUES (?, ?, ?)"
        " ON CONFLICT (scope_id, token) DO UPDATE SET count = count + excluded.count"
    )
    for scope, counts in tally(stored).items():
        if counts:
            sid = _scope_id(conn, scope)
            conn.executemany(upsert, [(sid, token, n) for token, n in counts.items()])
    return len(stored)


def store_message_vectors(conn: apsw.Connection, items: Iterable[StoredVector]) -> int:
    """Store each message's vector unless it has one or is gone; count its tokens in its
    scope. Returns how many were stored."""
    return _store(conn, "message_vectors", "message_id", "messages", items)


def store_memory_vectors(conn: apsw.Connection, items: Iterable[StoredVector]) -> int:
    """Store each memory row's vector unless it has one or is gone; count its tokens."""
    return _store(conn, "memory_vectors", "memory_id", "memories", items)


def token_counts(
    conn: apsw.Connection, scopes: Iterable[str], tokens: Iterable[int]
) -> tuple[dict[int, int], int]:
    """The counts of ``tokens`` summed over ``scopes``, and those scopes' total."""
    wanted = sorted({*tokens, TOTAL})
    rows = conn.execute(
        "SELECT t.token, sum(t.count) FROM embedding_tokens AS t"
        " JOIN embedding_scopes AS s ON s.id = t.scope_id"
        " WHERE s.name IN (SELECT value FROM json_each(?))"
        " AND t.token IN (SELECT value FROM json_each(?)) GROUP BY t.token",
        (json.dumps(sorted(set(scopes))), json.dumps(wanted)),
    )
    return split_total(rows)


# -- what a search reads ------------------------------------------------------------------


def scope_vectors(
    conn: apsw.Connection,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = MAX_SCOPE_ROWS,
) -> ScopeRows | None:
    """Every message of the scope :func:`fermix.storage.sqlite.messages.search` would search, with
    its vector or None, by conversation, time and id; None when the scope has more than
    ``limit`` messages or no index to read it by (an agent, the whole table).

    The rows are sorted by SQLite (a conversation's come in its index's order) and read in
    one ``fetchall``; the conversations are found by comparing the key columns of
    consecutive rows, so no object is made per row beyond the row's own values."""
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    params: tuple[Any, ...]
    if scope.indexed:
        # One conversation: its index gives the order, and stops a scope too large early.
        sql = (
            f"SELECT {SCOPE_COLUMNS} FROM messages AS m {VECTOR_JOIN} WHERE {scope.clause()}"
            " ORDER BY m.created_at, m.id LIMIT ?"
        )
        params = scope.params
    elif scope.tokens:
        # Sorted after the LIMIT, so a scope too large stops the read at limit + 1 rows.
        sql = (
            f"SELECT * FROM (SELECT {SCOPE_COLUMNS} FROM messages_fts"
            f" JOIN messages AS m ON m.id = messages_fts.rowid {VECTOR_JOIN}"
            f" WHERE messages_fts MATCH ? AND {scope.clause()} LIMIT ?)"
            " ORDER BY agent_id, channel, chat_id, thread_scope, created_at, id"
        )
        params = (scope.match(), *scope.params)
    else:
        return None
    found: list[tuple[Any, ...]] = conn.execute(sql, (*params, limit + 1)).fetchall()
    if len(found) > limit:
        return None
    return scope_rows(found)


def nearest_messages(
    conn: apsw.Connection,
    query: Sequence[float],
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = NEAREST_ROWS,
    include: Sequence[int] = (),
) -> ScopeRows | None:
    """The ``limit`` messages of the scope whose vectors are (about) nearest ``query``, and
    the scope's messages ``include``, as :func:`scope_vectors` gives them; None where no
    approximate index exists: always on SQLite, which searches a scope too large for
    :func:`scope_vectors` lexically (PostgreSQL with pgvector:
    :mod:`fermix.storage.postgres.vectors`)."""
    return None


def memory_vectors(conn: apsw.Connection, ids: Sequence[int]) -> dict[int, bytes]:
    """The vectors of the memory rows ``ids`` that have one."""
    rows = conn.execute(
        "SELECT memory_id, vector FROM memory_vectors"
        " WHERE memory_id IN (SELECT value FROM json_each(?))",
        (json.dumps(list(ids)),),
    )
    return {int(i): bytes(v) for i, v in rows}


def coverage(conn: apsw.Connection) -> Coverage:
    """How many messages and live memory rows there are, how many have a vector, and the
    recorded model (``fermix index status``, ``fermix doctor``)."""

    def count(sql: str) -> int:
        return int(fetch_value(conn, sql))

    recorded = model(conn)
    return Coverage(
        messages=count("SELECT count(*) FROM messages"),
        message_vectors=count("SELECT count(*) FROM message_vectors"),
        memories=count("SELECT count(*) FROM memories WHERE archived_at IS NULL"),
        memory_vectors=count(
            "SELECT count(*) FROM memory_vectors AS v JOIN memories AS m ON m.id = v.memory_id"
            " WHERE m.archived_at IS NULL"
        ),
        model=None if recorded is None else recorded[0],
        dim=None if recorded is None else recorded[1],
    )


def database_file(conn: apsw.Connection) -> str:
    """The path of the database file this session reads (to find its process's embedder)."""
    return str(conn.filename)
