"""The PostgreSQL adapter's sessions: the port's :class:`~fermix.storage.port.Reads`,
:class:`~fermix.storage.port.Writes`, :class:`~fermix.storage.port.Inspection` and
:class:`~fermix.storage.port.Repair`, each operation one function of a table-family module
bound to the unit's psycopg connection.
"""

from __future__ import annotations

from typing import Any

from fermix.storage import port
from fermix.storage.operation import Op, SqlOp
from fermix.storage.postgres import conversations as _conversations
from fermix.storage.postgres import health as _health
from fermix.storage.postgres import memories as _memories
from fermix.storage.postgres import memory_relevance as _relevance
from fermix.storage.postgres import messages as _messages
from fermix.storage.postgres import migrations as _migrations
from fermix.storage.postgres import vectors as _vectors
from fermix.storage.postgres.sql import PgSql
from fermix.storage.sessions import SharedReads, SharedWrites
from fermix.storage.sql import Sql


class PgReads(SharedReads):
    """The read operations, on one pooled connection for the length of one unit."""

    def shared_sql(self, conn: Any) -> Sql:
        return PgSql(conn)

    # messages: the search (the reads are shared)
    search_messages = Op(_messages.search)

    # memory rows: their search by text (stems) and change counters
    search_rows = SqlOp(_relevance.search)
    relevant_rows = SqlOp(_relevance.relevant)
    memory_version = Op(_memories.change_counter)

    # health, for fermix doctor (postgres/health.py)
    schema_version = Op(_migrations.current_version)
    integrity_check_name = Op(_health.integrity_check_name)
    pending_migrations = Op(_migrations.pending_count)
    integrity_problems = Op(_health.integrity_problems)
    fts_problem = Op(_health.fts_problem)

    # vectors for recall (postgres/vectors.py)
    embedding_model = Op(_vectors.model)
    messages_to_embed = SqlOp(_vectors.messages_to_embed)  # with their look back
    memories_to_embed = SqlOp(_vectors.memories_to_embed)
    scope_vectors = Op(_vectors.scope_vectors)
    nearest_messages = Op(_vectors.nearest_messages)
    database_file = Op(_vectors.database_file)


class PgWrites(PgReads, SharedWrites):
    """The write operations (and every read), inside one write transaction.

    :meth:`touch_known` skips a touch only within one transaction: a touch locks the
    conversation's row until the commit, so no other service can change its owner or trust
    meanwhile. The committer calls :meth:`drop_known` at the start of every transaction and
    after every rollback (there is no cheap "did another connection commit" on PostgreSQL,
    as SQLite's data version).
    """

    # conversations: a review locks its row before it reads the backlog
    finish_review = SqlOp(_conversations.finish_review)
    release_review = SqlOp(_conversations.release_review)

    # messages: the insert (the rest of the conversation's writes are shared)
    insert_message = Op(_messages.insert)

    # health (postgres/health.py)
    rebuild_fts = Op(_health.rebuild_fts)

    # vectors for recall (postgres/vectors.py)
    record_embedding_model = Op(_vectors.record_model)
    store_message_vectors = Op(_vectors.store_message_vectors)
    store_memory_vectors = Op(_vectors.store_memory_vectors)


def _satisfies_the_port(reads: PgReads, writes: PgWrites) -> tuple[port.Inspection, port.Repair]:
    """Never called: mypy checks here that the sessions offer every operation of the port's
    Protocols, with their signatures."""
    return reads, writes
