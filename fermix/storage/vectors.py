"""Vectors of messages and memory rows, and the token counts their pooling needs (Q2, Q4).

Schema migration 8: ``message_vectors`` and ``memory_vectors`` hold one int8 BLOB per row,
beside the row (deleted with it, dropped when its text changes); ``embedding_tokens`` counts
the tokens of each scope's embedded texts (``embedding_scopes`` names the scopes);
``embedding_model`` records the model and dimension every stored vector is of.

The background embedder (:mod:`fermix.runtime.embedding`) finds the rows without a vector
(:func:`messages_to_embed`, :func:`memories_to_embed`), oldest first, and stores a batch
(:func:`store_message_vectors`, :func:`store_memory_vectors`) in one write; a search reads
the vectors of the scope it searches only (:func:`scope_vectors`: a conversation by its
index, an owner's messages by their FTS5 scope token).
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.model import ConversationKey
from fermix.storage.connection import fetch_value
from fermix.storage.messages import SearchScope

TOTAL = -1
"""The token id under which a scope's total token count is kept."""
MAX_SCOPE_ROWS = 50_000
"""The most rows of one scope a vector search reads; a larger scope is searched lexically."""
NEAREST_ROWS = 1_000
"""The messages an approximate search of a scope too large to read returns by default."""
SCOPE_COLUMNS = (
    "m.id, m.agent_id, m.channel, m.chat_id, m.thread_scope, m.sender, m.created_at, v.vector"
)
"""What a search reads of each message ``m`` of a scope and its vector ``v``: the rows of
:func:`scope_rows`."""
VECTOR_JOIN = "LEFT JOIN message_vectors AS v ON v.message_id = m.id"
"""Each message ``m`` with its vector ``v``, or NULL."""


def conversation_scope(key: ConversationKey) -> str:
    """The token-count scope of conversation ``key``'s messages."""
    return "c\x1f" + "\x1f".join(key.as_tuple())


def memory_scope(agent_id: str) -> str:
    """The token-count scope of ``agent_id``'s memory rows."""
    return "m\x1f" + agent_id


@dataclass(frozen=True, slots=True)
class PendingText:
    """A row without a vector: its id, its token-count scope and the text to embed."""

    id: int
    scope: str
    text: str


@dataclass(frozen=True, slots=True)
class StoredVector:
    """A vector to store for row ``id``, and the tokens it adds to ``scope``'s counts."""

    id: int
    scope: str
    vector: bytes
    tokens: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class ScopeRows:
    """The messages of a searched scope as fusion needs them, by conversation, time and id:
    one sequence per column rather than an object per row (a scope has thousands).

    Row ``i`` is message ``ids[i]`` of conversation ``conversations[k]`` for the last ``k``
    with ``starts[k] <= i``; ``vectors[i]`` is None when it has no vector yet."""

    ids: Sequence[int]
    senders: Sequence[str]
    created_at: Sequence[int]
    vectors: Sequence[bytes | None]
    conversations: Sequence[tuple[str, str, str, str]]
    """The scope's conversations (agent, channel, chat, thread), in order."""
    starts: Sequence[int]
    """The row each of ``conversations`` starts at (the first is 0)."""

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class Coverage:
    """How many rows have a vector, and of what model."""

    messages: int
    message_vectors: int
    memories: int
    memory_vectors: int
    model: str | None
    dim: int | None


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


def pending_messages(rows: Iterable[Sequence[Any]]) -> list[PendingText]:
    """The messages of rows (id, agent, channel, chat, thread, content) to embed."""
    return [
        PendingText(r[0], conversation_scope(ConversationKey(r[1], r[2], r[3], r[4])), r[5])
        for r in rows
    ]


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


def pending_memories(rows: Iterable[Sequence[Any]]) -> list[PendingText]:
    """The memory rows of rows (id, agent, key, value) to embed."""
    return [PendingText(r[0], memory_scope(r[1]), memory_text(r[2], r[3])) for r in rows]


def memory_text(key: str, value: str) -> str:
    """The text of a memory row that is embedded: its key's words and its value."""
    return f"{key.replace('_', ' ')}: {value}"


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


def tally(stored: Iterable[StoredVector]) -> dict[str, dict[int, int]]:
    """The token counts the vectors ``stored`` add, by scope: each token's occurrences and,
    under :data:`TOTAL`, all of them (a scope whose vectors have no tokens: empty)."""
    added: dict[str, dict[int, int]] = {}
    for item in stored:
        counts = added.setdefault(item.scope, {})
        for token in item.tokens:
            counts[token] = counts.get(token, 0) + 1
        if item.tokens:
            counts[TOTAL] = counts.get(TOTAL, 0) + len(item.tokens)
    return added


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


def split_total(rows: Iterable[Sequence[Any]]) -> tuple[dict[int, int], int]:
    """Rows (token, count) as :func:`token_counts` returns them: the counts of the tokens,
    and the :data:`TOTAL`."""
    counts = {int(token): int(n) for token, n in rows}
    total = counts.pop(TOTAL, 0)
    return counts, total


# -- what a search reads ------------------------------------------------------------------


def scope_vectors(
    conn: apsw.Connection,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = MAX_SCOPE_ROWS,
) -> ScopeRows | None:
    """Every message of the scope :func:`fermix.storage.messages.search` would search, with
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


def scope_rows(found: Sequence[tuple[Any, ...]]) -> ScopeRows:
    """Rows of (id, agent, channel, chat, thread, sender, created_at, vector), sorted by
    conversation, time and id, as :class:`ScopeRows`."""
    if not found:
        return ScopeRows((), (), (), (), (), ())
    ids, agents, channels, chats, threads, senders, created_at, blobs = zip(*found, strict=True)
    n = len(ids)
    # Row i > 0 starts a conversation when one of its key columns differs from row i - 1's
    # (C-level maps: no Python frame, no object per row).
    a, b, c, d = (map(operator.ne, col[1:], col[:-1]) for col in (agents, channels, chats, threads))
    moved = map(operator.or_, map(operator.or_, a, b), map(operator.or_, c, d))
    starts = [0, *itertools.compress(range(1, n), moved)]
    conversations = [(agents[i], channels[i], chats[i], threads[i]) for i in starts]
    return ScopeRows(ids, senders, created_at, blobs, conversations, starts)


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
    :func:`scope_vectors` lexically (PostgreSQL with pgvector: :mod:`fermix.storage.pg.vectors`)."""
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
