"""The ``messages`` table: conversation history with its FTS5 mirror (S3, S4)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.model import ConversationKey, Message, NewMessage, SearchHit
from fermix.storage import fulltext as fts
from fermix.storage.messages import (
    MAX_SCOPED_MATCHES,
    scope_filter,
)
from fermix.storage.port import CANDIDATES, SearchHits
from fermix.storage.sqlite.connection import fetch_value

_COLUMNS = (
    "id, agent_id, owner_id, channel, chat_id, thread_scope, sender, role, kind, content, "
    "metadata_json, created_at, trust, client_key"
)


def _row(values: tuple[Any, ...]) -> Message:
    return Message(*values)


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


def by_client_key(conn: apsw.Connection, key: ConversationKey, client_key: str) -> Message | None:
    """The message of conversation ``key`` stored under ``client_key``, or None (N3)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM messages WHERE agent_id = ? AND channel = ? AND chat_id = ?"
        " AND thread_scope = ? AND client_key = ?",
        (*key.as_tuple(), client_key),
    ).fetchall()
    return _row(rows[0]) if rows else None


def get(conn: apsw.Connection, message_id: int) -> Message | None:
    """The message with ``message_id``, or None."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchall()
    return _row(rows[0]) if rows else None


def conversation(
    conn: apsw.Connection,
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
    where = "agent_id = ? AND channel = ? AND chat_id = ? AND thread_scope = ? AND id > ?"
    params: list[Any] = [*key.as_tuple(), after_id]
    if role is not None:
        where += " AND role = ?"
        params.append(role)
    order = "DESC" if newest else "ASC"
    sql = f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY created_at {order}, id {order}"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    rows = [_row(r) for r in conn.execute(sql, params)]
    if newest:
        rows.reverse()
    return rows


def count(conn: apsw.Connection, key: ConversationKey, *, after_id: int = 0) -> int:
    """How many messages ``key`` has with id > ``after_id``."""
    return int(
        fetch_value(
            conn,
            "SELECT count(*) FROM messages WHERE agent_id = ? AND channel = ? AND chat_id = ?"
            " AND thread_scope = ? AND id > ?",
            (*key.as_tuple(), after_id),
        )
    )


# -- search ----------------------------------------------------------------------------
#
# A search names its scope: one conversation (``key``), one owner's messages of an agent
# (``agent_id`` and ``owner_id``), an agent, or the whole table. :class:`SearchScope` holds
# the two faces of a scope: the SQL filter on the row's own columns, which is the rule
# (every query of a search carries it), and the FTS5 tokens that let the index walk only
# the scope's rows (schema migration 7: ``messages.search_scope``, indexed beside the
# text). A vector search of messages (issue 14) takes its rows from the same filter.


@dataclass(frozen=True, slots=True)
class SearchScope:
    """The messages one search covers: a SQL filter on ``messages AS m`` and the FTS5
    scope tokens every one of those messages is indexed with (none for an agent or the
    whole table, which have no token)."""

    where: tuple[str, ...]
    params: tuple[Any, ...]
    tokens: tuple[str, ...]
    indexed: bool = False
    """Whether the filter is a range of an index of ``messages`` (a conversation's)."""

    @classmethod
    def of(
        cls,
        *,
        agent_id: str | None = None,
        key: ConversationKey | None = None,
        owner_id: str | None = None,
    ) -> SearchScope:
        """The scope of :func:`search`'s filters (``key`` wins over ``agent_id``)."""
        return cls(*scope_filter(agent_id=agent_id, key=key, owner_id=owner_id, mark="?"))

    def clause(self) -> str:
        """The filter as one SQL condition on ``m`` (``1`` for the whole table)."""
        return " AND ".join(self.where) or "1"

    def match(self, words: str | None = None) -> str:
        """An FTS5 MATCH expression for the scope's rows holding ``words`` (an expression of
        :func:`fts.build_query`), or for all its rows when ``words`` is None."""
        parts = [f"search_scope : {fts.quote(token)}" for token in self.tokens]
        if words is not None:
            parts.append(f"content : ({words})")
        return " AND ".join(parts)

    def count(self, conn: apsw.Connection) -> int:
        """How many messages the scope holds.

        A conversation is counted on its index; an owner's rows through their token's
        doclist, each checked against the filter; an agent or the table, row by row.
        """
        if self.tokens and not self.indexed:
            sql = (
                "SELECT count(*) FROM messages_fts JOIN messages AS m"
                " ON m.id = messages_fts.rowid"
                f" WHERE messages_fts MATCH ? AND {self.clause()}"
            )
            return int(fetch_value(conn, sql, (self.match(), *self.params)))
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
) -> SearchHits:
    """Messages matching any text, best first; filters narrow to an agent, owner or key.

    ``text`` is whatever a user or model typed: it goes through :func:`fts.build_query`, so
    FTS5 syntax in it is inert and it never raises on content. The rows of the scope
    holding a word are found through the scope's token (:class:`SearchScope`), so the cost
    follows the scope searched, not the table. They are ordered by bm25 over the scope
    (:func:`fts.preselect`); the best :data:`CANDIDATES` are re-ranked by
    :func:`fts.rank` with statistics of the scope; a hit's ``rank`` is minus that score,
    so lower is still better. Rows that tie stay in the preselection's order, then by id.

    When more than :data:`MAX_SCOPED_MATCHES` rows match (a very large scope, or a search
    of an agent or the whole table with a common word), the candidates are the best by
    FTS5's own ``bm25()`` instead, whose statistics are the table's.

    The best ``limit`` are returned whole; with ``ranked``, the ids and ranks of the best
    ``ranked`` too (:class:`SearchHits`), the same as the hits of a search with that
    limit, without reading their rows.
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
    candidates = max(CANDIDATES, limit, ranked)
    found: list[tuple[Any, ...]] = conn.execute(
        f"{select} ORDER BY messages_fts.rowid LIMIT ?",
        (match, *scope.params, MAX_SCOPED_MATCHES + 1),
    ).fetchall()
    if not found:
        return SearchHits()
    if len(found) > MAX_SCOPED_MATCHES:
        found = conn.execute(
            f"{select} ORDER BY bm25(messages_fts, 1.0, 0.0) LIMIT ?",
            (match, *scope.params, candidates),
        ).fetchall()
    scope_rows = scope.count(conn)
    tokenize = fts.tokenizer(conn)
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
    ids = json.dumps([found[i][0] for i in best])
    sql = f"SELECT {_COLUMNS} FROM messages WHERE id IN (SELECT value FROM json_each(?))"
    rows = conn.execute(sql, (ids,))
    by_id = {message.id: message for message in map(_row, rows)}
    # A row deleted since the match is left out rather than failing the search.
    hits = [SearchHit(by_id[found[i][0]], -scores[i]) for i in best if found[i][0] in by_id]
    if not ranked:
        return SearchHits(hits)
    top = order[:ranked]
    return SearchHits(hits, [found[i][0] for i in top], [-scores[i] for i in top])


def stored_after(
    conn: apsw.Connection,
    key: ConversationKey,
    *,
    after_id: int,
    stored_from: int = 0,
    limit: int | None = None,
) -> list[Message]:
    """Messages of ``key`` with id > ``after_id`` stored at or after ``stored_from`` (epoch
    ms), oldest first; the newest ``limit`` of them when given.

    The time bound is a range of the conversation's index, so a read of the few messages
    after a known one costs the same in a conversation of ten messages or of a million.
    """
    sql = (
        f"SELECT {_COLUMNS} FROM messages WHERE agent_id = ? AND channel = ? AND chat_id = ?"
        " AND thread_scope = ? AND created_at >= ? AND id > ?"
    )
    params: list[Any] = [*key.as_tuple(), stored_from, after_id]
    if limit is None:
        return [_row(r) for r in conn.execute(sql + " ORDER BY created_at, id", params)]
    rows = [
        _row(r)
        for r in conn.execute(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", [*params, limit])
    ]
    rows.reverse()
    return rows
