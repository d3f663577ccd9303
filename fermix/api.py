"""``Memory``: the one object a host holds (H1).

A host opens a :class:`Memory` on a home, gets a :class:`~fermix.conversation.Conversation`
handle per chat, and for each turn appends the user's message, composes the prompt, calls
its model and commits the reply. ``commit`` writes the reply, then dispatches the
post-delivery work (the reviewer, the compactor) off the host's path: their failures never
reach the turn.

    with Memory("~/.fermix") as memory:
        conv = memory.conversation("assistant", "telegram", "12345", owner_id="alice")
        conv.append_user("I moved to Porto last month")
        ...
        conv.commit(reply, usage={"prompt_tokens": 1234})
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from fermix import llm, validate
from fermix.clock import now_ms
from fermix.config import Config, load_config
from fermix.conversation import Conversation
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.errors import InvalidInputError, SupervisorEscalationError
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow, Message, check_trust
from fermix.runtime.engine import Runtime
from fermix.tools import MemoryTools

__all__ = ["Conversation", "Memory"]


class Memory:
    """fermix for one home: the database, the supervised actor tree, the conversations.

    ``conversation_cap`` bounds the live conversation actors (threads); ``idle_s`` is how
    long an unused conversation keeps its actor before it is passivated (A7). ``route``
    gives the reviewer's and compactor's model route in code instead of the config's
    ``[fermix_core.model]``; ``clock`` (epoch milliseconds) is the time their gates read.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | Home | None = None,
        *,
        config: Config | None = None,
        conversation_cap: int = 256,
        idle_s: float = 600.0,
        vfs: str | None = None,
        route: llm.Route | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.home = home if isinstance(home, Home) else Home.resolve(home)
        self.config = config if config is not None else load_config(self.home.config_path)
        self._runtime = Runtime(
            self.home,
            self.config,
            conversation_cap=conversation_cap,
            idle_s=idle_s,
            vfs=vfs,
            route=route,
            clock=clock,
        )
        self.tools = MemoryTools(self._runtime)
        """The agent's memory tools: ``schemas()`` and ``run(tool_call, conversation)`` (T4)."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Open the database (migrating it) and start the actor tree."""
        self._runtime.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the tree gracefully (queued writes finish first), then close the database."""
        self._runtime.close(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def failure(self) -> SupervisorEscalationError | None:
        """Why the actor tree gave up, if it did; every later call then raises."""
        return self._runtime.failure

    def tick(self) -> None:
        """Run the periodic work once (the due-review sweep); a service calls it on a timer."""
        self._runtime.tick()

    # -- conversations -----------------------------------------------------------------

    def conversation(
        self,
        agent_id: str,
        channel: str,
        chat_id: str,
        thread_scope: str = "",
        *,
        owner_id: str = "",
        trust: str = "operator",
    ) -> Conversation:
        """A handle on one conversation; cheap, and safe to create on every turn."""
        self._runtime.check_running()
        check_trust(trust)
        key = ConversationKey(agent_id, channel, chat_id, thread_scope)
        validate.identifier("owner_id", owner_id, allow_empty=True)
        return Conversation(self._runtime, key, owner_id=owner_id, trust=trust)

    def review(self, conv: Conversation, *, force: bool = True) -> ReviewResult:
        """Review ``conv`` now and wait for the result (``force``: past the time gates)."""
        return self._runtime.review(conv.key, force=force)

    def compact(self, conv: Conversation, *, force: bool = False) -> CompactionResult:
        """Compact ``conv`` now if due (``force``: whatever its peak) and wait for it."""
        return self._runtime.compact(conv.key, force=force)

    def handle_command(self, conv: Conversation, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command and return the reply to send (K4)."""
        return conv.handle_command(text)

    # -- memory rows -------------------------------------------------------------------

    def get_row(self, memory_id: int) -> MemoryRow | None:
        """The memory row ``memory_id`` (archived or not), or None."""
        self._runtime.check_running()
        with self._runtime.db.read() as reads:
            return reads.row(memory_id)

    def list_rows(self, **filters: Any) -> list[MemoryRow]:
        """Memory rows matching ``filters`` (the keywords of ``storage.memories.list_rows``)."""
        self._runtime.check_running()
        with self._runtime.db.read() as reads:
            return reads.rows(**filters)

    # -- realtime voice transcripts (V1) -------------------------------------------------

    def voice_transcript(
        self,
        agent_id: str,
        device_id: str,
        role: str,
        text: str,
        *,
        owner_id: str = "",
        trust: str = "operator",
    ) -> Message | None:
        """Store a final voice transcript when ``persist_transcripts`` is on; else None.

        Stored as ``kind = voice_turn`` in the device's ``realtime`` conversation with
        ``source_type = "realtime"`` in its metadata; user turns reach the reviewer like
        chat messages (V1).
        """
        if role not in ("user", "assistant"):
            raise InvalidInputError(f"a transcript's role is user or assistant, not {role!r}")
        conv = self.conversation(agent_id, "realtime", device_id, owner_id=owner_id, trust=trust)
        if not self.config.realtime.persist_transcripts:
            return None
        return conv.append(
            role,
            text,
            sender=owner_id if role == "user" else "assistant",
            kind="voice_turn",
            metadata={"source_type": "realtime", "device_id": device_id},
        )

