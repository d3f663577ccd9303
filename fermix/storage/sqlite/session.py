"""The SQLite adapter's sessions: the port's :class:`~fermix.storage.port.Reads`,
:class:`~fermix.storage.port.Writes`, :class:`~fermix.storage.port.Inspection` and
:class:`~fermix.storage.port.Repair`, each operation one function of a table-family module
bound to the unit's apsw connection.
"""

from __future__ import annotations

from typing import Any

from fermix.storage import port
from fermix.storage.operation import Op
from fermix.storage.sessions import SharedReads, SharedWrites
from fermix.storage.sql import Sql
from fermix.storage.sqlite import health as _health
from fermix.storage.sqlite import jobs as _jobs
from fermix.storage.sqlite import memories as _memories
from fermix.storage.sqlite import memory_relevance as _relevance
from fermix.storage.sqlite import messages as _messages
from fermix.storage.sqlite import resources as _resources
from fermix.storage.sqlite import vectors as _vectors
from fermix.storage.sqlite.sql import SqliteSql


class SqliteReads(SharedReads):
    """The read operations, on one connection for the length of one unit."""

    def shared_sql(self, conn: Any) -> Sql:
        return SqliteSql(conn)

    # messages: the search (the reads are shared)
    search_messages = Op(_messages.search)

    # memory rows
    row = Op(_memories.get)
    require_row = Op(_memories.require)
    row_by_key = Op(_memories.get_by_key)
    rows = Op(_memories.list_rows)
    search_rows = Op(_memories.search)
    relevant_rows = Op(_relevance.relevant)
    memory_version = Op(_memories.change_counter)
    memory_agents = Op(_memories.agents)
    memory_owners = Op(_memories.owners)

    # sources, jobs and runs
    source = Op(_jobs.get_source)
    sources = Op(_jobs.list_sources)
    job = Op(_jobs.get_job)
    jobs = Op(_jobs.list_jobs)
    runs = Op(_jobs.list_runs)
    run = Op(_jobs.get_run)

    # prompt-file resources and their revisions
    resource = Op(_resources.get_resource)
    resources = Op(_resources.list_resources)
    current_revision = Op(_resources.current)
    revision = Op(_resources.get_revision)
    revisions = Op(_resources.history)

    # health, for fermix doctor: schema version, integrity, FTS mirrors
    schema_version = Op(_health.schema_version)
    integrity_check_name = Op(_health.integrity_check_name)
    pending_migrations = Op(_health.pending_migrations)
    integrity_problems = Op(_health.integrity_problems)
    fts_problem = Op(_health.fts_problem)

    # vectors for recall (Q2): the recorded model, rows to embed, a scope's vectors
    embedding_model = Op(_vectors.model)
    messages_to_embed = Op(_vectors.messages_to_embed)
    memories_to_embed = Op(_vectors.memories_to_embed)
    token_counts = Op(_vectors.token_counts)
    scope_vectors = Op(_vectors.scope_vectors)
    nearest_messages = Op(_vectors.nearest_messages)  # None: no approximate index here
    memory_vectors = Op(_vectors.memory_vectors)
    vector_coverage = Op(_vectors.coverage)
    database_file = Op(_vectors.database_file)


class SqliteWrites(SqliteReads, SharedWrites):
    """The write operations (and every read), inside one write transaction.

    The database keeps one for its write connection, for every unit: the group commit calls
    :meth:`forget` after a rollback and when another connection (another process) committed,
    and every unit but an append starts by forgetting (:meth:`Database.write
    <fermix.storage.sqlite.database.Database.write>`).
    """

    # messages: the insert (the rest of the conversation's writes are shared)
    insert_message = Op(_messages.insert)

    # memory rows
    upsert_row = Op(_memories.upsert)
    replace_row = Op(_memories.replace_value)
    archive_row = Op(_memories.archive)
    restore_row = Op(_memories.restore)

    # sources, jobs and runs
    ensure_source = Op(_jobs.ensure_source)
    create_job = Op(_jobs.create_job)
    start_run = Op(_jobs.start_run)
    finish_run = Op(_jobs.finish_run)

    # prompt-file revisions, and the lock of one (agent, owner) for a rebuild
    record_revision = Op(_resources.record)
    lock_owner = Op(_resources.lock_owner)

    # health: an FTS mirror rebuilt from its content table (fermix doctor --fix)
    rebuild_fts = Op(_health.rebuild_fts)

    # vectors for recall (Q2)
    record_embedding_model = Op(_vectors.record_model)
    reset_vectors = Op(_vectors.reset)
    store_message_vectors = Op(_vectors.store_message_vectors)
    store_memory_vectors = Op(_vectors.store_memory_vectors)


def _satisfies_the_port(
    reads: SqliteReads, writes: SqliteWrites
) -> tuple[port.Inspection, port.Repair]:
    """Never called: mypy checks here that the sessions offer every operation of the port's
    Protocols, with their signatures."""
    return reads, writes
