"""The ``conversations`` table on PostgreSQL: the operations of
:mod:`fermix.storage.sqlite.conversations`, with the same results, and the review sweep's claim.

What SQLite's single writer gave for free is explicit here:

- :func:`touch` is an ``INSERT ... ON CONFLICT DO UPDATE``, which locks the row until the
  transaction ends even when nothing changes; ``messages_bi`` locks it on every insert.
- :func:`window_snapshot` and :func:`window_since` read in one ``REPEATABLE READ`` read-only
  transaction, so the mark and the rows are one snapshot (SQLite: a savepoint).
- :func:`finish_review` and :func:`release_review` lock the row before they read the
  backlog, so a user message that committed while they waited keeps the conversation due.
- :func:`claim_due_reviews` claims due conversations with ``FOR UPDATE SKIP LOCKED``:
  concurrent sweeps of several services never claim one twice, never wait on each other,
  and never scan every conversation (``conversations_due``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from psycopg import pq

from fermix.clock import now_ms
from fermix.errors import InvalidInputError
from fermix.model import ConversationKey, ConversationState, Message, check_trust
from fermix.storage.conversations import COLUMNS, due_params, still_due
from fermix.storage.port import NO_MARK, WindowMark
from fermix.storage.postgres import messages
from fermix.storage.postgres.connection import Conn, execute, fetch_rows, fetch_value, send

_SELECT = ", ".join(COLUMNS)
_WHERE_KEY = "agent_id = %s AND channel = %s AND chat_id = %s AND thread_scope = %s"
_KEY_ORDER = (
    'agent_id COLLATE "C", channel COLLATE "C", chat_id COLLATE "C", thread_scope COLLATE "C"'
)


def get(conn: Conn, key: ConversationKey) -> ConversationState | None:
    """The state of ``key``, or None if it was never written."""
    rows = fetch_rows(
        conn, f"SELECT {_SELECT} FROM conversations WHERE {_WHERE_KEY}", key.as_tuple()
    )
    return ConversationState(*rows[0]) if rows else None


def touch(conn: Conn, key: ConversationKey, *, owner_id: str, trust: str) -> None:
    """Create the row of ``key`` or bring it to this owner and trust; writes nothing when
    both are unchanged, but locks the row until the caller's transaction ends. Sent
    without waiting for its answer: in the group commit it goes out with the insert."""
    check_trust(trust)
    ts = now_ms()
    send(
        conn,
        "INSERT INTO conversations (agent_id, channel, chat_id, thread_scope, owner_id, trust,"
        " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (agent_id, channel, chat_id, thread_scope) DO UPDATE SET"
        " owner_id = excluded.owner_id, trust = excluded.trust, updated_at = excluded.updated_at"
        " WHERE conversations.owner_id IS DISTINCT FROM excluded.owner_id"
        " OR conversations.trust IS DISTINCT FROM excluded.trust",
        (*key.as_tuple(), owner_id, trust, ts, ts),
    )


def update(conn: Conn, /, key: ConversationKey, **fields: Any) -> None:
    """Set some columns of an existing conversation row (caller's transaction)."""
    unknown = set(fields) - set(COLUMNS[4:])
    if unknown:
        raise InvalidInputError(f"not conversation state columns: {sorted(unknown)}")
    fields.setdefault("updated_at", now_ms())
    assignments = ", ".join(f"{name} = %s" for name in fields)
    execute(
        conn,
        f"UPDATE conversations SET {assignments} WHERE {_WHERE_KEY}",
        (*fields.values(), *key.as_tuple()),
    )


def window(conn: Conn, key: ConversationKey, *, limit: int | None = None) -> list[Message]:
    """The conversation's current window, oldest first: its checkpoint, then later messages
    (the newest ``limit`` with ``limit``)."""
    return _window_of(conn, key, get(conn, key), limit)


def window_mark(conn: Conn, key: ConversationKey) -> WindowMark:
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
    conn: Conn, key: ConversationKey, *, limit: int | None = None
) -> tuple[ConversationState | None, WindowMark, list[Message], Message | None]:
    """The state, the mark, the window and the newest stored message of ``key``, read as one
    snapshot: another process's commit is in all of them or in none."""
    with _snapshot(conn):
        mark = window_mark(conn, key)
        state = get(conn, key)
        rows = _window_of(conn, key, state, limit)
        newest = messages.conversation(conn, key, limit=1, newest=True)
    return state, mark, rows, newest[0] if newest else None


def window_since(
    conn: Conn,
    key: ConversationKey,
    *,
    after_id: int,
    stored_from: int = 0,
    limit: int | None = None,
) -> tuple[WindowMark, list[Message]]:
    """The mark of ``key`` and its messages stored after message ``after_id``, oldest first
    (the newest ``limit`` of them), read as one snapshot."""
    with _snapshot(conn):
        mark = window_mark(conn, key)
        rows = messages.stored_after(
            conn, key, after_id=after_id, stored_from=stored_from, limit=limit
        )
    return mark, rows


@contextlib.contextmanager
def _snapshot(conn: Conn) -> Iterator[None]:
    """One snapshot for the block: a ``REPEATABLE READ READ ONLY`` transaction outside a
    transaction; inside a write unit the unit's own transaction (READ COMMITTED: each
    statement sees the commits made before it, as the unit's other reads do)."""
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        yield
        return
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _window_of(
    conn: Conn,
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


def list_states(conn: Conn, *, agent_id: str | None = None) -> list[ConversationState]:
    """Every conversation row, of one agent when given, in key order (bytewise, as SQLite)."""
    sql = f"SELECT {_SELECT} FROM conversations"
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = %s"
        params = (agent_id,)
    return [ConversationState(*r) for r in fetch_rows(conn, f"{sql} ORDER BY {_KEY_ORDER}", params)]


def newest_user_message_id(conn: Conn, key: ConversationKey) -> int:
    """The id of the conversation's newest user-sent message (0 when it has none)."""
    value = fetch_value(
        conn,
        f"SELECT max(id) FROM messages WHERE {_WHERE_KEY} AND role = 'user'",
        key.as_tuple(),
    )
    return int(value or 0)


def review_backlog(
    conn: Conn, key: ConversationKey, *, after_id: int, up_to: int, limit: int
) -> tuple[list[Message], int]:
    """The first ``limit`` user messages of ``key`` with ids in ``(after_id, up_to]``, in id
    order, and how many there are in all (M5)."""
    where = f"{_WHERE_KEY} AND role = 'user' AND id > %s AND id <= %s"
    params = (*key.as_tuple(), after_id, up_to)
    sql = f"SELECT {messages._COLUMNS} FROM messages WHERE {where} ORDER BY id LIMIT %s"
    rows = [messages._row(r) for r in fetch_rows(conn, sql, (*params, limit))]
    total = int(fetch_value(conn, f"SELECT count(*) FROM messages WHERE {where}", params))
    return rows, total


def claim_review(conn: Conn, key: ConversationKey, *, token: str, now: int, ttl_ms: int) -> bool:
    """Take the review claim of ``key`` unless another live claim holds it (caller's
    transaction); True, the claim renewed, when ``token`` holds it already (what the sweep
    claimed for this review, :func:`claim_due_reviews`). Under READ COMMITTED the second of
    two claimers waits for the first's commit, then finds the claim taken and changes
    nothing. A claim past its expiry is taken over (E2)."""
    changed = execute(
        conn,
        "UPDATE conversations SET review_claim_token = %s, review_claim_expires_at = %s"
        f" WHERE {_WHERE_KEY} AND (review_claim_token IS NULL OR review_claim_token = %s"
        " OR review_claim_expires_at <= %s)",
        (token, now + ttl_ms, *key.as_tuple(), token, now),
    )
    return changed > 0


_DUE = (
    "review_due_at IS NOT NULL"
    " AND (last_reviewed_at IS NULL OR last_reviewed_at <= %s)"
    " AND (review_claim_token IS NULL OR review_claim_expires_at <= %s)"
    " AND (review_failed_at IS NULL OR review_failed_at <= %s)"
)
"""The review gates as SQL, as on SQLite."""


def due_reviews(
    conn: Conn,
    *,
    now: int,
    limit: int | None = None,
    interval_ms: int = 0,
    backoff_ms: int = 0,
) -> list[ConversationKey]:
    """The conversations :func:`claim_due_reviews` would claim at ``now``, oldest due first
    (the first ``limit``); claims nothing. Read off the ``conversations_due`` index."""
    rows = fetch_rows(
        conn,
        f"SELECT agent_id, channel, chat_id, thread_scope FROM conversations WHERE {_DUE}"
        f" ORDER BY review_due_at, {_KEY_ORDER} LIMIT %s",
        (*due_params(now=now, interval_ms=interval_ms, backoff_ms=backoff_ms), limit),
    )
    return [ConversationKey(*row) for row in rows]


def claim_due_reviews(
    conn: Conn,
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
    transaction). Each review then takes its claim with the same token (:func:`claim_review`).

    Rows locked by another transaction (an append, another sweep) are skipped, not waited
    for: they are due again at the next sweep.
    """
    rows = fetch_rows(
        conn,
        "WITH due AS ("
        f" SELECT agent_id, channel, chat_id, thread_scope FROM conversations WHERE {_DUE}"
        " ORDER BY review_due_at LIMIT %s FOR UPDATE SKIP LOCKED)"
        " UPDATE conversations AS c"
        " SET review_claim_token = %s, review_claim_expires_at = %s"
        " FROM due WHERE (c.agent_id, c.channel, c.chat_id, c.thread_scope)"
        " = (due.agent_id, due.channel, due.chat_id, due.thread_scope)"
        " RETURNING c.agent_id, c.channel, c.chat_id, c.thread_scope",
        (
            *due_params(now=now, interval_ms=interval_ms, backoff_ms=backoff_ms),
            limit,
            token,
            now + ttl_ms,
        ),
    )
    return sorted(ConversationKey(*row) for row in rows)


def _lock_claimed(conn: Conn, key: ConversationKey, token: str) -> bool:
    """Lock the row of ``key`` if ``token`` holds its claim (then later statements see every
    append that held it, committed)."""
    sql = f"SELECT 1 FROM conversations WHERE {_WHERE_KEY} AND review_claim_token = %s"
    return bool(fetch_rows(conn, sql + " FOR UPDATE", (*key.as_tuple(), token)))


def finish_review(
    conn: Conn, key: ConversationKey, *, token: str, now: int, last_message_id: int
) -> bool:
    """Record a successful review and release its claim; False if the claim was lost.

    The conversation stays due when user messages after ``last_message_id`` wait (M5). The
    row is locked first, so the backlog is read after any append that held it committed.
    """
    if not _lock_claimed(conn, key, token):
        return False
    execute(
        conn,
        "UPDATE conversations SET last_reviewed_at = %s, last_reviewed_message_id = %s,"
        " review_failed_at = NULL, review_claim_token = NULL, review_claim_expires_at = NULL,"
        f" updated_at = %s, review_due_at = {still_due('%s')} WHERE {_WHERE_KEY}",
        (now, last_message_id, now, last_message_id, last_message_id, *key.as_tuple()),
    )
    return True


def release_review(conn: Conn, key: ConversationKey, *, token: str) -> bool:
    """Give back the review claim ``token`` holds on ``key``, nothing reviewed; False if
    ``token`` no longer holds it. It stays due while user messages after its cursor wait
    (the row locked first, as in :func:`finish_review`)."""
    if not _lock_claimed(conn, key, token):
        return False
    execute(
        conn,
        "UPDATE conversations SET review_claim_token = NULL, review_claim_expires_at = NULL,"
        f" review_due_at = {still_due('conversations.last_reviewed_message_id')}"
        f" WHERE {_WHERE_KEY}",
        key.as_tuple(),
    )
    return True


def fail_review(conn: Conn, key: ConversationKey, *, token: str, now: int) -> None:
    """Record a failed review (for the backoff) and release its claim."""
    execute(
        conn,
        "UPDATE conversations SET review_failed_at = %s, review_claim_token = NULL,"
        f" review_claim_expires_at = NULL, updated_at = %s WHERE {_WHERE_KEY}"
        " AND review_claim_token = %s",
        (now, now, *key.as_tuple(), token),
    )


def release_expired_claims(conn: Conn, *, now: int) -> int:
    """Clear every review claim past its expiry; return how many (caller's transaction)."""
    return execute(
        conn,
        "UPDATE conversations SET review_claim_token = NULL, review_claim_expires_at = NULL"
        " WHERE review_claim_token IS NOT NULL AND review_claim_expires_at <= %s",
        (now,),
    )


def with_new_user_messages(
    conn: Conn,
    *,
    agent_id: str | None = None,
    owner_id: str | None = None,
    channel: str | None = None,
    chat_id: str | None = None,
) -> list[tuple[ConversationState, int]]:
    """Conversations with user messages newer than their last review, and how many, most
    first (for the CLI and doctor; the sweep uses :func:`claim_due_reviews`)."""
    where = ["true"]
    params: list[Any] = []
    for column, value in (
        ("agent_id", agent_id),
        ("owner_id", owner_id),
        ("channel", channel),
        ("chat_id", chat_id),
    ):
        if value is not None:
            where.append(f"c.{column} = %s")
            params.append(value)
    columns = ", ".join(f"c.{name}" for name in COLUMNS)
    sql = (
        f"SELECT {columns}, count(m.id) AS pending FROM conversations AS c JOIN messages AS m"
        " ON m.agent_id = c.agent_id AND m.channel = c.channel AND m.chat_id = c.chat_id"
        " AND m.thread_scope = c.thread_scope AND m.role = 'user'"
        " AND m.id > c.last_reviewed_message_id"
        f" WHERE {' AND '.join(where)}"
        f" GROUP BY {columns} ORDER BY pending DESC, c.{_KEY_ORDER.replace(', ', ', c.')}"
    )
    return [(ConversationState(*r[:-1]), int(r[-1])) for r in fetch_rows(conn, sql, params)]
