"""``Runtime``: the private object that wires one process's fermix together.

It opens the database, builds the one write path (:class:`~fermix.runtime.writer.Writer`)
and the prompt files, starts the supervised actor tree (the Reviewer, the Compactor and a
dynamic supervisor of ConversationStore actors found through the registry), and offers the
facades (:class:`~fermix.api.Memory`, :class:`~fermix.conversation.Conversation`, the tools,
the CLI, the service) the few operations they need. Nothing here is public API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from fermix import llm
from fermix.actors.base import ask_found
from fermix.actors.compactor import Compact, Compactor
from fermix.actors.conversation import (
    Appended,
    ConversationStore,
    History,
    Reload,
    Snapshot,
    StateQuery,
    WindowMark,
)
from fermix.actors.reviewer import Review, Reviewer, ReviewRunner
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.core.review import gate as review_gate
from fermix.errors import (
    ActorUnavailableError,
    FermixError,
    InvalidInputError,
    SupervisorEscalationError,
)
from fermix.home import Home
from fermix.model import ConversationKey, ConversationState, Message, NewMessage
from fermix.runtime import files
from fermix.runtime.compacting import Compacting
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.registry import ConversationRegistry, conversation_spec
from fermix.runtime.reviewing import Reviewing
from fermix.runtime.writer import Writer
from fermix.storage import Database
from fermix.supervision.restarts import Intensity, Restart
from fermix.supervisor import ChildSpec, Supervisor

log = logging.getLogger(__name__)



class _Windows:
    """Reads a conversation's state, window and window mark for its actor (a
    ``WindowSource``), each in one read unit (M4)."""

    def __init__(self, db: Database) -> None:
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


class Runtime:
    """One home's database, write path, prompt files and actor tree, in this process.

    ``clock`` (epoch milliseconds) and ``monotonic`` (seconds) are the times the gates and
    the passivation read; ``route`` replaces the configured model route. Tests pass them.
    """

    def __init__(
        self,
        home: Home,
        config: Config,
        *,
        conversation_cap: int = 256,
        idle_s: float = 600.0,
        vfs: str | None = None,
        clock: Callable[[], int] = now_ms,
        monotonic: Callable[[], float] = time.monotonic,
        route: llm.Route | None = None,
    ) -> None:
        cap = conversation_cap
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise InvalidInputError(f"conversation_cap must be an integer >= 1, not {cap!r}")
        if isinstance(idle_s, bool) or not isinstance(idle_s, int | float) or not idle_s > 0:
            raise InvalidInputError(f"idle_s must be a number of seconds > 0, not {idle_s!r}")
        self.home = home
        self.config = config
        self._cap = conversation_cap
        self._idle_s = idle_s
        self._vfs = vfs
        self._clock = clock
        self._monotonic = monotonic
        self._route = route
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self.failure: SupervisorEscalationError | None = None
        """Why the actor tree gave up, if it did; every later call then raises."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Open the database (migrating it) and start the actor tree.

        If the tree fails to start, the database is closed again before the error
        propagates: nothing is left open.
        """
        with self._lock:
            if self._started:
                return
            files.make_private_dir(self.home.root)
            self.db = Database(self.home.db_path, vfs=self._vfs)
            try:
                self._start_tree()
            except BaseException:
                self.db.close()
                raise
            self._started = True
        if self.reviewing.route.primary is None:
            log.warning("%s", llm.NO_MODEL_OFF)  # once per start, not per turn (M8)

    def _start_tree(self) -> None:
        db, config = self.db, self.config
        self.files = PromptFiles(self.home, db)
        self.writer = Writer(db, self.files, deliver=self._deliver)
        self.reviewing = Reviewing(config, db, self.writer, clock=self._clock, route=self._route)
        self.compacting = Compacting(
            config,
            db,
            self.writer,
            clock=self._clock,
            route=self._route,
            on_compacted=self._reload_window,
        )
        windows = _Windows(db)
        max_history = config.memory.max_conversation_history
        compacting = self.compacting
        reviewing: ReviewRunner = self.reviewing
        if self.reviewing.route.primary is None:
            reviewing = _ReviewsOff(self.reviewing, db, config, self._clock)  # M8
        self.tree = Supervisor(
            [
                ChildSpec("reviewer", lambda: Reviewer.start(reviewing)),
                ChildSpec("compactor", lambda: Compactor.start(compacting)),
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
        try:
            self.registry = ConversationRegistry(
                lambda: self._child_supervisor("conversations"),
                lambda key: conversation_spec(
                    key,
                    lambda: ConversationStore.start(key, source=windows, max_history=max_history),
                ),
                cap=self._cap,
                idle_s=self._idle_s,
                monotonic=self._monotonic,
            )
            self.registry.start_sweeper()
        except BaseException:
            self.tree.stop()
            raise

    def close(self, timeout: float = 30.0) -> None:
        """Stop the tree gracefully (queued writes finish first), then close the database."""
        with self._lock:
            if not self._started or self._closed:
                self._closed = True
                return
            self._closed = True
        try:
            self.registry.stop()
            self.tree.stop(timeout=timeout)
        finally:
            self.db.close()

    @property
    def running(self) -> bool:
        """Whether the runtime was started, is not closed and its tree has not given up."""
        return self._started and not self._closed and self.failure is None

    def check_running(self) -> None:
        """Raise :class:`ActorUnavailableError` unless the runtime can serve calls."""
        if self.failure is not None:
            raise ActorUnavailableError(f"fermix stopped after a failure: {self.failure}")
        if not self._started or self._closed:
            raise ActorUnavailableError("Memory is not running: use it as a context manager")

    def _escalated(self, error: SupervisorEscalationError) -> None:
        log.critical("fermix actor tree gave up: %s", error)
        self.failure = error

    def _child_supervisor(self, child_id: str) -> Supervisor:
        # Waits while the parent restarts it (it gave up), rather than failing the caller.
        child = self.tree.await_child(child_id)
        assert isinstance(child, Supervisor)
        return child

    def _ask(self, child: str, message: Any, timeout: float | None = 30) -> Any:
        self.check_running()
        return ask_found(
            lambda: _ref(self.tree.await_child(child)),
            message,
            timeout=timeout,
            what=f"the {child} actor",
        )

    def _tell(self, child: str, message: Any) -> None:
        _ref(self.tree.child_ref(child)).tell(message)

    # -- conversations -----------------------------------------------------------------

    def _deliver(self, stored: Message) -> None:
        # Called by the writer after the commit, still in the conversation's order.
        self.registry.tell_if_live(stored.key, Appended(stored))

    def append(self, new: NewMessage, *, trust: str, peak_prompt_tokens: int | None) -> Message:
        """Store ``new``; returns once it is committed (A1)."""
        self.check_running()
        return self.writer.append(new, trust=trust, peak_prompt_tokens=peak_prompt_tokens)

    def history(self, key: ConversationKey, limit: int | None = None) -> list[Message]:
        """The window of ``key``, oldest first, from its actor."""
        self.check_running()
        window: list[Message] = self.registry.ask(key, History(limit))
        return window

    def state(self, key: ConversationKey) -> ConversationState | None:
        """The stored state of ``key``, read fresh."""
        self.check_running()
        state: ConversationState | None = self.registry.ask(key, StateQuery())
        return state

    def reload(self, key: ConversationKey) -> None:
        """Make the actor of ``key`` read its window again from SQLite."""
        self.check_running()
        self.registry.ask(key, Reload())

    def _reload_window(self, key: ConversationKey) -> None:
        # Called after a compaction or /new committed: the actor re-reads its window.
        try:
            self.registry.tell(key, Reload())
        except ActorUnavailableError:
            log.warning("could not reload the window of %s after a compaction", key)

    def live_conversations(self) -> int:
        """How many conversation actors are live."""
        return self.registry.live_count()

    # -- post-delivery work: reviewer and compactor (E1, K3) -----------------------------

    def after_delivery(self, key: ConversationKey) -> None:
        """Dispatch the reviewer and the compactor for ``key``, off the caller's path.

        Only tells: each actor checks its own gates on its own thread, and a failure to
        dispatch is logged, never raised into the host's turn (E1).
        """
        for child, message in (("reviewer", Review(key)), ("compactor", Compact(key))):
            try:
                self._tell(child, message)
            except (FermixError, pykka.ActorDeadError) as exc:
                log.error("could not dispatch the %s for %s: %s", child, key, exc)

    def review(self, key: ConversationKey, *, force: bool = True) -> ReviewResult:
        """Review ``key`` now and wait for the result (``force``: past the time gates)."""
        result: ReviewResult = self._ask("reviewer", Review(key, force), timeout=None)
        return result

    def compact(self, key: ConversationKey, *, force: bool = False) -> CompactionResult:
        """Compact ``key`` now if due (``force``: whatever its peak) and wait for it."""
        result: CompactionResult = self._ask("compactor", Compact(key, force), timeout=None)
        return result

    def clear_window(self, key: ConversationKey) -> int:
        """Start the window of ``key`` after its newest message (``/new``, ``/clear``)."""
        self.check_running()
        return self.compacting.clear_window(key)

    def tick(self) -> None:
        """Run the periodic work once: dispatch every due review (the sweep)."""
        self.check_running()
        for key in self.reviewing.due():
            self._tell("reviewer", Review(key))


class _ReviewsOff:
    """The Reviewer's runner when no model is configured (M8): the repairs at start still
    run, the review gates still answer first (nothing new, disabled...), and a review that
    would run is skipped as ``no_model`` instead of failing into its backoff every time."""

    def __init__(
        self, reviewing: Reviewing, db: Database, config: Config, clock: Callable[[], int]
    ) -> None:
        self._reviewing = reviewing
        self._db = db
        self._config = config.memory
        self._clock = clock

    def start(self) -> None:
        self._reviewing.start()

    def review(self, key: ConversationKey, *, force: bool = False) -> ReviewResult:
        with self._db.read() as reads:
            state = reads.conversation(key)
            newest = reads.newest_user_message_id(key)
        skip = review_gate(
            state,
            now_ms=self._clock(),
            interval_hours=self._config.review_interval_hours,
            backoff_ms=self._config.review_failure_backoff_ms,
            newest_user_message_id=newest,
            force=force,
        )
        if skip is not None:
            return ReviewResult(key, "skipped", skip=skip)
        return ReviewResult(key, "skipped", error=f"{llm.NO_MODEL}: {llm.NO_MODEL_OFF}")


def _ref(child: object) -> pykka.ActorRef[Any]:
    # The tree's children named here are actors, never nested supervisors.
    assert isinstance(child, pykka.ActorRef)
    return child
