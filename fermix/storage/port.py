"""The storage port: what every adapter offers the layers above, declared as Protocols.

Two adapters implement it as siblings that import nothing of each other:
:mod:`fermix.storage.sqlite` (``memory.db`` in the home, the default) and
:mod:`fermix.storage.postgres` (one database shared by several services, B1). The layers
above hold a :class:`Storage` and its sessions and never learn which adapter runs:

- :class:`Reads`: one read unit on a pooled read connection (``with storage.read() as r``);
- :class:`Writes`: one write unit inside the group commit (``storage.write(unit)``, where
  ``unit`` is a function of a :class:`Writes`); it can read too, under the write lock;
- :class:`Inspection` and :class:`Repair`: what ``fermix doctor`` asks and fixes
  (``storage.inspection()``, ``storage.repair(unit)``), kept apart from the turn's port.

mypy checks each adapter's sessions against these Protocols (``fermix/storage/sqlite/
session.py`` and ``fermix/storage/postgres/session.py`` end with the assignments that make
it), and ``tests/storage/test_contract.py`` takes its list of operations from them: an
adapter that lacks an operation, or whose signature differs, fails both. The values the
operations take and return that are storage's own (a window's mark, search hits, vectors
to store) are declared here too, so neither adapter defines what the other uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from fermix.model import (
    ApiToken,
    ConversationKey,
    ConversationState,
    Erasure,
    JobRun,
    MemoryRow,
    MemorySource,
    Message,
    NewMessage,
    Provenance,
    Resource,
    Revision,
    ScheduledJob,
    Scope,
    SearchHit,
)

if TYPE_CHECKING:
    from fermix.storage.leaders import CommitObserver, CommitStats

T = TypeVar("T")

# -- the values of the port ---------------------------------------------------------------

WindowMark = tuple[int, int, int | None]
"""Where a conversation's window stands: ``(window_version, window_after_id,
checkpoint_message_id)``. The version moves with every message stored in the conversation
and every move of the window, by any process (migration 4, M4)."""

NO_MARK: Final[WindowMark] = (0, 0, None)
"""The mark of a conversation without a row."""

CANDIDATES: Final = 300
"""The full-text candidates a search ranks by default (a hybrid search fuses them)."""
MAX_SCOPE_ROWS: Final = 50_000
"""The most rows of one scope a vector search reads; a larger scope is searched lexically."""
NEAREST_ROWS: Final = 1_000
"""The messages an approximate search of a scope too large to read returns by default."""


class SearchHits(list[SearchHit]):
    """The hits of a message search, best first, and the ``ids`` and ``ranks`` of its best
    candidates, as many as it was asked to rank (the hits are their first ones, whole).

    A hybrid search fuses hundreds of full-text candidates and returns a few: it needs the
    candidates' ids and ranks, and whole messages for only the few it returns.
    """

    __slots__ = ("ids", "ranks")

    def __init__(
        self, hits: Sequence[SearchHit] = (), ids: Sequence[int] = (), ranks: Sequence[float] = ()
    ) -> None:
        super().__init__(hits)
        self.ids = ids
        self.ranks = ranks


def conversation_scope(key: ConversationKey) -> str:
    """The token-count scope of conversation ``key``'s messages."""
    return "c\x1f" + "\x1f".join(key.as_tuple())


def memory_scope(agent_id: str) -> str:
    """The token-count scope of ``agent_id``'s memory rows."""
    return "m\x1f" + agent_id


@dataclass(frozen=True, slots=True)
class PendingText:
    """A row without a vector: its id, its token-count scope and the text to embed."""

    id: int
    scope: str
    text: str


@dataclass(frozen=True, slots=True)
class StoredVector:
    """A vector to store for row ``id``, and the tokens it adds to ``scope``'s counts."""

    id: int
    scope: str
    vector: bytes
    tokens: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class ScopeRows:
    """The messages of a searched scope as fusion needs them, by conversation, time and id:
    one sequence per column rather than an object per row (a scope has thousands).

    Row ``i`` is message ``ids[i]`` of conversation ``conversations[k]`` for the last ``k``
    with ``starts[k] <= i``; ``vectors[i]`` is None when it has no vector yet."""

    ids: Sequence[int]
    senders: Sequence[str]
    created_at: Sequence[int]
    vectors: Sequence[bytes | None]
    conversations: Sequence[tuple[str, str, str, str]]
    """The scope's conversations (agent, channel, chat, thread), in order."""
    starts: Sequence[int]
    """The row each of ``conversations`` starts at (the first is 0)."""

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class Dropped:
    """What one batch of :func:`drop_messages` did, and where the next starts."""

    dropped: int
    after_id: int
    """The cursor: the next batch reads messages after this id."""
    finished: bool
    """Whether no older message is left to look at."""


@dataclass(frozen=True, slots=True)
class Purge:
    """What :meth:`Storage.purge` found: whether the store's files still hold a copy of what
    was deleted (F3), and what holds it when they do."""

    clean: bool
    left: str = ""
    """What still holds a copy (a reader holding the write-ahead log back, say), if any."""
    log_clean_at: int | None = None
    """When the store's own files were found clean (epoch ms), even if a copy beside them
    (Litestream's local files) is still left; None when they were not."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """How many rows have a vector, and of what model."""

    messages: int
    message_vectors: int
    memories: int
    memory_vectors: int
    model: str | None
    dim: int | None


# -- the sessions ---------------------------------------------------------------------------


class Reads(Protocol):
    """The read operations of one unit, on one connection for its length."""

    def conversation(self, key: ConversationKey) -> ConversationState | None:
        """The state of ``key``, or None if it was never written."""
        ...

    def conversations(self, *, agent_id: str | None = None) -> list[ConversationState]:
        """Every conversation row, of one agent when given."""
        ...

    def owned_conversations(
        self, owner_id: str, *, agent_id: str | None = None
    ) -> list[ConversationState]:
        """The conversations ``owner_id`` owns (of ``agent_id``, or every agent)."""
        ...

    def owner_messages(
        self, owner_id: str, *, agent_id: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[Message]:
        """The messages ``owner_id`` wrote, in id order after ``after_id``: an export's page."""
        ...

    def window(self, key: ConversationKey, *, limit: int | None = None) -> list[Message]:
        """The conversation's current window, oldest first: its checkpoint, then later messages.

        Messages before ``window_after_id`` stay stored (K5): a checkpoint or ``/new`` only
        moves the window's start. With ``limit``, only the newest ``limit`` messages are kept."""
        ...

    def window_mark(self, key: ConversationKey) -> WindowMark:
        """The mark of the window of ``key`` (``(0, 0, None)`` without a row): one read by the
        primary key, which tells a cache whether the window it holds is still current (M4)."""
        ...

    def window_snapshot(
        self, key: ConversationKey, *, limit: int | None = None
    ) -> tuple[ConversationState | None, WindowMark, list[Message], Message | None]:
        """The state, the mark, the window (as :func:`window`) and the newest stored message of
        ``key``, read as one snapshot: another process's commit is in all of them or in none."""
        ...

    def window_since(
        self, key: ConversationKey, *, after_id: int, stored_from: int = 0, limit: int | None = None
    ) -> tuple[WindowMark, list[Message]]:
        """The mark of ``key`` and its messages stored after message ``after_id``, oldest first
        (the newest ``limit`` of them), read as one snapshot.

        ``stored_from`` (the ``created_at`` of message ``after_id``) lets the read start there in
        the conversation's index instead of walking all of it; a message stored with an older
        time is left out, and the caller, counting what it got against the versions, reads the
        whole window instead."""
        ...

    def newest_user_message_id(self, key: ConversationKey) -> int:
        """The id of the conversation's newest user-sent message (0 when it has none)."""
        ...

    def with_new_user_messages(
        self,
        *,
        agent_id: str | None = None,
        owner_id: str | None = None,
        channel: str | None = None,
        chat_id: str | None = None,
    ) -> list[tuple[ConversationState, int]]:
        """Conversations with user messages newer than their last review, and how many, most
        first."""
        ...

    def review_backlog(
        self, key: ConversationKey, *, after_id: int, up_to: int, limit: int
    ) -> tuple[list[Message], int]:
        """The first ``limit`` user messages of ``key`` with ids in ``(after_id, up_to]``, in id
        order, and how many there are in all: what a review takes next, and its backlog (M5).

        In id order, not by time: the review's cursor is an id, so a message stored with an
        older clock must not fall behind it."""
        ...

    def due_reviews(
        self, *, now: int, limit: int | None = None, interval_ms: int = 0, backoff_ms: int = 0
    ) -> list[ConversationKey]:
        """The conversations :func:`claim_due_reviews` would claim at ``now``, oldest due
        first (the first ``limit``); claims nothing. Read off the ``conversations_due`` index,
        never by a scan of the messages (migration 9)."""
        ...

    def message(self, message_id: int) -> Message | None:
        """The message with ``message_id``, or None."""
        ...

    def message_by_client_key(self, key: ConversationKey, client_key: str) -> Message | None:
        """The message of conversation ``key`` stored under ``client_key``, or None (N3)."""
        ...

    def messages(
        self,
        key: ConversationKey,
        *,
        after_id: int = 0,
        limit: int | None = None,
        newest: bool = False,
        role: str | None = None,
    ) -> list[Message]:
        """Messages of ``key`` with id > ``after_id``, oldest first.

        With ``limit``, the first ``limit`` such messages, or the last ``limit`` when ``newest``
        (still returned oldest first)."""
        ...

    def count_messages(self, key: ConversationKey, *, after_id: int = 0) -> int:
        """How many messages ``key`` has with id > ``after_id``."""
        ...

    def search_messages(
        self,
        text: str,
        *,
        agent_id: str | None = None,
        key: ConversationKey | None = None,
        owner_id: str | None = None,
        limit: int = 10,
        ranked: int = 0,
        scope_rows: int | None = None,
    ) -> SearchHits:
        """Messages matching any text, best first; filters narrow to an agent, owner or key.

        ``text`` is whatever a user or model typed: it goes through :func:`fts.build_query`, so
        FTS5 syntax in it is inert and it never raises on content. The rows of the scope
        holding a word are found through the scope's token (:class:`SearchScope`), so the cost
        follows the scope searched, not the table. They are ordered by bm25 over the scope
        (:func:`fts.preselect`); the best :data:`fts.CANDIDATES` are re-ranked by
        :func:`fts.rank` with statistics of the scope; a hit's ``rank`` is minus that score,
        so lower is still better. Rows that tie stay in the preselection's order, then by id.

        When more than :data:`MAX_SCOPED_MATCHES` rows match (a very large scope, or a search
        of an agent or the whole table with a common word), the candidates are the best by
        FTS5's own ``bm25()`` instead, whose statistics are the table's.

        The best ``limit`` are returned whole; with ``ranked``, the ids and ranks of the best
        ``ranked`` too (:class:`SearchHits`), the same as the hits of a search with that
        limit, without reading their rows.

        ``scope_rows``, when the caller has just read the whole scope (a hybrid search, from
        :meth:`scope_vectors`), is how many messages it holds: the ranking's statistics take
        it instead of counting the scope again (Q4)."""
        ...

    def row(self, memory_id: int) -> MemoryRow | None:
        """The row with ``memory_id``, archived or not, or None."""
        ...

    def require_row(self, memory_id: int) -> MemoryRow:
        """The row with ``memory_id``, or :class:`NotFoundError`."""
        ...

    def row_by_key(
        self, *, agent_id: str, owner_id: str, scope: Scope, key: str
    ) -> MemoryRow | None:
        """The row with this unique key, or None."""
        ...

    def rows(
        self,
        *,
        agent_id: str | None = None,
        owner_id: str | None = None,
        scopes: Iterable[Scope] | None = None,
        scope_type: str | None = None,
        category: str | None = None,
        archived: bool | None = False,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[MemoryRow]:
        """Rows matching every given filter, most recently updated first.

        ``archived``: False (default) live rows only, True archived only, None both.
        ``scopes``: when given, only rows in one of these scopes (an empty list matches nothing)."""
        ...

    def search_rows(
        self,
        text: str,
        *,
        agent_id: str | None = None,
        owner_id: str | None = None,
        scopes: Iterable[Scope] | None = None,
        scope_type: str | None = None,
        category: str | None = None,
        archived: bool | None = False,
        limit: int = 10,
    ) -> list[MemoryRow]:
        """Rows whose key or value matches any text, best first, within the given filters."""
        ...

    def relevant_rows(
        self,
        texts: Sequence[str],
        *,
        agent_id: str,
        places: Sequence[tuple[str, Scope]],
        limit: int,
    ) -> list[MemoryRow]:
        """Live rows of ``agent_id`` in ``places`` whose key or value holds a word of ``texts``,
        best first (M6, SC3).

        ``places`` are the (owner id, scope) pairs the caller may see: the filter is part of
        the query. The best :data:`fts.CANDIDATES` matches by FTS5's bm25 are re-ranked by
        :func:`fts.rank` with statistics of the rows in ``places``, not of the whole table."""
        ...

    def memory_version(self, agent_id: str | None = None, owner_id: str | None = None) -> int:
        """A number that changes whenever a memory row is written, by any process (A3).

        With ``agent_id`` (and ``owner_id``), it changes at least whenever a row of that agent
        (that shows in that owner's prompt files) is written; SQLite keeps one counter for the
        whole table, so it also changes on other writes (a cache only reloads more often). The
        PostgreSQL adapter keeps one per (agent, owner)."""
        ...

    def memory_agents(self) -> list[str]:
        """Every agent with memory rows or prompt-file resources, sorted."""
        ...

    def memory_owners(self, agent_id: str) -> list[str]:
        """Every owner of ``agent_id`` with memory rows or prompt-file resources, ``""`` first."""
        ...

    def source(self, source_id: int) -> MemorySource | None:
        """The source with ``source_id``, or None."""
        ...

    def sources(self, *, agent_id: str, owner_id: str | None = None) -> list[MemorySource]:
        """Sources of an agent; with ``owner_id``, those of that owner and the agent's shared
        ones."""
        ...

    def job(self, job_id: int) -> ScheduledJob:
        """The job with ``job_id``, or :class:`NotFoundError`."""
        ...

    def jobs(self, *, agent_id: str | None = None) -> list[ScheduledJob]:
        """Scheduled jobs, of one agent when given."""
        ...

    def runs(self, job_id: int, *, limit: int = 20) -> list[JobRun]:
        """The most recent runs of a job, newest first."""
        ...

    def run(self, run_id: int) -> JobRun | None:
        """The run with ``run_id``, or None."""
        ...

    def resource(self, agent_id: str, name: str, *, owner_id: str = "") -> Resource | None:
        """The resource ``name`` of ``agent_id`` and ``owner_id``, or None."""
        ...

    def resources(self, agent_id: str | None = None) -> list[Resource]:
        """Every resource, or those of one agent, ordered by agent and name."""
        ...

    def current_revision(self, agent_id: str, name: str, *, owner_id: str = "") -> Revision | None:
        """The current revision of a resource, or None when it has none."""
        ...

    def revision(self, agent_id: str, name: str, revision: int, *, owner_id: str = "") -> Revision:
        """Revision ``revision`` of a resource, or :class:`NotFoundError`."""
        ...

    def revisions(
        self, agent_id: str, name: str, *, owner_id: str = "", limit: int | None = None
    ) -> list[Revision]:
        """Revisions of a resource, newest first."""
        ...

    def token(self, token_id: int) -> ApiToken | None:
        """The token ``token_id``, revoked or not, or None."""
        ...

    def token_by_secret(self, secret_sha256: str) -> ApiToken | None:
        """The live (unrevoked) token whose secret hashes to ``secret_sha256``, or None."""
        ...

    def tokens(self, *, include_revoked: bool = False) -> list[ApiToken]:
        """Every token, oldest first; revoked ones only with ``include_revoked``."""
        ...

    def embedding_model(self) -> tuple[str, int] | None:
        """The model and dimension of the stored vectors, or None before any."""
        ...

    def messages_to_embed(self, *, after_id: int, limit: int) -> list[PendingText]:
        """Messages with id > ``after_id`` that have no vector, oldest first."""
        ...

    def memories_to_embed(self, *, after_id: int, limit: int) -> list[PendingText]:
        """Live memory rows with id > ``after_id`` that have no vector, oldest first."""
        ...

    def token_counts(
        self, scopes: Iterable[str], tokens: Iterable[int]
    ) -> tuple[dict[int, int], int]:
        """The counts of ``tokens`` summed over ``scopes``, and those scopes' total."""
        ...

    def scope_vectors(
        self,
        *,
        agent_id: str | None = None,
        key: ConversationKey | None = None,
        owner_id: str | None = None,
        limit: int = 50000,
    ) -> ScopeRows | None:
        """Every message of the scope :func:`fermix.storage.sqlite.messages.search` would search,
        with its vector or None, by conversation, time and id; None when the scope has more
        than ``limit`` messages or no index to read it by (an agent, the whole table).

        The rows come sorted by the database (on SQLite in the order of an index of the
        scope, a conversation's or an owner's) and are read in one ``fetchall``; the
        conversations are found by comparing the key columns of consecutive rows, so no
        object is made per row beyond the row's own values."""
        ...

    def nearest_messages(
        self,
        query: Sequence[float],
        *,
        agent_id: str | None = None,
        key: ConversationKey | None = None,
        owner_id: str | None = None,
        limit: int = 1000,
        include: Sequence[int] = (),
    ) -> ScopeRows | None:
        """The ``limit`` messages of the scope whose vectors are (about) nearest ``query``, and
        the scope's messages ``include``, as :func:`scope_vectors` gives them; None where no
        approximate index exists: always on SQLite, which searches a scope too large for
        :func:`scope_vectors` lexically (PostgreSQL with pgvector:
        :mod:`fermix.storage.postgres.vectors`)."""
        ...

    def memory_vectors(self, ids: Sequence[int]) -> dict[int, bytes]:
        """The vectors of the memory rows ``ids`` that have one."""
        ...

    def database_file(self) -> str:
        """The path of the database file this session reads (to find its process's embedder)."""
        ...

    def vector_coverage(self) -> Coverage:
        """How many messages and live memory rows there are, how many have a vector, and the
        recorded model (``fermix index status``, ``fermix doctor``)."""
        ...

    # -- erasures (F1-F5) ----------------------------------------------------------------

    def erasure(self, erasure_id: int) -> Erasure:
        """The erasure ``erasure_id``; :class:`~fermix.errors.NotFoundError` if there is none."""
        ...

    def erasures(self, *, limit: int = 100) -> list[Erasure]:
        """The newest erasure records first: the audit (no subject once its rows are gone)."""
        ...

    def unfinished_erasures(self) -> list[Erasure]:
        """The erasures not ``done``, oldest first (a killed one, or one a reader held)."""
        ...

    def latest_erasure_id(self) -> int:
        """The newest erasure's id, 0 when none: noted by a review or compaction at its start."""
        ...

    def erasures_since(self, after_id: int, agent_id: str) -> bool:
        """Whether an erasure that may touch ``agent_id`` began after ``after_id`` (F4)."""
        ...

    def erasure_rerender(self, erasure_id: int) -> tuple[list[tuple[str, str]], int | None]:
        """The (agent, owner) pairs (owner ``*``: every owner) whose prompt files showed a
        row the erasure took, and the earliest such row's creation time."""
        ...

    def erasure_key(self, target: str, subject: str) -> str | None:
        """The keyed hash an erasure record keeps of ``subject`` (None: no erasure yet)."""
        ...

    def owner_known(self, owner_id: str, agent_id: str | None) -> bool:
        """Whether anything of ``owner_id`` is stored (for ``agent_id``, or any agent)."""
        ...

    # -- retention (F7) -------------------------------------------------------------------

    def retention_due(
        self,
        *,
        messages_before: int | None,
        archived_before: int | None,
        keep: int | None,
        drop_unreviewed: bool = False,
    ) -> dict[str, int]:
        """How many messages, archived rows and revisions a retention sweep would drop now."""
        ...


class Writes(Reads, Protocol):
    """The write operations (and every read), inside one write transaction of the group
    commit. A unit is a function of a :class:`Writes`; its result is returned once
    committed."""

    def touch_known(self, key: ConversationKey, owner_id: str, trust: str) -> None:
        """:meth:`touch_conversation`, skipped when this session gave the row this owner
        and trust and nothing can have changed it since (one statement less per append)."""
        ...

    def drop_known(self) -> None:
        """Drop the conversation rows :meth:`touch_known` remembers: the next touch of
        each writes again (after a rollback, or another process's commit)."""
        ...

    def touch_conversation(self, key: ConversationKey, *, owner_id: str, trust: str) -> None:
        """Create the row of ``key`` or bring it to this owner and trust; writes nothing when
        both are unchanged (caller's transaction)."""
        ...

    def update_conversation(self, key: ConversationKey, **fields: Any) -> None:
        """Set some columns of an existing conversation row (caller's transaction)."""
        ...

    def claim_review(self, key: ConversationKey, *, token: str, now: int, ttl_ms: int) -> bool:
        """Take the review claim of ``key`` unless another live claim holds it (caller's
        transaction); True, the claim renewed, when ``token`` holds it already: a review takes
        over so what the sweep claimed for it (:func:`claim_due_reviews`).

        A claim past its expiry (its reviewer crashed) is taken over (E2)."""
        ...

    def claim_due_reviews(
        self,
        *,
        token: str,
        now: int,
        ttl_ms: int,
        limit: int,
        interval_ms: int = 0,
        backoff_ms: int = 0,
    ) -> list[ConversationKey]:
        """Claim up to ``limit`` conversations due for a review under ``token``, oldest due
        first, none that another live claim holds, none reviewed less than ``interval_ms`` ago
        nor failed less than ``backoff_ms`` ago; return their keys, sorted (caller's
        transaction).

        The sweep of every process claims this way, so no two claim one conversation; each
        review then takes its claim with the same token (:func:`claim_review`)."""
        ...

    def finish_review(
        self, key: ConversationKey, *, token: str, now: int, last_message_id: int
    ) -> bool:
        """Record a successful review and release its claim; False if the claim was lost.

        The conversation stays due while user messages after ``last_message_id`` wait (M5)."""
        ...

    def release_review(self, key: ConversationKey, *, token: str) -> bool:
        """Give back the review claim ``token`` holds on ``key``, nothing reviewed (the sweep
        claimed it and no review took it); False if ``token`` no longer holds it. The
        conversation stays due while user messages after its cursor wait."""
        ...

    def fail_review(self, key: ConversationKey, *, token: str, now: int) -> None:
        """Record a failed review (for the backoff) and release its claim."""
        ...

    def record_outcome(
        self, key: ConversationKey, *, work: str, outcome: str, reason: str, now: int
    ) -> None:
        """Keep how the last ``work`` (``review`` or ``compaction``) of ``key`` ended and a
        short ``reason`` (bounded, never message text), for the console (W1); a key without
        a row records nothing (caller's transaction)."""
        ...

    def release_expired_claims(self, *, now: int) -> int:
        """Clear every review claim past its expiry; return how many (caller's transaction)."""
        ...

    def insert_message(self, new: NewMessage, *, created_at: int | None = None) -> Message:
        """Insert ``new`` in the caller's transaction and return the stored row.

        Its trust is ``new.trust``, or else its conversation's (a guest's without a row, M2)."""
        ...

    def upsert_row(
        self,
        *,
        agent_id: str,
        owner_id: str,
        scope: Scope,
        category: str,
        key: str,
        value: str,
        promote_target: str | None,
        confidence: float = 1.0,
        provenance: Provenance = Provenance(
            source_id=None,
            source_type=None,
            source_name=None,
            source_description=None,
            session_id=None,
            run_id=None,
            source_message_id=None,
        ),
        now: int | None = None,
    ) -> MemoryRow:
        """Insert a row, or update the one with the same unique key (S5), in the caller's
        transaction.

        Updating an archived row brings it back: writing a fact again means it holds again."""
        ...

    def replace_row(
        self,
        memory_id: int,
        *,
        value: str,
        key: str | None = None,
        category: str | None = None,
        provenance: Provenance | None = None,
        now: int | None = None,
    ) -> MemoryRow:
        """Update a row's value (and optionally key and category) by id, in the caller's
        transaction."""
        ...

    def archive_row(
        self, memory_id: int, *, by: str, reason: str, now: int | None = None
    ) -> MemoryRow:
        """Mark a row archived with who and why (S7); archiving an archived row keeps its record."""
        ...

    def restore_row(self, memory_id: int, *, now: int | None = None) -> MemoryRow:
        """Clear a row's archive fields (S7)."""
        ...

    def ensure_source(
        self,
        *,
        agent_id: str,
        source_type: str,
        name: str,
        owner_id: str = "",
        description: str = "",
        now: int | None = None,
    ) -> MemorySource:
        """The source with this agent, type and name, created if missing (caller's transaction)."""
        ...

    def create_job(
        self,
        *,
        agent_id: str,
        name: str,
        schedule: str,
        prompt: str,
        owner_id: str = "",
        now: int | None = None,
    ) -> ScheduledJob:
        """Create a scheduled job and its memory source, in the caller's transaction."""
        ...

    def start_run(self, job_id: int, *, now: int | None = None) -> JobRun:
        """Record that a run of ``job_id`` started (caller's transaction)."""
        ...

    def finish_run(
        self,
        run_id: int,
        *,
        status: str,
        output: str = "",
        error: str | None = None,
        now: int | None = None,
    ) -> JobRun:
        """Record a run's outcome (caller's transaction), once.

        A failed run says why (``error``); a succeeded one has no error. A run that already
        finished is refused, its outcome kept."""
        ...

    def record_revision(
        self,
        agent_id: str,
        name: str,
        content: str,
        *,
        reason: str,
        owner_id: str = "",
        now: int | None = None,
    ) -> Revision | None:
        """Record ``content`` as the next revision, in the caller's transaction.

        Returns None, recording nothing, when ``content`` equals the current revision."""
        ...

    def lock_owner(self, agent_id: str, owner_id: str) -> None:
        """Hold the lock of (``agent_id``, ``owner_id``) until the transaction ends: one unit at
        a time per pair (a prompt-file rebuild). Nothing to take on SQLite, whose single writer
        already runs one write transaction at a time; the ids are checked as on PostgreSQL."""
        ...

    def insert_token(
        self, *, name: str, prefix: str, secret_sha256: str, agents: tuple[str, ...], operator: bool
    ) -> ApiToken:
        """Store a new token (its secret's hash only) and return it."""
        ...

    def revoke_token(self, token_id: int) -> ApiToken | None:
        """Revoke token ``token_id`` (once: a revoked token keeps its first time); or None."""
        ...

    def record_embedding_model(self, name: str, dim: int, *, now: int | None = None) -> bool:
        """Record ``name`` and ``dim`` as the vectors' model; when another was recorded, every
        vector and token count is dropped first (they are all computed again). Returns whether
        anything changed."""
        ...

    def reset_vectors(self) -> None:
        """Drop every vector and token count (``fermix index rebuild``, a model change)."""
        ...

    def store_message_vectors(self, items: Iterable[StoredVector]) -> int:
        """Store each message's vector unless it has one or is gone; count its tokens in its
        scope. Returns how many were stored."""
        ...

    def store_memory_vectors(self, items: Iterable[StoredVector]) -> int:
        """Store each memory row's vector unless it has one or is gone; count its tokens."""
        ...

    # -- erasures (F1-F5) ----------------------------------------------------------------

    def begin_erasure(
        self,
        *,
        target: str,
        subject: str,
        agent_id: str | None,
        requested_by: str,
        now: int | None = None,
    ) -> Erasure:
        """Record the start of an erasure (``running``): a killed one is finished later."""
        ...

    def erase_step(self, erasure_id: int, *, batch: int = 500) -> dict[str, int]:
        """Erase one bounded batch of the erasure; what it erased by kind, ``{}`` when none is
        left (the unit stays short: other writers wait for one batch at most)."""
        ...

    def erasure_rows_gone(self, erasure_id: int) -> None:
        """The erasure's rows are gone: drop its subject (its keyed hash stays), ``pending``."""
        ...

    def settle_erasures(self, erasure_ids: Iterable[int], *, now: int | None = None) -> int:
        """Say ``done`` for these ``pending`` erasures: the files hold no copy (F3)."""
        ...

    def erasure_log_clean(self, erasure_id: int, at: int) -> None:
        """Record, once, when a ``pending`` erasure's store files were first found clean: the
        copies made before it (a replica's local files) are what it still waits for."""
        ...

    def drop_revisions(self, agent_id: str, owner_id: str, *, since: int) -> int:
        """Drop the revisions of ``agent_id``'s prompt files of ``owner_id`` (``*``: every
        owner) recorded since ``since``, but each file's current one (F2)."""
        ...

    # -- retention (F7) -------------------------------------------------------------------

    def expire_messages(
        self,
        *,
        before: int,
        after_id: int = 0,
        drop_unreviewed: bool = False,
        batch: int = 200,
    ) -> Dropped:
        """Drop one batch of messages created before ``before``, read after ``after_id``:
        never a checkpoint, nor (unless ``drop_unreviewed``) a user message not reviewed."""
        ...

    def expire_archived(self, *, before: int, batch: int = 200) -> int:
        """Drop one batch of memory rows archived before ``before``; how many went."""
        ...

    def trim_revisions(self, *, keep: int, batch: int = 200) -> int:
        """Drop one batch of revisions beyond each prompt file's newest ``keep``."""
        ...


class Inspection(Reads, Protocol):
    """What ``fermix doctor`` reads besides the turn's reads: schema, integrity, full-text
    mirrors."""

    def integrity_check_name(self, *, full: bool) -> str:
        """The name of the check :meth:`integrity_problems` runs, for people."""
        ...

    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        ...

    def pending_migrations(self) -> int:
        """How many migrations of this fermix the file has not had yet."""
        ...

    def integrity_problems(self, *, full: bool = False) -> list[str]:
        """What SQLite's integrity check finds wrong with the file (empty when nothing).

        ``full`` runs ``PRAGMA integrity_check``, otherwise ``PRAGMA quick_check`` (see the
        module's docstring for what that leaves out). Both check the FTS5 indexes' structure:
        a problem of that kind starts with ``fts5:`` (:func:`fts_damage` picks them out)."""
        ...

    def fts_problem(
        self, table: str, *, full: bool = False, structure_checked: bool = False
    ) -> str | None:
        """Why FTS mirror ``table`` disagrees with its content table, or None when it agrees.

        Quick: the rowids of the index (its ``_docsize`` table) and of the content table are
        the same set, and the index's structure is sound (skipped when ``structure_checked``:
        :func:`integrity_problems` checked it already). Full: FTS5 ``integrity-check`` with
        rank 1, which also compares every row's terms with the index."""
        ...


class Repair(Writes, Inspection, Protocol):
    """What ``fermix doctor --fix`` writes besides the turn's writes: derived state only."""

    def rebuild_fts(self, table: str) -> None:
        """Rebuild FTS mirror ``table`` from its content table (caller's transaction)."""
        ...


# -- the store -----------------------------------------------------------------------------


class Storage(Protocol):
    """One process's way into the store: read units, and write units through its group
    commit."""

    name: str
    """What the store is, for messages and logs: a file name, or a database without its
    password."""

    @property
    def key(self) -> str:
        """One string per store, the same in every process that opens it (a registry key:
        the file's path, or the URL without its password)."""
        ...

    @property
    def shared(self) -> bool:
        """Whether services on other machines may write the same store (PostgreSQL): caches
        then check freshness per conversation and per (agent, owner), never a local file."""
        ...

    @property
    def writes_aside(self) -> bool:
        """Whether :meth:`write_aside` commits beside the group commit (PostgreSQL), holding
        up no other unit; False where one writer writes at a time (SQLite)."""
        ...

    def read(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[Reads]:
        """A read unit: the block's reads run on one pooled read connection. A database error
        is a :class:`~fermix.errors.StorageError` naming the store."""
        ...

    def write(self, unit: Callable[[Writes], T], *, label: str = "write") -> T:
        """Run ``unit`` in a write transaction; return its result once committed."""
        ...

    def append(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write` for a unit that changes no conversation's owner or trust but through
        :meth:`Writes.touch_known` (an append)."""
        ...

    def write_aside(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write` for a rare, slow unit (an erasure's step) that must not hold up the
        appends: on PostgreSQL it commits on a connection of its own, beside the group commit,
        as another service's unit would (it waits only for the rows it shares with them); on
        SQLite, where one writer writes at a time, it is :meth:`write`."""
        ...

    def write_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """Run each ``(unit, label)`` as :meth:`write` would, in order, sharing commits;
        return each outcome, ``(True, result)`` or ``(False, error)``, once committed."""
        ...

    def append_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """:meth:`write_each` for appends, as :meth:`append` is :meth:`write` for one."""
        ...

    def inspection(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[Inspection]:
        """A read unit for ``fermix doctor``: the reads of :meth:`read` and the checks of
        :class:`Inspection`."""
        ...

    def repair(self, unit: Callable[[Repair], T], *, label: str = "repair") -> T:
        """:meth:`write` for ``fermix doctor --fix``: the unit may rebuild derived state."""
        ...

    def purge(self, *, since_ms: int | None = None) -> Purge:
        """Take what was deleted out of the store's files (F3): on SQLite, the write-ahead
        log checkpointed and truncated (deleted cells are zeroed as they go), and not clean
        while Litestream's local files from before ``since_ms`` (default: now) are left; on
        PostgreSQL, the dead tuples vacuumed away. Not clean while a reader still needs the
        old copy."""
        ...

    @property
    def commits(self) -> int:
        """Write transactions committed so far (for benchmarks and tests)."""
        ...

    def observe(self, observer: CommitObserver) -> None:
        """Tell ``observer`` of the group commit's retries and failures from now on: the
        runtime's metrics (O1), passed in so that storage imports none of them."""
        ...

    def commit_stats(self) -> CommitStats:
        """What the group commit did so far (commits, their writes, their sizes) and the
        writes queued behind it now (O1)."""
        ...

    def close(self) -> None:
        """Finish the queued writes, then close every connection."""
        ...
