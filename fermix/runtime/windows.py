"""``Windows``: what a conversation actor reads from SQLite (its ``WindowSource``, M4)."""

from __future__ import annotations

from fermix.actors.conversation import Snapshot, WindowMark
from fermix.model import ConversationKey, ConversationState, Message
from fermix.storage import Storage


class Windows:
    """Reads a conversation's state, window and window mark for its actor (a
    ``WindowSource``), each in one read unit (M4)."""

    def __init__(self, db: Storage) -> None:
        self._db = db

    def state(self, key: ConversationKey) -> ConversationState | None:
        with self._db.read() as reads:
            return reads.conversation(key)

    def snapshot(self, key: ConversationKey, limit: int | None) -> Snapshot:
        with self._db.read() as reads:
            state, mark, window, newest = reads.window_snapshot(key, limit=limit)
        return Snapshot(state, WindowMark(*mark), window, newest)

    def mark(self, key: ConversationKey) -> WindowMark:
        with self._db.read() as reads:
            return WindowMark(*reads.window_mark(key))

    def since(
        self, key: ConversationKey, after: Message | None, after_id: int, limit: int | None
    ) -> tuple[WindowMark, list[Message]]:
        stored_from = 0 if after is None or after.id != after_id else after.created_at
        with self._db.read() as reads:
            mark, new = reads.window_since(
                key, after_id=after_id, stored_from=stored_from, limit=limit
            )
        return WindowMark(*mark), new
