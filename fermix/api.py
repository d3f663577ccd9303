"""``Memory``: the one object a host holds (H1).

A host opens a :class:`Memory` on a home, gets a :class:`Conversation` handle per chat, and
for each turn appends the user's message, composes the prompt, calls its model and commits
the reply. ``commit`` writes the reply, then dispatches the post-delivery work (the
reviewer, the compactor) off the host's path: their failures never reach the turn.

    with Memory("~/.fermix") as memory:
        conv = memory.conversation("assistant", "telegram", "12345", owner_id="alice")
        conv.append_user("I moved to Porto last month")
        ...
        conv.commit(reply, usage={"prompt_tokens": 1234})
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import pykka

from fermix import model, validate
from fermix.actors.compactor import (
    Compact,
    CompactionContext,
    CompactionResult,
    Compactor,
    clear_window,
)
from fermix.actors.conversation import Appended, ConversationStore, Reload, write_through
from fermix.actors.registry import ConversationRegistry, conversation_spec
from fermix.actors.reviewer import (
    Review,
    ReviewContext,
    Reviewer,
    ReviewResult,
    due_reviews,
)
from fermix.actors.store import GetRow, ListRows, Store, Write, list_filters
from fermix.config import Config, load_config
from fermix.conversation import Conversation
from fermix.core import commands
from fermix.core.composer import PromptComposer
from fermix.errors import ActorUnavailableError, InvalidInputError, SupervisorEscalationError
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow, Message, NewMessage
from fermix.runtime import prompt_files
from fermix.storage import open_database
from fermix.storage.committer import Committer
from fermix.storage.connection import connect
from fermix.storage.pool import ReaderPool
from fermix.supervisor import ChildSpec, Intensity, Restart, Supervisor
from fermix.tools import MemoryTools

__all__ = ["AfterDelivery", "Conversation", "Memory"]

log = logging.getLogger(__name__)

AfterDelivery = Callable[["Conversation"], None]
"""Post-delivery work run after a committed turn (the reviewer, the compactor)."""


class Memory:
    """fermix for one home: the database, the supervised actor tree, the conversations.

    ``conversation_cap`` bounds the live conversation actors (threads); ``idle_s`` is how
    long an unused conversation keeps its actor before it is passivated (A7).
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | Home | None = None,
        *,
        config: Config | None = None,
        conversation_cap: int = 256,
        idle_s: float = 600.0,
        vfs: str | None = None,
    ) -> None:
        self.home = home if isinstance(home, Home) else Home.resolve(home)
        self.config = config if config is not None else load_config(self.home.config_path)
        self._cap = conversation_cap
        self._idle_s = idle_s
        self._vfs = vfs
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._after_delivery: list[tuple[str, AfterDelivery]] = []
        self._periodic: list[tuple[str, Callable[[], None]]] = []
        self.composer = PromptComposer(self.home)
        """Reads the prompt files for :meth:`Conversation.compose` (P1)."""
        self.tools = MemoryTools(self)
        """The agent's memory tools: ``schemas()`` and ``run(tool_call, conversation)`` (T4)."""
        self._rendered: set[tuple[str, str]] = set()
        self._render_lock = threading.Lock()
        self.failure: SupervisorEscalationError | None = None
        """Why the actor tree gave up, if it did; every later call then raises."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Open the database (migrating it) and start the actor tree."""
        with self._lock:
            if self._started:
                return self
            self.home.root.mkdir(parents=True, exist_ok=True)
            writer = open_database(self.home.db_path, vfs=self._vfs)
            self.committer = Committer(writer)
            self.readers = ReaderPool(self.home.db_path, vfs=self._vfs)
            db_path, vfs = self.home.db_path, self._vfs
            max_history = self.config.memory.max_conversation_history
            committer, readers = self.committer, self.readers
            self.review_context = ReviewContext(self.home, self.config, committer, readers, vfs=vfs)
            review_context = self.review_context
            self.compaction_context = CompactionContext(
                self.config, committer, readers, on_compacted=self._reload_window
            )
            compaction_context = self.compaction_context

            def conversation_start(key: ConversationKey) -> Callable[[], pykka.ActorRef[Any]]:
                return lambda: ConversationStore.start(
                    key, readers=readers, max_history=max_history
                )

            self.tree = Supervisor(
                [
                    ChildSpec("store", lambda: Store.start(db_path, committer=committer, vfs=vfs)),
                    ChildSpec("reviewer", lambda: Reviewer.start(review_context)),
                    ChildSpec("compactor", lambda: Compactor.start(compaction_context)),
                    ChildSpec(
                        "conversations",
                        lambda: Supervisor(
                            name="conversations", intensity=Intensity(max_restarts=20)
                        ).start(),
                        restart=Restart.PERMANENT,
                    ),
                ],
                name="fermix",
                on_escalate=self._escalated,
            ).start()
            self.registry = ConversationRegistry(
                lambda: self._child_supervisor("conversations"),
                lambda key: conversation_spec(key, conversation_start(key)),
                cap=self._cap,
                idle_s=self._idle_s,
            )
            self.registry.start_sweeper()
            self.on_after_delivery(
                "reviewer", lambda conv: self._tell("reviewer", Review(conv.key))
            )
            self.on_after_delivery("compactor", self._dispatch_compaction)
            self.on_tick("review sweep", self._sweep_reviews)
            self._started = True
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the tree gracefully (queued writes finish first), then close the database."""
        with self._lock:
            if not self._started or self._closed:
                self._closed = True
                return
            self._closed = True
        self.registry.stop()
        self.tree.stop(timeout=timeout)
        self.committer.close()
        self.readers.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _escalated(self, error: SupervisorEscalationError) -> None:
        log.critical("fermix actor tree gave up: %s", error)
        self.failure = error

    def _child_supervisor(self, child_id: str) -> Supervisor:
        # Waits while the parent restarts it (it gave up), rather than failing the caller.
        child = self.tree.await_child(child_id)
        assert isinstance(child, Supervisor)
        return child

    def _check_running(self) -> None:
        if self.failure is not None:
            raise ActorUnavailableError(f"fermix stopped after a failure: {self.failure}")
        if not self._started or self._closed:
            raise ActorUnavailableError("Memory is not running: use it as a context manager")

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
        self._check_running()
        model.check_trust(trust)
        key = ConversationKey(agent_id, channel, chat_id, thread_scope)
        validate.identifier("owner_id", owner_id, allow_empty=True)
        return Conversation(self, key, owner_id=owner_id, trust=trust)

    def on_after_delivery(self, name: str, hook: AfterDelivery) -> None:
        """Register post-delivery work run after every committed turn, off the host's path."""
        self._after_delivery.append((name, hook))

    def on_tick(self, name: str, hook: Callable[[], None]) -> None:
        """Register periodic work run by the background service on each tick."""
        self._periodic.append((name, hook))

    def tick(self) -> None:
        """Run the periodic work once (the service calls this on a timer)."""
        self._check_running()
        for name, hook in self._periodic:
            try:
                hook()
            except Exception:
                log.exception("periodic %s failed", name)

    def _dispatch_after_delivery(self, conv: Conversation) -> None:
        # Post-delivery hooks only enqueue work for their actors; a failure to do so is
        # logged and never reaches the host's turn (E1).
        for name, hook in self._after_delivery:
            try:
                hook(conv)
            except Exception:
                log.exception("post-delivery %s failed for %s", name, conv.key)

    def ensure_prompt_files(self, agent_id: str, owner_id: str) -> None:
        """Render the prompt files of this agent and owner once if they were never written.

        Rebuilds after a memory write cover the owners that already have files; an owner
        seen for the first time (a new guest, say) still gets the agent's shared rows.
        """
        pair = (agent_id, owner_id)
        if pair in self._rendered:
            return
        with self._render_lock:
            if pair in self._rendered:
                return
            if not any(p.exists() for p in prompt_files.paths(self.home, agent_id, owner_id)):
                conn = connect(self.home.db_path, vfs=self._vfs)
                try:
                    prompt_files.rebuild(conn, self.home, agent_id, owner_id)
                finally:
                    conn.close()
            self._rendered.add(pair)

    # -- memory rows, through the Store's read-through cache (A3) ------------------------

    def get_row(self, memory_id: int) -> MemoryRow | None:
        """The memory row ``memory_id`` (archived or not), or None."""
        row: MemoryRow | None = self._store_ask(GetRow(memory_id))
        return row

    def list_rows(self, **filters: Any) -> list[MemoryRow]:
        """Memory rows matching ``filters`` (the keywords of ``storage.memories.list_rows``)."""
        rows: list[MemoryRow] = self._store_ask(ListRows(list_filters(**filters)))
        return rows

    def write(self, work: Callable[[Any], Any], *, label: str = "memory write") -> Any:
        """Run ``work(conn)`` as one committed write of memory rows; caches see it at once."""
        return self._store_ask(Write(work, label))

    def _store_ask(self, message: Any) -> Any:
        return self._child_ask("store", message)

    def _child_ask(self, child: str, message: Any, timeout: float | None = 30) -> Any:
        self._check_running()
        for _ in range(3):
            ref = self.tree.await_child(child)
            assert isinstance(ref, pykka.ActorRef)
            try:
                return ref.ask(message, timeout=timeout)
            except pykka.ActorDeadError:
                continue  # crashed between lookup and ask: the next lookup waits for it
        raise ActorUnavailableError(f"the {child} actor is unavailable")

    def _tell(self, child: str, message: Any) -> None:
        ref = self.tree.child_ref(child)
        assert isinstance(ref, pykka.ActorRef)
        ref.tell(message)

    # -- the reviewer (E1, E2, E10) ----------------------------------------------------

    def review(self, conv: Conversation, *, force: bool = True) -> ReviewResult:
        """Review ``conv`` now and wait for the result (``force``: past the time gates)."""
        result: ReviewResult = self._child_ask("reviewer", Review(conv.key, force), timeout=None)
        return result

    def _dispatch_review(self, conv: Conversation) -> None:
        # Only a tell: the reviewer checks its gates on its own thread (E1).
        self._tell("reviewer", Review(conv.key))

    # -- the compactor and chat commands (K1-K4) ---------------------------------------

    def _dispatch_compaction(self, conv: Conversation) -> None:
        # Post-delivery compaction: only a tell, the compactor checks the peak itself (K3).
        self._tell("compactor", Compact(conv.key))

    def compact(self, conv: Conversation, *, force: bool = False) -> CompactionResult:
        """Compact ``conv`` now if due (``force``: whatever its peak) and wait for it."""
        result: CompactionResult = self._child_ask(
            "compactor", Compact(conv.key, force), timeout=None
        )
        return result

    def _reload_window(self, key: ConversationKey) -> None:
        # Called on the compactor's thread after its write committed: the actor re-reads.
        try:
            self.registry.tell(key, Reload())
        except ActorUnavailableError:
            log.warning("could not reload the window of %s after a compaction", key)

    def handle_command(self, conv: Conversation, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command and return the reply to send (K4).

        None means ``text`` is not a fermix command: the host goes on with its turn. A
        guest's state-changing command is refused and changes nothing.
        """
        command = commands.parse(text)
        if command is None:
            return None
        if not commands.allowed(command, conv.trust):
            return commands.refusal(command)
        if command.name == "compact":
            result = self.compact(conv, force=True)
            if result.status == "compacted":
                return (
                    f"Compacted {result.summarized} older messages into a summary "
                    f"({result.before_tokens} -> {result.after_tokens} tokens)."
                )
            if result.status == "failed":
                return f"Compaction failed: {result.error}"
            return "Nothing to compact yet."
        clear_window(self.compaction_context, conv.key)
        return "Started a fresh conversation window. Long-term memory is kept."

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

    def _sweep_reviews(self) -> None:
        for key in due_reviews(self.review_context):
            self._tell("reviewer", Review(key))

    def _append(self, new: NewMessage, trust: str, peak: int | None) -> Message:
        # Committed on the caller's thread in the conversation's order, then cached (A1).
        self._check_running()
        with self.registry.ordering(new.key):
            stored = write_through(self.committer, new, trust=trust, peak_prompt_tokens=peak)
            self.registry.tell_if_live(new.key, Appended(stored))
        return stored

    def _ask(self, key: ConversationKey, message: Any) -> Any:
        self._check_running()
        return self.registry.ask(key, message)
