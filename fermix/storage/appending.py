"""The write unit of one append, as data: what ``Writer.append`` commits (A1, N3).

:class:`AppendUnit` is a unit like any other (a function of the write session: the
conversation touched, the message inserted, or found under its client key, the recorded
peak updated), so every adapter's group commit runs it as it runs every unit. Being data
as well, it lets an adapter run several appends of one batch together: PostgreSQL's group
commit stores a run of plain appends (:attr:`AppendUnit.plain`) with one touch and one
insert for all of them (:func:`fermix.storage.postgres.messages.insert_all`), where each
one alone costs two round trips.
"""

from __future__ import annotations

from dataclasses import dataclass

from fermix.errors import ConflictError
from fermix.model import AppendResult, Message, NewMessage
from fermix.storage.port import Writes


@dataclass(frozen=True, slots=True)
class AppendUnit:
    """Store ``new`` in its conversation, whose owner and trust are ``owner_id`` and
    ``trust`` (the handle's, which may differ from the author's, M1), and record ``peak``
    prompt tokens when given. Run with :meth:`fermix.storage.port.Storage.append`: it
    changes a conversation's owner and trust only through :meth:`Writes.touch_known`."""

    new: NewMessage
    owner_id: str
    trust: str
    peak: int | None = None

    @property
    def plain(self) -> bool:
        """Whether the append only touches its conversation and inserts: no client key to
        read first, no peak to write after (what an adapter may run with others)."""
        return self.new.client_key is None and self.peak is None

    def __call__(self, writes: Writes) -> AppendResult:
        new = self.new
        key = new.key
        if new.client_key is not None:
            # Read under the write lock: no other writer, in any process, can store the
            # same key between this read and the insert (N3).
            earlier = writes.message_by_client_key(key, new.client_key)
            if earlier is not None:
                return AppendResult(same_message(earlier, new), replayed=True)
        writes.touch_known(key, self.owner_id, self.trust)
        stored = writes.insert_message(new)
        if self.peak is not None:
            writes.update_conversation(key, peak_prompt_tokens=self.peak)
        return AppendResult(stored, replayed=False)


def same_message(earlier: Message, new: NewMessage) -> Message:
    """``earlier``, stored under ``new``'s client key, if it is the same message (N3).

    A retry sends the same message again; the same key with another role, author or text
    is a client's mistake, refused rather than answered with a message it did not send.
    """
    if (earlier.role, earlier.owner_id, earlier.content) != (new.role, new.owner_id, new.content):
        raise ConflictError(
            f"client_key {new.client_key!r} was already used in this conversation"
            f" for another message (id {earlier.id})"
        )
    return earlier
