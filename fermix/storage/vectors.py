"""Vectors and token counts (Q2, Q4): the columns, row mappings and tallies both adapters share."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from fermix.model import ConversationKey
from fermix.storage.port import (
    PendingText,
    ScopeRows,
    StoredVector,
    conversation_scope,
    memory_scope,
)

TOTAL = -1
"""The token id under which a scope's total token count is kept."""


SCOPE_COLUMNS = (
    "m.id, m.agent_id, m.channel, m.chat_id, m.thread_scope, m.sender, m.created_at, v.vector"
)
"""What a search reads of each message ``m`` of a scope and its vector ``v``: the rows of
:func:`scope_rows`."""


VECTOR_JOIN = "LEFT JOIN message_vectors AS v ON v.message_id = m.id"
"""Each message ``m`` with its vector ``v``, or NULL."""


def pending_messages(rows: Iterable[Sequence[Any]]) -> list[PendingText]:
    """The messages of rows (id, agent, channel, chat, thread, content) to embed."""
    return [
        PendingText(r[0], conversation_scope(ConversationKey(r[1], r[2], r[3], r[4])), r[5])
        for r in rows
    ]


def pending_memories(rows: Iterable[Sequence[Any]]) -> list[PendingText]:
    """The memory rows of rows (id, agent, key, value) to embed."""
    return [PendingText(r[0], memory_scope(r[1]), memory_text(r[2], r[3])) for r in rows]


def tally(stored: Iterable[StoredVector]) -> dict[str, dict[int, int]]:
    """The token counts the vectors ``stored`` add, by scope: each token's occurrences and,
    under :data:`TOTAL`, all of them (a scope whose vectors have no tokens: empty)."""
    added: dict[str, dict[int, int]] = {}
    for item in stored:
        counts = added.setdefault(item.scope, {})
        for token in item.tokens:
            counts[token] = counts.get(token, 0) + 1
        if item.tokens:
            counts[TOTAL] = counts.get(TOTAL, 0) + len(item.tokens)
    return added


def split_total(rows: Iterable[Sequence[Any]]) -> tuple[dict[int, int], int]:
    """Rows (token, count) as :func:`token_counts` returns them: the counts of the tokens,
    and the :data:`TOTAL`."""
    counts = {int(token): int(n) for token, n in rows}
    total = counts.pop(TOTAL, 0)
    return counts, total


def scope_rows(found: Sequence[tuple[Any, ...]]) -> ScopeRows:
    """Rows of (id, agent, channel, chat, thread, sender, created_at, vector), sorted by
    conversation, time and id, as :class:`ScopeRows`."""
    if not found:
        return ScopeRows((), (), (), (), (), ())
    ids, agents, channels, chats, threads, senders, created_at, blobs = zip(*found, strict=True)
    n = len(ids)
    # Row i > 0 starts a conversation when one of its key columns differs from row i - 1's
    # (C-level maps: no Python frame, no object per row).
    a, b, c, d = (map(operator.ne, col[1:], col[:-1]) for col in (agents, channels, chats, threads))
    moved = map(operator.or_, map(operator.or_, a, b), map(operator.or_, c, d))
    starts = [0, *itertools.compress(range(1, n), moved)]
    conversations = [(agents[i], channels[i], chats[i], threads[i]) for i in starts]
    return ScopeRows(ids, senders, created_at, blobs, conversations, starts)


def memory_text(key: str, value: str) -> str:
    """The text of a memory row that is embedded: its key's words and its value."""
    return f"{key.replace('_', ' ')}: {value}"
