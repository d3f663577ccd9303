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

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

from fermix import llm, validate
from fermix.clock import now_ms
from fermix.config import Config, load_config
from fermix.conversation import Conversation
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.errors import (
    FermixError,
    InvalidInputError,
    NotFoundError,
    SupervisorEscalationError,
    WriteFailedError,
)
from fermix.home import Home
from fermix.model import (
    AppendResult,
    ConversationKey,
    Erasure,
    ForgetReport,
    JobCaller,
    JobRun,
    MemoryRow,
    Message,
    PendingAppend,
    Resource,
    Revision,
    ScheduledJob,
    Scope,
    check_trust,
)
from fermix.runtime import jobs
from fermix.runtime.access import Tokens
from fermix.runtime.engine import Runtime
from fermix.tools import MemoryTools

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from fermix.remote import Client

__all__ = ["Conversation", "Memory"]

MAX_LISTED = 100_000
"""The most rows or revisions one listing returns."""


class Memory:
    """fermix for one home: the database, the supervised actor tree, the conversations.

    ``conversation_cap`` bounds the live conversation actors (threads); ``idle_s`` is how
    long an unused conversation keeps its actor before it is passivated (A7).

    ``model`` is the litellm model of fermix's own calls, the reviewer's and the compactor's
    (``"openai/gpt-4o-mini"``; M8), with ``fallbacks`` tried in turn, ``api_base`` for an
    OpenAI-compatible server and ``context_window`` (tokens) for a model litellm does not
    know. Each composes with ``[fermix_core.model]`` in config.toml and is checked by the
    same rule as that key (:func:`fermix.llm.configure`): ``model`` replaces the configured
    primary and fallbacks, the others replace their key. Without a model here or in the
    config, :meth:`start` logs one warning and reviews and compaction are off.
    ``route`` (an :class:`~fermix.llm.Route`, for tests) replaces the whole route;
    ``clock`` (epoch milliseconds) is the time their gates read.

    :attr:`metrics` is the process's Prometheus registry (O1). Spans (O2) are made when
    ``[fermix_core.tracing] enabled`` is set, or into ``tracer_provider``, the host's own
    OpenTelemetry ``TracerProvider``; otherwise none, and OpenTelemetry is not imported.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | Home | None = None,
        *,
        config: Config | None = None,
        conversation_cap: int = 256,
        idle_s: float = 600.0,
        vfs: str | None = None,
        model: str | None = None,
        fallbacks: Sequence[str] | None = None,
        api_base: str | None = None,
        context_window: int | None = None,
        route: llm.Route | None = None,
        clock: Callable[[], int] = now_ms,
        tracer_provider: Any | None = None,
    ) -> None:
        self.home = home if isinstance(home, Home) else Home.resolve(home)
        config = config if config is not None else load_config(self.home.config_path)
        self._with_route_in_code = functools.partial(
            llm.configure,
            model=model,
            fallbacks=fallbacks,
            api_base=api_base,
            context_window=context_window,
            given_to="Memory",
        )
        """``[fermix_core.model]`` with the route given here, which wins over the file's."""
        route_in_code = self._with_route_in_code(config.model)
        self.config = dataclasses.replace(config, model=route_in_code)
        """The configuration in effect: config.toml's, with the model route given here."""
        self._runtime = Runtime(
            self.home,
            self.config,
            conversation_cap=conversation_cap,
            idle_s=idle_s,
            vfs=vfs,
            route=route,
            clock=clock,
            tracer_provider=tracer_provider,
        )
        self.tools = MemoryTools(self._runtime)
        """The agent's memory tools: ``schemas()`` and ``run(tool_call, conversation)`` (T4)."""

    # -- lifecycle ---------------------------------------------------------------------

    def _reconfigure(self, config: Config) -> Config:
        """Run with ``config``, config.toml as just written (the server's console, W1): the
        route given in code still wins, and the running services apply what they can at once
        (:meth:`~fermix.runtime.engine.Runtime.reconfigure`); the rest waits for the next
        start. Returns the config now in effect. Not part of the host's surface."""
        model = self._with_route_in_code(config.model)
        self.config = self._runtime.reconfigure(dataclasses.replace(config, model=model))
        return self.config

    def start(self) -> Self:
        """Open the database (migrating it) and start the actor tree.

        With no model configured (neither ``Memory(model=...)`` nor ``[fermix_core.model]
        primary``), logs one warning on the ``fermix`` logger saying so: reviews and
        compaction are then skipped as ``no_model`` (M8).
        """
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
    def tokens(self) -> Tokens:
        """The memory server's bearer tokens of this home: create, list, revoke (N2)."""
        return self._runtime.tokens()

    @property
    def failure(self) -> SupervisorEscalationError | None:
        """Why the actor tree gave up, if it did; every later call then raises."""
        return self._runtime.failure

    @property
    def metrics(self) -> CollectorRegistry:
        """This memory's prometheus-client ``CollectorRegistry`` (O1): appends and commits,
        latencies, reviews and compactions by outcome, model calls by model, queues, live
        conversation actors, storage errors and retries, vectors pending. Serve it with
        any exporter (``prometheus_client.generate_latest(memory.metrics)``); the memory
        server's ``GET /metrics`` does. prometheus_client is imported on first use."""
        return self._runtime.telemetry.registry

    def stats(self) -> dict[str, Any]:
        """What the process holds now (N7): live and passivated conversation actors, the
        supervision tree's children, the reviews and compactions in flight, and the
        append and compose latency of the last minute (``latency``: count, median and
        99th percentile in milliseconds, W1).

        In flight is counted from the pools' own bookkeeping (requests sent to an actor
        and not yet finished), so it costs a lock and no query: ``*_running`` is how many
        actors hold at least one (each runs one at a time), ``*_queued`` the rest waiting
        behind them. A request may end at its gate without a model call (not due yet), so
        this counts requests, not model calls.
        """
        runtime = self._runtime
        runtime.check_running()
        reviews, compactions = runtime.in_flight()
        reviews_running = sum(1 for n in reviews if n > 0)
        compactions_running = sum(1 for n in compactions if n > 0)
        return {
            "live_conversations": runtime.live_conversations(),
            "passivated": runtime.passivated(),
            "children": runtime.children(),
            "reviews_running": reviews_running,
            "reviews_queued": sum(reviews) - reviews_running,
            "compactions_running": compactions_running,
            "compactions_queued": sum(compactions) - compactions_running,
            "latency": runtime.telemetry.latency(),
        }

    def tick(self) -> int:
        """Sweep for due reviews now; returns how many were dispatched.

        A running Memory already sweeps on its own every ``[fermix_core.memory]
        sweep_interval_s`` seconds (30; 0 turns it off), in every host, embedded or the
        service (M7): conversations with new user messages whose review interval has
        passed, voice transcripts included, are reviewed without a ``commit``. Calling this
        restarts that interval.
        """
        return self._runtime.tick()

    # -- conversations -----------------------------------------------------------------

    def conversation(
        self,
        agent_id: str,
        channel: str,
        chat_id: str,
        thread_scope: str = "",
        *,
        owner_id: str = "",
        trust: str | None = None,
    ) -> Conversation:
        """A handle on one conversation; cheap, and safe to create on every turn.

        ``trust`` is ``"operator"`` or ``"guest"``. Not given, it is ``guest`` unless the
        config names ``owner_id`` in ``[fermix_core.security] operators`` (M2): being the
        operator is explicit. In a group chat, record each speaker with
        ``conv.append_user(text, owner_id=..., trust=...)`` (M1).
        """
        self._runtime.check_running()
        key = ConversationKey(agent_id, channel, chat_id, thread_scope)
        validate.identifier("owner_id", owner_id, allow_empty=True)
        trust = self.config.trust_of(owner_id) if trust is None else check_trust(trust)
        return Conversation(self._runtime, key, owner_id=owner_id, trust=trust)

    def append_many(self, pending: Sequence[PendingAppend]) -> list[AppendResult | FermixError]:
        """Store many appends at once, each made by ``conversation.prepare(...)``: in
        order, sharing commits, on this one thread; returns each one's
        :class:`~fermix.model.AppendResult` or its typed error (one failing leaves the
        others stored, N3).

        For a server that batches its concurrent requests: one hand-off to a worker
        thread for a batch, instead of one per request (bench/server.py).
        """
        results: list[AppendResult | FermixError] = []
        for result in self._runtime.append_many(pending):
            if isinstance(result, BaseException) and not isinstance(result, FermixError):
                raise result
            results.append(result)
        return results

    def review(self, conv: Conversation, *, force: bool = True) -> ReviewResult:
        """Review ``conv`` now and wait for the result (``force``: past the time gates)."""
        return self._runtime.review(conv.key, force=force)

    def compact(self, conv: Conversation, *, force: bool = False) -> CompactionResult:
        """Compact ``conv`` now if due (``force``: whatever its peak) and wait for it."""
        return self._runtime.compact(conv.key, force=force)

    def handle_command(self, conv: Conversation, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command and return the reply to send (K4)."""
        return conv.handle_command(text)

    # -- realtime voice transcripts (V1) -------------------------------------------------

    def voice_transcript(
        self,
        agent_id: str,
        device_id: str,
        role: str,
        text: str,
        *,
        owner_id: str = "",
        trust: str | None = None,
    ) -> Message | None:
        """Store a final voice transcript when ``persist_transcripts`` is on; else None.

        Stored as ``kind = voice_turn`` in the device's ``realtime`` conversation with
        ``source_type = "realtime"`` in its metadata; user turns reach the reviewer like
        chat messages (V1). ``trust`` defaults as in :meth:`conversation` (a guest, M2).
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

    # -- memory rows -------------------------------------------------------------------

    def get_row(self, memory_id: int) -> MemoryRow | None:
        """The memory row ``memory_id`` (archived or not), or None."""
        self._runtime.check_running()
        with self._runtime.read() as reads:
            return reads.row(memory_id)

    def list_rows(self, **filters: Any) -> list[MemoryRow]:
        """Memory rows matching ``filters`` (the keywords of ``storage.memories.list_rows``)."""
        self._runtime.check_running()
        with self._runtime.read() as reads:
            return reads.rows(**filters)

    # -- operator inspection: rows, prompt-file revisions (S7, P2, N1) ---------------------

    def search_rows(
        self,
        query: str,
        *,
        agent_id: str | None = None,
        owner_id: str | None = None,
        category: str | None = None,
        archived: bool | None = False,
        limit: int = 10,
    ) -> list[MemoryRow]:
        """Rows whose key or value matches any word of ``query``, best first (FTS syntax in
        it is plain words). ``archived`` as in :meth:`list_rows`: False live rows only."""
        self._runtime.check_running()
        validate.positive_int("limit", limit, maximum=MAX_LISTED)
        with self._runtime.read() as reads:
            return reads.search_rows(
                query,
                agent_id=agent_id,
                owner_id=owner_id,
                category=category,
                archived=archived,
                limit=limit,
            )

    def restore_row(self, memory_id: int) -> MemoryRow:
        """Un-archive row ``memory_id`` and rebuild the prompt files it shows in (S7). A
        failed rebuild (:class:`~fermix.errors.WriteFailedError`) leaves the row restored:
        the files are derived, and the next rebuild repairs them."""
        self._runtime.check_running()
        written = self._runtime.write_rows(
            lambda w: [w.restore_row(memory_id)],
            label=f"restore of row {memory_id}",
            reason=f"restore:{memory_id}",
        )
        if written.error is not None:
            raise WriteFailedError(written.error)
        return written.rows[0]

    # -- a host's own rows at a scope it names (SC1-SC3; LangGraph's store) ----------------

    def put_row(
        self,
        agent_id: str,
        key: str,
        value: str,
        *,
        scope: Scope,
        owner_id: str = "",
        trust: str | None = None,
        source: str = "host",
    ) -> MemoryRow:
        """Store ``value`` under ``key`` at ``scope`` as a row of ``owner_id``, replacing
        that key's value there (an archived row comes back); returns it once committed.

        For a host that keeps items of its own (a framework's store): the row is
        ``context`` with no promote target, so it renders into no prompt file (as
        ``memory_store``'s), and records ``source_type = "host"`` and ``source`` as its
        provenance. ``scope`` must be the owner's (``Scope("owner", ...)`` of
        ``owner_id``, ``"_default"`` for ``""``), this agent's, a conversation's (its
        key's ``scope_id``) or a job's of this agent and owner. ``trust`` is the writer's,
        by default as in :meth:`conversation` (a guest unless the config names the
        owner): the agent's shared rows (agent scope, owner ``""``) need ``operator``,
        else an :class:`~fermix.errors.AccessDeniedError`, and nothing is written.
        """
        self._runtime.check_running()
        return self._runtime.put_row(
            agent_id=agent_id,
            owner_id=owner_id,
            scope=scope,
            key=key,
            value=value,
            trust=self.config.trust_of(owner_id) if trust is None else trust,
            source=source,
        )

    def archive_row(
        self,
        agent_id: str,
        key: str,
        *,
        scope: Scope,
        owner_id: str = "",
        trust: str | None = None,
        source: str = "host",
    ) -> MemoryRow | None:
        """Archive the live row under ``key`` at ``scope`` of ``owner_id`` (S7): what a
        host's delete is. Returns the archived row, or None when there was none. The same
        rules as :meth:`put_row`; ``archived_by`` is ``source``. :meth:`restore_row` brings
        it back, ``[fermix_core.retention] archived_days`` drops it, :meth:`forget_memory`
        erases it now."""
        self._runtime.check_running()
        return self._runtime.archive_row(
            agent_id=agent_id,
            owner_id=owner_id,
            scope=scope,
            key=key,
            trust=self.config.trust_of(owner_id) if trust is None else trust,
            source=source,
        )

    def recall_rows(
        self,
        query: str,
        *,
        agent_id: str,
        owner_id: str | None = None,
        scope: Scope | None = None,
        scope_type: str | None = None,
        limit: int = 10,
    ) -> list[MemoryRow]:
        """Live rows of ``agent_id`` matching ``query``, best first, as ``memory_recall``
        finds them: full-text and vector search fused (Q3), within ``owner_id`` and one
        ``scope`` or every scope of ``scope_type`` when given (at most 1000)."""
        self._runtime.check_running()
        return self._runtime.recall_rows(
            query,
            agent_id=agent_id,
            owner_id=owner_id,
            scope=scope,
            scope_type=scope_type,
            limit=limit,
        )

    # -- forgetting (F1-F5, F8) -----------------------------------------------------------

    def forget_owner(self, owner_id: str, *, agent_id: str | None = None) -> ForgetReport:
        """Erase everything of ``owner_id``, for ``agent_id`` or every agent (F1).

        Every message the owner wrote, everywhere (in a group chat the others' messages
        stay); the conversations the owner owns in which nobody else wrote, whole; the
        owner's memory rows of every scope, archived too, and every row drawn from the
        owner's messages; their vectors and index entries; the owner's prompt files and
        every revision of them; the owner's jobs and runs. Returns the report (counts by
        kind; ``done``, or ``pending`` while a reader of another process holds an old copy
        on disk, finished later). The audit record keeps no content and the owner id only
        as a keyed hash (:meth:`erasures`).

        An owner with nothing stored is a :class:`~fermix.errors.NotFoundError`; an empty
        id, or one like a pattern that names nobody, an
        :class:`~fermix.errors.InvalidInputError` (F8); either changes nothing.
        """
        self._runtime.check_running()
        return self._runtime.forget_owner(owner_id, agent_id=agent_id)

    def forget_message(self, message_id: int) -> ForgetReport:
        """Erase message ``message_id``, the rows drawn from it and a checkpoint that
        summarised it (F2)."""
        self._runtime.check_running()
        return self._runtime.forget_message(message_id)

    def forget_memory(self, memory_id: int) -> ForgetReport:
        """Erase memory row ``memory_id``, archived or not: a real delete (F2). The prompt
        files that showed it are rendered again, and no kept revision still holds it."""
        self._runtime.check_running()
        return self._runtime.forget_memory(memory_id)

    def export_owner(
        self,
        owner_id: str,
        file: str | os.PathLike[str] | IO[bytes],
        *,
        agent_id: str | None = None,
    ) -> int:
        """Write everything fermix keeps of ``owner_id`` (for ``agent_id``, or every agent)
        to ``file`` as one JSON document of a versioned schema (F6; ``docs/forgetting.md``):
        their conversations, the messages they wrote, their memory rows (archived too, with
        provenance), their current prompt files, their jobs and runs. ``file`` is a path
        (created readable by its owner only) or a binary file open for writing; it is
        written as it is read, in bounded memory. Returns the bytes written. An owner with
        nothing stored is a :class:`~fermix.errors.NotFoundError`, and nothing is written.
        """
        self._runtime.check_running()
        return self._runtime.export_owner(owner_id, file, agent_id=agent_id)

    def export_chunks(self, owner_id: str, *, agent_id: str | None = None) -> Iterator[bytes]:
        """:meth:`export_owner`'s document as UTF-8 pieces, for a stream (the memory
        server's); the owner is checked before the first piece."""
        self._runtime.check_running()
        return self._runtime.export_chunks(owner_id, agent_id=agent_id)

    def get_message(self, message_id: int) -> Message | None:
        """The stored message ``message_id``, or None."""
        self._runtime.check_running()
        validate.positive_int("message_id", message_id, maximum=2**63 - 1)
        with self._runtime.read() as reads:
            return reads.message(message_id)

    def retain(self) -> dict[str, int]:
        """Apply ``[fermix_core.retention]`` now, as the host's timer does every few minutes
        (F7): what was dropped, by kind (``messages``, ``archived_rows``, ``revisions``)."""
        self._runtime.check_running()
        return self._runtime.retain()

    def erasures(self, *, limit: int = 100) -> list[Erasure]:
        """The erasure records, newest first: what was erased, when, at whose request,
        without content (F1)."""
        self._runtime.check_running()
        return self._runtime.erasures(limit=limit)

    def get_run(self, run_id: int) -> JobRun | None:
        """The job run ``run_id``, or None."""
        self._runtime.check_running()
        validate.positive_int("run_id", run_id, maximum=2**63 - 1)
        with self._runtime.read() as reads:
            return reads.run(run_id)

    def resources(self, agent_id: str | None = None) -> list[Resource]:
        """The prompt-file resources (every agent's, or ``agent_id``'s) with their current
        revision numbers; a file is recorded on its first rebuild (P2)."""
        self._runtime.check_running()
        with self._runtime.read() as reads:
            return reads.resources(agent_id)

    def revisions(
        self, agent_id: str, name: str, *, owner_id: str = "", limit: int = 20
    ) -> list[Revision]:
        """The newest ``limit`` revisions of ``name`` (``user_md`` or ``memory_md``)."""
        self._runtime.check_running()
        validate.positive_int("limit", limit, maximum=MAX_LISTED)
        with self._runtime.read() as reads:
            return reads.revisions(agent_id, name, owner_id=owner_id, limit=limit)

    def revision(
        self, agent_id: str, name: str, number: int | None = None, *, owner_id: str = ""
    ) -> Revision:
        """Revision ``number`` of ``name``, or its current one when ``number`` is None;
        :class:`~fermix.errors.NotFoundError` when there is none."""
        self._runtime.check_running()
        with self._runtime.read() as reads:
            if number is not None:
                return reads.revision(agent_id, name, number, owner_id=owner_id)
            found = reads.current_revision(agent_id, name, owner_id=owner_id)
        if found is None:
            raise NotFoundError(f"{name} of agent {agent_id!r}, owner {owner_id!r} has no revision")
        return found

    def rollback(self, agent_id: str, name: str, revision: int, *, owner_id: str = "") -> Revision:
        """Write revision ``revision`` of ``name`` back to its file (P2); returns the
        current revision after it (a new one, reason ``rollback:N``, unless it already was).
        The file stays derived: the next rebuild from the rows renders it again."""
        self._runtime.check_running()
        result = self._runtime.rollback(agent_id, name, revision, owner_id=owner_id)
        if result.revision is not None:
            return result.revision
        return self.revision(agent_id, name, owner_id=owner_id)

    # -- scheduled jobs and their runs (M9, SC1, T2) ------------------------------------

    def create_job(
        self, agent_id: str, name: str, *, schedule: str, prompt: str, owner_id: str = ""
    ) -> ScheduledJob:
        """Create a scheduled job of ``agent_id`` and, with it, its memory source.

        ``schedule`` is the host's own text (fermix stores it; the host runs the job when
        it is due); ``prompt`` is what a run asks its model. A second job of the same name
        of the agent is an :class:`~fermix.errors.InvalidInputError`.
        """
        self._runtime.check_running()
        return jobs.create_job(
            self._runtime,
            agent_id=agent_id,
            name=name,
            schedule=schedule,
            prompt=prompt,
            owner_id=owner_id,
        )

    def get_job(self, job_id: int) -> ScheduledJob | None:
        """The job ``job_id``, or None."""
        self._runtime.check_running()
        return jobs.get_job(self._runtime, job_id)

    def list_jobs(self, *, agent_id: str | None = None) -> list[ScheduledJob]:
        """Every job, or those of ``agent_id``, oldest first."""
        self._runtime.check_running()
        return jobs.list_jobs(self._runtime, agent_id=agent_id)

    def start_run(self, job_id: int) -> JobRun:
        """Record that a run of ``job_id`` starts now; returns it ``running``."""
        self._runtime.check_running()
        return jobs.start_run(self._runtime, job_id)

    def job_caller(self, run_id: int) -> JobCaller:
        """The caller to pass to ``memory.tools.run(call, caller)`` during run ``run_id``.

        It is bound to the job's memory source, agent and owner and to the run: the run's
        tools see and write only the job's own memories, and no history (T2).
        """
        self._runtime.check_running()
        return jobs.caller_for_run(self._runtime, run_id)

    def finish_run(
        self, run_id: int, *, status: str, output: str = "", error: str | None = None
    ) -> JobRun:
        """Record how run ``run_id`` ended, once: ``status="succeeded"`` with its ``output``,
        or ``status="failed"`` with its ``error``. Its tools are refused from then on."""
        self._runtime.check_running()
        return jobs.finish_run(self._runtime, run_id, status=status, output=output, error=error)

    def list_runs(self, job_id: int, *, limit: int = 20) -> list[JobRun]:
        """The newest ``limit`` runs of ``job_id``, newest first."""
        self._runtime.check_running()
        return jobs.list_runs(self._runtime, job_id, limit=limit)

    # -- the memory server (N1) ------------------------------------------------------------

    @staticmethod
    def connect(url: str, token: str, **keywords: Any) -> Client:
        """A :class:`~fermix.remote.Client` of the memory server at ``url``, with ``token``:
        the same surface as a ``Memory``, served by the one process that owns the home
        (``fermix supervisor start``). ``keywords`` are the client's (``timeout``,
        ``retries``)."""
        from fermix.remote import Client

        return Client(url, token, **keywords)
