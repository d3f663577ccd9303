"""``Runtime``: the private object that wires one process's fermix together.

It opens the database, builds the one write path (:class:`~fermix.runtime.writer.Writer`)
and the prompt files, starts the supervised actor tree (a pool of Reviewers, a pool of
Compactors and a dynamic supervisor of ConversationStore actors found through the registry),
runs the due-review sweep on a timer (M7), and offers the facades
(:class:`~fermix.api.Memory`, :class:`~fermix.conversation.Conversation`, the tools, the CLI,
the service) the few operations they need. Nothing here is public API.

No turn waits on another conversation (M3): a turn's preflight decides from SQLite, on its
own thread, whether its compaction is due and asks a Compactor only then; each pool sends a
conversation's requests in order to one actor and otherwise to the least busy one, so a
model call that hangs for one conversation holds one actor, not the others' turns; and
every wait a turn makes on a pool is bounded by the model timeout plus a margin.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import pykka

from fermix import llm
from fermix.actors.compactor import Compact, Compactor
from fermix.actors.conversation import Appended, ConversationStore, History, Reload, StateQuery
from fermix.actors.reviewer import Review, Reviewer
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.errors import (
    ActorUnavailableError,
    FermixError,
    InvalidInputError,
    SupervisorEscalationError,
)
from fermix.home import Home
from fermix.model import (
    AppendResult,
    ConversationKey,
    ConversationState,
    Message,
    NewMessage,
    PendingAppend,
)
from fermix.runtime.compacting import Compacting
from fermix.runtime.indexing import Indexer
from fermix.runtime.pool import Pool, PooledCompactions, PooledReviews
from fermix.runtime.prompt_files import PromptFiles, disk
from fermix.runtime.registry import ConversationRegistry, conversation_spec
from fermix.runtime.reviewing import SWEEP_AGAIN_S, SWEEP_CLAIMS_PER_WORKER, Reviewing
from fermix.runtime.timer import Timer
from fermix.runtime.windows import Windows
from fermix.runtime.writer import Writer
from fermix.storage import Storage, open_storage
from fermix.supervisor import ChildSpec, Intensity, Restart, Supervisor

log = logging.getLogger(__name__)


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
        self.wait_s: float | None = None
        """How long a turn waits for its compaction; None derives it from the model timeout
        (:meth:`~fermix.runtime.compacting.Compacting.wait_s`). Tests set it."""
        self.indexer: Indexer | None = None
        """The background embedder (Q2), None when ``[fermix_core.embedding]`` is off."""
        self.timer = Timer()
        """The thread of the periodic work: passivation (A7) and, unless
        ``sweep_interval_s`` is 0, the sweep for due reviews (M7)."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Open the store ``[fermix_core.storage]`` chooses (migrating it) and start the
        actor tree.

        If the tree fails to start, the database is closed again before the error
        propagates: nothing is left open.
        """
        with self._lock:
            if self._started:
                return
            disk.make_private_dir(self.home.root)
            self.db: Storage = open_storage(self.home, self.config, vfs=self._vfs)
            try:
                self._start_tree()
            except BaseException:
                self.db.close()
                raise
            self._started = True
            self.timer.start()
            self.indexer = Indexer.from_config(self.db, self.writer, self.config.embedding)
            if self.indexer is not None:
                self.indexer.start()
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
        windows = Windows(db)
        max_history = config.memory.max_conversation_history
        compacting = self.compacting
        reviewing = self.reviewing
        tree = self._current_tree  # set once the tree has started; the pools ask it later
        reviewers = self.reviewers = Pool("reviewer", config.memory.review_workers, tree)
        compactors = self.compactors = Pool("compactor", config.compaction.workers, tree)
        self.tree = Supervisor(
            [
                *reviewers.specs(lambda n: Reviewer.start(PooledReviews(reviewing, reviewers, n))),
                *compactors.specs(
                    lambda n: Compactor.start(PooledCompactions(compacting, compactors, n))
                ),
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
            self.timer.every("passivation", max(self._idle_s / 2, 0.05), self._passivate)
            interval = config.memory.sweep_interval_s
            if interval > 0:
                self.timer.every("sweep", interval, self._sweep_from_timer)
        except BaseException:
            self.tree.stop()
            raise

    def close(self, timeout: float = 30.0) -> None:
        """Stop the sweep and the tree gracefully (queued writes and prompt-file rebuilds
        finish first), then close the database."""
        with self._lock:
            if not self._started or self._closed:
                self._closed = True
                return
            self._closed = True
        try:
            self.timer.stop(timeout)
            if self.indexer is not None:
                self.indexer.stop(timeout)
            self.registry.stop()
            self.tree.stop(timeout=timeout)
            self.files.settle()  # prompt-file rebuilds queued by reviews and composes
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

    def _current_tree(self) -> Supervisor:
        return self.tree

    def _child_supervisor(self, child_id: str) -> Supervisor:
        # Waits while the parent restarts it (it gave up), rather than failing the caller.
        child = self.tree.await_child(child_id)
        assert isinstance(child, Supervisor)
        return child

    # -- conversations -----------------------------------------------------------------

    def _deliver(self, stored: Message) -> None:
        # Called by the writer after the commit, still in the conversation's order.
        self.registry.tell_if_live(stored.key, Appended(stored))
        if self.indexer is not None:
            self.indexer.wake()  # embeds behind the append, never on its path (Q2)

    def append(
        self,
        new: NewMessage,
        *,
        trust: str,
        peak_prompt_tokens: int | None,
        owner_id: str | None = None,
    ) -> AppendResult:
        """Store ``new``; returns once it is committed (A1). ``owner_id`` and ``trust`` are
        the conversation's, ``new`` carries its author's (M1)."""
        self.check_running()
        return self.writer.append_keyed(
            new, trust=trust, peak_prompt_tokens=peak_prompt_tokens, owner_id=owner_id
        )

    def append_many(self, pending: Sequence[PendingAppend]) -> list[AppendResult | BaseException]:
        """Store each of ``pending`` in order, sharing commits; each one's result or error."""
        self.check_running()
        return self.writer.append_many(pending)

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

    # -- post-delivery work: reviewers and compactors (E1, K3, M3) -----------------------

    def after_delivery(self, key: ConversationKey) -> None:
        """Dispatch a review and a compaction of ``key``, off the caller's path.

        Only tells: each actor checks its own gates on its own thread, and a failure to
        dispatch is logged, never raised into the host's turn (E1).
        """
        for pool, message in ((self.reviewers, Review(key)), (self.compactors, Compact(key))):
            try:
                pool.tell(key, message)
            except (FermixError, pykka.ActorDeadError) as exc:
                log.error("could not dispatch the %s for %s: %s", pool.name, key, exc)

    def review(self, key: ConversationKey, *, force: bool = True) -> ReviewResult:
        """Review ``key`` now and wait for the result (``force``: past the time gates).

        It waits behind this conversation's earlier requests only, never another's while a
        Reviewer is free (M3); a forced review may take a backlog in several model calls,
        so this wait has no bound (a turn never makes it: ``commit`` only tells).
        """
        self.check_running()
        result: ReviewResult = self.reviewers.ask(key, Review(key, force), timeout=None)
        return result

    def compact(self, key: ConversationKey, *, force: bool = False) -> CompactionResult:
        """Compact ``key`` now if due (``force``: whatever its peak) and wait for it, at most
        the model timeout plus a margin (M3): past it the result is ``failed`` and the
        compaction goes on in the background."""
        self.check_running()
        wait = self.wait_s if self.wait_s is not None else self.compacting.wait_s()
        try:
            result: CompactionResult = self.compactors.ask(key, Compact(key, force), timeout=wait)
        except pykka.Timeout:
            log.warning(
                "no compaction of %s/%s within %g s: the turn goes on without it",
                *(key.agent_id, key.scope_id, wait),
            )
            error = f"no result within {wait:g} s; the compaction goes on in the background"
            return CompactionResult(key, "failed", error=error)
        return result

    def preflight(self, key: ConversationKey) -> CompactionResult | None:
        """Before a turn: compact ``key`` if its recorded peak calls for it (K3, M3).

        Whether it does is read from SQLite on the caller's thread: a conversation whose
        compaction is not due returns None at once, with no ask to any actor. A due one
        waits for its own compaction only, bounded as :meth:`compact`.
        """
        self.check_running()
        if not self.compacting.due(key):
            return None
        return self.compact(key)

    def clear_window(self, key: ConversationKey) -> int:
        """Start the window of ``key`` after its newest message (``/new``, ``/clear``)."""
        self.check_running()
        return self.compacting.clear_window(key)

    # -- the sweep (E1, M7) --------------------------------------------------------------

    def tick(self) -> int:
        """Sweep once now: claim due conversations and dispatch a review of each that has
        none pending in this process; returns how many were dispatched. The :attr:`timer`
        calls it every ``sweep_interval_s``, counting from the last sweep, whoever ran it.

        The claim is one write over the store (M7, B2): the sweeps of other processes, on
        this machine or others, never claim the same conversations. It takes no more than
        the reviewers can start well before the claims expire (:data:`SWEEP_CLAIMS_PER_WORKER`
        each, less what they have pending); the rest stays due for the next sweep, here or
        in another process. A claim no review here takes goes back at once.
        """
        self.check_running()
        self.timer.ran("sweep")
        room = SWEEP_CLAIMS_PER_WORKER * len(self.reviewers.ids) - sum(self.reviewers.pending())
        claimed = self.reviewing.claim_due(room)
        if len(claimed) >= room:
            # Full (or the reviewers were): more may be due. The timer sweeps again soon, so
            # a backlog of many conversations drains at the reviewers' pace, not one
            # sweep_interval_s per handful.
            self.timer.soon("sweep", SWEEP_AGAIN_S)
        sent = 0
        for key in claimed:
            try:
                if self.reviewers.tell(key, Review(key), unless_pending=True):
                    sent += 1
                    continue
            except (FermixError, pykka.ActorDeadError) as exc:
                log.error("could not dispatch the review of %s: %s", key, exc)
            self.reviewing.release(key)
        return sent

    def _passivate(self) -> bool:
        """The timer's passivation of idle conversation actors (A7)."""
        stopped = self.registry.passivate_idle()
        if stopped:
            log.debug("passivated %d idle conversation actors", stopped)
        return True

    def _sweep_from_timer(self) -> bool:
        """One sweep of the timer; False once the runtime can no longer serve."""
        if not self.running:
            return False
        try:
            self.tick()
        except FermixError as exc:
            if self.running:
                log.error("the review sweep failed: %s", exc)
        return self.running
