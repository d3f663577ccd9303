"""``Conversation``: the handle a host holds for one chat (H1).

Cheap to create on every turn: it holds only the key, the owner and the trust, and asks the
process's runtime (and through it the conversation's actor) for everything else.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fermix import validate
from fermix.core import commands, composer
from fermix.errors import InvalidInputError
from fermix.model import (
    AppendResult,
    ConversationKey,
    ConversationState,
    ForgetReport,
    Message,
    NewMessage,
    PendingAppend,
    check_trust,
)
from fermix.runtime.engine import Runtime


class Conversation:
    """One conversation of a host: append, read the window, commit a turn."""

    def __init__(self, runtime: Runtime, key: ConversationKey, *, owner_id: str, trust: str):
        self._runtime = runtime
        self.key = key
        self.owner_id = owner_id
        self.trust = trust

    def __repr__(self) -> str:
        return f"Conversation({self.key!r}, owner_id={self.owner_id!r}, trust={self.trust!r})"

    def append(
        self,
        role: str,
        text: str,
        *,
        sender: str = "",
        kind: str = "chat",
        metadata: Mapping[str, Any] | None = None,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store a message; returns once it is committed in SQLite (A1).

        ``owner_id`` and ``trust`` are its author's (M1), the conversation's by default.
        ``client_key`` is the caller's own key for the message: appending again with the
        same key stores nothing new and returns the stored message, so a retry after a
        lost answer never doubles history (N3); the same key for a different message is a
        :class:`~fermix.errors.ConflictError`. :meth:`append_keyed` also says which
        happened.
        """
        return self.append_keyed(
            role,
            text,
            sender=sender,
            kind=kind,
            metadata=metadata,
            peak_prompt_tokens=peak_prompt_tokens,
            owner_id=owner_id,
            trust=trust,
            client_key=client_key,
        ).message

    def append_keyed(
        self,
        role: str,
        text: str,
        *,
        sender: str = "",
        kind: str = "chat",
        metadata: Mapping[str, Any] | None = None,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> AppendResult:
        """:meth:`append`, saying whether ``client_key`` replayed an earlier append (N3):
        a server answering a retried request tells its client so."""
        pending = self.prepare(
            role,
            text,
            sender=sender,
            kind=kind,
            metadata=metadata,
            peak_prompt_tokens=peak_prompt_tokens,
            owner_id=owner_id,
            trust=trust,
            client_key=client_key,
        )
        return self._runtime.append(
            pending.new,
            trust=pending.trust,
            peak_prompt_tokens=pending.peak_prompt_tokens,
            owner_id=pending.owner_id,
        )

    def prepare(
        self,
        role: str,
        text: str,
        *,
        sender: str = "",
        kind: str = "chat",
        metadata: Mapping[str, Any] | None = None,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> PendingAppend:
        """The append :meth:`append` would store, checked but not stored: for
        :meth:`fermix.api.Memory.append_many`, which stores many in one go. Bad input
        raises here, before anything is written."""
        author, author_trust = self._author(owner_id, trust)
        if peak_prompt_tokens is not None and (
            isinstance(peak_prompt_tokens, bool)
            or not isinstance(peak_prompt_tokens, int)
            or peak_prompt_tokens < 0
        ):
            raise InvalidInputError(
                f"peak_prompt_tokens must be a non-negative integer, not {peak_prompt_tokens!r}"
            )
        new = NewMessage(
            self.key,
            role,
            text,
            owner_id=author,
            sender=sender,
            kind=kind,
            metadata=dict(metadata or {}),
            trust=author_trust,
            client_key=client_key,
        )
        return PendingAppend(new, self.trust, peak_prompt_tokens, self.owner_id)

    def append_user(
        self,
        text: str,
        *,
        sender: str = "",
        metadata: Mapping[str, Any] | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store what a user said, recording who said it and with what trust (M1).

        In a group chat, pass each speaker's ``owner_id`` (and ``trust``): a review then
        files each fact under the person who said it and admits it with that person's
        trust, whoever else spoke. ``owner_id`` defaults to the conversation's owner;
        ``trust`` to the conversation's trust for that owner, and for another owner to
        ``operator`` only when the config names it in ``[fermix_core.security] operators``
        (else ``guest``, M2).
        """
        author, author_trust = self._author(owner_id, trust)
        # What append() would do with these arguments, without checking the author twice.
        new = NewMessage(
            self.key,
            "user",
            text,
            owner_id=author,
            sender=sender or author,
            metadata=dict(metadata) if metadata else {},
            trust=author_trust,
            client_key=client_key,
        )
        return self._runtime.append(
            new, trust=self.trust, peak_prompt_tokens=None, owner_id=self.owner_id
        ).message

    def _author(self, owner_id: str | None, trust: str | None) -> tuple[str, str]:
        """Who wrote a message and at what trust: the conversation's unless given (M1, M2)."""
        if owner_id is None or owner_id == self.owner_id:
            author = self.owner_id
            default = self.trust
        else:
            validate.identifier("owner_id", owner_id, allow_empty=True)
            author = owner_id
            default = self._runtime.trust_of(owner_id)
        return author, check_trust(default if trust is None else trust)

    def append_assistant(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store what the assistant said (``commit`` also dispatches post-delivery work)."""
        return self.append(
            "assistant", text, sender="assistant", metadata=metadata, client_key=client_key
        )

    def history(self, limit: int | None = None) -> list[Message]:
        """The conversation's window, oldest first (the newest ``limit`` messages if given)."""
        if limit is not None and (isinstance(limit, bool) or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, not {limit!r}")
        return self._runtime.history(self.key, limit)

    def memory_files(self) -> tuple[str, str]:
        """The current USER.md and MEMORY.md of this agent and owner."""
        return self._runtime.memory_files(self.key.agent_id, self.owner_id)

    def compose(self, system: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The litellm messages for the next model call: system prompt, the fenced
        ``<memory-context>`` block (USER.md, MEMORY.md of this agent and owner), then the
        window (P1, T5)."""
        telemetry = self._runtime.telemetry
        started = time.perf_counter()
        with telemetry.span("fermix.compose", {"fermix.agent_id": self.key.agent_id}):
            user_md, memory_md = self.memory_files()
            composed = composer.compose(system, user_md, memory_md, self.history(limit))
        telemetry.composed(time.perf_counter() - started)
        return composed

    def preflight(self) -> str | None:
        """Before a turn: compact if the previous turn's recorded peak calls for it (K3).

        Returns the notice for the host to send when it compacted, else None. Whether a
        compaction is due is read from SQLite on this thread: when it is not (a cold
        conversation, a peak under the threshold, compaction off or backing off) it returns
        at once without asking any actor; when it is, it waits for this conversation's own
        compaction only, at most the model timeout plus a margin, and past that the turn
        goes on without it (logged) while the compaction finishes in the background (M3).
        """
        result = self._runtime.preflight(self.key)
        return None if result is None else result.notice

    def handle_command(self, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command and return the reply to send (K4).

        None means ``text`` is not a fermix command: the host goes on with its turn. A
        guest's state-changing command is refused and changes nothing.
        """
        command = commands.parse(text)
        if command is None:
            return None
        if not commands.allowed(command, self.trust):
            return commands.refusal(command)
        if command.name == "compact":
            return commands.compaction_reply(self._runtime.compact(self.key, force=True))
        self._runtime.clear_window(self.key)
        return commands.CLEARED

    def state(self) -> ConversationState | None:
        """The conversation's stored state: owner, trust, window, gates."""
        return self._runtime.state(self.key)

    def forget(self) -> ForgetReport:
        """Erase this conversation: every message of it (whoever wrote it), the rows drawn
        from them, its own rows and its state (F2). The handle can be used again: the next
        append starts the conversation anew."""
        return self._runtime.forget_conversation(self.key)

    def reload(self) -> None:
        """Re-read the window from SQLite (after a compaction or ``/new`` by another actor)."""
        self._runtime.reload(self.key)

    def commit(
        self,
        reply: str,
        usage: Mapping[str, Any] | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Write the turn's reply and its peak prompt tokens, then dispatch post-delivery work.

        ``usage`` is the provider's usage of the turn (litellm's ``response.usage``, or a
        dict); its ``prompt_tokens`` is recorded as the turn's peak for compaction (K3).
        ``client_key`` makes a retried commit store the reply once (N3).
        """
        return self.commit_keyed(reply, usage, metadata=metadata, client_key=client_key).message

    def commit_keyed(
        self,
        reply: str,
        usage: Mapping[str, Any] | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> AppendResult:
        """:meth:`commit`, saying whether ``client_key`` replayed an earlier commit (N3).

        A replayed commit dispatches the post-delivery work again: it is idempotent (a
        review or compaction that is not due does nothing).
        """
        peak = _prompt_tokens(usage)
        appended = self.append_keyed(
            "assistant",
            reply,
            sender="assistant",
            metadata=metadata,
            peak_prompt_tokens=peak,
            client_key=client_key,
        )
        self._runtime.after_delivery(self.key)
        return appended


def _prompt_tokens(usage: Mapping[str, Any] | Any | None) -> int | None:
    if usage is None:
        return None
    value = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    if value is None:
        value = getattr(usage, "prompt_tokens", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"usage.prompt_tokens must be a non-negative integer: {value!r}")
    return value
