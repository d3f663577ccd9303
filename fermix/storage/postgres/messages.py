"""The ``messages`` table on PostgreSQL: the insert and the search, with SQLite's results (the
reads and the search's ranking are :mod:`fermix.storage.messages`).

The row's id is drawn by the ``messages_bi`` trigger after the conversation's row is
locked (schema.sql), so within one conversation ids commit in order. A message is stored
with its search stems (:mod:`fermix.storage.postgres.stems`); a search finds the scope's rows
holding a word (a small conversation's by reading them, any other scope's through the GIN
index over the stems), then ranks exactly as SQLite does (:func:`fermix.storage.fulltext.preselect`
and :func:`~fermix.storage.fulltext.rank`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from fermix.clock import now_ms
from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage import fulltext as fts
from fermix.storage import messages
from fermix.storage.messages import MAX_SCOPED_MATCHES, conversation_token, owner_token
from fermix.storage.port import SearchHits
from fermix.storage.postgres import stems
from fermix.storage.postgres.connection import Conn, fetch_rows, fetch_value, rows_param
from fermix.storage.postgres.sql import PgSql

_WHERE_KEY = "agent_id = %s AND channel = %s AND chat_id = %s AND thread_scope = %s"

_INSERT = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at, client_key, stems, trust)"
    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,{created_at},%s,%s::tsvector,{trust})"
    " RETURNING id, created_at, trust"
)
_NOT_BEFORE_LATEST = (
    f"greatest(%s, (SELECT latest_message_at FROM conversations WHERE {_WHERE_KEY}))"
)
_CONVERSATION_TRUST = f"coalesce((SELECT trust FROM conversations WHERE {_WHERE_KEY}), 'guest')"
_INSERTS = {
    (stamped, trusted): _INSERT.format(
        created_at="%s" if stamped else _NOT_BEFORE_LATEST,
        trust="%s" if trusted else _CONVERSATION_TRUST,
    )
    for stamped in (False, True)
    for trusted in (False, True)
}
"""The insert, by (time given as it is, trust given)."""


def document(content: str, key: ConversationKey, owner_id: str) -> str:
    """The ``stems`` of a message (a ``tsvector`` literal): the stems of ``content`` and the
    scope lexemes of its conversation ``key`` and of its owner. Written by :func:`insert`,
    checked and rebuilt by :mod:`fermix.storage.postgres.health`."""
    return stems.document(content, (conversation_token(key), owner_token(key.agent_id, owner_id)))


def insert(conn: Conn, new: NewMessage, *, created_at: int | None = None) -> Message:
    """Insert ``new`` in the caller's transaction and return the stored row.

    Its trust is ``new.trust``, or else its conversation's (a guest's without a row, M2).
    Its time is ``created_at``, or else now but not before the conversation's latest
    message: the caller touched the conversation first, so its row is locked when the
    insert runs and every message committed before it is seen. Within a conversation times
    then follow ids, as on SQLite, even when another service's clock is ahead of this one's
    (another machine: windows are read in time order, and a time behind the latest would
    put an acknowledged message before older ones, tests/server/test_multi_service.py), and even
    though in the group commit's pipeline the clock is read before the touch has waited for
    the lock. The latest time is the conversation's ``latest_message_at``, which the
    ``messages_bi`` trigger keeps (a primary-key lookup, where ``max(created_at)`` over the
    messages could be planned by another index, schema migration 7): reading the clock
    after the lock is not enough, since the clocks of two services need not agree.

    A client key already stored in the conversation, by this transaction or one committed
    (in any process), is a ``psycopg.errors.UniqueViolation``; the PostgreSQL committer
    runs the unit once more, so its own read by client key then finds that row (N3).
    """
    return insert_stemmed(
        conn, new, document(new.content, new.key, new.owner_id), created_at=created_at
    )


def insert_stemmed(
    conn: Conn, new: NewMessage, stems: str, *, created_at: int | None = None
) -> Message:
    """:func:`insert`, with ``stems`` (its :func:`document`) made beforehand: by an
    append's caller before it queued (:class:`~fermix.storage.postgres.committer.StemmedAppend`)."""
    key = new.key.as_tuple()
    agent_id, channel, chat_id, thread_scope = key
    values = (
        agent_id,
        new.owner_id,
        channel,
        chat_id,
        thread_scope,
        new.sender,
        new.role,
        new.kind,
        new.content,
        new.metadata_json(),
    )
    stamped = created_at is not None
    params: list[Any] = [*values, now_ms() if created_at is None else created_at]
    if not stamped:
        params.extend(key)
    params += [new.client_key, stems]
    params.extend(key if new.trust is None else (new.trust,))
    sql = _INSERTS[(stamped, new.trust is not None)]
    message_id, stored_at, trust = fetch_rows(conn, sql, params)[0]
    return Message(int(message_id), *values, int(stored_at), trust, new.client_key)


_ITS_KEY = (
    "c.agent_id = i.agent_id AND c.channel = i.channel AND c.chat_id = i.chat_id"
    " AND c.thread_scope = i.thread_scope"
)
"""The row ``i``'s conversation: scalar subqueries by it are primary-key lookups whatever
the plan (a join could be planned as a scan of every conversation, and cached so)."""
INSERT_ALL = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at, client_key, stems, trust)"
    " SELECT i.agent_id, i.owner_id, i.channel, i.chat_id, i.thread_scope, i.sender, i.role,"
    " i.kind, i.content, i.metadata_json,"
    " greatest(i.created_at, (SELECT c.latest_message_at FROM conversations AS c"
    f"  WHERE {_ITS_KEY})), NULL, i.stems::tsvector,"
    f" coalesce(i.trust, (SELECT c.trust FROM conversations AS c WHERE {_ITS_KEY}), 'guest')"
    " FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(r, n),"
    " LATERAL (SELECT e.r->>0 AS agent_id, e.r->>1 AS owner_id, e.r->>2 AS channel,"
    "  e.r->>3 AS chat_id, e.r->>4 AS thread_scope, e.r->>5 AS sender, e.r->>6 AS role,"
    "  e.r->>7 AS kind, e.r->>8 AS content, e.r->>9 AS metadata_json,"
    "  (e.r->>10)::bigint AS created_at, e.r->>11 AS stems, e.r->>12 AS trust) AS i"
    " ORDER BY e.n"
    " RETURNING id, created_at, trust, agent_id, channel, chat_id, thread_scope"
)


def insert_all(conn: Conn, news: Sequence[NewMessage], documents: Sequence[str]) -> list[Message]:
    """:func:`insert` of each of ``news`` (no client key, in distinct conversations, each
    touched first) in one statement, with ``documents`` their stems (:func:`document`); the
    stored rows, in the order of ``news``.

    The rows are inserted in that order, so the ``messages_bi`` trigger draws their ids in
    it; each is timed now but not before its conversation's latest message, as
    :func:`insert` times one (a conversation has one message here, so the latest is one
    committed before).

    The rows go out as one JSON array (:func:`~fermix.storage.postgres.connection.rows_param`):
    psycopg builds the thirteen arrays of an ``unnest`` in Python, about 180 us for 8 rows
    on this machine's 2 cores, where ``json.dumps`` takes 20 (issue 25: the group commit's
    leader does it while every caller of its batch waits).
    """
    param, read = insert_all_param(news, documents)
    return read(fetch_rows(conn, INSERT_ALL, (param,)))


_Values: TypeAlias = tuple[str, str, str, str, str, str, str, str, str, str]
"""A message's own values, from its agent to its metadata, as :class:`Message` takes them."""


def insert_all_param(
    news: Sequence[NewMessage], documents: Sequence[str]
) -> tuple[str, Callable[[Sequence[Sequence[Any]]], list[Message]]]:
    """The one parameter of :data:`INSERT_ALL` that inserts ``news`` with ``documents``
    (as :func:`insert_all` does), and what makes the stored messages of the rows it
    returns."""
    now = now_ms()
    rows: list[_Values] = []
    sent: list[tuple[Any, ...]] = []
    for new, stemmed in zip(news, documents, strict=True):
        assert new.client_key is None  # the run of plain appends: no key to answer under
        values: _Values = (
            *new.key.as_tuple()[:1],
            new.owner_id,
            *new.key.as_tuple()[1:],
            new.sender,
            new.role,
            new.kind,
            new.content,
            new.metadata_json(),
        )
        rows.append(values)
        sent.append((*values, now, stemmed, new.trust))

    def read(returned: Sequence[Sequence[Any]]) -> list[Message]:
        stored = {tuple(found[3:]): found[:3] for found in returned}
        out: list[Message] = []
        for new, values in zip(news, rows, strict=True):
            message_id, stored_at, trust = stored[new.key.as_tuple()]
            out.append(Message(int(message_id), *values, int(stored_at), trust, None))
        return out

    return rows_param(sent), read


# -- search ----------------------------------------------------------------------------

DIRECT_MATCH_ROWS = 1_000
"""The most messages a conversation may hold for a search to read them all by its index and
match each row's stems, instead of asking the GIN index.

The GIN index finds a conversation's matching rows by stepping through every search word's
posting list from one of the conversation's runs of ids to the next, and those lists grow
with the table: for a conversation of 500 messages the index scan read 19 pages at 20,000
messages and 71 at 1,000,000 (p50; p99 28 and 172), while the rows it led to took 25 pages
at both, and the statement's time went from 0.21 to 0.94 ms. Reading the whole conversation
took 0.42 and 0.64 ms (its own pages only; at 1,000,000 messages they come from outside
PostgreSQL's buffers). Both ways cost the same at about 2,000 messages in a table of
1,000,000 (bench/backends.py's data: a conversation's sessions interleaved with others');
in a smaller table the index wins sooner, hence half that."""


@dataclass(frozen=True, slots=True)
class SearchScope(messages.SearchScope):
    """A search scope (:class:`fermix.storage.messages.SearchScope`) whose tokens are
    lexemes of the stems, which let the GIN index walk only the scope's rows."""

    mark: ClassVar[str] = "%s"

    def count(self, conn: Conn, *, up_to: int | None = None) -> int:
        """How many messages the scope holds (with ``up_to``, counted up to that many only):
        a conversation on its index, an owner on ``messages_owner``, an agent or the table
        row by row."""
        if up_to is None:
            sql = f"SELECT count(*) FROM messages AS m WHERE {self.clause()}"
            return int(fetch_value(conn, sql, self.params))
        sql = (
            f"SELECT count(*) FROM (SELECT FROM messages AS m WHERE {self.clause()} LIMIT %s) AS s"
        )
        return int(fetch_value(conn, sql, (*self.params, up_to)))

    def matching(self, *, direct: bool) -> str:
        """The ids and contents of the scope's rows whose stems match a ``tsquery``: a query
        taking the scope's parameters, then the ``tsquery``. ``direct`` reads every row of
        the scope, by its index, and matches each one; else the GIN index finds them."""
        if direct:
            # OFFSET 0 keeps the match out of the subquery (a subquery with a LIMIT or an
            # OFFSET takes no condition from outside), where the planner would find it a
            # GIN index to AND with the conversation's.
            return (
                "SELECT m.id, m.content FROM (SELECT id, content, stems FROM messages AS m"
                f" WHERE {self.clause()} OFFSET 0) AS m WHERE m.stems @@ %s::tsquery"
            )
        return (
            "SELECT m.id, m.content FROM messages AS m"
            f" WHERE {self.clause()} AND m.stems @@ %s::tsquery"
        )


def _small_conversation(conn: Conn, scope: SearchScope) -> int | None:
    """How many messages ``scope`` holds when it is a conversation of at most
    :data:`DIRECT_MATCH_ROWS` (counted on its index, no further than one past that), else
    None."""
    if not scope.indexed:
        return None
    rows = scope.count(conn, up_to=DIRECT_MATCH_ROWS + 1)
    return rows if rows <= DIRECT_MATCH_ROWS else None


def search(
    conn: Conn,
    text: str,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = 10,
    ranked: int = 0,
    scope_rows: int | None = None,
) -> SearchHits:
    """Messages matching any text, best first (:meth:`fermix.storage.port.Reads.search_messages`).

    The candidates are the scope's rows holding any search word and the scope lexemes, in
    id order, so :func:`messages.ranked_hits` sees the rows SQLite's ``MATCH`` gives, in its
    order, and returns the same hits and ranks. A conversation of at most
    :data:`DIRECT_MATCH_ROWS` messages is read by its index and each row matched, so its
    search costs what the conversation holds, whatever the table holds; any other scope is
    searched through the GIN index. Over :data:`MAX_SCOPED_MATCHES` matches, where SQLite
    takes the best by FTS5's ``bm25()``, the candidates are the best by ``ts_rank`` instead:
    the one case whose results may differ.
    """
    if fts.build_query(text) is None or limit <= 0:
        return SearchHits()
    words = stems.query(text)
    if words is None:
        return SearchHits()
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    small = _small_conversation(conn, scope)
    select = scope.matching(direct=small is not None)
    match = stems.scoped(words, scope.tokens)
    found = fetch_rows(
        conn, f"{select} ORDER BY m.id LIMIT %s", (*scope.params, match, MAX_SCOPED_MATCHES + 1)
    )
    if not found:
        return SearchHits()
    if len(found) > MAX_SCOPED_MATCHES:
        found = fetch_rows(
            conn,
            f"{select} ORDER BY ts_rank(m.stems, %s::tsquery) DESC, m.id LIMIT %s",
            (*scope.params, match, words, messages.candidate_count(limit=limit, ranked=ranked)),
        )
    return messages.ranked_hits(
        PgSql(conn),
        text,
        found,
        scope_rows=scope_rows if scope_rows is not None else small or scope.count(conn),
        tokenize=stems.tokenizer(),
        limit=limit,
        ranked=ranked,
    )
