"""The ``conversations`` table on PostgreSQL: what its concurrent writers need beyond
:mod:`fermix.storage.conversations` (the table's operations, written once).

:func:`finish_review` and :func:`release_review` lock the row before they read the backlog,
so a user message that committed while they waited keeps the conversation due: an
``UPDATE`` that waits for a row lock re-checks the row it updates, but its subqueries on
``messages`` keep the statement's snapshot. (SQLite's one writer needs no lock.)

:func:`touch_all` touches the conversations of a run of appends in one statement (the
group commit's, :mod:`fermix.storage.postgres.committer`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fermix.clock import now_ms
from fermix.model import ConversationKey, check_trust
from fermix.storage import conversations
from fermix.storage.postgres.connection import Conn, rows_param, send
from fermix.storage.sql import Sql


def _lock_claimed(sql: Sql, key: ConversationKey, token: str) -> bool:
    """Lock the row of ``key`` if ``token`` holds its claim (then later statements see every
    append that held it, committed)."""
    return bool(
        sql.rows(
            f"SELECT 1 FROM conversations WHERE {conversations.WHERE_KEY}"
            " AND review_claim_token = ? FOR UPDATE",
            (*key.as_tuple(), token),
        )
    )


def finish_review(
    sql: Sql, key: ConversationKey, *, token: str, now: int, last_message_id: int
) -> bool:
    """:func:`fermix.storage.conversations.finish_review`, the row locked first."""
    return _lock_claimed(sql, key, token) and conversations.finish_review(
        sql, key, token=token, now=now, last_message_id=last_message_id
    )


def release_review(sql: Sql, key: ConversationKey, *, token: str) -> bool:
    """:func:`fermix.storage.conversations.release_review`, the row locked first."""
    return _lock_claimed(sql, key, token) and conversations.release_review(sql, key, token=token)


TOUCH_ALL = (
    "INSERT INTO conversations AS c (agent_id, channel, chat_id, thread_scope, owner_id, trust,"
    " created_at, updated_at)"
    " SELECT e.r->>0, e.r->>1, e.r->>2, e.r->>3, e.r->>4, e.r->>5, (e.r->>6)::bigint,"
    " (e.r->>6)::bigint FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(r, n)"
    " ORDER BY e.n"
    " ON CONFLICT (agent_id, channel, chat_id, thread_scope) DO UPDATE SET"
    " owner_id = excluded.owner_id, trust = excluded.trust, updated_at = excluded.updated_at"
    " WHERE c.owner_id IS DISTINCT FROM excluded.owner_id"
    " OR c.trust IS DISTINCT FROM excluded.trust"
)


def touch_all(conn: Conn, rows: Sequence[tuple[ConversationKey, str, str]]) -> None:
    """:func:`fermix.storage.conversations.touch` of every ``(key, owner_id, trust)`` of
    ``rows`` (distinct keys) in one statement (:data:`TOUCH_ALL`), locking their rows in
    that order; sent without waiting for its answer, as the touch is."""
    send(conn, TOUCH_ALL, (touch_all_param(rows),))


def touch_all_param(rows: Sequence[tuple[ConversationKey, str, str]]) -> str:
    """The one parameter of :data:`TOUCH_ALL` that touches ``rows``."""
    for _, _, trust in rows:
        check_trust(trust)
    ts = now_ms()
    return rows_param([(*key.as_tuple(), owner_id, trust, ts) for key, owner_id, trust in rows])
