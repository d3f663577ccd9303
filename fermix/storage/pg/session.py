"""The storage port's sessions on PostgreSQL: :class:`PgReads` and :class:`PgWrites`.

The same operation names, signatures and results as :class:`fermix.storage.Reads` and
:class:`fermix.storage.Writes`, for the table families of this slice (conversations,
messages, bearer tokens); each is one function of a PostgreSQL table-family module bound
to the session's connection, as on SQLite. ``tests/test_storage_contract.py`` checks the
signatures against the SQLite sessions and runs the same tests over both.
"""

from __future__ import annotations

from fermix.model import ConversationKey
from fermix.storage.pg import conversations as _conversations
from fermix.storage.pg import health as _health
from fermix.storage.pg import jobs as _jobs
from fermix.storage.pg import memories as _memories
from fermix.storage.pg import memory_relevance as _relevance
from fermix.storage.pg import messages as _messages
from fermix.storage.pg import resources as _resources
from fermix.storage.pg import tokens as _tokens
from fermix.storage.pg import vectors as _vectors
from fermix.storage.pg.connection import Conn
from fermix.storage.session import Op, Reads, Writes


class PgReads(Reads):
    """The read operations, on one pooled connection for the length of one unit."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    # conversations: state, window, review gates
    conversation = Op(_conversations.get)
    conversations = Op(_conversations.list_states)
    window = Op(_conversations.window)
    window_mark = Op(_conversations.window_mark)
    window_snapshot = Op(_conversations.window_snapshot)
    window_since = Op(_conversations.window_since)
    newest_user_message_id = Op(_conversations.newest_user_message_id)
    with_new_user_messages = Op(_conversations.with_new_user_messages)
    review_backlog = Op(_conversations.review_backlog)
    due_reviews = Op(_conversations.due_reviews)

    # messages
    message = Op(_messages.get)
    message_by_client_key = Op(_messages.by_client_key)
    messages = Op(_messages.conversation)
    count_messages = Op(_messages.count)
    search_messages = Op(_messages.search)

    # memory rows (pg/memories.py, pg/memory_relevance.py)
    row = Op(_memories.get)
    require_row = Op(_memories.require)
    row_by_key = Op(_memories.get_by_key)
    rows = Op(_memories.list_rows)
    search_rows = Op(_relevance.search)
    relevant_rows = Op(_relevance.relevant)
    memory_version = Op(_memories.change_counter)
    memory_agents = Op(_memories.agents)
    memory_owners = Op(_memories.owners)

    # sources, jobs and runs (pg/jobs.py)
    source = Op(_jobs.get_source)
    sources = Op(_jobs.list_sources)
    job = Op(_jobs.get_job)
    jobs = Op(_jobs.list_jobs)
    runs = Op(_jobs.list_runs)
    run = Op(_jobs.get_run)

    # prompt-file resources and their revisions (pg/resources.py)
    resource = Op(_resources.get_resource)
    resources = Op(_resources.list_resources)
    current_revision = Op(_resources.current)
    revision = Op(_resources.get_revision)
    revisions = Op(_resources.history)

    # the memory server's bearer tokens (N2)
    token = Op(_tokens.get)
    token_by_secret = Op(_tokens.by_secret)
    tokens = Op(_tokens.list_tokens)

    # health, for fermix doctor (pg/health.py)
    schema_version = Op(_health.schema_version)
    pending_migrations = Op(_health.pending_migrations)
    integrity_problems = Op(_health.integrity_problems)
    fts_problem = Op(_health.fts_problem)

    # vectors for recall (pg/vectors.py)
    embedding_model = Op(_vectors.model)
    messages_to_embed = Op(_vectors.messages_to_embed)
    memories_to_embed = Op(_vectors.memories_to_embed)
    token_counts = Op(_vectors.token_counts)
    scope_vectors = Op(_vectors.scope_vectors)
    nearest_messages = Op(_vectors.nearest_messages)
    memory_vectors = Op(_vectors.memory_vectors)
    vector_coverage = Op(_vectors.coverage)
    database_file = Op(_vectors.database_file)


class PgWrites(PgReads, Writes):
    """The write operations (and every read), inside one write transaction.

    :meth:`touch_known` skips a touch only within one transaction: a touch locks the
    conversation's row until the commit, so no other service can change its owner or trust
    meanwhile. The committer calls :meth:`forget` at the start of every transaction and
    after every rollback (there is no cheap "did another connection commit" on PostgreSQL,
    as SQLite's data version).
    """

    def __init__(self, conn: Conn) -> None:
        super().__init__(conn)
        self._known: dict[ConversationKey, tuple[str, str]] = {}

    # conversations
    touch_conversation = Op(_conversations.touch)
    update_conversation = Op(_conversations.update)
    claim_review = Op(_conversations.claim_review)
    claim_due_reviews = Op(_conversations.claim_due_reviews)
    finish_review = Op(_conversations.finish_review)
    release_review = Op(_conversations.release_review)
    fail_review = Op(_conversations.fail_review)
    release_expired_claims = Op(_conversations.release_expired_claims)

    # messages
    insert_message = Op(_messages.insert)

    # memory rows (pg/memories.py)
    upsert_row = Op(_memories.upsert)
    replace_row = Op(_memories.replace_value)
    archive_row = Op(_memories.archive)
    restore_row = Op(_memories.restore)

    # sources, jobs and runs (pg/jobs.py)
    ensure_source = Op(_jobs.ensure_source)
    create_job = Op(_jobs.create_job)
    start_run = Op(_jobs.start_run)
    finish_run = Op(_jobs.finish_run)

    # prompt-file revisions (pg/resources.py), and the lock of one (agent, owner)
    record_revision = Op(_resources.record)
    lock_owner = Op(_resources.lock_owner)

    # the memory server's bearer tokens (N2)
    insert_token = Op(_tokens.insert)
    revoke_token = Op(_tokens.revoke)

    # health (pg/health.py)
    rebuild_fts = Op(_health.rebuild_fts)

    # vectors for recall (pg/vectors.py)
    record_embedding_model = Op(_vectors.record_model)
    reset_vectors = Op(_vectors.reset)
    store_message_vectors = Op(_vectors.store_message_vectors)
    store_memory_vectors = Op(_vectors.store_memory_vectors)
