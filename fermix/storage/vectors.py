"""Vectors of messages and memory rows, and the token counts their pooling needs (Q2, Q4):
what both adapters share, the statements written once (:class:`~fermix.storage.sql.Sql`).

``message_vectors`` and ``memory_vectors`` hold one int8 vector per row, beside the row
(deleted with it, dropped when its text changes); ``embedding_tokens`` counts the tokens of
each scope's embedded texts (``embedding_scopes`` names the scopes): a row's tokens are
added when its vector is stored (:func:`tally`) and taken out when fermix deletes the row or
changes its text (:func:`uncount`): they are those of the rows with a vector, no erased
text's (SQL from outside that edits a message leaves its old text's tokens counted);
``embedding_model`` records the model and dimension every stored vector is of.

The background embedder (:mod:`fermix.runtime.indexing`) finds the rows without a vector
(:func:`messages_to_embed`, :func:`memories_to_embed`), oldest first, and each adapter
stores a batch in one write. What each adapter keeps: how a batch is stored (SQLite's
statements per row, PostgreSQL's arrays in id order), how a search reads a scope (an
owner's messages by ``messages_owner_order`` or by ``messages_owner``), PostgreSQL's
approximate index and the locks under which its services record a model.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from fermix.clock import now_ms
from fermix.model import ConversationKey
from fermix.storage.port import (
    Coverage,
    PendingText,
    ScopeRows,
    StoredVector,
    conversation_scope,
    memory_scope,
)
from fermix.storage.sql import Sql

TOTAL = -1
"""The token id under which a scope's total token count is kept."""


SCOPE_COLUMNS = (
    "m.id, m.agent_id, m.channel, m.chat_id, m.thread_scope, m.sender, m.created_at, v.vector"
)
"""What a search reads of each message ``m`` of a scope and its vector ``v``: the rows of
:func:`scope_rows`."""


VECTOR_JOIN = "LEFT JOIN message_vectors AS v ON v.message_id = m.id"
"""Each message ``m`` with its vector ``v``, or NULL."""


def pending_messages(rows: Iterable[Sequence[Any]]) -> list[PendingText]:
    """The messages of rows (id, agent, channel, chat, thread, content) to embed (each
    conversation's scope made once: a batch is mostly one conversation's rows)."""
    scopes: dict[tuple[str, str, str, str], str] = {}
    pending = []
    for r in rows:
        where = (r[1], r[2], r[3], r[4])
        scope = scopes.get(where)
        if scope is None:
            scope = scopes[where] = conversation_scope(ConversationKey(*where))
        pending.append(PendingText(r[0], scope, r[5]))
    return pending


def pending_memories(rows: Iterable[Sequence[Any]]) -> list[PendingText]:
    """The memory rows of rows (id, agent, key, value) to embed."""
    return [PendingText(r[0], memory_scope(r[1]), memory_text(r[2], r[3])) for r in rows]


def tally(stored: Iterable[StoredVector]) -> dict[str, dict[int, int]]:
    """The token counts the vectors ``stored`` add, by scope: each token's occurrences and,
    under :data:`TOTAL`, all of them (a scope whose vectors have no tokens: empty)."""
    by_scope: dict[str, list[Sequence[int]]] = {}
    for item in stored:
        by_scope.setdefault(item.scope, []).append(item.tokens)
    added: dict[str, dict[int, int]] = {}
    for scope, texts in by_scope.items():
        counts = Counter(itertools.chain.from_iterable(texts))  # in C: under the write lock
        total = sum(map(len, texts))
        if total:
            counts[TOTAL] = total
        added[scope] = dict(counts)
    return added


_MESSAGE_TEXTS = (
    "SELECT m.id, m.agent_id, m.channel, m.chat_id, m.thread_scope, m.content"
    " FROM messages AS m JOIN message_vectors AS v ON v.message_id = m.id"
)
MEMORY_TEXTS = (
    "SELECT m.id, m.agent_id, m.key, m.value FROM memories AS m"
    " JOIN memory_vectors AS v ON v.memory_id = m.id"
)
"""The rows of :func:`pending_memories` of the memory rows ``m`` that have a vector (their
tokens are counted), to be completed by a ``WHERE``: what :func:`uncount` takes out."""


def uncount_messages(sql: Sql, ids: Sequence[int]) -> None:
    """Take the tokens of those of the messages ``ids`` that have a vector out of their
    conversations' counts; called in the transaction that deletes them (an erasure, a
    retention sweep), before it does (:func:`uncount`)."""
    uncount(sql, pending_messages(_with_vectors(sql, _MESSAGE_TEXTS, ids)))


def uncount_memories(sql: Sql, ids: Sequence[int]) -> None:
    """Take the tokens of those of the memory rows ``ids`` that have a vector out of their
    agents' counts; called before they are deleted, or their text changed (which drops
    their vector: it is embedded, and counted, again) (:func:`uncount`)."""
    uncount(sql, pending_memories(_with_vectors(sql, MEMORY_TEXTS, ids)))


def _with_vectors(sql: Sql, select: str, ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """The rows ``select`` reads of the rows ``m`` with an id of ``ids``."""
    items = sql.dialect.json_items
    return sql.rows(
        f"{select} WHERE m.id IN (SELECT CAST(value AS BIGINT) FROM {items})",
        (json.dumps(list(ids)),),
    )


def uncount(sql: Sql, gone: Sequence[PendingText]) -> None:
    """Take the tokens of the texts ``gone`` (each of a row that has a vector, so counted)
    out of their scopes' counts, and drop a token's row once it counts nothing (F3: an
    erased text leaves no token behind, not even as a count of its scope).

    The counts are of the tokens of every row with a vector (:func:`tally` of what was
    stored); a row's tokens are its text's, as the embedder tokenizes it, so they are
    computed again here. Only the offline model counts tokens: with another recorded (or
    none), there is nothing to take out."""
    if not gone:
        return
    from fermix.embedding import WordLlamaEmbedder  # loaded only where counts exist

    found = model(sql)
    if found is None or found[0] != WordLlamaEmbedder.name:
        return
    tokens = WordLlamaEmbedder().tokens([g.text for g in gone])
    counted = tally(StoredVector(g.id, g.scope, b"", t) for g, t in zip(gone, tokens, strict=True))
    items = sql.dialect.json_items
    for scope, counts in counted.items():
        scope_id = sql.value("SELECT id FROM embedding_scopes WHERE name = ?", (scope,))
        if scope_id is None or not counts:
            continue
        by_count: dict[int, list[int]] = {}
        for token, n in counts.items():
            by_count.setdefault(n, []).append(token)
        for n, same in by_count.items():  # one statement per count, not per token
            sql.run(
                "UPDATE embedding_tokens SET count = count - ? WHERE scope_id = ?"
                f" AND token IN (SELECT CAST(value AS BIGINT) FROM {items})",
                (n, scope_id, json.dumps(same)),
            )
        sql.run(  # only a token just taken out can have reached nothing
            "DELETE FROM embedding_tokens WHERE scope_id = ? AND count <= 0"
            f" AND token IN (SELECT CAST(value AS BIGINT) FROM {items})",
            (scope_id, json.dumps(list(counts))),
        )


def split_total(rows: Iterable[Sequence[Any]]) -> tuple[dict[int, int], int]:
    """Rows (token, count) as :func:`token_counts` returns them: the counts of the tokens,
    and the :data:`TOTAL`."""
    counts = {int(token): int(n) for token, n in rows}
    total = counts.pop(TOTAL, 0)
    return counts, total


def scope_rows(found: Sequence[tuple[Any, ...]]) -> ScopeRows:
    """Rows of (id, agent, channel, chat, thread, sender, created_at, vector), sorted by
    conversation, time and id, as :class:`ScopeRows`."""
    if not found:
        return ScopeRows((), (), (), (), (), ())
    # One column at a time, by C-level maps over the rows: zip(*found) would hold an
    # iterator per row, which the garbage collector tracks and, caught by a collection
    # mid-way, promotes to its oldest generation, whose full collections then come every
    # few dozen searches of an owner (bench/recall.py at 1,000,000 messages).
    columns = (tuple(map(operator.itemgetter(k), found)) for k in range(len(found[0])))
    ids, agents, channels, chats, threads, senders, created_at, blobs = columns
    n = len(ids)
    # Row i > 0 starts a conversation when one of its key columns differs from row i - 1's
    # (C-level maps: no Python frame, no object per row).
    a, b, c, d = (map(operator.ne, col[1:], col[:-1]) for col in (agents, channels, chats, threads))
    moved = map(operator.or_, map(operator.or_, a, b), map(operator.or_, c, d))
    starts = [0, *itertools.compress(range(1, n), moved)]
    conversations = [(agents[i], channels[i], chats[i], threads[i]) for i in starts]
    return ScopeRows(ids, senders, created_at, blobs, conversations, starts)


def memory_text(key: str, value: str) -> str:
    """The text of a memory row that is embedded: its key's words and its value."""
    return f"{key.replace('_', ' ')}: {value}"


# -- the recorded model ------------------------------------------------------------------

MODEL = "SELECT model, dim FROM embedding_model WHERE id = 1"
"""The recorded model's row (PostgreSQL adds a row lock to it inside a write unit)."""


def recorded(rows: Sequence[Sequence[Any]]) -> tuple[str, int] | None:
    """The model and dimension of the rows of :data:`MODEL`, or None."""
    return (str(rows[0][0]), int(rows[0][1])) if rows else None


def model(sql: Sql) -> tuple[str, int] | None:
    """The model and dimension of the stored vectors, or None before any."""
    return recorded(sql.rows(MODEL))


def record_model(sql: Sql, name: str, dim: int, *, now: int | None = None) -> bool:
    """Record ``name`` and ``dim`` as the vectors' model; when another was recorded, every
    vector and token count is dropped first (they are all computed again). Returns whether
    anything changed."""
    if model(sql) == (name, dim):
        return False
    reset(sql)
    write_model(sql, name, dim, now=now)
    return True


def write_model(sql: Sql, name: str, dim: int, *, now: int | None = None) -> None:
    """Make ``name`` and ``dim`` the recorded model, whatever was recorded before."""
    sql.run(
        "INSERT INTO embedding_model (id, model, dim, recorded_at) VALUES (1, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET model = excluded.model, dim = excluded.dim,"
        " recorded_at = excluded.recorded_at",
        (name, dim, now_ms() if now is None else now),
    )


def reset(sql: Sql) -> None:
    """Drop every vector and token count (``fermix index rebuild``, a model change; on
    PostgreSQL the approximate index's rows go with their vectors)."""
    for table in ("message_vectors", "memory_vectors", "embedding_tokens", "embedding_scopes"):
        sql.run(f"DELETE FROM {table}")


# -- the background embedder's work -------------------------------------------------------


def messages_to_embed(sql: Sql, *, after_id: int, limit: int) -> list[PendingText]:
    """Messages with id > ``after_id`` that have no vector, oldest first."""
    rows = sql.rows(
        "SELECT m.id, m.agent_id, m.channel, m.chat_id, m.thread_scope, m.content"
        " FROM messages AS m WHERE m.id > ?"
        " AND NOT EXISTS (SELECT 1 FROM message_vectors AS v WHERE v.message_id = m.id)"
        " ORDER BY m.id LIMIT ?",
        (after_id, limit),
    )
    return pending_messages(rows)


def memories_to_embed(sql: Sql, *, after_id: int, limit: int) -> list[PendingText]:
    """Live memory rows with id > ``after_id`` that have no vector, oldest first."""
    rows = sql.rows(
        "SELECT m.id, m.agent_id, m.key, m.value FROM memories AS m"
        " WHERE m.id > ? AND m.archived_at IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM memory_vectors AS v WHERE v.memory_id = m.id)"
        " ORDER BY m.id LIMIT ?",
        (after_id, limit),
    )
    return pending_memories(rows)


# -- what a search reads ------------------------------------------------------------------


def token_counts(
    sql: Sql, scopes: Iterable[str], tokens: Iterable[int]
) -> tuple[dict[int, int], int]:
    """The counts of ``tokens`` summed over ``scopes``, and those scopes' total."""
    items = sql.dialect.json_items
    rows = sql.rows(
        "SELECT t.token, sum(t.count) FROM embedding_tokens AS t"
        " JOIN embedding_scopes AS s ON s.id = t.scope_id"
        f" WHERE s.name IN (SELECT value FROM {items})"
        f" AND t.token IN (SELECT CAST(value AS BIGINT) FROM {items}) GROUP BY t.token",
        (json.dumps(sorted(set(scopes))), json.dumps(sorted({*tokens, TOTAL}))),
    )
    return split_total(rows)


def memory_vectors(sql: Sql, ids: Sequence[int]) -> dict[int, bytes]:
    """The vectors of the memory rows ``ids`` that have one."""
    rows = sql.rows(
        "SELECT memory_id, vector FROM memory_vectors"
        f" WHERE memory_id IN (SELECT CAST(value AS BIGINT) FROM {sql.dialect.json_items})",
        (json.dumps(list(ids)),),
    )
    return {int(i): bytes(v) for i, v in rows}


def coverage(sql: Sql) -> Coverage:
    """How many messages and live memory rows there are, how many have a vector, and the
    recorded model (``fermix index status``, ``fermix doctor``)."""
    row = sql.rows(
        "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM message_vectors),"
        " (SELECT count(*) FROM memories WHERE archived_at IS NULL),"
        " (SELECT count(*) FROM memory_vectors AS v JOIN memories AS m ON m.id = v.memory_id"
        "  WHERE m.archived_at IS NULL)",
    )[0]
    found = model(sql)
    return Coverage(
        messages=int(row[0]),
        message_vectors=int(row[1]),
        memories=int(row[2]),
        memory_vectors=int(row[3]),
        model=None if found is None else found[0],
        dim=None if found is None else found[1],
    )
