"""``ConversationStore``: one actor per conversation, holding its recent window (A1, A2).

The write-through of an append (:func:`write_through`) runs on the caller's thread, in the
order the registry's per-conversation lock gives it: the message is handed to the process's
:class:`~fermix.storage.committer.Committer`, acknowledged only once committed, and only
then sent to the conversation's actor (:class:`Appended`), which adds it to its window.
Keeping the actor hop off the write path halves an append's latency and lets concurrent
appends share commits; a failed write never reaches the cache. A crash or a restart loses
nothing: the window is read back from SQLite when the actor starts, and a message it
already read is not added twice.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import apsw

from fermix.actors.base import SupervisedActor
from fermix.errors import InvalidInputError, WriteFailedError
from fermix.model import ConversationKey, ConversationState, Message, NewMessage
from fermix.storage import conversations, messages
from fermix.storage.committer import Committer
from fermix.storage.pool import ReaderPool

log = logging.getLogger(__name__)


class Appended(NamedTuple):
    """``message`` was committed: add it to the window unless the window already has it."""

    message: Message


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
        readers: ReaderPool,
        max_history: int | None = None,
    ) -> None:
        super().__init__()
        self.key = key
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
            case Appended(stored):
                self._add(stored)
                return None
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

    def _add(self, stored: Message) -> None:
        if stored.key != self.key:
            raise InvalidInputError(f"message for {stored.key} sent to conversation {self.key}")
        newest = self._window[-1].id if self._window else 0
        after = 0 if self._state is None else self._state.window_after_id
        if stored.id <= max(newest, after):
            return  # read from SQLite when the actor started, or before the window's start
        self._window.append(stored)
        if self._max_history is not None and len(self._window) > self._max_history:
            del self._window[: len(self._window) - self._max_history]


def write_through(
    committer: Committer, new: NewMessage, *, trust: str, peak_prompt_tokens: int | None = None
) -> Message:
    """Commit ``new`` (and the conversation's owner, trust and recorded peak) in one unit.

    Returns the stored row once committed; raises :class:`WriteFailedError` after the
    committer's retries, and then nothing of it was kept (A1).
    """
    key = new.key

    def write(conn: apsw.Connection) -> Message:
        conversations.touch(conn, key, owner_id=new.owner_id, trust=trust)
        stored = messages.insert(conn, new)
        if peak_prompt_tokens is not None:
            conversations.update(conn, key, peak_prompt_tokens=peak_prompt_tokens)
        return stored

    try:
        return committer.run(write, label=f"append to {key.agent_id}/{key.scope_id}")
    except WriteFailedError:
        log.error("append to %s/%s was not written", key.agent_id, key.scope_id)
        raise
