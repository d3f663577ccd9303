"""The composition root: every service of one process, built from a home and a config.

:func:`build` is the one place that wires fermix together: the store ``[fermix_core.storage]``
chooses, the one write path (:class:`~fermix.runtime.writer.Writer`) with the prompt files,
the review and compaction use cases, the pools of Reviewers and Compactors under the
supervision tree, the registry of conversation actors, the timer and the background
embedder. The :class:`~fermix.runtime.engine.Runtime` behind ``Memory`` builds its services
here, and so do the CLI and the tests' rig, so that no two of them wire a piece differently.

Building opens the store and starts no thread: the store, the writer and the prompt files
serve at once (a CLI command needs nothing more), and :meth:`Services.start` starts the
tree, the timer and the embedder. :meth:`Services.close` stops what was started in reverse
order and closes the store.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fermix import llm
from fermix.actors.conversation import Appended, Reload, WindowSource
from fermix.clock import now_ms
from fermix.config import Config
from fermix.errors import ActorUnavailableError, SupervisorEscalationError
from fermix.home import Home, make_private_dir
from fermix.model import ConversationKey, Message
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.registry import ConversationRegistry, conversation_spec
from fermix.runtime.telemetry import Telemetry
from fermix.runtime.timer import Timer
from fermix.runtime.windows import Windows
from fermix.runtime.writer import Writer
from fermix.storage import Storage, open_storage
from fermix.supervisor import ChildSpec, Intensity, Restart, Supervisor

if TYPE_CHECKING:
    from fermix.runtime.compacting import Compacting
    from fermix.runtime.forgetting import Forgetting
    from fermix.runtime.indexing import Indexer
    from fermix.runtime.pool import Pool
    from fermix.runtime.retention import Retention
    from fermix.runtime.reviewing import Reviewing

log = logging.getLogger(__name__)

CONVERSATIONS = "conversations"
"""The child id of the supervisor of the conversation actors."""


class Services:
    """The services of one process, as :func:`build` wired them.

    ``storage``, ``files``, ``writer``, ``reviewing`` and ``compacting`` serve from the
    start; the rest run once :meth:`start` has started the tree (``tree``: the Reviewers,
    the Compactors and the supervisor of the conversation actors), the ``timer``
    (passivation, A7) and the ``indexer`` (Q2; None when ``[fermix_core.embedding]`` is off).
    """

    def __init__(
        self,
        home: Home,
        config: Config,
        storage: Storage,
        *,
        conversation_cap: int,
        idle_s: float,
        clock: Callable[[], int],
        monotonic: Callable[[], float],
        route: llm.Route | None,
        reviewers: int | None,
        compactors: int | None,
        windows: Callable[[Storage], WindowSource],
        telemetry: Telemetry | None,
    ) -> None:
        self.home = home
        self.config = config
        self.storage = storage
        self.files = PromptFiles(home, storage)
        self.telemetry = Telemetry() if telemetry is None else telemetry
        """What this process counts and traces (O1, O2)."""
        if telemetry is not None:
            storage.observe(self.telemetry)
        self.writer = Writer(storage, self.files, deliver=self._deliver, telemetry=telemetry)
        self.failure: SupervisorEscalationError | None = None
        """Why the tree gave up, if it did."""
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._clock = clock
        self._route = route
        self._monotonic = monotonic
        self._conversation_cap = conversation_cap
        self._idle_s = idle_s
        self._windows = windows
        self._review_workers = config.memory.review_workers if reviewers is None else reviewers
        self._compaction_workers = config.compaction.workers if compactors is None else compactors
        self._indexer: Indexer | None = None
        self._indexer_made = False
        self._gauges()

    # The use cases and the actor side are wired on first use: a CLI command that lists
    # rows imports none of the review, compaction, actor or embedding code (bench/cli_start.py).

    @functools.cached_property
    def reviewing(self) -> Reviewing:
        """The review use case (E1-E10), over the writer."""
        from fermix.runtime.reviewing import Reviewing

        return Reviewing(
            self.config,
            self.storage,
            self.writer,
            clock=self._clock,
            route=self._route,
            telemetry=self.telemetry,
        )

    @functools.cached_property
    def compacting(self) -> Compacting:
        """The compaction use case (K1-K5), over the writer."""
        from fermix.runtime.compacting import Compacting

        return Compacting(
            self.config,
            self.storage,
            self.writer,
            clock=self._clock,
            route=self._route,
            on_compacted=self._reload_window,
            telemetry=self.telemetry,
        )

    @functools.cached_property
    def forgetting(self) -> Forgetting:
        """The erasures (F1-F5), over the writer; they drop this process's hot copies."""
        from fermix.runtime.forgetting import Forgetting

        return Forgetting(self.storage, self.writer, self.files, drop_hot=self._drop_hot)

    @functools.cached_property
    def retention(self) -> Retention:
        """The retention sweep ``[fermix_core.retention]`` asks for (F7)."""
        from fermix.runtime.retention import Retention

        return Retention(self.storage, self.writer, self.config.retention, clock=self._clock)

    @functools.cached_property
    def reviewers(self) -> Pool:
        """The pool of Reviewer actors (M3)."""
        from fermix.runtime.pool import Pool

        return Pool("reviewer", self._review_workers, self._current_tree)

    @functools.cached_property
    def compactors(self) -> Pool:
        """The pool of Compactor actors (M3)."""
        from fermix.runtime.pool import Pool

        return Pool("compactor", self._compaction_workers, self._current_tree)

    @functools.cached_property
    def tree(self) -> Supervisor:
        """The supervision tree: the Reviewers, the Compactors and the supervisor of the
        conversation actors (A1-A6)."""
        from fermix.actors.compactor import Compactor
        from fermix.actors.reviewer import Reviewer
        from fermix.runtime.pool import PooledCompactions, PooledReviews

        reviewing, compacting = self.reviewing, self.compacting
        reviewers_pool, compactors_pool = self.reviewers, self.compactors
        return Supervisor(
            [
                *reviewers_pool.specs(
                    lambda n: Reviewer.start(PooledReviews(reviewing, reviewers_pool, n))
                ),
                *compactors_pool.specs(
                    lambda n: Compactor.start(PooledCompactions(compacting, compactors_pool, n))
                ),
                ChildSpec(
                    CONVERSATIONS,
                    lambda: Supervisor(
                        name=CONVERSATIONS, intensity=Intensity(max_restarts=20)
                    ).start(),
                    restart=Restart.PERMANENT,
                ),
            ],
            name="fermix",
            on_escalate=self._escalated,
        )

    @functools.cached_property
    def registry(self) -> ConversationRegistry:
        """The live conversation actors, started on demand and passivated when idle (A7)."""
        from fermix.actors.conversation import ConversationStore

        source = self._windows(self.storage)
        max_history = self.config.memory.max_conversation_history
        return ConversationRegistry(
            self._conversations,
            lambda key: conversation_spec(
                key,
                lambda: ConversationStore.start(key, source=source, max_history=max_history),
            ),
            cap=self._conversation_cap,
            idle_s=self._idle_s,
            monotonic=self._monotonic,
        )

    @functools.cached_property
    def timer(self) -> Timer:
        """The thread of the periodic work: passivation (A7) and the runtime's sweep (M7)."""
        timer = Timer()
        timer.every("passivation", max(self._idle_s / 2, 0.05), self._passivate)
        return timer

    @property
    def indexer(self) -> Indexer | None:
        """The background embedder ``[fermix_core.embedding]`` asks for (Q2), None when it
        is off; made on first use (by :meth:`start`, or a command that embeds), so that a
        command that needs none never checks its config."""
        if not self._indexer_made:
            from fermix.runtime.indexing import Indexer

            self._indexer = Indexer.from_config(self.storage, self.writer, self.config.embedding)
            self._indexer_made = True
        return self._indexer

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the tree, then the timer and the embedder; once only.

        If the tree cannot start, nothing is left running (the store stays open:
        :meth:`close` closes it).
        """
        with self._lock:
            if self._started or self._stopped:
                raise RuntimeError("these services were already started")
            indexer = self.indexer
            self.tree.start()
            self._started = True
            self.timer.start()
            if indexer is not None:
                indexer.start()

    def reconfigure(self, config: Config) -> None:
        """Run the reviews, compactions and retention sweeps from now on by ``config``
        (:func:`~fermix.runtime.live_config.applied` made it: only what applies live
        differs); each swaps its settings whole, so no review, compaction or sweep running
        now mixes the old and the new (W1)."""
        self.config = config
        self.reviewing.reconfigure(config)
        self.compacting.reconfigure(config)
        self.retention.reconfigure(config.retention)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` started the tree."""
        return self._started

    def close(self, timeout: float = 30.0) -> None:
        """Stop the timer, the embedder and the tree (queued work finishes first; the tree
        stops the conversation actors the registry started), finish the queued prompt-file
        rebuilds, then close the store; once, whatever was started."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            started = self._started
        try:
            if started:
                self.timer.stop(timeout)
                if self._indexer is not None:
                    self._indexer.stop(timeout)
                self.tree.stop(timeout=timeout)
            self.files.settle()  # prompt-file rebuilds queued by reviews and composes
        finally:
            self.storage.close()

    # -- the wiring between them -------------------------------------------------------

    def _gauges(self) -> None:
        """The readings of a scrape (O1): queues, live actors, vectors still to compute.
        Each reads what is there without starting anything: 0 before the tree starts."""
        t = self.telemetry
        t.commits_from(self.storage.commit_stats)
        t.gauge(
            "fermix_review_queue_depth",
            "Reviews sent to the Reviewers and not finished.",
            lambda: sum(self.reviewers.pending()) if self._started else 0,
        )
        t.gauge(
            "fermix_compaction_queue_depth",
            "Compactions sent to the Compactors and not finished.",
            lambda: sum(self.compactors.pending()) if self._started else 0,
        )
        t.gauge(
            "fermix_live_conversations",
            "Conversation actors live in this process.",
            lambda: self.registry.live_count() if self._started else 0,
        )
        t.counted(
            "fermix_conversations_passivated",
            "Conversation actors stopped for idleness or the cap.",
            lambda: self.registry.passivated if self._started else 0,
        )
        t.gauge(
            "fermix_vectors_pending",
            "Messages and live memory rows without a vector yet (0 with embedding off).",
            self._vectors_pending,
        )

    def _vectors_pending(self) -> int:
        if not self._started or self._indexer is None:
            return 0
        with self.storage.read() as reads:
            c = reads.vector_coverage()
        return max(0, c.messages - c.message_vectors) + max(0, c.memories - c.memory_vectors)

    def _escalated(self, error: SupervisorEscalationError) -> None:
        log.critical("fermix actor tree gave up: %s", error)
        self.failure = error

    def _current_tree(self) -> Supervisor:
        return self.tree

    def _conversations(self) -> Supervisor:
        # Waits while the parent restarts it (it gave up), rather than failing the caller.
        child = self.tree.await_child(CONVERSATIONS)
        assert isinstance(child, Supervisor)
        return child

    def _deliver(self, stored: Message) -> None:
        # Called by the writer after the commit, still in the conversation's order; before
        # the tree starts no actor holds a window to tell.
        if self._started:
            self.registry.tell_if_live(stored.key, Appended(stored))
        if self._indexer is not None:
            self._indexer.wake()  # embeds behind the append, never on its path (Q2)

    def _reload_window(self, key: ConversationKey) -> None:
        # Called after a compaction or /new committed: the actor re-reads its window.
        if not self._started:
            return  # no actor holds a window before the tree starts
        try:
            self.registry.tell(key, Reload())
        except ActorUnavailableError:
            log.warning("could not reload the window of %s after a compaction", key)

    def _drop_hot(self, agent_id: str | None) -> None:
        # After an erasure: no conversation actor of the agent keeps a window in memory.
        if self._started:
            self.registry.passivate_agent(agent_id)

    def _passivate(self) -> bool:
        """The timer's passivation of idle conversation actors (A7)."""
        stopped = self.registry.passivate_idle()
        if stopped:
            log.debug("passivated %d idle conversation actors", stopped)
        return True


def build(
    home: Home,
    config: Config,
    *,
    vfs: str | None = None,
    readers: int = 4,
    conversation_cap: int = 256,
    idle_s: float = 600.0,
    clock: Callable[[], int] = now_ms,
    monotonic: Callable[[], float] = time.monotonic,
    route: llm.Route | None = None,
    reviewers: int | None = None,
    compactors: int | None = None,
    windows: Callable[[Storage], WindowSource] = Windows,
    telemetry: Telemetry | None = None,
) -> Services:
    """Open the store of ``home`` that ``config`` chooses (creating and migrating it) and
    wire every service of a process over it; no thread is started.

    The seams, for tests and tools: ``vfs`` (SQLite's, a fault-injecting one), ``readers``
    (the store's read connections; a CLI command needs 1), ``conversation_cap`` and
    ``idle_s`` (the live conversation actors and how long an idle one lives, A7),
    ``clock`` (epoch milliseconds, the gates' time), ``monotonic`` (seconds, the
    passivation's), ``route`` (replaces the configured model route), ``reviewers`` and
    ``compactors`` (the pool sizes; None: the config's), ``windows`` (what conversation
    actors read their windows from, over the store), ``telemetry`` (the metrics and
    tracer, O1, O2; None: counts of their own and no spans, the append path and the group
    commit not instrumented at all, as a CLI command needs). If wiring fails, the
    store is closed again before the error propagates.
    """
    make_private_dir(home.root)
    storage = open_storage(home, config, vfs=vfs, readers=readers)
    try:
        return Services(
            home,
            config,
            storage,
            conversation_cap=conversation_cap,
            idle_s=idle_s,
            clock=clock,
            monotonic=monotonic,
            route=route,
            reviewers=reviewers,
            compactors=compactors,
            windows=windows,
            telemetry=telemetry,
        )
    except BaseException:
        storage.close()
        raise
