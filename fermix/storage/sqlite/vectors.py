"""Vectors of messages and memory rows on SQLite: what its statements do their own way
(Q2; the rest is :mod:`fermix.storage.vectors`).

A batch of vectors is stored a statement per row (:func:`store_message_vectors`,
:func:`store_memory_vectors`: in-process, under the one writer); a search reads the vectors
of the scope it searches only (:func:`scope_vectors`: a conversation's messages or an
owner's by an index in the order the search wants). There is no approximate index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import apsw

from fermix.model import ConversationKey
from fermix.storage.port import (
    MAX_SCOPE_ROWS,
    NEAREST_ROWS,
    ScopeRows,
    StoredVector,
)
from fermix.storage.sqlite.connection import fetch_value
from fermix.storage.sqlite.messages import SearchScope
from fermix.storage.vectors import SCOPE_COLUMNS, VECTOR_JOIN, scope_rows, tally

# -- storing the background embedder's batches --------------------------------------------


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

    A conversation's rows come in the order of its index (``messages_conversation``), an
    owner's in that of ``messages_owner_order`` (schema migration 13: agent, owner, then a
    conversation's columns, time and id, and the sender), which holds every column read of
    them: no lookup of the row, no sort. Either read stops a scope too large at ``limit +
    1`` rows. The conversations are found by comparing the key columns of consecutive
    rows, so no object is made per row beyond the row's own values."""
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    if scope.indexed:
        order = "m.created_at, m.id"  # one conversation
    elif scope.tokens:
        order = "m.channel, m.chat_id, m.thread_scope, m.created_at, m.id"  # one agent's owner
    else:
        return None
    found: list[tuple[Any, ...]] = conn.execute(
        f"SELECT {SCOPE_COLUMNS} FROM messages AS m {VECTOR_JOIN} WHERE {scope.clause()}"
        f" ORDER BY {order} LIMIT ?",
        (*scope.params, limit + 1),
    ).fetchall()
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


def database_file(conn: apsw.Connection) -> str:
    """The path of the database file this session reads (to find its process's embedder)."""
    return str(conn.filename)
