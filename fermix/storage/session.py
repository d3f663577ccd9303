"""The storage port: what the layers above may ask of the database, and nothing else.

Everything above ``fermix/storage/`` reads and writes through two session types, never a
connection or SQL of its own:

- :class:`Reads` — one read unit on a pooled read connection (``with storage.read() as r``);
- :class:`Writes` — one write unit inside the group commit (``storage.write(unit)``, where
  ``unit`` is a function of a :class:`Writes`); it can read too, under the write lock.

Each operation is one function of a table-family module bound to the session's connection,
so the modules stay the single place each query is written. A second backend provides
sessions with the same operations; the layers above do not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import apsw

from fermix.storage import conversations as _conversations
from fermix.storage import health as _health
from fermix.storage import jobs as _jobs
from fermix.storage import memories as _memories
from fermix.storage import memory_relevance as _relevance
from fermix.storage import messages as _messages
from fermix.storage import resources as _resources
from fermix.storage import tokens as _tokens
from fermix.storage import vectors as _vectors

P = ParamSpec("P")
R = TypeVar("R")


class Op(Generic[P, R]):
    """A table-family function of a connection, offered as a method of a session.

    The function bound to the session's connection is a :func:`functools.partial` (no
    Python frame of its own per call), made at the first access and kept on the session:
    this is a non-data descriptor, so later accesses find it in the instance's dict.
    """

    def __init__(self, fn: Callable[Concatenate[Any, P], R]) -> None:
        self._fn = fn
        self._name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @property
    def function(self) -> Callable[Concatenate[Any, P], R]:
        """The table-family function this operation binds."""
        return self._fn

    @overload
    def __get__(self, session: None, owner: type[Any]) -> Op[P, R]: ...

    @overload
    def __get__(self, session: Reads, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, session: Reads | None, owner: type[Any]) -> Op[P, R] | Callable[P, R]:
        if session is None:
            return self
        bound: Callable[P, R] = functools.partial(self._fn, session._conn)
        session.__dict__[self._name] = bound
        return bound


class Reads:
    """The read operations, on one connection for the length of one unit."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn: Any = conn

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

    # the memory server's bearer tokens (N2)
    token = Op(_tokens.get)
    token_by_secret = Op(_tokens.by_secret)
    tokens = Op(_tokens.list_tokens)

    # health, for fermix doctor: schema version, integrity, FTS mirrors
    schema_version = Op(_health.schema_version)
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


_KNOWN_ROWS = 4096
"""Conversation rows a write session remembers at most (then it starts over)."""


class Writes(Reads):
    """The write operations (and every read), inside one write transaction.

    The database keeps one for its write connection, for every unit. It remembers the owner
    and trust it last gave each conversation row (:meth:`touch_known`), as long as nothing
    else may have changed them: the group commit calls :meth:`forget` after a rollback and
    when another connection (another process) committed, and every unit but an append
    starts by forgetting (:meth:`fermix.storage.Database.write`).
    """

    def __init__(self, conn: apsw.Connection) -> None:
        super().__init__(conn)
        self._known: dict[Any, tuple[str, str]] = {}

    def touch_known(self, key: Any, owner_id: str, trust: str) -> None:
        """:meth:`touch_conversation`, skipped when this session gave the row this owner
        and trust and nothing can have changed it since (one statement less per append)."""
        known = self._known
        mark = (owner_id, trust)
        if known.get(key) == mark:
            return
        self.touch_conversation(key, owner_id=owner_id, trust=trust)  # this adapter's touch
        if len(known) >= _KNOWN_ROWS:
            known.clear()
        known[key] = mark

    def forget(self) -> None:
        """Forget the conversation rows known: the next touch of each writes again."""
        self._known.clear()

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

    # the memory server's bearer tokens (N2)
    insert_token = Op(_tokens.insert)
    revoke_token = Op(_tokens.revoke)

    # health: an FTS mirror rebuilt from its content table (fermix doctor --fix)
    rebuild_fts = Op(_health.rebuild_fts)

    # vectors for recall (Q2)
    record_embedding_model = Op(_vectors.record_model)
    reset_vectors = Op(_vectors.reset)
    store_message_vectors = Op(_vectors.store_message_vectors)
    store_memory_vectors = Op(_vectors.store_memory_vectors)
