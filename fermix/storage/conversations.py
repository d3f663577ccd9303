"""The ``conversations`` table: per-conversation state that must hold across processes.

One row per conversation key: who owns it and at what trust, which stored messages form its
window (everything after ``window_after_id``, behind an optional checkpoint message), and
the gates of the reviewer (E2) and the compactor (K3), with since when a review is due: the
sweep's index (migration 9, :func:`claim_due_reviews`).

Written once for both adapters (:class:`~fermix.storage.sql.Sql`). What PostgreSQL's
concurrent writers need beyond SQLite's single writer is named, not copied: the sweep skips
rows another transaction locked (:attr:`~fermix.storage.sql.Dialect.skip_locked`), and a
review locks its row before it reads the backlog
(:func:`fermix.storage.postgres.conversations.finish_review`).
"""

from __future__ import annotations

from typing import Any

from fermix.clock import now_ms
from fermix.errors import InvalidInputError
from fermix.model import (
    OUTCOME_WORK,
    ConversationKey,
    ConversationState,
    Message,
    check_trust,
    outcome_reason,
)
from fermix.storage import messages
from fermix.storage.port import NO_MARK, WindowMark
from fermix.storage.sql import Sql

COLUMNS = (
    "agent_id",
    "channel",
    "chat_id",
    "thread_scope",
    "owner_id",
    "trust",
    "window_after_id",
    "checkpoint_message_id",
    "last_reviewed_at",
    "last_reviewed_message_id",
    "review_failed_at",
    "review_claim_token",
    "review_claim_expires_at",
    "peak_prompt_tokens",
    "compaction_failed_at",
    "created_at",
    "updated_at",
    "review_outcome",
    "review_reason",
    "review_outcome_at",
    "compaction_outcome",
    "compaction_reason",
    "compaction_outcome_at",
)
"""The columns of a conversation row, in :class:`~fermix.model.ConversationState`'s order."""

_SELECT = ", ".join(COLUMNS)
_KEY = "agent_id, channel, chat_id, thread_scope"
WHERE_KEY = "agent_id = ? AND channel = ? AND chat_id = ? AND thread_scope = ?"
"""The condition that picks one conversation's rows (its key's four parameters)."""

_TOUCH = (
    "INSERT INTO conversations (agent_id, channel, chat_id, thread_scope, owner_id, trust,"
    " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (agent_id, channel, chat_id, thread_scope) DO UPDATE SET"
    " owner_id = excluded.owner_id, trust = excluded.trust, updated_at = excluded.updated_at"
    " WHERE conversations.owner_id IS DISTINCT FROM excluded.owner_id"
    " OR conversations.trust IS DISTINCT FROM excluded.trust"
)


def key_order(sql: Sql, table: str = "") -> str:
    """The conversation key's columns (of ``table``, an alias, when given) as an ``ORDER BY``
    list: bytewise on both dialects."""
    prefix = f"{table}." if table else ""
    binary = sql.dialect.binary_order
    return ", ".join(f"{prefix}{column}{binary}" for column in _KEY.split(", "))


def get(sql: Sql, key: ConversationKey) -> ConversationState | None:
    """The state of ``key``, or None if it was never written."""
    rows = sql.rows(f"SELECT {_SELECT} FROM conversations WHERE {WHERE_KEY}", key.as_tuple())
    return ConversationState(*rows[0]) if rows else None


def touch(sql: Sql, key: ConversationKey, *, owner_id: str, trust: str) -> None:
    """Create the row of ``key`` or bring it to this owner and trust; writes nothing when
    both are unchanged (caller's transaction; on PostgreSQL it locks the row until that
    ends). Sent without waiting for its answer: in PostgreSQL's group commit it goes out
    with the insert."""
    check_trust(trust)
    ts = now_ms()
    sql.send(_TOUCH, (*key.as_tuple(), owner_id, trust, ts, ts))


def update(sql: Sql, /, key: ConversationKey, **fields: Any) -> None:
    """Set some columns of an existing conversation row (caller's transaction)."""
    unknown = set(fields) - set(COLUMNS[4:])
    if unknown:
        raise InvalidInputError(f"not conversation state columns: {sorted(unknown)}")
    fields.setdefault("updated_at", now_ms())
    assignments = ", ".join(f"{name} = ?" for name in fields)
    sql.run(
        f"UPDATE conversations SET {assignments} WHERE {WHERE_KEY}",
        (*fields.values(), *key.as_tuple()),
    )


def window(sql: Sql, key: ConversationKey, *, limit: int | None = None) -> list[Message]:
    """The conversation's current window, oldest first: its checkpoint, then later messages.

    Messages before ``window_after_id`` stay stored (K5): a checkpoint or ``/new`` only
    moves the window's start. With ``limit``, only the newest ``limit`` messages are kept.
    """
    return _window_of(sql, key, get(sql, key), limit)


def window_mark(sql: Sql, key: ConversationKey) -> WindowMark:
    """The mark of the window of ``key`` (``(0, 0, None)`` without a row): one read by the
    primary key, which tells a cache whether the window it holds is still current (M4)."""
    rows = sql.rows(
        "SELECT window_version, window_after_id, checkpoint_message_id FROM conversations"
        f" WHERE {WHERE_KEY}",
        key.as_tuple(),
    )
    return (int(rows[0][0]), int(rows[0][1]), rows[0][2]) if rows else NO_MARK


def window_snapshot(
    sql: Sql, key: ConversationKey, *, limit: int | None = None
) -> tuple[ConversationState | None, WindowMark, list[Message], Message | None]:
    """The state, the mark, the window (as :func:`window`) and the newest stored message of
    ``key``, read as one snapshot: another process's commit is in all of them or in none."""
    with sql.snapshot():
        mark = window_mark(sql, key)
        state = get(sql, key)
        rows = _window_of(sql, key, state, limit)
        newest = messages.conversation(sql, key, limit=1, newest=True)
    return state, mark, rows, newest[0] if newest else None


def window_since(
    sql: Sql,
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
    with sql.snapshot():
        mark = window_mark(sql, key)
        rows = messages.stored_after(
            sql, key, after_id=after_id, stored_from=stored_from, limit=limit
        )
    return mark, rows


def _window_of(
    sql: Sql, key: ConversationKey, state: ConversationState | None, limit: int | None
) -> list[Message]:
    after = 0 if state is None else state.window_after_id
    rows = messages.conversation(sql, key, after_id=after, limit=limit, newest=limit is not None)
    checkpoint_id = None if state is None else state.checkpoint_message_id
    if checkpoint_id is None:
        return rows
    rows = [m for m in rows if m.id != checkpoint_id]
    checkpoint = messages.get(sql, checkpoint_id)
    head = [checkpoint] if checkpoint is not None else []
    if limit is not None:
        rows = rows[-(limit - len(head)) :] if limit > len(head) else []
    return head + rows


def list_states(sql: Sql, *, agent_id: str | None = None) -> list[ConversationState]:
    """Every conversation row, of one agent when given, in key order (bytewise)."""
    where = "" if agent_id is None else " WHERE agent_id = ?"
    params = () if agent_id is None else (agent_id,)
    rows = sql.rows(f"SELECT {_SELECT} FROM conversations{where} ORDER BY {key_order(sql)}", params)
    return [ConversationState(*r) for r in rows]


def owned_by(sql: Sql, owner_id: str, *, agent_id: str | None = None) -> list[ConversationState]:
    """The conversations ``owner_id`` owns (of ``agent_id``, or every agent), in key order."""
    only = "" if agent_id is None else " AND agent_id = ?"
    rows = sql.rows(
        f"SELECT {_SELECT} FROM conversations WHERE owner_id = ?{only} ORDER BY {key_order(sql)}",
        (owner_id, *(() if agent_id is None else (agent_id,))),
    )
    return [ConversationState(*r) for r in rows]


def newest_user_message_id(sql: Sql, key: ConversationKey) -> int:
    """The id of the conversation's newest user-sent message (0 when it has none)."""
    value = sql.value(
        f"SELECT max(id) FROM messages WHERE {WHERE_KEY} AND role = 'user'", key.as_tuple()
    )
    return int(value or 0)


def review_backlog(
    sql: Sql, key: ConversationKey, *, after_id: int, up_to: int, limit: int
) -> tuple[list[Message], int]:
    """The first ``limit`` user messages of ``key`` with ids in ``(after_id, up_to]``, in id
    order, and how many there are in all: what a review takes next, and its backlog (M5).

    In id order, not by time: the review's cursor is an id, so a message stored with an
    older clock must not fall behind it.
    """
    where = f"{WHERE_KEY} AND role = 'user' AND id > ? AND id <= ?"
    params = (*key.as_tuple(), after_id, up_to)
    select = f"SELECT {messages.COLUMNS} FROM messages WHERE {where} ORDER BY id LIMIT ?"
    rows = [Message(*r) for r in sql.rows(select, (*params, limit))]
    total = int(sql.value(f"SELECT count(*) FROM messages WHERE {where}", params))
    return rows, total


def claim_review(sql: Sql, key: ConversationKey, *, token: str, now: int, ttl_ms: int) -> bool:
    """Take the review claim of ``key`` unless another live claim holds it (caller's
    transaction); True, the claim renewed, when ``token`` holds it already: a review takes
    over so what the sweep claimed for it (:func:`claim_due_reviews`).

    A claim past its expiry (its reviewer crashed) is taken over (E2). On PostgreSQL the
    second of two claimers waits for the first's commit, then finds the claim taken and
    changes nothing.
    """
    changed = sql.run(
        "UPDATE conversations SET review_claim_token = ?, review_claim_expires_at = ?"
        f" WHERE {WHERE_KEY} AND (review_claim_token IS NULL OR review_claim_token = ?"
        " OR review_claim_expires_at <= ?)",
        (token, now + ttl_ms, *key.as_tuple(), token, now),
    )
    return changed > 0


_DUE = (
    "review_due_at IS NOT NULL"
    " AND (last_reviewed_at IS NULL OR last_reviewed_at <= ?)"
    " AND (review_claim_token IS NULL OR review_claim_expires_at <= ?)"
    " AND (review_failed_at IS NULL OR review_failed_at <= ?)"
)
"""The review gates of :func:`fermix.core.review.gate` as SQL: a user message waits, the
interval since the last complete review and the failure backoff have passed, and no live
claim holds the conversation. Its parameters are :func:`_due_params`."""


def _due_params(*, now: int, interval_ms: int, backoff_ms: int) -> tuple[int, int, int]:
    """The parameters of :data:`_DUE` at ``now``."""
    return (now - interval_ms, now, now - backoff_ms)


def _due_order(sql: Sql) -> str:
    # Oldest due first, ties in key order: the sweep and its preview pick the same rows.
    return f"review_due_at, {key_order(sql)}"


def due_reviews(
    sql: Sql,
    *,
    now: int,
    limit: int | None = None,
    interval_ms: int = 0,
    backoff_ms: int = 0,
) -> list[ConversationKey]:
    """The conversations :func:`claim_due_reviews` would claim at ``now``, oldest due
    first (the first ``limit``); claims nothing. Read off the ``conversations_due`` index,
    never by a scan of the messages (migration 9)."""
    params: tuple[Any, ...] = _due_params(now=now, interval_ms=interval_ms, backoff_ms=backoff_ms)
    select = f"SELECT {_KEY} FROM conversations WHERE {_DUE} ORDER BY {_due_order(sql)}"
    if limit is not None:
        select += " LIMIT ?"
        params = (*params, limit)
    return [ConversationKey(*row) for row in sql.rows(select, params)]


def claim_due_reviews(
    sql: Sql,
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
    review then takes its claim with the same token (:func:`claim_review`). On PostgreSQL
    rows locked by another transaction (an append, another sweep) are skipped, not waited
    for: they are due again at the next sweep; the due rows are chosen once
    (``MATERIALIZED``), so a skip cannot make the claim take more than ``limit``.
    """
    rows = sql.rows(
        f"WITH due AS MATERIALIZED (SELECT {_KEY} FROM conversations WHERE {_DUE}"
        f" ORDER BY {_due_order(sql)} LIMIT ?{sql.dialect.skip_locked})"
        " UPDATE conversations SET review_claim_token = ?, review_claim_expires_at = ?"
        f" WHERE ({_KEY}) IN (SELECT {_KEY} FROM due) RETURNING {_KEY}",
        (
            *_due_params(now=now, interval_ms=interval_ms, backoff_ms=backoff_ms),
            limit,
            token,
            now + ttl_ms,
        ),
    )
    return sorted(ConversationKey(*row) for row in rows)


def _still_due(cursor: str) -> str:
    """``review_due_at`` once the review cursor is ``cursor`` (an SQL expression): kept while
    user messages after it wait (from the oldest of them if it was missing), NULL when none
    does."""
    backlog = (
        " FROM messages AS m WHERE m.agent_id = conversations.agent_id"
        " AND m.channel = conversations.channel AND m.chat_id = conversations.chat_id"
        " AND m.thread_scope = conversations.thread_scope"
        f" AND m.role = 'user' AND m.id > {cursor}"
    )
    return (
        f"CASE WHEN EXISTS (SELECT 1{backlog})"
        f" THEN coalesce(review_due_at, (SELECT min(m.created_at){backlog})) END"
    )


def finish_review(
    sql: Sql, key: ConversationKey, *, token: str, now: int, last_message_id: int
) -> bool:
    """Record a successful review and release its claim; False if the claim was lost.

    The conversation stays due while user messages after ``last_message_id`` wait (M5).
    """
    changed = sql.run(
        "UPDATE conversations SET last_reviewed_at = ?, last_reviewed_message_id = ?,"
        " review_failed_at = NULL, review_claim_token = NULL, review_claim_expires_at = NULL,"
        f" updated_at = ?, review_due_at = {_still_due('?')}"
        f" WHERE {WHERE_KEY} AND review_claim_token = ?",
        (now, last_message_id, now, last_message_id, last_message_id, *key.as_tuple(), token),
    )
    return changed > 0


def release_review(sql: Sql, key: ConversationKey, *, token: str) -> bool:
    """Give back the review claim ``token`` holds on ``key``, nothing reviewed (the sweep
    claimed it and no review took it); False if ``token`` no longer holds it. The
    conversation stays due while user messages after its cursor wait."""
    changed = sql.run(
        "UPDATE conversations SET review_claim_token = NULL, review_claim_expires_at = NULL,"
        f" review_due_at = {_still_due('conversations.last_reviewed_message_id')}"
        f" WHERE {WHERE_KEY} AND review_claim_token = ?",
        (*key.as_tuple(), token),
    )
    return changed > 0


def fail_review(sql: Sql, key: ConversationKey, *, token: str, now: int) -> None:
    """Record a failed review (for the backoff) and release its claim."""
    sql.run(
        "UPDATE conversations SET review_failed_at = ?, review_claim_token = NULL,"
        f" review_claim_expires_at = NULL, updated_at = ? WHERE {WHERE_KEY}"
        " AND review_claim_token = ?",
        (now, now, *key.as_tuple(), token),
    )


def record_outcome(
    sql: Sql, key: ConversationKey, *, work: str, outcome: str, reason: str, now: int
) -> None:
    """Keep how the last ``work`` (``review`` or ``compaction``) of ``key`` ended and why,
    bounded (:func:`~fermix.model.outcome_reason`); ``updated_at`` stays (caller's
    transaction)."""
    if work not in OUTCOME_WORK:
        raise InvalidInputError(f"work must be one of {list(OUTCOME_WORK)}, not {work!r}")
    if not outcome or len(outcome) > 20:
        raise InvalidInputError(f"not an outcome: {outcome!r}")
    sql.run(
        f"UPDATE conversations SET {work}_outcome = ?, {work}_reason = ?, {work}_outcome_at = ?"
        f" WHERE {WHERE_KEY}",
        (outcome, outcome_reason(reason), now, *key.as_tuple()),
    )


def release_expired_claims(sql: Sql, *, now: int) -> int:
    """Clear every review claim past its expiry; return how many (caller's transaction)."""
    return sql.run(
        "UPDATE conversations SET review_claim_token = NULL, review_claim_expires_at = NULL"
        " WHERE review_claim_token IS NOT NULL AND review_claim_expires_at <= ?",
        (now,),
    )


def with_new_user_messages(
    sql: Sql,
    *,
    agent_id: str | None = None,
    owner_id: str | None = None,
    channel: str | None = None,
    chat_id: str | None = None,
) -> list[tuple[ConversationState, int]]:
    """Conversations with user messages newer than their last review, and how many: most
    first, ties in key order (bytewise). For the CLI and doctor; the sweep uses
    :func:`claim_due_reviews`."""
    conditions: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("agent_id", agent_id),
        ("owner_id", owner_id),
        ("channel", channel),
        ("chat_id", chat_id),
    ):
        if value is not None:
            conditions.append(f"c.{column} = ?")
            params.append(value)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    columns = ", ".join(f"c.{name}" for name in COLUMNS)
    select = (
        f"SELECT {columns}, count(m.id) AS pending FROM conversations AS c JOIN messages AS m"
        " ON m.agent_id = c.agent_id AND m.channel = c.channel AND m.chat_id = c.chat_id"
        " AND m.thread_scope = c.thread_scope AND m.role = 'user'"
        f" AND m.id > c.last_reviewed_message_id{where}"
        " GROUP BY c.agent_id, c.channel, c.chat_id, c.thread_scope"
        f" ORDER BY pending DESC, {key_order(sql, 'c')}"
    )
    return [(ConversationState(*r[:-1]), int(r[-1])) for r in sql.rows(select, params)]
