"""The approximate index of message vectors on PostgreSQL, where pgvector can be had (Q2).

``message_ann`` holds each stored message vector again as a ``halfvec`` of the recorded
model's dimension (its int8 values, exact in half precision; the cosine ignores the scale),
with copies of its message's agent, owner and conversation key, under an HNSW index: an HNSW
scan filters only on its own table's columns. It is a table of its own, deleted with its
vector (a foreign key), so ``message_vectors`` stays SQLite's. :func:`make` creates it (and
the extension, which is not a trusted one: that takes a superuser) inside a savepoint, so a
refusal leaves the recording unit whole and only logs; :func:`store` adds what a store
added; :data:`SETTINGS` let a filtered scan go on until it has its rows (pgvector >= 0.8,
``relaxed_order``: :func:`fermix.storage.postgres.vectors.nearest_messages` sorts them anyway).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Sequence

import psycopg

from fermix.storage.port import StoredVector
from fermix.storage.postgres.connection import Conn, execute, fetch_value

log = logging.getLogger(__name__)

MAX_ANN_DIM = 4_000
"""The largest dimension an HNSW index over ``halfvec`` takes."""
MIN_PGVECTOR = (0, 8)
"""The first pgvector whose filtered HNSW scan goes on until it has its rows."""
SETTINGS = (
    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('hnsw.ef_search', '200', true),"
    " set_config('hnsw.max_scan_tuples', '200000', true)"
)
"""For the transaction: a filtered search scans on until it has its rows, within a bound."""

_NOT_INDEXED = (
    psycopg.ProgrammingError,  # no right to create the extension; halfvec not on the path
    psycopg.NotSupportedError,
    psycopg.IntegrityError,  # another service created the extension at the same moment
    psycopg.DataError,
)


def dimension(conn: Conn) -> int | None:
    """The dimension of ``message_ann``, or None where there is none."""
    found = fetch_value(
        conn,
        "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass('message_ann')"
        " AND attname = 'ann' AND NOT attisdropped",
    )
    return None if found is None else int(found)


def make(conn: Conn, dim: int) -> bool:
    """Make ``message_ann`` for ``dim`` from the stored vectors, if pgvector can be had;
    returns whether it was. Anything refused leaves the transaction as it was."""
    if dim > MAX_ANN_DIM or not fetch_value(
        conn, "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"
    ):
        return False
    conn.execute("SAVEPOINT fermix_ann")
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        version = str(
            fetch_value(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        )
        if tuple(int(n) for n in version.split(".")[:2]) >= MIN_PGVECTOR:
            _create(conn, dim)
            conn.execute("RELEASE SAVEPOINT fermix_ann")
            return True
        reason: object = f"pgvector {version} is older than 0.8"
    except _NOT_INDEXED as exc:
        reason = exc
    conn.execute("ROLLBACK TO SAVEPOINT fermix_ann")
    conn.execute("RELEASE SAVEPOINT fermix_ann")
    log.info("no approximate vector index (a scope over the cap is searched lexically): %s", reason)
    return False


def _create(conn: Conn, dim: int) -> None:
    conn.execute("DROP TABLE IF EXISTS message_ann")
    conn.execute(
        "CREATE TABLE message_ann ("
        " message_id bigint PRIMARY KEY"
        " REFERENCES message_vectors (message_id) ON DELETE CASCADE,"
        " agent_id text NOT NULL, owner_id text NOT NULL, channel text NOT NULL,"
        f" chat_id text NOT NULL, thread_scope text NOT NULL, ann halfvec({dim}) NOT NULL)"
    )
    # The vectors stored before: each int8 byte as a signed number (x # 128 - 128).
    conn.execute(
        "INSERT INTO message_ann SELECT m.id, m.agent_id, m.owner_id, m.channel, m.chat_id,"
        " m.thread_scope, (SELECT array_agg((get_byte(v.vector, i) # 128) - 128 ORDER BY i)"
        " FROM generate_series(0, length(v.vector) - 1) AS i)::halfvec"
        " FROM message_vectors AS v JOIN messages AS m ON m.id = v.message_id"
        " WHERE length(v.vector) = %s AND v.vector <> decode(repeat('00', %s), 'hex')",
        (dim, dim),
    )
    conn.execute("CREATE INDEX message_ann_hnsw ON message_ann USING hnsw (ann halfvec_cosine_ops)")


def _literal(blob: bytes) -> str:
    """An int8 vector as a ``halfvec`` literal."""
    return "[" + ",".join(map(str, array("b", blob))) + "]"


def store(conn: Conn, stored: Sequence[StoredVector]) -> None:
    """Index the message vectors just ``stored``, where ``message_ann`` exists."""
    dim = dimension(conn)
    # A vector of another length has no place there; a zero one has no direction.
    kept = [s for s in stored if len(s.vector) == dim and any(s.vector)]
    if dim is None or not kept:
        return
    execute(
        conn,
        "INSERT INTO message_ann SELECT m.id, m.agent_id, m.owner_id, m.channel, m.chat_id,"
        " m.thread_scope, a.ann::halfvec FROM unnest(%s::bigint[], %s::text[]) AS a (id, ann)"
        " JOIN messages AS m ON m.id = a.id",
        ([s.id for s in kept], [_literal(s.vector) for s in kept]),
    )
