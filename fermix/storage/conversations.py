"""The ``conversations`` table's rules both adapters share: its columns and the due-review gate
(E2, M4, M7)."""

from __future__ import annotations

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
)
"""The columns of a conversation row, in :class:`~fermix.model.ConversationState`'s order."""


def due_params(*, now: int, interval_ms: int, backoff_ms: int) -> tuple[int, int, int]:
    """The parameters of :data:`_DUE` at ``now``."""
    return (now - interval_ms, now, now - backoff_ms)


def still_due(cursor: str) -> str:
    """``review_due_at`` once the review cursor is ``cursor`` (an SQL expression, in either
    dialect): kept while user messages after it wait (from the oldest of them if it was
    missing), NULL when none does."""
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
