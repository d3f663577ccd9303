"""Vectors of messages and memory rows on PostgreSQL: what its statements do their own way
(Q2; the rest is :mod:`fermix.storage.vectors`), and an approximate search where pgvector
can be had.

The int8 ``bytea`` vectors, the token counts and the recorded model are SQLite's (migration 4
of ``postgres/schema.sql``), so :func:`scope_vectors` reads the same rows and the fusion in Python
gives the same results with or without pgvector. What SQLite's single writer hid is explicit:

- **Ids commit out of order across conversations** (a message's id is drawn under its
  conversation's row lock, ``messages_bi``): a row may become visible after the embedder's
  cursor passed its id. :func:`messages_to_embed` and :func:`memories_to_embed` keep the
  anti-join and look again at the :data:`LOOKBACK` ids below the cursor, so such a row is
  found by the next batch; the embedder's rescan from the first row
  (:attr:`fermix.runtime.indexing.Indexer.rescan_s`) covers a transaction held open longer.
  A row below the cursor whose vector was dropped (its text changed) is found there too,
  where SQLite waits for that rescan.
- **The model and its vectors change together.** Inside a write unit :func:`model` reads the
  recorded model ``FOR SHARE``, and :func:`record_model` locks it ``FOR UPDATE`` before it
  drops anything: a unit that checked the model and then stores vectors commits before a
  model change deletes them; vectors of an old model never outlive the change.
- **Two services storing at once** insert in id order and upsert token counts in key order,
  so their batches never deadlock; a vector another service stored first is skipped.

**The approximate index** (:mod:`fermix.storage.postgres.vector_index`). Where ``CREATE
EXTENSION vector`` works, or the extension is installed, :func:`record_model` also makes
``message_ann``, the stored message vectors under an HNSW index, for the model's dimension (a
model change drops it and makes it again; a model recorded before pgvector came is indexed
at its next record), and :func:`store_message_vectors` adds to it. :func:`nearest_messages`
searches it, filtered to the scope, and still returns ``limit`` rows: recall's way into a
scope above :data:`~fermix.storage.port.MAX_SCOPE_ROWS`, where :func:`scope_vectors` gives
None. **Without pgvector** (not installed, no right to create it: it is not a trusted
extension, or a dimension above :data:`~fermix.storage.postgres.vector_index.MAX_ANN_DIM`) there is
no ``message_ann``, :func:`nearest_messages` returns None, and a scope above the cap is
searched lexically only, as on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from psycopg import pq
from psycopg.conninfo import make_conninfo

from fermix.model import ConversationKey
from fermix.storage import vectors
from fermix.storage.port import (
    MAX_SCOPE_ROWS,
    NEAREST_ROWS,
    PendingText,
    ScopeRows,
    StoredVector,
)
from fermix.storage.postgres import vector_index
from fermix.storage.postgres.connection import Conn, execute, fetch_rows
from fermix.storage.postgres.messages import SearchScope
from fermix.storage.postgres.sql import PgSql
from fermix.storage.sql import Sql
from fermix.storage.vectors import SCOPE_COLUMNS, VECTOR_JOIN, scope_rows, tally

LOOKBACK = 10_000
"""How many ids below its cursor the embedder looks again for rows without a vector."""
MODEL_LOCK = 8210816
"""The advisory lock key under which a model is recorded (services starting together)."""
_IDLE = pq.TransactionStatus.IDLE
_KEY_ORDER = (
    'agent_id COLLATE "C", channel COLLATE "C", chat_id COLLATE "C", thread_scope COLLATE "C"'
)

# -- the recorded model ------------------------------------------------------------------


def model(conn: Conn) -> tuple[str, int] | None:
    """The model and dimension of the stored vectors, or None before any. Inside a write
    unit the row is read ``FOR SHARE``: a model change waits until the unit commits."""
    in_unit = conn.info.transaction_status != _IDLE
    return vectors.recorded(fetch_rows(conn, vectors.MODEL + (" FOR SHARE" if in_unit else "")))


def record_model(conn: Conn, name: str, dim: int, *, now: int | None = None) -> bool:
    """Record ``name`` and ``dim`` as the vectors' model; when another was recorded, every
    vector and token count is dropped first (they are all computed again). Returns whether
    anything changed. Where pgvector can be had, the approximate index is made for ``dim``."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MODEL_LOCK,))
    changed = vectors.recorded(fetch_rows(conn, vectors.MODEL + " FOR UPDATE")) != (name, dim)
    if changed:
        sql = PgSql(conn)
        execute(conn, "DROP TABLE IF EXISTS message_ann")
        vectors.reset(sql)
        vectors.write_model(sql, name, dim, now=now)
    if vector_index.dimension(conn) != dim:
        vector_index.make(conn, dim)
    return changed


# -- the background embedder's work -------------------------------------------------------


def messages_to_embed(sql: Sql, *, after_id: int, limit: int) -> list[PendingText]:
    """Messages without a vector, oldest first: those with id > ``after_id``, and those of
    the :data:`LOOKBACK` ids below it (committed after the cursor passed them)."""
    return vectors.messages_to_embed(sql, after_id=after_id - LOOKBACK, limit=limit)


def memories_to_embed(sql: Sql, *, after_id: int, limit: int) -> list[PendingText]:
    """Live memory rows without a vector, oldest first, from :data:`LOOKBACK` ids below
    ``after_id`` on."""
    return vectors.memories_to_embed(sql, after_id=after_id - LOOKBACK, limit=limit)


def _count_tokens(conn: Conn, stored: Iterable[StoredVector]) -> None:
    added = tally(stored)
    names = sorted(scope for scope, counts in added.items() if counts)
    if not names:
        return
    execute(
        conn,
        "INSERT INTO embedding_scopes (name) SELECT unnest(%s::text[])"
        " ON CONFLICT (name) DO NOTHING",
        (names,),
    )
    ids: dict[str, int] = dict(
        fetch_rows(conn, "SELECT name, id FROM embedding_scopes WHERE name = ANY(%s)", (names,))
    )
    # In key order, so two services' batches lock the rows they share in the same order.
    rows = sorted((ids[name], token, n) for name in names for token, n in added[name].items())
    execute(
        conn,
        "INSERT INTO embedding_tokens (scope_id, token, count)"
        " SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[])"
        " ON CONFLICT (scope_id, token)"
        " DO UPDATE SET count = embedding_tokens.count + excluded.count",
        tuple(map(list, zip(*rows, strict=True))),
    )


def _store(
    conn: Conn, table: str, column: str, parent: str, items: Iterable[StoredVector]
) -> list[StoredVector]:
    first: dict[int, StoredVector] = {}
    for item in items:
        first.setdefault(item.id, item)  # as SQLite: the first vector given for a row
    if not first:
        return []
    ordered = sorted(first)  # in id order: two services' batches never deadlock
    added = {
        int(r[0])
        for r in fetch_rows(
            conn,
            f"INSERT INTO {table} ({column}, vector)"
            " SELECT i.id, i.vector FROM unnest(%s::bigint[], %s::bytea[]) AS i (id, vector)"
            f" WHERE EXISTS (SELECT 1 FROM {parent} AS p WHERE p.id = i.id)"
            f" ON CONFLICT ({column}) DO NOTHING RETURNING {column}",
            (ordered, [first[i].vector for i in ordered]),
        )
    }
    stored = [item for item in first.values() if item.id in added]
    _count_tokens(conn, stored)
    return stored


def store_message_vectors(conn: Conn, items: Iterable[StoredVector]) -> int:
    """Store each message's vector unless it has one or is gone; count its tokens in its
    scope, and index it where the approximate index exists. Returns how many were stored."""
    stored = _store(conn, "message_vectors", "message_id", "messages", items)
    vector_index.store(conn, stored)
    return len(stored)


def store_memory_vectors(conn: Conn, items: Iterable[StoredVector]) -> int:
    """Store each memory row's vector unless it has one or is gone; count its tokens."""
    return len(_store(conn, "memory_vectors", "memory_id", "memories", items))


# -- what a search reads ------------------------------------------------------------------


def scope_vectors(
    conn: Conn,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = MAX_SCOPE_ROWS,
) -> ScopeRows | None:
    """Every message of the scope :func:`fermix.storage.postgres.messages.search` would search,
    with its vector or None, by conversation (bytewise, as SQLite), time and id; None when
    the scope has more than ``limit`` messages or no index to read it by (an agent, the
    whole table). A conversation is read by its index, an owner by ``messages_owner``."""
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    select = f"SELECT {SCOPE_COLUMNS} FROM messages AS m {VECTOR_JOIN} WHERE {scope.clause()}"
    if scope.indexed:
        sql = f"{select} ORDER BY m.created_at, m.id LIMIT %s"
    elif scope.tokens:
        # Sorted after the LIMIT, so a scope too large stops the read at limit + 1 rows.
        sql = f"SELECT * FROM ({select} LIMIT %s) AS s ORDER BY {_KEY_ORDER}, created_at, id"
    else:
        return None
    found = fetch_rows(conn, sql, (*scope.params, limit + 1))
    if len(found) > limit:
        return None
    return scope_rows(found)


def nearest_messages(
    conn: Conn,
    query: Sequence[float],
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = NEAREST_ROWS,
    include: Sequence[int] = (),
) -> ScopeRows | None:
    """The ``limit`` messages of the scope whose vectors are (about) nearest ``query``, and
    the scope's messages ``include`` (the full-text candidates), as :func:`scope_vectors`
    gives them; None where there is no approximate index, or it is of another dimension
    than ``query``'s, or ``query`` is all zeros."""
    dim = vector_index.dimension(conn)
    if dim is None or len(query) != dim or not any(query):
        return None
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    clause = scope.clause()
    sql = (
        "WITH near AS MATERIALIZED (SELECT m.message_id FROM message_ann AS m"
        f" WHERE {clause} ORDER BY m.ann <=> %s::halfvec LIMIT %s)"
        f" SELECT {SCOPE_COLUMNS} FROM messages AS m {VECTOR_JOIN}"
        " WHERE m.id = ANY(ARRAY(SELECT message_id FROM near) || %s::bigint[])"
        f" AND {clause} ORDER BY {_KEY_ORDER}, m.created_at, m.id"
    )
    vector = "[" + ",".join(repr(float(x)) for x in query) + "]"
    params = (*scope.params, vector, limit, list(include), *scope.params)
    own = conn.info.transaction_status == _IDLE
    if own:  # a read unit: a transaction of its own for the settings (in a unit: the unit's)
        conn.execute("BEGIN READ ONLY")
    try:
        conn.execute(vector_index.SETTINGS)
        found = fetch_rows(conn, sql, params)
    except BaseException:
        if own and not conn.broken:
            conn.execute("ROLLBACK")
        raise
    if own:
        conn.execute("COMMIT")
    return scope_rows(found)


def database_file(conn: Conn) -> str:
    """The database this session reads, without its password (the key under which its
    process's embedder is found): the same for every connection of the process."""
    info = conn.info
    return "postgresql:" + make_conninfo(
        dbname=info.dbname, host=info.host, port=info.port, user=info.user
    )
