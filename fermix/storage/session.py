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


class _Op(Generic[P, R]):
    """A table-family function of a connection, offered as a method of a session.

    The function bound to the session's connection is a :func:`functools.partial` (no
    Python frame of its own per call), made at the first access and kept on the session:
    this is a non-data descriptor, so later accesses find it in the instance's dict.
    """

    def __init__(self, fn: Callable[Concatenate[apsw.Connection, P], R]) -> None:
        self._fn = fn
        self._name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, session: None, owner: type[Any]) -> _Op[P, R]: ...

    @overload
    def __get__(self, session: Reads, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, session: Reads | None, owner: type[Any]) -> _Op[P, R] | Callable[P, R]:
        if session is None:
            return self
        bound: Callable[P, R] = functools.partial(self._fn, session._conn)
        session.__dict__[self._name] = bound
        return bound


class Reads:
    """The read operations, on one connection for the length of one unit."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    # conversations: state, window, review gates
    conversation = _Op(_conversations.get)
    conversations = _Op(_conversations.list_states)
    window = _Op(_conversations.window)
    window_mark = _Op(_conversations.window_mark)
    window_snapshot = _Op(_conversations.window_snapshot)
    window_since = _Op(_conversations.window_since)
    newest_user_message_id = _Op(_conversations.newest_user_message_id)
    with_new_user_messages = _Op(_conversations.with_new_user_messages)
    review_backlog = _Op(_conversations.review_backlog)

    # messages
    message = _Op(_messages.get)
    message_by_client_key = _Op(_messages.by_client_key)
    messages = _Op(_messages.conversation)
    count_messages = _Op(_messages.count)
    search_messages = _Op(_messages.search)

    # memory rows
    row = _Op(_memories.get)
    require_row = _Op(_memories.require)
    row_by_key = _Op(_memories.get_by_key)
    rows = _Op(_memories.list_rows)
    search_rows = _Op(_memories.search)
    relevant_rows = _Op(_relevance.relevant)
    memory_version = _Op(_memories.change_counter)
    memory_agents = _Op(_memories.agents)
    memory_owners = _Op(_memories.owners)

    # sources, jobs and runs
    source = _Op(_jobs.get_source)
    sources = _Op(_jobs.list_sources)
    job = _Op(_jobs.get_job)
    jobs = _Op(_jobs.list_jobs)
    runs = _Op(_jobs.list_runs)
    run = _Op(_jobs.get_run)

    # prompt-file resources and their revisions
    resource = _Op(_resources.get_resource)
    resources = _Op(_resources.list_resources)
    current_revision = _Op(_resources.current)
    revision = _Op(_resources.get_revision)
    revisions = _Op(_resources.history)

    # the memory server's bearer tokens (N2)
    token = _Op(_tokens.get)
    token_by_secret = _Op(_tokens.by_secret)
    tokens = _Op(_tokens.list_tokens)

    # health, for fermix doctor: schema version, integrity, FTS mirrors
    schema_version = _Op(_health.schema_version)
    pending_migrations = _Op(_health.pending_migrations)
    integrity_problems = _Op(_health.integrity_problems)
    fts_problem = _Op(_health.fts_problem)

    # vectors for recall (Q2): the recorded model, rows to embed, a scope's vectors
    embedding_model = _Op(_vectors.model)
    messages_to_embed = _Op(_vectors.messages_to_embed)
    memories_to_embed = _Op(_vectors.memories_to_embed)
    token_counts = _Op(_vectors.token_counts)
    scope_vectors = _Op(_vectors.scope_vectors)
    memory_vectors = _Op(_vectors.memory_vectors)
    vector_coverage = _Op(_vectors.coverage)
    database_file = _Op(_vectors.database_file)


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
        _conversations.touch(self._conn, key, owner_id=owner_id, trust=trust)
        if len(known) >= _KNOWN_ROWS:
            known.clear()
        known[key] = mark

    def forget(self) -> None:
        """Forget the conversation rows known: the next touch of each writes again."""
        self._known.clear()

    # conversations
    touch_conversation = _Op(_conversations.touch)
    update_conversation = _Op(_conversations.update)
    claim_review = _Op(_conversations.claim_review)
    finish_review = _Op(_conversations.finish_review)
    fail_review = _Op(_conversations.fail_review)
    release_expired_claims = _Op(_conversations.release_expired_claims)

    # messages
    insert_message = _Op(_messages.insert)

    # memory rows
    upsert_row = _Op(_memories.upsert)
    replace_row = _Op(_memories.replace_value)
    archive_row = _Op(_memories.archive)
    restore_row = _Op(_memories.restore)

    # sources, jobs and runs
    ensure_source = _Op(_jobs.ensure_source)
    create_job = _Op(_jobs.create_job)
    start_run = _Op(_jobs.start_run)
    finish_run = _Op(_jobs.finish_run)

    # prompt-file revisions
    record_revision = _Op(_resources.record)

    # the memory server's bearer tokens (N2)
    insert_token = _Op(_tokens.insert)
    revoke_token = _Op(_tokens.revoke)

    # health: an FTS mirror rebuilt from its content table (fermix doctor --fix)
    rebuild_fts = _Op(_health.rebuild_fts)

    # vectors for recall (Q2)
    record_embedding_model = _Op(_vectors.record_model)
    reset_vectors = _Op(_vectors.reset)
    store_message_vectors = _Op(_vectors.store_message_vectors)
    store_memory_vectors = _Op(_vectors.store_memory_vectors)
