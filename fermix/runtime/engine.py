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

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from fermix import llm
from fermix.actors.base import ask_found
from fermix.actors.compactor import Compact, CompactionRunner, Compactor
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
    NotFoundError,
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
        self.wait_s: float | None = None
        """How long a turn waits for its compaction; None derives it from the model timeout
        (:meth:`~fermix.runtime.compacting.Compacting.wait_s`). Tests set it."""
        self.timer = _Timer()
        """The thread of the periodic work: passivation (A7) and, unless
        ``sweep_interval_s`` is 0, the sweep for due reviews (M7)."""

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
            self.timer.start()
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
        tree = self._current_tree  # set once the tree has started; the pools ask it later
        reviewers = self.reviewers = _Pool("reviewer", config.memory.review_workers, tree)
        compactors = self.compactors = _Pool("compactor", config.compaction.workers, tree)
        self.tree = Supervisor(
            [
                *reviewers.specs(lambda n: Reviewer.start(_PooledReviews(reviewing, reviewers, n))),
                *compactors.specs(
                    lambda n: Compactor.start(_PooledCompactions(compacting, compactors, n))
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
        """Stop the sweep and the tree gracefully (queued writes finish first), then close
        the database."""
        with self._lock:
            if not self._started or self._closed:
                self._closed = True
                return
            self._closed = True
        try:
            self.timer.stop(timeout)
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
        """Sweep once now: dispatch a review of every due conversation that has none pending
        in this process; returns how many were dispatched. The :attr:`timer` calls
        it every ``sweep_interval_s``, counting from the last sweep, whoever ran it."""
        self.check_running()
        self.timer.ran("sweep")
        sent = 0
        for key in self.reviewing.due():
            try:
                if self.reviewers.tell(key, Review(key), unless_pending=True):
                    sent += 1
            except (FermixError, pykka.ActorDeadError) as exc:
                log.error("could not dispatch the review of %s: %s", key, exc)
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


class _Pool:
    """``size`` supervised actors of one kind, each a child of the tree (M3).

    Named ``name``, ``name-2``, ``name-3``... A conversation's requests go in order to one
    actor: the one still holding an earlier request of it, else the one with the fewest
    requests pending (the first of a tie). So a request never queues behind another
    conversation's while an actor is idle, one conversation's requests keep their order
    (asked after a tell, answered after it), and at most ``size`` run at once. The actors'
    runners report each finished request (:meth:`finished`); a restarted actor starts with
    nothing pending, its predecessor's queue being lost with it.
    """

    def __init__(self, name: str, size: int, tree: Callable[[], Supervisor]) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidInputError(f"{name} workers must be an integer >= 1, not {size!r}")
        self.name = name
        self.ids = [name, *(f"{name}-{n}" for n in range(2, size + 1))]
        self._tree = tree
        self._lock = threading.Lock()
        self._pending = [0] * size
        self._holders: dict[ConversationKey, tuple[int, int]] = {}
        """The actor holding requests of a conversation, and how many."""

    def specs(self, start: Callable[[int], pykka.ActorRef[Any]]) -> list[ChildSpec]:
        """The tree's child specs: actor ``n`` is started by ``start(n)``."""
        return [
            ChildSpec(child, functools.partial(self._start, n, start))
            for n, child in enumerate(self.ids)
        ]

    def _start(self, n: int, start: Callable[[int], pykka.ActorRef[Any]]) -> pykka.ActorRef[Any]:
        with self._lock:
            self._pending[n] = 0
            for key in [k for k, (holder, _) in self._holders.items() if holder == n]:
                del self._holders[key]
        return start(n)

    def pending(self) -> list[int]:
        """Requests sent to each actor and not finished yet (for tests and status)."""
        with self._lock:
            return list(self._pending)

    def _assign(self, key: ConversationKey, *, unless_pending: bool) -> int | None:
        with self._lock:
            held = self._holders.get(key)
            if held is not None and unless_pending:
                return None
            if held is not None:
                n, count = held
            else:
                n = min(range(len(self._pending)), key=self._pending.__getitem__)
                count = 0
            self._holders[key] = (n, count + 1)
            self._pending[n] += 1
            return n

    def finished(self, n: int, key: ConversationKey) -> None:
        """Actor ``n`` is done with a request of ``key`` (or it never reached it)."""
        with self._lock:
            self._pending[n] = max(0, self._pending[n] - 1)
            held = self._holders.get(key)
            if held is not None and held[0] == n:
                if held[1] <= 1:
                    del self._holders[key]
                else:
                    self._holders[key] = (n, held[1] - 1)

    def tell(self, key: ConversationKey, message: Any, *, unless_pending: bool = False) -> bool:
        """Send ``message`` about ``key`` without waiting; False when ``unless_pending`` and
        a request of ``key`` is still pending (nothing is sent)."""
        n = self._assign(key, unless_pending=unless_pending)
        if n is None:
            return False
        try:
            _ref(self._tree().child_ref(self.ids[n])).tell(message)
        except (FermixError, pykka.ActorDeadError):
            self.finished(n, key)
            raise
        return True

    def ask(self, key: ConversationKey, message: Any, *, timeout: float | None) -> Any:
        """Send ``message`` about ``key`` and wait for the reply, at most ``timeout`` seconds
        (``pykka.Timeout``: the request stays queued and runs later)."""
        n = self._assign(key, unless_pending=False)
        assert n is not None
        child = self.ids[n]
        try:
            return ask_found(
                lambda: _ref(self._tree().await_child(child)),
                message,
                timeout=timeout,
                what=f"the {child} actor",
            )
        except (ActorUnavailableError, NotFoundError):
            self.finished(n, key)  # it never reached an actor
            raise


class _PooledReviews:
    """The runner of Reviewer ``n``: tells the pool when each review ends; only the first
    Reviewer repairs the prompt files at start (they are the same files for all)."""

    def __init__(self, runner: ReviewRunner, pool: _Pool, n: int) -> None:
        self._runner = runner
        self._pool = pool
        self._n = n

    def start(self) -> None:
        if self._n == 0:
            self._runner.start()

    def review(self, key: ConversationKey, *, force: bool = False) -> ReviewResult:
        try:
            return self._runner.review(key, force=force)
        finally:
            self._pool.finished(self._n, key)


class _PooledCompactions:
    """The runner of Compactor ``n``: tells the pool when each compaction ends."""

    def __init__(self, runner: CompactionRunner, pool: _Pool, n: int) -> None:
        self._runner = runner
        self._pool = pool
        self._n = n

    def compact(self, key: ConversationKey, *, force: bool) -> CompactionResult:
        try:
            return self._runner.compact(key, force=force)
        finally:
            self._pool.finished(self._n, key)


class _Job:
    """One periodic job of a :class:`_Timer`."""

    def __init__(self, name: str, interval_s: float, run: Callable[[], bool]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.run = run
        self.last = time.monotonic()

    @property
    def due_at(self) -> float:
        return self.last + self.interval_s


class _Timer:
    """The one thread of a runtime's periodic work (A7, M7): passivating idle conversation
    actors and sweeping for due reviews.

    Each job runs every ``interval_s`` seconds counted from its last run, whoever ran it
    (:meth:`ran`: an explicit ``tick()`` restarts the sweep's interval, so a host that also
    sweeps on its own timer does not sweep twice as often). A job returning False is dropped;
    one raising is logged and kept. :meth:`stop` wakes the thread and joins it.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fermix-timer", daemon=True)

    def every(self, name: str, interval_s: float, run: Callable[[], bool]) -> None:
        """Run ``run`` every ``interval_s`` seconds, the first time one interval from now."""
        with self._lock:
            self._jobs[name] = _Job(name, interval_s, run)

    def jobs(self) -> dict[str, float]:
        """Each job's name and interval in seconds."""
        with self._lock:
            return {job.name: job.interval_s for job in self._jobs.values()}

    def ran(self, name: str) -> None:
        """Job ``name`` runs now (if there is one): its next run is one interval from now."""
        with self._lock:
            job = self._jobs.get(name)
            if job is not None:
                job.last = time.monotonic()

    def start(self) -> None:
        self.thread.start()

    def _next(self) -> tuple[_Job | None, float | None]:
        with self._lock:
            if not self._jobs:
                return None, None
            job = min(self._jobs.values(), key=lambda j: j.due_at)
            return job, job.due_at - time.monotonic()

    def _run(self) -> None:
        while True:
            job, delay = self._next()
            if self._stop.wait(None if delay is None else max(0.0, delay)):
                return
            if job is None or delay is None or delay > 0:
                continue  # an interval may have restarted meanwhile: look again
            self.ran(job.name)
            try:
                keep = job.run()
            except Exception:
                log.exception("the periodic %s failed", job.name)
                keep = True
            if not keep:
                with self._lock:
                    self._jobs.pop(job.name, None)

    def stop(self, timeout: float) -> None:
        """Stop the jobs and wait (at most ``timeout`` seconds) for one in progress."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)


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
