"""``ConversationStore``: one actor per conversation, holding its recent window (A1, A2, M4).

Appends are written by the runtime's writer on the caller's thread, in the conversation's
order, and only once committed sent here (:class:`Appended`), so the cached window never
holds an unwritten message. A crash or a restart loses nothing: the window is read back
from SQLite (through the :class:`WindowSource` it was given) when the actor starts, and a
message it already read is not added twice.

Other processes write the same conversation too (several workers behind one bot): before
it answers :class:`History`, the actor reads the conversation's :class:`WindowMark`, one
primary-key read. Its version moves with every message stored in the conversation and every
move of the window, by any process, and with nothing else. When the version is the one the
actor expects (the one it read, plus one per :class:`Appended` it added since), the cache is
current and no more is read. When only messages were added since, it reads just those, and
keeps them if their number accounts for every step of the version; anything else (a
``/clear``, a ``/new`` or a compaction elsewhere, a message it cannot place) reads the
window again (M4).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from fermix.actors.base import SupervisedActor
from fermix.errors import InvalidInputError
from fermix.model import ConversationKey, ConversationState, Message


class WindowMark(NamedTuple):
    """Where a conversation's stored window stands."""

    version: int
    """Moves with every message stored in the conversation and every move of its window."""
    after_id: int
    """The window holds the messages after this id (``window_after_id``)."""
    checkpoint_id: int | None
    """The compaction checkpoint at the window's head, if any."""

    def moved_from(self, other: WindowMark) -> bool:
        """Whether the window starts elsewhere than in ``other`` (a /clear, /new, compaction)."""
        return (self.after_id, self.checkpoint_id) != (other.after_id, other.checkpoint_id)


NO_MARK = WindowMark(0, 0, None)
"""The mark of a conversation with no stored state."""


class Snapshot(NamedTuple):
    """A conversation's state, mark, window and newest message, read as one snapshot."""

    state: ConversationState | None
    mark: WindowMark
    window: list[Message]
    """The window, oldest first (the newest ``limit`` messages)."""
    newest: Message | None
    """The newest message stored in the conversation, in the window or not (None if none)."""


class WindowSource(Protocol):
    """Where a conversation's stored state and window are read from."""

    def state(self, key: ConversationKey) -> ConversationState | None:
        """The stored state of ``key`` (None if it has none yet)."""
        ...

    def snapshot(self, key: ConversationKey, limit: int | None) -> Snapshot:
        """The state, mark, window (the newest ``limit`` messages) and newest message of
        ``key``, read together."""
        ...

    def mark(self, key: ConversationKey) -> WindowMark:
        """The mark of ``key``'s window, now: one cheap read."""
        ...

    def since(
        self, key: ConversationKey, after: Message | None, after_id: int, limit: int | None
    ) -> tuple[WindowMark, list[Message]]:
        """The mark of ``key`` and its messages after ``after_id`` (``after``: that message,
        when known, so the read starts at it), oldest first, the newest ``limit``; read
        together."""
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
    """Holds the window of one conversation, current with every process's commits."""

    def __init__(
        self, key: ConversationKey, *, source: WindowSource, max_history: int | None = None
    ) -> None:
        super().__init__()
        self.key = key
        self._source = source
        self._max_history = max_history
        self._window: list[Message] = []
        self._state: ConversationState | None = None
        self._mark = NO_MARK
        """The mark the window was last checked against."""
        self._known: Message | None = None
        """The newest stored message at that check: the cache accounts for it and for every
        message before it."""
        self._known_id = 0
        """Its id, or the window's start when it is older (or there is none)."""
        self._added = 0
        """Messages added by :class:`Appended` since that check (each moved the version)."""
        self._added_last: Message | None = None
        """The newest of them."""

    def on_start(self) -> None:
        """Read the window and the stored state from SQLite."""
        self._load()

    def on_receive(self, message: Any) -> Any:
        """Handle one typed message; anything else is a programming error and crashes."""
        match message:
            case Appended(stored):
                self._add(stored)
                return None
            case History(limit):
                self._refresh()
                if limit is None:
                    return list(self._window)
                return self._window[-limit:] if limit else []  # [-0:] would be everything
            case Reload():
                self._load()
                return None
            case StateQuery():
                # Read fresh: gates in the row are also written by other actors and processes.
                self._state = self._source.state(self.key)
                return self._state
        raise TypeError(f"ConversationStore got an unknown message: {message!r}")

    # -- reading from SQLite -------------------------------------------------------------

    def _load(self) -> None:
        snapshot = self._source.snapshot(self.key, self._max_history)
        self._state, self._mark, self._window = snapshot.state, snapshot.mark, snapshot.window
        self._known = snapshot.newest
        self._known_id = max(
            snapshot.mark.after_id, 0 if snapshot.newest is None else snapshot.newest.id
        )
        self._added, self._added_last = 0, None

    def _refresh(self) -> None:
        """Make the window current with what every process has committed (M4)."""
        mark = self._source.mark(self.key)
        if mark == self._mark._replace(version=self._mark.version + self._added):
            self._checked(mark)
            return
        if not mark.moved_from(self._mark):
            mark, new = self._source.since(self.key, self._known, self._known_id, self._max_history)
            if self._takes(mark, new):
                kept = [m for m in self._window if m.id <= self._known_id]
                self._window = self._trimmed(kept + new)
                self._mark, self._added, self._added_last = mark, 0, None
                if new:
                    self._known, self._known_id = new[-1], new[-1].id
                return
        self._load()

    def _takes(self, mark: WindowMark, new: list[Message]) -> bool:
        """Whether ``new`` is every change since the checked mark, in the window's order."""
        if mark.moved_from(self._mark) or mark.version - self._mark.version != len(new):
            return False  # the window moved, a message was edited, or some are not in ``new``
        last = next(
            (
                m
                for m in reversed(self._window)
                if m.id <= self._known_id and m.id != mark.checkpoint_id
            ),
            None,
        )
        return (
            not new or last is None or (new[0].created_at, new[0].id) > (last.created_at, last.id)
        )

    def _checked(self, mark: WindowMark) -> None:
        """The cache was found current at ``mark``: what :class:`Appended` added counts now."""
        if self._added_last is not None and self._added_last.id > self._known_id:
            self._known, self._known_id = self._added_last, self._added_last.id
        self._mark, self._added, self._added_last = mark, 0, None

    # -- appends of this process -----------------------------------------------------------

    def _add(self, stored: Message) -> None:
        if stored.key != self.key:
            raise InvalidInputError(f"message for {stored.key} sent to conversation {self.key}")
        newest = self._window[-1].id if self._window else 0
        if stored.id <= max(newest, self._known_id):
            return  # read from SQLite already, or before the window's start
        self._window.append(stored)
        self._window = self._trimmed(self._window)
        self._added += 1
        self._added_last = stored

    def _trimmed(self, window: list[Message]) -> list[Message]:
        """The newest ``max_history`` messages, the checkpoint at the head kept as SQLite's
        window keeps it."""
        limit = self._max_history
        if limit is None or len(window) <= limit:
            return window
        head = window[:1] if window and window[0].id == self._mark.checkpoint_id else []
        rest = window[len(head) :]
        return head + (rest[-(limit - len(head)) :] if limit > len(head) else [])
