"""The sessions' operations written once for both adapters: each binds a function of a
shared table-family module to the session's :class:`~fermix.storage.sql.Sql`.

Each adapter's sessions (:mod:`fermix.storage.sqlite.session`,
:mod:`fermix.storage.postgres.session`) derive from :class:`SharedReads` and
:class:`SharedWrites` and bind only the operations whose SQL is their own.
"""

from __future__ import annotations

from fermix.storage import api_tokens
from fermix.storage import conversations as _conversations
from fermix.storage import erasure as _erasure
from fermix.storage import jobs as _jobs
from fermix.storage import memories as _memories
from fermix.storage import messages as _messages
from fermix.storage import resources as _resources
from fermix.storage import retention as _retention
from fermix.storage import vectors as _vectors
from fermix.storage.operation import Session, SqlOp, WriteSession


class SharedReads(Session):
    """The read operations both adapters run with the same SQL."""

    # the memory server's bearer tokens (N2)
    token = SqlOp(api_tokens.get)
    token_by_secret = SqlOp(api_tokens.by_secret)
    tokens = SqlOp(api_tokens.list_tokens)

    # sources, jobs and runs (S6, SC1)
    source = SqlOp(_jobs.get_source)
    sources = SqlOp(_jobs.list_sources)
    job = SqlOp(_jobs.get_job)
    jobs = SqlOp(_jobs.list_jobs)
    runs = SqlOp(_jobs.list_runs)
    run = SqlOp(_jobs.get_run)

    # vectors for recall (Q2): token counts, memory rows' vectors, coverage
    token_counts = SqlOp(_vectors.token_counts)
    memory_vectors = SqlOp(_vectors.memory_vectors)
    vector_coverage = SqlOp(_vectors.coverage)

    # memory rows (their search by text and change counters are each adapter's)
    row = SqlOp(_memories.get)
    require_row = SqlOp(_memories.require)
    row_by_key = SqlOp(_memories.get_by_key)
    rows = SqlOp(_memories.list_rows)
    memory_agents = SqlOp(_memories.agents)
    memory_owners = SqlOp(_memories.owners)

    # prompt-file resources and their revisions
    resource = SqlOp(_resources.get_resource)
    resources = SqlOp(_resources.list_resources)
    current_revision = SqlOp(_resources.current)
    revision = SqlOp(_resources.get_revision)
    revisions = SqlOp(_resources.history)

    # conversations: state, window, review gates
    conversation = SqlOp(_conversations.get)
    conversations = SqlOp(_conversations.list_states)
    owned_conversations = SqlOp(_conversations.owned_by)
    window = SqlOp(_conversations.window)
    window_mark = SqlOp(_conversations.window_mark)
    window_snapshot = SqlOp(_conversations.window_snapshot)
    window_since = SqlOp(_conversations.window_since)
    newest_user_message_id = SqlOp(_conversations.newest_user_message_id)
    with_new_user_messages = SqlOp(_conversations.with_new_user_messages)
    review_backlog = SqlOp(_conversations.review_backlog)
    due_reviews = SqlOp(_conversations.due_reviews)

    # messages (each adapter searches them its own way)
    message = SqlOp(_messages.get)
    message_by_client_key = SqlOp(_messages.by_client_key)
    messages = SqlOp(_messages.conversation)
    count_messages = SqlOp(_messages.count)
    owner_messages = SqlOp(_messages.by_owner)

    # erasures (F1-F5): the records, and what a review or compaction checks before it writes
    erasure = SqlOp(_erasure.get)
    erasures = SqlOp(_erasure.list_erasures)
    unfinished_erasures = SqlOp(_erasure.unfinished)
    latest_erasure_id = SqlOp(_erasure.latest_id)
    erasures_since = SqlOp(_erasure.since)
    erasure_rerender = SqlOp(_erasure.rerender)
    owner_known = SqlOp(_erasure.owner_known)
    erasure_key = SqlOp(_erasure.known_key)

    # retention (F7): what the next sweep drops
    retention_due = SqlOp(_retention.due)


class SharedWrites(SharedReads, WriteSession):
    """The write operations both adapters run with the same SQL."""

    # the memory server's bearer tokens (N2)
    insert_token = SqlOp(api_tokens.insert)
    revoke_token = SqlOp(api_tokens.revoke)

    # sources, jobs and runs (S6, SC1)
    ensure_source = SqlOp(_jobs.ensure_source)
    create_job = SqlOp(_jobs.create_job)
    start_run = SqlOp(_jobs.start_run)
    finish_run = SqlOp(_jobs.finish_run)

    # vectors for recall (Q2)
    reset_vectors = SqlOp(_vectors.reset)

    # memory rows
    upsert_row = SqlOp(_memories.upsert)
    replace_row = SqlOp(_memories.replace_value)
    archive_row = SqlOp(_memories.archive)
    restore_row = SqlOp(_memories.restore)

    # prompt-file revisions, and the lock of one (agent, owner) for a rebuild
    record_revision = SqlOp(_resources.record)
    lock_owner = SqlOp(_resources.lock_owner)

    # conversations (each adapter inserts messages its own way)
    touch_conversation = SqlOp(_conversations.touch)
    update_conversation = SqlOp(_conversations.update)
    claim_review = SqlOp(_conversations.claim_review)
    claim_due_reviews = SqlOp(_conversations.claim_due_reviews)
    finish_review = SqlOp(_conversations.finish_review)
    release_review = SqlOp(_conversations.release_review)
    fail_review = SqlOp(_conversations.fail_review)
    record_outcome = SqlOp(_conversations.record_outcome)
    release_expired_claims = SqlOp(_conversations.release_expired_claims)

    # erasures (F1-F5): one bounded batch per unit
    begin_erasure = SqlOp(_erasure.begin)
    erase_step = SqlOp(_erasure.step)
    erasure_rows_gone = SqlOp(_erasure.rows_gone)
    settle_erasures = SqlOp(_erasure.settle)
    erasure_log_clean = SqlOp(_erasure.log_clean)
    drop_revisions = SqlOp(_erasure.drop_revisions)

    # retention (F7): one bounded batch per unit
    expire_messages = SqlOp(_retention.drop_messages)
    expire_archived = SqlOp(_retention.drop_archived)
    trim_revisions = SqlOp(_retention.drop_revisions)
