"""``ConversationStore``: one actor per conversation, holding its recent window (A1, A2).

Appends are written by the runtime's writer on the caller's thread, in the conversation's
order, and only once committed sent here (:class:`Appended`), so the cached window never
holds an unwritten message. A crash or a restart loses nothing: the window is read back
from SQLite (through the :class:`WindowSource` it was given) when the actor starts, and a
message it already read is not added twice.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from fermix.actors.base import SupervisedActor
from fermix.errors import InvalidInputError
from fermix.model import ConversationKey, ConversationState, Message


class WindowSource(Protocol):
    """Where a conversation's stored state and window are read from."""

    def state(self, key: ConversationKey) -> ConversationState | None:
        """The stored state of ``key`` (None if it has none yet)."""
        ...

    def window(
        self, key: ConversationKey, limit: int | None
    ) -> tuple[ConversationState | None, list[Message]]:
        """The state and the window (the newest ``limit`` messages), read together."""
        ...


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
    """Holds the window of one conversation."""

    def __init__(
        self, key: ConversationKey, *, source: WindowSource, max_history: int | None = None
    ) -> None:
        super().__init__()
        self.key = key
        self._source = source
        self._max_history = max_history
        self._window: list[Message] = []
        self._state: ConversationState | None = None

    def on_start(self) -> None:
        """Read the window and the stored state from SQLite."""
        self._load()

    def _load(self) -> None:
        self._state, self._window = self._source.window(self.key, self._max_history)

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
                self._state = self._source.state(self.key)
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
