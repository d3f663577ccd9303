"""The ``messages`` table: conversation history with its FTS5 mirror (S3, S4)."""

from __future__ import annotations

import json
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.model import ConversationKey, Message, NewMessage, SearchHit
from fermix.storage import fts
from fermix.storage.connection import fetch_value

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


def search(
    conn: apsw.Connection,
    text: str,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = 10,
) -> list[SearchHit]:
    """Messages matching any text, best first; filters narrow to an agent, owner or key.

    ``text`` is whatever a user or model typed: it goes through :func:`fts.build_query`, so
    FTS5 syntax in it is inert and it never raises on content. The best
    :data:`fts.CANDIDATES` matches by FTS5's bm25 are re-ranked by :func:`fts.rank` with
    statistics of the filtered rows (one conversation, not the whole table); a hit's
    ``rank`` is minus that score, so lower is still better.
    """
    match = fts.build_query(text)
    if match is None or limit <= 0:
        return []
    where: list[str] = []
    params: list[Any] = []
    if key is not None:
        where.append("m.agent_id = ? AND m.channel = ? AND m.chat_id = ? AND m.thread_scope = ?")
        params.extend(key.as_tuple())
    elif agent_id is not None:
        where.append("m.agent_id = ?")
        params.append(agent_id)
    if owner_id is not None:
        where.append("m.owner_id = ?")
        params.append(owner_id)
    sql = (
        "SELECT m.id, m.content FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid"
        f" WHERE {' AND '.join(['messages_fts MATCH ?', *where])}"
        " ORDER BY bm25(messages_fts) LIMIT ?"
    )
    candidates = max(fts.CANDIDATES, limit)
    found: list[tuple[Any, ...]] = conn.execute(sql, [match, *params, candidates]).fetchall()
    if not found:
        return []
    scope_sql = "SELECT count(*) FROM messages AS m"
    if where:
        scope_sql += f" WHERE {' AND '.join(where)}"
    scope_rows: Any = conn.execute(scope_sql, params).fetchall()[0][0]
    scores = fts.rank(
        text, [row[1] for row in found], scope_rows=int(scope_rows), tokenize=fts.tokenizer(conn)
    )
    best = sorted(range(len(found)), key=lambda i: -scores[i])[:limit]
    ids = json.dumps([found[i][0] for i in best])
    sql = f"SELECT {_COLUMNS} FROM messages WHERE id IN (SELECT value FROM json_each(?))"
    rows = conn.execute(sql, (ids,))
    by_id = {message.id: message for message in map(_row, rows)}
    # A row deleted since the match is left out rather than failing the search.
    return [SearchHit(by_id[found[i][0]], -scores[i]) for i in best if found[i][0] in by_id]


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
