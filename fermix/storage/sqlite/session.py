"""The SQLite adapter's sessions: the port's :class:`~fermix.storage.port.Reads`,
:class:`~fermix.storage.port.Writes`, :class:`~fermix.storage.port.Inspection` and
:class:`~fermix.storage.port.Repair`, each operation one function of a table-family module
bound to the unit's apsw connection.
"""

from __future__ import annotations

from typing import Any

from fermix.storage import port
from fermix.storage import vectors as _shared_vectors
from fermix.storage.operation import Op, SqlOp
from fermix.storage.sessions import SharedReads, SharedWrites
from fermix.storage.sql import Sql
from fermix.storage.sqlite import health as _health
from fermix.storage.sqlite import memories as _memories
from fermix.storage.sqlite import memory_relevance as _relevance
from fermix.storage.sqlite import messages as _messages
from fermix.storage.sqlite import migrations as _migrations
from fermix.storage.sqlite import vectors as _vectors
from fermix.storage.sqlite.sql import SqliteSql


class SqliteReads(SharedReads):
    """The read operations, on one connection for the length of one unit."""

    def shared_sql(self, conn: Any) -> Sql:
        return SqliteSql(conn)

    # messages: the search (the reads are shared)
    search_messages = Op(_messages.search)

    # memory rows: their search by text (FTS5) and change counter
    search_rows = Op(_relevance.search)
    relevant_rows = Op(_relevance.relevant)
    memory_version = Op(_memories.change_counter)

    # health, for fermix doctor: schema version, integrity, FTS mirrors
    schema_version = Op(_migrations.current_version)
    integrity_check_name = Op(_health.integrity_check_name)
    pending_migrations = Op(_migrations.pending_count)
    integrity_problems = Op(_health.integrity_problems)
    fts_problem = Op(_health.fts_problem)

    # vectors for recall (Q2): the recorded model, rows to embed, a scope's vectors
    embedding_model = SqlOp(_shared_vectors.model)
    messages_to_embed = SqlOp(_shared_vectors.messages_to_embed)
    memories_to_embed = SqlOp(_shared_vectors.memories_to_embed)
    scope_vectors = Op(_vectors.scope_vectors)
    nearest_messages = Op(_vectors.nearest_messages)  # None: no approximate index here
    database_file = Op(_vectors.database_file)


class SqliteWrites(SqliteReads, SharedWrites):
    """The write operations (and every read), inside one write transaction.

    The database keeps one for its write connection, for every unit: the group commit calls
    :meth:`drop_known` after a rollback and when another connection (another process) committed,
    and every unit but an append starts by forgetting (:meth:`Database.write
    <fermix.storage.sqlite.database.Database.write>`).
    """

    # messages: the insert (the rest of the conversation's writes are shared)
    insert_message = Op(_messages.insert)

    # health: an FTS mirror rebuilt from its content table (fermix doctor --fix)
    rebuild_fts = Op(_health.rebuild_fts)

    # vectors for recall (Q2)
    record_embedding_model = SqlOp(_shared_vectors.record_model)
    store_message_vectors = Op(_vectors.store_message_vectors)
    store_memory_vectors = Op(_vectors.store_memory_vectors)


def _satisfies_the_port(
    reads: SqliteReads, writes: SqliteWrites
) -> tuple[port.Inspection, port.Repair]:
    """Never called: mypy checks here that the sessions offer every operation of the port's
    Protocols, with their signatures."""
    return reads, writes
