"""The ``conversations`` table: per-conversation state that must hold across processes.

One row per conversation key: who owns it and at what trust, which stored messages form its
window (everything after ``window_after_id``, behind an optional checkpoint message), and
the gates of the reviewer (E2) and the compactor (K3), with since when a review is due: the
sweep's index (migration 9, :func:`claim_due_reviews`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.errors import InvalidInputError
from fermix.model import ConversationKey, ConversationState, Message, check_trust
from fermix.storage.conversations import COLUMNS, due_params, still_due
from fermix.storage.port import NO_MARK, WindowMark
from fermix.storage.sqlite import messages
from fermix.storage.sqlite.connection import fetch_rows, fetch_value

_SELECT = ", ".join(COLUMNS)
_WHERE_KEY = "agent_id = ? AND channel = ? AND chat_id = ? AND thread_scope = ?"


def get(conn: apsw.Connection, key: ConversationKey) -> ConversationState | None:
    """The state of ``key``, or None if it was never written."""
    rows = fetch_rows(
        conn, f"SELECT {_SELECT} FROM conversations WHERE {_WHERE_KEY}", key.as_tuple()
    )
    return ConversationState(*rows[0]) if rows else None


def touch(conn: apsw.Connection, key: ConversationKey, *, owner_id: str, trust: str) -> None:
    """Create the row of ``key`` or bring it to this owner and trust; writes nothing when
    both are unchanged (caller's transaction)."""
    check_trust(trust)
    ts = now_ms()
    conn.execute(
        "INSERT INTO conversations (agent_id, channel, chat_id, thread_scope, owner_id, trust,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (agent_id, channel, chat_id, thread_scope) DO UPDATE SET"
        " owner_id = excluded.owner_id, trust = excluded.trust, updated_at = excluded.updated_at"
        " WHERE owner_id IS NOT excluded.owner_id OR trust IS NOT excluded.trust",
        (*key.as_tuple(), owner_id, trust, ts, ts),
    )


def update(conn: apsw.Connection, /, key: ConversationKey, **fields: Any) -> None:
    """Set some columns of an existing conversation row (caller's transaction)."""
    unknown = set(fields) - set(COLUMNS[4:])
    if unknown:
        raise InvalidInputError(f"not conversation state columns: {sorted(unknown)}")
    fields.setdefault("updated_at", now_ms())
    assignments = ", ".join(f"{name} = ?" for name in fields)
    conn.execute(
        f"UPDATE conversations SET {assignments} WHERE {_WHERE_KEY}",
        (*fields.values(), *key.as_tuple()),
    )


def window(
    conn: apsw.Connection, key: ConversationKey, *, limit: int | None = None
) -> list[Message]:
    """The conversation's current window, oldest first: its checkpoint, then later messages.

    Messages before ``window_after_id`` stay stored (K5): a checkpoint or ``/new`` only
    moves the window's start. With ``limit``, only the newest ``limit`` messages are kept.
    """
    return _window_of(conn, key, get(conn, key), limit)


def window_mark(conn: apsw.Connection, key: ConversationKey) -> WindowMark:
    """The mark of the window of ``key`` (``(0, 0, None)`` without a row): one read by the
    primary key, which tells a cache whether the window it holds is still current (M4)."""
    rows = fetch_rows(
        conn,
        "SELECT window_version, window_after_id, checkpoint_message_id FROM conversations"
        f" WHERE {_WHERE_KEY}",
        key.as_tuple(),
    )
    return (int(rows[0][0]), int(rows[0][1]), rows[0][2]) if rows else NO_MARK


def window_snapshot(
    conn: apsw.Connection, key: ConversationKey, *, limit: int | None = None
) -> tuple[ConversationState | None, WindowMark, list[Message], Message | None]:
    """The state, the mark, the window (as :func:`window`) and the newest stored message of
    ``key``, read as one snapshot: another process's commit is in all of them or in none."""
    with _snapshot(conn):
        mark = window_mark(conn, key)
        state = get(conn, key)
        rows = _window_of(conn, key, state, limit)
        newest = messages.conversation(conn, key, limit=1, newest=True)
    return state, mark, rows, newest[0] if newest else None


def window_since(
    conn: apsw.Connection,
    key: ConversationKey,
    *,
    after_id: int,
    stored_from: int = 0,
    limit: int | None = None,
) -> tuple[WindowMark, list[Message]]:
    """The mark of ``key`` and its messages stored after message ``after_id``, oldest first
    (the newest ``limit`` of them), read as one snapshot.

    ``stored_from`` (the ``created_at`` of message ``after_id``) lets the read start there in
    the conversation's index instead of walking all of it; a message stored with an older
    time is left out, and the caller, counting what it got against the versions, reads the
    whole window instead.
    """
    with _snapshot(conn):
        mark = window_mark(conn, key)
        rows = messages.stored_after(
            conn, key, after_id=after_id, stored_from=stored_from, limit=limit
        )
    return mark, rows


@contextlib.contextmanager
def _snapshot(conn: apsw.Connection) -> Iterator[None]:
    # A savepoint is a read transaction outside a write, and nests inside one.
    conn.execute("SAVEPOINT window_snapshot")
    try:
        yield
    finally:
        conn.execute("RELEASE window_snapshot")


def _window_of(
    conn: apsw.Connection,
    key: ConversationKey,
    state: ConversationState | None,
    limit: int | None,
) -> list[Message]:
    after = 0 if state is None else state.window_after_id
    rows = messages.conversation(conn, key, after_id=after, limit=limit, newest=limit is not None)
    checkpoint_id = None if state is None else state.checkpoint_message_id
    if checkpoint_id is None:
        return rows
    rows = [m for m in rows if m.id != checkpoint_id]
    checkpoint = messages.get(conn, checkpoint_id)
    head = [checkpoint] if checkpoint is not None else []
    if limit is not None:
        rows = rows[-(limit - len(head)) :] if limit > len(head) else []
    return head + rows


def list_states(conn: apsw.Connection, *, agent_id: str | None = None) -> list[ConversationState]:
    """Every conversation row, of one agent when given."""
    sql = f"SELECT {_SELECT} FROM conversations"
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = ?"
        params = (agent_id,)
    return [ConversationState(*r) for r in fetch_rows(conn, sql, params)]


def newest_user_message_id(conn: apsw.Connection, key: ConversationKey) -> int:
    """The id of the conversation's newest user-sent message (0 when it has none)."""
    value = fetch_value(
        conn,
        f"SELECT max(id) FROM messages WHERE {_WHERE_KEY} AND role = 'user'",
        key.as_tuple(),
    )
    return int(value or 0)


def review_backlog(
    conn: apsw.Connection, key: ConversationKey, *, after_id: int, up_to: int, limit: int
) -> tuple[list[Message], int]:
    """The first ``limit`` user messages of ``key`` with ids in ``(after_id, up_to]``, in id
    order, and how many there are in all: what a review takes next, and its backlog (M5).

    In id order, not by time: the review's cursor is an id, so a message stored with an
    older clock must not fall behind it.
    """
    where = f"{_WHERE_KEY} AND role = 'user' AND id > ? AND id <= ?"
    params = (*key.as_tuple(), after_id, up_to)
    sql = f"SELECT {messages._COLUMNS} FROM messages WHERE {where} ORDER BY id LIMIT ?"
    rows = [messages._row(r) for r in fetch_rows(conn, sql, (*params, limit))]
    total = int(fetch_value(conn, f"SELECT count(*) FROM messages WHERE {where}", params))
    return rows, total


def claim_review(
    conn: apsw.Connection, key: ConversationKey, *, token: str, now: int, ttl_ms: int
) -> bool:
    """Take the review claim of ``key`` unless another live claim holds it (caller's
    transaction); True, the claim renewed, when ``token`` holds it already: a review takes
    over so what the sweep claimed for it (:func:`claim_due_reviews`).

    A claim past its expiry (its reviewer crashed) is taken over (E2).
    """
    conn.execute(
        "UPDATE conversations SET review_claim_token = ?, review_claim_expires_at = ?"
        f" WHERE {_WHERE_KEY} AND (review_claim_token IS NULL OR review_claim_token = ?"
        " OR review_claim_expires_at <= ?)",
        (token, now + ttl_ms, *key.as_tuple(), token, now),
    )
    return bool(conn.changes())


_DUE = (
    "review_due_at IS NOT NULL"
    " AND (last_reviewed_at IS NULL OR last_reviewed_at <= ?)"
    " AND (review_claim_token IS NULL OR review_claim_expires_at <= ?)"
    " AND (review_failed_at IS NULL OR review_failed_at <= ?)"
)
"""The review gates of :func:`fermix.core.review.gate` as SQL: a user message waits, the
interval since the last complete review and the failure backoff have passed, and no live
claim holds the conversation. Its parameters are :func:`due_params`."""

_DUE_ORDER = "review_due_at, agent_id, channel, chat_id, thread_scope"


def due_reviews(
    conn: apsw.Connection,
    *,
    now: int,
    limit: int | None = None,
    interval_ms: int = 0,
    backoff_ms: int = 0,
) -> list[ConversationKey]:
    """The conversations :func:`claim_due_reviews` would claim at ``now``, oldest due
    first (the first ``limit``); claims nothing. Read off the ``conversations_due`` index,
    never by a scan of the messages (migration 9)."""
    rows = fetch_rows(
        conn,
        f"SELECT agent_id, channel, chat_id, thread_scope FROM conversations WHERE {_DUE}"
        f" ORDER BY {_DUE_ORDER} LIMIT ?",
        (
            *due_params(now=now, interval_ms=interval_ms, backoff_ms=backoff_ms),
            -1 if limit is None else limit,
        ),
    )
    return [ConversationKey(*row) for row in rows]


def claim_due_reviews(
    conn: apsw.Connection,
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
    review then takes its claim with the same token (:func:`claim_review`).
    """
    rows = fetch_rows(
        conn,
        "UPDATE conversations SET review_claim_token = ?, review_claim_expires_at = ?"
        " WHERE (agent_id, channel, chat_id, thread_scope) IN ("
        " SELECT agent_id, channel, chat_id, thread_scope FROM conversations"
        f" WHERE {_DUE} ORDER BY {_DUE_ORDER} LIMIT ?)"
        " RETURNING agent_id, channel, chat_id, thread_scope",
        (
            token,
            now + ttl_ms,
            *due_params(now=now, interval_ms=interval_ms, backoff_ms=backoff_ms),
            limit,
        ),
    )
    return sorted(ConversationKey(*row) for row in rows)


def finish_review(
    conn: apsw.Connection, key: ConversationKey, *, token: str, now: int, last_message_id: int
) -> bool:
    """Record a successful review and release its claim; False if the claim was lost.

    The conversation stays due while user messages after ``last_message_id`` wait (M5).
    """
    conn.execute(
        "UPDATE conversations SET last_reviewed_at = ?, last_reviewed_message_id = ?,"
        " review_failed_at = NULL, review_claim_token = NULL, review_claim_expires_at = NULL,"
        f" updated_at = ?, review_due_at = {still_due('?')}"
        f" WHERE {_WHERE_KEY} AND review_claim_token = ?",
        (now, last_message_id, now, last_message_id, last_message_id, *key.as_tuple(), token),
    )
    return bool(conn.changes())


def release_review(conn: apsw.Connection, key: ConversationKey, *, token: str) -> bool:
    """Give back the review claim ``token`` holds on ``key``, nothing reviewed (the sweep
    claimed it and no review took it); False if ``token`` no longer holds it. The
    conversation stays due while user messages after its cursor wait."""
    conn.execute(
        "UPDATE conversations SET review_claim_token = NULL, review_claim_expires_at = NULL,"
        f" review_due_at = {still_due('conversations.last_reviewed_message_id')}"
        f" WHERE {_WHERE_KEY} AND review_claim_token = ?",
        (*key.as_tuple(), token),
    )
    return bool(conn.changes())


def fail_review(conn: apsw.Connection, key: ConversationKey, *, token: str, now: int) -> None:
    """Record a failed review (for the backoff) and release its claim."""
    conn.execute(
        "UPDATE conversations SET review_failed_at = ?, review_claim_token = NULL,"
        f" review_claim_expires_at = NULL, updated_at = ? WHERE {_WHERE_KEY}"
        " AND review_claim_token = ?",
        (now, now, *key.as_tuple(), token),
    )


def release_expired_claims(conn: apsw.Connection, *, now: int) -> int:
    """Clear every review claim past its expiry; return how many (caller's transaction)."""
    conn.execute(
        "UPDATE conversations SET review_claim_token = NULL, review_claim_expires_at = NULL"
        " WHERE review_claim_token IS NOT NULL AND review_claim_expires_at <= ?",
        (now,),
    )
    return int(conn.changes())


def with_new_user_messages(
    conn: apsw.Connection,
    *,
    agent_id: str | None = None,
    owner_id: str | None = None,
    channel: str | None = None,
    chat_id: str | None = None,
) -> list[tuple[ConversationState, int]]:
    """Conversations with user messages newer than their last review, and how many, most first."""
    where = ["1"]
    params: list[Any] = []
    for column, value in (
        ("agent_id", agent_id),
        ("owner_id", owner_id),
        ("channel", channel),
        ("chat_id", chat_id),
    ):
        if value is not None:
            where.append(f"c.{column} = ?")
            params.append(value)
    columns = ", ".join(f"c.{name}" for name in COLUMNS)
    sql = (
        f"SELECT {columns}, count(m.id) AS pending FROM conversations AS c JOIN messages AS m"
        " ON m.agent_id = c.agent_id AND m.channel = c.channel AND m.chat_id = c.chat_id"
        " AND m.thread_scope = c.thread_scope AND m.role = 'user'"
        " AND m.id > c.last_reviewed_message_id"
        f" WHERE {' AND '.join(where)}"
        " GROUP BY c.agent_id, c.channel, c.chat_id, c.thread_scope ORDER BY pending DESC"
    )
    return [(ConversationState(*r[:-1]), int(r[-1])) for r in fetch_rows(conn, sql, params)]
