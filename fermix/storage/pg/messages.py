"""The ``messages`` table on PostgreSQL: the operations of :mod:`fermix.storage.messages`,
with the same results.

The row's id is drawn by the ``messages_bi`` trigger after the conversation's row is
locked (schema.sql), so within one conversation ids commit in order. A message is stored
with its search stems (:mod:`fermix.storage.pg.stems`); a search finds the scope's rows
holding a word through the GIN index over them, then ranks exactly as SQLite does
(:func:`fermix.storage.fts.preselect` and :func:`~fermix.storage.fts.rank`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fermix.clock import now_ms
from fermix.model import ConversationKey, Message, NewMessage, SearchHit
from fermix.storage import fts
from fermix.storage.messages import (
    MAX_SCOPED_MATCHES,
    SearchHits,
    conversation_token,
    owner_token,
)
from fermix.storage.pg import stems
from fermix.storage.pg.connection import Conn, fetch_rows, fetch_value

_COLUMNS = (
    "id, agent_id, owner_id, channel, chat_id, thread_scope, sender, role, kind, content, "
    "metadata_json, created_at, trust, client_key"
)
_WHERE_KEY = "agent_id = %s AND channel = %s AND chat_id = %s AND thread_scope = %s"


def _row(values: tuple[Any, ...]) -> Message:
    return Message(*values)


_INSERT = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at, client_key, stems, trust)"
    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,{created_at},%s,%s::tsvector,{trust})"
    " RETURNING id, created_at, trust"
)
_NOT_BEFORE_LATEST = f"greatest(%s, (SELECT max(created_at) FROM messages WHERE {_WHERE_KEY}))"
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
    checked and rebuilt by :mod:`fermix.storage.pg.health`."""
    return stems.document(content, (conversation_token(key), owner_token(key.agent_id, owner_id)))


def insert(conn: Conn, new: NewMessage, *, created_at: int | None = None) -> Message:
    """Insert ``new`` in the caller's transaction and return the stored row.

    Its trust is ``new.trust``, or else its conversation's (a guest's without a row, M2).
    Its time is ``created_at``, or else now but not before the conversation's latest
    message: the caller touched the conversation first, so its row is locked when the
    insert runs and every message committed before it is seen. Within a conversation times
    then follow ids, as on SQLite, even when another service's clock is ahead of this one's
    (another machine: windows are read in time order, and a time behind the latest would
    put an acknowledged message before older ones, tests/test_multi_service.py), and even
    though in the group commit's pipeline the clock is read before the touch has waited for
    the lock. The read of the latest time (about 20 us) is paid on every insert: reading
    the clock after the lock is not enough, since the clocks of two services need not agree.

    A client key already stored in the conversation, by this transaction or one committed
    (in any process), is a ``psycopg.errors.UniqueViolation``; the PostgreSQL committer
    runs the unit once more, so its own read by client key then finds that row (N3).
    """
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
    params += [new.client_key, document(new.content, new.key, new.owner_id)]
    params.extend(key if new.trust is None else (new.trust,))
    sql = _INSERTS[(stamped, new.trust is not None)]
    message_id, stored_at, trust = fetch_rows(conn, sql, params)[0]
    return Message(int(message_id), *values, int(stored_at), trust, new.client_key)


def by_client_key(conn: Conn, key: ConversationKey, client_key: str) -> Message | None:
    """The message of conversation ``key`` stored under ``client_key``, or None (N3)."""
    rows = fetch_rows(
        conn,
        f"SELECT {_COLUMNS} FROM messages WHERE {_WHERE_KEY} AND client_key = %s",
        (*key.as_tuple(), client_key),
    )
    return _row(rows[0]) if rows else None


def get(conn: Conn, message_id: int) -> Message | None:
    """The message with ``message_id``, or None."""
    rows = fetch_rows(conn, f"SELECT {_COLUMNS} FROM messages WHERE id = %s", (message_id,))
    return _row(rows[0]) if rows else None


def conversation(
    conn: Conn,
    key: ConversationKey,
    *,
    after_id: int = 0,
    limit: int | None = None,
    newest: bool = False,
    role: str | None = None,
) -> list[Message]:
    """Messages of ``key`` with id > ``after_id``, oldest first.

    With ``limit``, the first ``limit`` such messages, or the last ``limit`` when ``newest``
    (still returned oldest first).
    """
    where = f"{_WHERE_KEY} AND id > %s"
    params: list[Any] = [*key.as_tuple(), after_id]
    if role is not None:
        where += " AND role = %s"
        params.append(role)
    order = "DESC" if newest else "ASC"
    sql = f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY created_at {order}, id {order}"
    if limit is not None:
        sql += " LIMIT %s"
        params.append(limit)
    rows = [_row(r) for r in fetch_rows(conn, sql, params)]
    if newest:
        rows.reverse()
    return rows


def count(conn: Conn, key: ConversationKey, *, after_id: int = 0) -> int:
    """How many messages ``key`` has with id > ``after_id``."""
    return int(
        fetch_value(
            conn,
            f"SELECT count(*) FROM messages WHERE {_WHERE_KEY} AND id > %s",
            (*key.as_tuple(), after_id),
        )
    )


def stored_after(
    conn: Conn,
    key: ConversationKey,
    *,
    after_id: int,
    stored_from: int = 0,
    limit: int | None = None,
) -> list[Message]:
    """Messages of ``key`` with id > ``after_id`` stored at or after ``stored_from`` (epoch
    ms), oldest first; the newest ``limit`` of them when given."""
    sql = f"SELECT {_COLUMNS} FROM messages WHERE {_WHERE_KEY} AND created_at >= %s AND id > %s"
    params: list[Any] = [*key.as_tuple(), stored_from, after_id]
    if limit is None:
        return [_row(r) for r in fetch_rows(conn, sql + " ORDER BY created_at, id", params)]
    rows = [
        _row(r)
        for r in fetch_rows(
            conn, sql + " ORDER BY created_at DESC, id DESC LIMIT %s", [*params, limit]
        )
    ]
    rows.reverse()
    return rows


# -- search ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SearchScope:
    """The messages one search covers, as :class:`fermix.storage.messages.SearchScope`: a
    SQL filter on ``messages AS m`` (the rule) and the scope lexemes that let the GIN index
    walk only the scope's rows (the accelerator)."""

    where: tuple[str, ...]
    params: tuple[Any, ...]
    tokens: tuple[str, ...]
    indexed: bool = False

    @classmethod
    def of(
        cls,
        *,
        agent_id: str | None = None,
        key: ConversationKey | None = None,
        owner_id: str | None = None,
    ) -> SearchScope:
        """The scope of :func:`search`'s filters (``key`` wins over ``agent_id``)."""
        where: list[str] = []
        params: list[Any] = []
        tokens: list[str] = []
        if key is not None:
            where.append(
                "m.agent_id = %s AND m.channel = %s AND m.chat_id = %s AND m.thread_scope = %s"
            )
            params.extend(key.as_tuple())
            tokens.append(conversation_token(key))
            agent_id = key.agent_id
        elif agent_id is not None:
            where.append("m.agent_id = %s")
            params.append(agent_id)
        if owner_id is not None:
            where.append("m.owner_id = %s")
            params.append(owner_id)
            if agent_id is not None:
                tokens.append(owner_token(agent_id, owner_id))
        return cls(tuple(where), tuple(params), tuple(tokens), indexed=key is not None)

    def clause(self) -> str:
        """The filter as one SQL condition on ``m`` (``true`` for the whole table)."""
        return " AND ".join(self.where) or "true"

    def count(self, conn: Conn) -> int:
        """How many messages the scope holds: a conversation on its index, an owner on
        ``messages_owner``, an agent or the table row by row."""
        sql = f"SELECT count(*) FROM messages AS m WHERE {self.clause()}"
        return int(fetch_value(conn, sql, self.params))


def search(
    conn: Conn,
    text: str,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = 10,
    ranked: int = 0,
) -> SearchHits:
    """Messages matching any text, best first, as :func:`fermix.storage.messages.search`
    (with ``ranked``, the ids and ranks of the best ``ranked`` candidates too).

    The candidates are the scope's rows holding any search word (the GIN index over the
    stems, intersected with the scope lexemes), in id order, so :func:`fts.preselect` and
    :func:`fts.rank` see the rows SQLite's ``MATCH`` gives, in its order, and return the
    same hits and ranks. Over :data:`MAX_SCOPED_MATCHES` matches, where SQLite takes the
    best by FTS5's ``bm25()``, the candidates are the best by ``ts_rank`` instead: the one
    case whose results may differ.
    """
    if fts.build_query(text) is None or limit <= 0:
        return SearchHits()
    words = stems.query(text)
    if words is None:
        return SearchHits()
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    select = (
        "SELECT m.id, m.content FROM messages AS m"
        f" WHERE m.stems @@ %s::tsquery AND {scope.clause()}"
    )
    match = stems.scoped(words, scope.tokens)
    candidates = max(fts.CANDIDATES, limit, ranked)
    found = fetch_rows(
        conn, f"{select} ORDER BY m.id LIMIT %s", (match, *scope.params, MAX_SCOPED_MATCHES + 1)
    )
    if not found:
        return SearchHits()
    if len(found) > MAX_SCOPED_MATCHES:
        found = fetch_rows(
            conn,
            f"{select} ORDER BY ts_rank(m.stems, %s::tsquery) DESC, m.id LIMIT %s",
            (match, *scope.params, words, candidates),
        )
    scope_rows = scope.count(conn)
    tokenize = stems.tokenizer()
    tokens = fts.tokenize_each([row[1] for row in found], tokenize)
    chosen = fts.preselect(text, tokens, scope_rows=scope_rows, keep=candidates, tokenize=tokenize)
    found = [found[i] for i in chosen]
    scores = fts.rank(
        text,
        [row[1] for row in found],
        scope_rows=scope_rows,
        tokenize=tokenize,
        tokens=[tokens[i] for i in chosen],
    )
    order = sorted(range(len(found)), key=lambda i: -scores[i])
    best = order[:limit]
    ids = [int(found[i][0]) for i in best]
    rows = fetch_rows(conn, f"SELECT {_COLUMNS} FROM messages WHERE id = ANY(%s)", (ids,))
    by_id = {message.id: message for message in map(_row, rows)}
    # A row deleted since the match is left out rather than failing the search.
    hits = [SearchHit(by_id[found[i][0]], -scores[i]) for i in best if found[i][0] in by_id]
    if not ranked:
        return SearchHits(hits)
    top = order[:ranked]
    return SearchHits(hits, [int(found[i][0]) for i in top], [-scores[i] for i in top])
