"""``ConversationStore``: one actor per conversation, holding its recent window (A1, A2).

The actor is a thin shell: it owns the window cache and a mailbox, so the appends of one
conversation are applied one at a time, in order. Every append is handed to the process's
:class:`~fermix.storage.committer.Committer` and acknowledged only once committed; only then
does the message enter the cache. A crash or a restart loses nothing: the window is read
back from SQLite when the actor starts.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from fermix.actors.base import SupervisedActor
from fermix.errors import InvalidInputError
from fermix.storage import conversations, messages
from fermix.storage.committer import Committer
from fermix.storage.conversations import ConversationState
from fermix.storage.messages import ConversationKey, Message, NewMessage
from fermix.storage.pool import ReaderPool

log = logging.getLogger(__name__)


class Append(NamedTuple):
    """Write ``message`` through to SQLite, then add it to the window; reply with the row.

    ``peak_prompt_tokens``, when given, is recorded in the same transaction (K3).
    """

    message: NewMessage
    trust: str
    peak_prompt_tokens: int | None = None


class History(NamedTuple):
    """Reply with the window, oldest first; the newest ``limit`` messages when given."""

    limit: int | None = None


class Reload(NamedTuple):
    """Drop the cache and read the window again from SQLite (after a compaction or /new)."""


class StateQuery(NamedTuple):
    """Reply with the conversation's stored state (None if it has none yet)."""


class ConversationStore(SupervisedActor):
    """Holds the window of one conversation and writes its appends through."""

    def __init__(
        self,
        key: ConversationKey,
        *,
        committer: Committer,
        readers: ReaderPool,
        max_history: int | None = None,
    ) -> None:
        super().__init__()
        self.key = key
        self._committer = committer
        self._readers = readers
        self._max_history = max_history
        self._window: list[Message] = []
        self._state: ConversationState | None = None

    def on_start(self) -> None:
        """Read the window and the stored state from SQLite."""
        self._load()

    def _load(self) -> None:
        with self._readers.connection() as conn:
            self._state = conversations.get(conn, self.key)
            self._window = conversations.window(conn, self.key, limit=self._max_history)

    def on_receive(self, message: Any) -> Any:
        """Handle one typed message; anything else is a programming error and crashes."""
        match message:
            case Append(new, trust, peak):
                return self._append(new, trust, peak)
            case History(limit):
                return list(self._window if limit is None else self._window[-limit:])
            case Reload():
                self._load()
                return None
            case StateQuery():
                # Read fresh: gates in the row are also written by other actors and processes.
                with self._readers.connection() as conn:
                    self._state = conversations.get(conn, self.key)
                return self._state
        raise TypeError(f"ConversationStore got an unknown message: {message!r}")

    def _append(self, new: NewMessage, trust: str, peak: int | None) -> Message:
        if new.key != self.key:
            raise InvalidInputError(f"message for {new.key} sent to conversation {self.key}")
        state = self._state
        needs_state = state is None or state.owner_id != new.owner_id or state.trust != trust

        def write(conn: Any) -> tuple[Message, ConversationState | None]:
            fresh = None
            if needs_state:
                fresh = conversations.ensure(conn, self.key, owner_id=new.owner_id, trust=trust)
            stored = messages.insert(conn, new)
            if peak is not None:
                conversations.update(conn, self.key, peak_prompt_tokens=peak)
            return stored, fresh

        stored, fresh = self._committer.run(write, label=f"append to {self.key.scope_id}")
        if fresh is not None:
            self._state = fresh
        self._window.append(stored)
        if self._max_history is not None and len(self._window) > self._max_history:
            del self._window[: len(self._window) - self._max_history]
        return stored
