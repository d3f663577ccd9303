"""``Runtime``: the private object behind both facades in one process.

It builds the process's services through the composition root
(:func:`~fermix.runtime.composition.build`: the store, the one write path, the prompt
files, the supervised actor tree of Reviewers, Compactors and ConversationStore actors,
the timer, the embedder), starts them, runs the due-review sweep on the timer (M7), and
offers the facades
(:class:`~fermix.api.Memory`, :class:`~fermix.conversation.Conversation`, the tools, the CLI,
the service) the few operations they need. Nothing here is public API.

No turn waits on another conversation (M3): a turn's preflight decides from SQLite, on its
own thread, whether its compaction is due and asks a Compactor only then; each pool sends a
conversation's requests in order to one actor and otherwise to the least busy one, so a
model call that hangs for one conversation holds one actor, not the others' turns; and
every wait a turn makes on a pool is bounded by the model timeout plus a margin.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import IO, Any, TypeVar

import pykka

from fermix import llm
from fermix.actors.compactor import Compact
from fermix.actors.conversation import History, Reload, StateQuery
from fermix.actors.reviewer import Review
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.core.tool_calls import Recall, ToolCall
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
    Erasure,
    ForgetReport,
    MemoryRow,
    Message,
    NewMessage,
    PendingAppend,
)
from fermix.runtime import exporting, host_rows, recall
from fermix.runtime.access import Tokens
from fermix.runtime.composition import Services, build
from fermix.runtime.prompt_files import FileResult
from fermix.runtime.reviewing import SWEEP_AGAIN_S, SWEEP_CLAIMS_PER_WORKER
from fermix.runtime.telemetry import Telemetry
from fermix.runtime.writer import RowsWritten
from fermix.storage import Reads, Writes

log = logging.getLogger(__name__)

T = TypeVar("T")

ERASURE_RETRY_S = 60.0
"""How often the timer purges again for an erasure a reader held back (F3)."""

RETENTION_SWEEP_S = 300.0
"""How often the timer applies ``[fermix_core.retention]`` (F7)."""


class Runtime:
    """One home's services in this process, and the operations the facades call.

    :meth:`start` builds the services (:func:`~fermix.runtime.composition.build`) and
    starts them; every other method refuses while the runtime is not running. The keywords
    are :func:`~fermix.runtime.composition.build`'s seams: ``clock`` (epoch milliseconds)
    and ``monotonic`` (seconds) are the times the gates and the passivation read;
    ``route`` replaces the configured model route. Tests pass them. ``tracer_provider``
    (an OpenTelemetry ``TracerProvider``) traces into the host's own provider (O2).
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
        tracer_provider: Any | None = None,
    ) -> None:
        cap = conversation_cap
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise InvalidInputError(f"conversation_cap must be an integer >= 1, not {cap!r}")
        if isinstance(idle_s, bool) or not isinstance(idle_s, int | float) or not idle_s > 0:
            raise InvalidInputError(f"idle_s must be a number of seconds > 0, not {idle_s!r}")
        self._config = config
        self.telemetry = Telemetry(config.tracing, tracer_provider=tracer_provider)
        """What this runtime counts and traces (O1, O2): ``Memory.metrics`` is its registry."""
        self.instrumented = True
        """Whether the append path and the group commit count and trace; False only for
        bench/append.py's baseline of the instrumentation's cost. Set before :meth:`start`."""
        self._build = functools.partial(
            build,
            home,
            config,
            vfs=vfs,
            conversation_cap=conversation_cap,
            idle_s=idle_s,
            clock=clock,
            monotonic=monotonic,
            route=route,
        )
        self._services: Services | None = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self.wait_s: float | None = None
        """How long a turn waits for its compaction; None derives it from the model timeout
        (:meth:`~fermix.runtime.compacting.Compacting.wait_s`). Tests set it."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Build the services (opening and migrating the store ``[fermix_core.storage]``
        chooses) and start the actor tree, the timer and the embedder.

        If the tree fails to start, the store is closed again before the error
        propagates: nothing is left open.
        """
        with self._lock:
            if self._started:
                return
            services = self._build(telemetry=self.telemetry if self.instrumented else None)
            try:
                services.start()
            except BaseException:
                services.close()
                raise
            self._services = services
            self._started = True
            interval = self._config.memory.sweep_interval_s
            if interval > 0:
                services.timer.every("sweep", interval, self._sweep_from_timer)
            services.timer.every("erasures", ERASURE_RETRY_S, self._settle_erasures)
            if self._config.retention.enabled:
                services.timer.every("retention", RETENTION_SWEEP_S, self._retain)
        # An erasure a kill left halfway is finished before anything reads (F5).
        try:
            for report in services.forgetting.resume():
                log.info("erasure %d finished at start: %s", report.erasure_id, report.state)
        except FermixError as exc:
            log.error("an unfinished erasure could not be finished at start: %s", exc)
        if services.reviewing.route.primary is None:
            log.warning("%s", llm.NO_MODEL_OFF)  # once per start, not per turn (M8)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the sweep and the tree gracefully (queued writes finish first), then close
        the store."""
        with self._lock:
            started = self._started and not self._closed
            self._closed = True
        try:
            if started:
                self.services.close(timeout)
        finally:
            self.telemetry.close()  # the spans still buffered go out (O2)

    @property
    def config(self) -> Config:
        """The configuration this runtime runs with (changed by :meth:`reconfigure`)."""
        return self._config

    def reconfigure(self, config: Config) -> Config:
        """Apply ``config`` (config.toml just written) to the running services: the keys
        :data:`~fermix.runtime.live_config.LIVE_KEYS` names (the review interval, 0 turning
        background reviews off, and their budgets and backoff; compaction; retention, its
        timer job started or stopped; the model route) from the next review, compaction or
        sweep on. Every other key waits for the next start. Returns the config now in
        effect (W1)."""
        from fermix.runtime import live_config

        services = self._running()
        with self._lock:
            now = live_config.applied(self._config, config)
            was, self._config = self._config, now
            services.reconfigure(now)
            if now.retention.enabled and not was.retention.enabled:
                services.timer.every("retention", RETENTION_SWEEP_S, self._retain)
            elif was.retention.enabled and not now.retention.enabled:
                services.timer.cancel("retention")
        if services.reviewing.route.primary is None and was.model.primary is not None:
            log.warning("%s", llm.NO_MODEL_OFF)
        log.info("configuration applied: %s", _changed(was, now) or "nothing changed")
        return now

    @property
    def services(self) -> Services:
        """The services :meth:`start` built (tests and benchmarks look at them here)."""
        if self._services is None:
            raise ActorUnavailableError("Memory is not running: use it as a context manager")
        return self._services

    @property
    def failure(self) -> SupervisorEscalationError | None:
        """Why the actor tree gave up, if it did; every later call then raises."""
        return None if self._services is None else self._services.failure

    @property
    def running(self) -> bool:
        """Whether the runtime was started, is not closed and its tree has not given up."""
        return self._started and not self._closed and self.failure is None

    def check_running(self) -> None:
        """Raise :class:`ActorUnavailableError` unless the runtime can serve calls."""
        failure = self.failure
        if failure is not None:
            raise ActorUnavailableError(f"fermix stopped after a failure: {failure}")
        if not self._started or self._closed:
            raise ActorUnavailableError("Memory is not running: use it as a context manager")

    def _running(self) -> Services:
        """The services, once :meth:`check_running` let the call through."""
        self.check_running()
        return self.services

    # -- conversations -----------------------------------------------------------------

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
        services = self._running()
        return services.writer.append_keyed(
            new, trust=trust, peak_prompt_tokens=peak_prompt_tokens, owner_id=owner_id
        )

    def append_many(self, pending: Sequence[PendingAppend]) -> list[AppendResult | BaseException]:
        """Store each of ``pending`` in order, sharing commits; each one's result or error."""
        services = self._running()
        return services.writer.append_many(pending)

    def history(self, key: ConversationKey, limit: int | None = None) -> list[Message]:
        """The window of ``key``, oldest first, from its actor."""
        services = self._running()
        window: list[Message] = services.registry.ask(key, History(limit))
        return window

    def state(self, key: ConversationKey) -> ConversationState | None:
        """The stored state of ``key``, read fresh."""
        services = self._running()
        state: ConversationState | None = services.registry.ask(key, StateQuery())
        return state

    def reload(self, key: ConversationKey) -> None:
        """Make the actor of ``key`` read its window again from SQLite."""
        services = self._running()
        services.registry.ask(key, Reload())

    def memory_files(self, agent_id: str, owner_id: str) -> tuple[str, str]:
        """The current USER.md and MEMORY.md of ``agent_id`` and ``owner_id``."""
        return self._running().files.texts(agent_id, owner_id)

    def trust_of(self, owner_id: str) -> str:
        """The trust the config gives ``owner_id`` when a host does not say (M2)."""
        return self._config.trust_of(owner_id)

    def live_conversations(self) -> int:
        """How many conversation actors are live."""
        return self.services.registry.live_count()

    def passivated(self) -> int:
        """How many conversation actors were stopped for idleness or the cap (A7)."""
        return self.services.registry.passivated

    def children(self) -> list[str]:
        """The ids of the supervision tree's children, in start order."""
        return [info.id for info in self.services.tree.which_children()]

    def in_flight(self) -> tuple[list[int], list[int]]:
        """The reviews and the compactions each pooled actor has been sent and not yet
        finished (the pools' own bookkeeping: a lock, no query)."""
        services = self.services
        return services.reviewers.pending(), services.compactors.pending()

    # -- the store and the write path, for the facades (S7, P2, M9, N2, T1-T4) -----------

    def read(self) -> AbstractContextManager[Reads]:
        """A read session of the store."""
        return self._running().storage.read()

    def write(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """Commit ``unit`` through the one write path; its result once committed."""
        return self._running().writer.write(unit, label=label)

    def write_rows(
        self, unit: Callable[[Writes], Sequence[MemoryRow]], *, label: str, reason: str
    ) -> RowsWritten:
        """Commit memory rows, then rebuild the prompt files they show in."""
        return self._running().writer.write_rows(unit, label=label, reason=reason)

    def rollback(self, agent_id: str, name: str, revision: int, *, owner_id: str) -> FileResult:
        """Write revision ``revision`` of prompt file ``name`` back (P2)."""
        return self._running().files.rollback(agent_id, name, revision, owner_id=owner_id)

    def tokens(self) -> Tokens:
        """The memory server's bearer tokens of this home (N2)."""
        services = self._running()
        return Tokens(services.storage, services.writer)

    def put_row(self, **row: Any) -> MemoryRow:
        """Store a host's row at the scope it names (:func:`host_rows.put_row`)."""
        return host_rows.put_row(self._running().writer, **row)

    def archive_row(self, **row: Any) -> MemoryRow | None:
        """Archive a host's row by its key (:func:`host_rows.archive_row`)."""
        return host_rows.archive_row(self._running().writer, **row)

    def recall_rows(self, query: str, **filters: Any) -> list[MemoryRow]:
        """Rows matching ``query``, full-text and vectors fused (:func:`host_rows.recall_rows`)."""
        storage = self._running().storage
        self.telemetry.recalls.inc(("host",))
        with self.telemetry.span("fermix.recall", {"fermix.source": "host"}):
            return host_rows.recall_rows(storage, query, **filters)

    def run_tool(self, call: ToolCall, caller: recall.Caller) -> dict[str, Any]:
        """Run one checked memory tool call for ``caller`` (T1-T4)."""
        services = self._running()
        if not isinstance(call, Recall):
            return recall.run(services.storage, services.writer, call, caller)
        self.telemetry.recalls.inc(("tool",))
        with self.telemetry.span("fermix.recall", {"fermix.source": "tool"}):
            return recall.run(services.storage, services.writer, call, caller)

    # -- post-delivery work: reviewers and compactors (E1, K3, M3) -----------------------

    def after_delivery(self, key: ConversationKey) -> None:
        """Dispatch a review and a compaction of ``key``, off the caller's path.

        Only tells: each actor checks its own gates on its own thread, and a failure to
        dispatch is logged, never raised into the host's turn (E1).
        """
        services = self.services
        dispatches = ((services.reviewers, Review(key)), (services.compactors, Compact(key)))
        for pool, message in dispatches:
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
        services = self._running()
        result: ReviewResult = services.reviewers.ask(key, Review(key, force), timeout=None)
        return result

    def compact(self, key: ConversationKey, *, force: bool = False) -> CompactionResult:
        """Compact ``key`` now if due (``force``: whatever its peak) and wait for it, at most
        the model timeout plus a margin (M3): past it the result is ``failed`` and the
        compaction goes on in the background."""
        services = self._running()
        wait = self.wait_s if self.wait_s is not None else services.compacting.wait_s()
        try:
            result: CompactionResult = services.compactors.ask(
                key, Compact(key, force), timeout=wait
            )
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
        services = self._running()
        if not services.compacting.due(key):
            return None
        return self.compact(key)

    def clear_window(self, key: ConversationKey) -> int:
        """Start the window of ``key`` after its newest message (``/new``, ``/clear``)."""
        services = self._running()
        return services.compacting.clear_window(key)

    # -- forgetting (F1-F5) ---------------------------------------------------------------

    def forget_owner(self, owner_id: str, *, agent_id: str | None = None) -> ForgetReport:
        """Erase everything of ``owner_id`` (:meth:`Forgetting.forget_owner`, F1)."""
        return self._running().forgetting.forget_owner(owner_id, agent_id=agent_id)

    def forget_conversation(self, key: ConversationKey) -> ForgetReport:
        """Erase one conversation (F2)."""
        return self._running().forgetting.forget_conversation(key)

    def forget_message(self, message_id: int) -> ForgetReport:
        """Erase one message (F2)."""
        return self._running().forgetting.forget_message(message_id)

    def forget_memory(self, memory_id: int) -> ForgetReport:
        """Erase one memory row, archived or not (F2)."""
        return self._running().forgetting.forget_memory(memory_id)

    def erasures(self, *, limit: int = 100) -> list[Erasure]:
        """The erasure records, newest first (the audit, F1)."""
        with self.read() as reads:
            return reads.erasures(limit=limit)

    def export_owner(
        self,
        owner_id: str,
        file: str | os.PathLike[str] | IO[bytes],
        *,
        agent_id: str | None = None,
    ) -> int:
        """Write ``owner_id``'s data as one JSON document (:mod:`~fermix.runtime.exporting`,
        F6); returns the bytes written."""
        return exporting.write(self._running().storage, owner_id, file, agent_id=agent_id)

    def export_chunks(self, owner_id: str, *, agent_id: str | None = None) -> Iterator[bytes]:
        """The same document as pieces, for a stream; the owner is checked first (F8)."""
        storage = self._running().storage
        exporting.check_owner(storage, owner_id, agent_id)
        return exporting.chunks(storage, owner_id, agent_id=agent_id)

    def retain(self) -> dict[str, int]:
        """Apply ``[fermix_core.retention]`` now (the timer's sweep does it every
        :data:`RETENTION_SWEEP_S`); what was dropped, by kind (F7)."""
        return self._running().retention.sweep()

    def _retain(self) -> bool:
        """The timer's retention sweep."""
        if not self.running:
            return False
        try:
            self.retain()
        except FermixError as exc:
            log.error("the retention sweep failed: %s", exc)
        return self.running

    def _settle_erasures(self) -> bool:
        """The timer's retry of the erasures a reader held back (F3)."""
        if not self.running:
            return False
        try:
            self.services.forgetting.settle()
        except FermixError as exc:
            log.error("pending erasures not settled: %s", exc)
        return self.running

    # -- the sweep (E1, M7) --------------------------------------------------------------

    def tick(self) -> int:
        """Sweep once now: claim due conversations and dispatch a review of each that has
        none pending in this process; returns how many were dispatched. The services' timer
        calls it every ``sweep_interval_s``, counting from the last sweep, whoever ran it.

        The claim is one write over the store (M7, B2): the sweeps of other processes, on
        this machine or others, never claim the same conversations. It takes no more than
        the reviewers can start well before the claims expire (:data:`SWEEP_CLAIMS_PER_WORKER`
        each, less what they have pending); the rest stays due for the next sweep, here or
        in another process. A claim no review here takes goes back at once.
        """
        services = self._running()
        services.timer.ran("sweep")
        reviewers = services.reviewers
        room = SWEEP_CLAIMS_PER_WORKER * len(reviewers.ids) - sum(reviewers.pending())
        claimed = services.reviewing.claim_due(room)
        if len(claimed) >= room:
            # Full (or the reviewers were): more may be due. The timer sweeps again soon, so
            # a backlog of many conversations drains at the reviewers' pace, not one
            # sweep_interval_s per handful.
            services.timer.soon("sweep", SWEEP_AGAIN_S)
        sent = 0
        for key in claimed:
            try:
                if services.reviewers.tell(key, Review(key), unless_pending=True):
                    sent += 1
                    continue
            except (FermixError, pykka.ActorDeadError) as exc:
                log.error("could not dispatch the review of %s: %s", key, exc)
            services.reviewing.release(key)
        return sent

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


def _changed(was: Config, now: Config) -> str:
    """The dotted keys whose value differs between ``was`` and ``now`` (never a value: a
    key may name a secret's variable), for the log."""
    names = []
    for section in dataclasses.fields(now):
        before, after = getattr(was, section.name), getattr(now, section.name)
        if before == after:
            continue
        names += [
            f"{section.name}.{f.name}"
            for f in dataclasses.fields(after)
            if getattr(before, f.name) != getattr(after, f.name)
        ]
    return ", ".join(names)
