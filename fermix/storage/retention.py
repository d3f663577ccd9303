"""Retention (F7), written once for both adapters: what ``[fermix_core.retention]`` drops, in
batches small enough that appends never wait behind one.

- :func:`drop_messages`: messages older than the cut-off, read in id order from a cursor,
  :data:`BATCH` at a time. A conversation's checkpoint is kept (its window still composes:
  the checkpoint, then what came after), and so is a user message the reviewer has not read
  yet, unless ``drop_unreviewed``. What a message took with it goes with it (its vector, its
  index entry, its tokens from its conversation's token counts); the memory rows drawn from
  it stay: they are what was learnt.
- :func:`drop_archived`: memory rows archived before the cut-off.
- :func:`drop_revisions`: each prompt file's revisions but its newest ``keep`` (never the
  current one).
- :func:`due`: how many of each the next sweep would drop (``fermix doctor``).

Ids grow with time, so the scan of messages stops at the first one newer than the cut-off.
"""

from __future__ import annotations

import json

from fermix.storage.port import Dropped
from fermix.storage.sql import Sql
from fermix.storage.vectors import uncount_memories, uncount_messages

BATCH = 200
"""Rows one unit drops at most."""


_KEPT = (
    " AND m.id NOT IN (SELECT checkpoint_message_id FROM conversations"
    " WHERE checkpoint_message_id IS NOT NULL)"
)
_REVIEWED = (
    " AND NOT (m.role = 'user' AND m.id > coalesce((SELECT c.last_reviewed_message_id"
    " FROM conversations AS c WHERE c.agent_id = m.agent_id AND c.channel = m.channel"
    " AND c.chat_id = m.chat_id AND c.thread_scope = m.thread_scope), 0))"
)


def drop_messages(
    sql: Sql,
    *,
    before: int,
    after_id: int = 0,
    drop_unreviewed: bool = False,
    batch: int = BATCH,
) -> Dropped:
    """Drop one batch of messages created before ``before`` (epoch ms), read after
    ``after_id`` (caller's write transaction)."""
    window = sql.rows(
        "SELECT id, created_at FROM messages WHERE id > ? ORDER BY id LIMIT ?", (after_id, batch)
    )
    old = [int(i) for i, created in window if int(created) < before]
    finished = len(window) < batch or len(old) < len(window)
    if not old:
        return Dropped(0, after_id, True)
    kept = "" if drop_unreviewed else _REVIEWED
    items = sql.dialect.json_items
    dropped = [
        int(r[0])
        for r in sql.rows(
            f"SELECT m.id FROM messages AS m WHERE m.id IN (SELECT CAST(value AS BIGINT)"
            f" FROM {items}){_KEPT}{kept}",
            (json.dumps(old),),
        )
    ]
    if dropped:
        listed = json.dumps(dropped)
        in_ids = f"IN (SELECT CAST(value AS BIGINT) FROM {items})"
        uncount_messages(sql, dropped)
        sql.run(f"DELETE FROM message_vectors WHERE message_id {in_ids}", (listed,))
        sql.run(f"DELETE FROM messages WHERE id {in_ids}", (listed,))
    return Dropped(len(dropped), old[-1], finished)


def drop_archived(sql: Sql, *, before: int, batch: int = BATCH) -> int:
    """Drop one batch of memory rows archived before ``before``; how many went."""
    items = sql.dialect.json_items
    ids = [
        int(r[0])
        for r in sql.rows(
            "SELECT id FROM memories WHERE archived_at IS NOT NULL AND archived_at < ?"
            " ORDER BY id LIMIT ?",
            (before, batch),
        )
    ]
    if not ids:
        return 0
    listed = json.dumps(ids)
    in_ids = f"IN (SELECT CAST(value AS BIGINT) FROM {items})"
    uncount_memories(sql, ids)
    sql.run(f"DELETE FROM memory_vectors WHERE memory_id {in_ids}", (listed,))
    return sql.run(f"DELETE FROM memories WHERE id {in_ids}", (listed,))


_BEYOND = (
    " FROM resource_revisions AS r JOIN resources AS s ON s.id = r.resource_id"
    " WHERE r.revision <> s.current_revision AND r.revision <= (SELECT max(n.revision)"
    " FROM resource_revisions AS n WHERE n.resource_id = r.resource_id) - ?"
)


def drop_revisions(sql: Sql, *, keep: int, batch: int = BATCH) -> int:
    """Drop one batch of revisions beyond each prompt file's newest ``keep``; how many."""
    return sql.run(
        f"DELETE FROM resource_revisions WHERE id IN (SELECT r.id{_BEYOND} ORDER BY r.id LIMIT ?)",
        (keep, batch),
    )


def due(
    sql: Sql,
    *,
    messages_before: int | None,
    archived_before: int | None,
    keep: int | None,
    drop_unreviewed: bool = False,
) -> dict[str, int]:
    """How many messages, archived rows and revisions a sweep would drop now (None: that
    kind is kept)."""
    found: dict[str, int] = {}
    if messages_before is not None:
        kept = "" if drop_unreviewed else _REVIEWED
        found["messages"] = int(
            sql.value(
                f"SELECT count(*) FROM messages AS m WHERE m.created_at < ?{_KEPT}{kept}",
                (messages_before,),
            )
        )
    if archived_before is not None:
        found["archived_rows"] = int(
            sql.value(
                "SELECT count(*) FROM memories WHERE archived_at IS NOT NULL AND archived_at < ?",
                (archived_before,),
            )
        )
    if keep is not None:
        found["revisions"] = int(sql.value(f"SELECT count(*){_BEYOND}", (keep,)))
    return found
