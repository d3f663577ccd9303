"""The ``conversations`` table on PostgreSQL: what its concurrent writers need beyond
:mod:`fermix.storage.conversations` (the table's operations, written once).

:func:`finish_review` and :func:`release_review` lock the row before they read the backlog,
so a user message that committed while they waited keeps the conversation due: an
``UPDATE`` that waits for a row lock re-checks the row it updates, but its subqueries on
``messages`` keep the statement's snapshot. (SQLite's one writer needs no lock.)
"""

from __future__ import annotations

from fermix.model import ConversationKey
from fermix.storage import conversations
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
