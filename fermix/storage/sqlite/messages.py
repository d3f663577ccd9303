"""The ``messages`` table on SQLite: the insert, and the search through its FTS5 mirror (S3,
S4); the reads and the search's ranking are :mod:`fermix.storage.messages`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage import fulltext as fts
from fermix.storage import messages
from fermix.storage.messages import MAX_SCOPED_MATCHES
from fermix.storage.port import SearchHits
from fermix.storage.sqlite.connection import fetch_value
from fermix.storage.sqlite.sql import SqliteSql

_INSERT = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at, client_key, trust)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_WITH_CONVERSATION_TRUST = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at, client_key, trust)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,"
    " coalesce((SELECT trust FROM conversations WHERE agent_id = ? AND channel = ?"
    " AND chat_id = ? AND thread_scope = ?), 'guest'))"
    " RETURNING id, trust"
)


def insert(conn: apsw.Connection, new: NewMessage, *, created_at: int | None = None) -> Message:
    """Insert ``new`` in the caller's transaction and return the stored row.

    Its trust is ``new.trust``, or else its conversation's (a guest's without a row, M2).
    """
    metadata_json = new.metadata_json()
    ts = now_ms() if created_at is None else created_at
    agent_id, channel, chat_id, thread_scope = new.key.as_tuple()
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
        metadata_json,
        ts,
    )
    client_key = new.client_key
    # The row is built from the values just bound (no trigger or default changes a column
    # of it); only what SQLite decides is read back: the id, and a trust left to it.
    trust: str
    if new.trust is not None:
        trust = new.trust
        conn.execute(_INSERT, (*values, client_key, trust))
        message_id = conn.last_insert_rowid()
    else:
        row: tuple[Any, ...] = conn.execute(
            _INSERT_WITH_CONVERSATION_TRUST,
            (*values, client_key, agent_id, channel, chat_id, thread_scope),
        ).fetchall()[0]
        message_id, trust = row
    return Message(message_id, *values, trust, client_key)


# -- search: FTS5 finds the candidates (the ranking is shared: messages.ranked_hits)


@dataclass(frozen=True, slots=True)
class SearchScope(messages.SearchScope):
    """A search scope (:class:`fermix.storage.messages.SearchScope`) whose tokens are FTS5
    tokens of ``messages_fts.search_scope``."""

    def match(self, words: str | None = None) -> str:
        """An FTS5 MATCH expression for the scope's rows holding ``words`` (an expression of
        :func:`fts.build_query`), or for all its rows when ``words`` is None."""
        parts = [f"search_scope : {fts.quote(token)}" for token in self.tokens]
        if words is not None:
            parts.append(f"content : ({words})")
        return " AND ".join(parts)

    def count(self, conn: apsw.Connection) -> int:
        """How many messages the scope holds: a conversation's and an owner's counted on an
        index of ``messages``, an agent's or the table's row by row."""
        sql = f"SELECT count(*) FROM messages AS m WHERE {self.clause()}"
        return int(fetch_value(conn, sql, self.params))


def search(
    conn: apsw.Connection,
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

    ``text`` goes through :func:`fts.build_query`, so FTS5 syntax in it is inert and it
    never raises on content. The rows of the scope holding a word are found through the
    scope's token (:class:`SearchScope`), so the cost follows the scope searched, not the
    table, in rowid order, and ranked by :func:`messages.ranked_hits`. When more than
    :data:`MAX_SCOPED_MATCHES` rows match (a very large scope, or a search of an agent or
    the whole table with a common word), the candidates are the best by FTS5's own
    ``bm25()`` instead, whose statistics are the table's.
    """
    words = fts.build_query(text)
    if words is None or limit <= 0:
        return SearchHits()
    scope = SearchScope.of(agent_id=agent_id, key=key, owner_id=owner_id)
    select = (
        "SELECT m.id, m.content FROM messages_fts JOIN messages AS m"
        " ON m.id = messages_fts.rowid"
        f" WHERE messages_fts MATCH ? AND {scope.clause()}"
    )
    match = scope.match(words)
    found: list[tuple[Any, ...]] = conn.execute(
        f"{select} ORDER BY messages_fts.rowid LIMIT ?",
        (match, *scope.params, MAX_SCOPED_MATCHES + 1),
    ).fetchall()
    if not found:
        return SearchHits()
    if len(found) > MAX_SCOPED_MATCHES:
        found = conn.execute(
            f"{select} ORDER BY bm25(messages_fts, 1.0, 0.0) LIMIT ?",
            (match, *scope.params, messages.candidate_count(limit=limit, ranked=ranked)),
        ).fetchall()
    return messages.ranked_hits(
        SqliteSql(conn),
        text,
        found,
        scope_rows=scope.count(conn) if scope_rows is None else scope_rows,
        tokenize=fts.tokenizer(conn),
        limit=limit,
        ranked=ranked,
    )
