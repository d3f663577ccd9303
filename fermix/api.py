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
import os
from collections.abc import Callable, Sequence
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
from fermix.model import (
    ConversationKey,
    JobCaller,
    JobRun,
    MemoryRow,
    Message,
    ScheduledJob,
    check_trust,
)
from fermix.runtime import jobs
from fermix.runtime.access import Tokens
from fermix.runtime.engine import Runtime
from fermix.tools import MemoryTools

__all__ = ["Conversation", "Memory"]


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
    ) -> None:
        self.home = home if isinstance(home, Home) else Home.resolve(home)
        config = config if config is not None else load_config(self.home.config_path)
        route_in_code = llm.configure(
            config.model,
            model=model,
            fallbacks=fallbacks,
            api_base=api_base,
            context_window=context_window,
            given_to="Memory",
        )
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
        )
        self.tools = MemoryTools(self._runtime)
        """The agent's memory tools: ``schemas()`` and ``run(tool_call, conversation)`` (T4)."""

    # -- lifecycle ---------------------------------------------------------------------

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
        self._runtime.check_running()
        return Tokens(self._runtime.db, self._runtime.writer)

    @property
    def failure(self) -> SupervisorEscalationError | None:
        """Why the actor tree gave up, if it did; every later call then raises."""
        return self._runtime.failure

    def stats(self) -> dict[str, Any]:
        """What the process holds now: live and passivated conversation actors, the
        supervision tree's children, the tree's failure if it gave up (N7)."""
        runtime = self._runtime
        runtime.check_running()
        return {
            "live_conversations": runtime.live_conversations(),
            "passivated": runtime.registry.passivated,
            "children": [info.id for info in runtime.tree.which_children()],
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
            self._runtime.writer,
            agent_id=agent_id,
            name=name,
            schedule=schedule,
            prompt=prompt,
            owner_id=owner_id,
        )

    def get_job(self, job_id: int) -> ScheduledJob | None:
        """The job ``job_id``, or None."""
        self._runtime.check_running()
        return jobs.get_job(self._runtime.db, job_id)

    def list_jobs(self, *, agent_id: str | None = None) -> list[ScheduledJob]:
        """Every job, or those of ``agent_id``, oldest first."""
        self._runtime.check_running()
        return jobs.list_jobs(self._runtime.db, agent_id=agent_id)

    def start_run(self, job_id: int) -> JobRun:
        """Record that a run of ``job_id`` starts now; returns it ``running``."""
        self._runtime.check_running()
        return jobs.start_run(self._runtime.writer, job_id)

    def job_caller(self, run_id: int) -> JobCaller:
        """The caller to pass to ``memory.tools.run(call, caller)`` during run ``run_id``.

        It is bound to the job's memory source, agent and owner and to the run: the run's
        tools see and write only the job's own memories, and no history (T2).
        """
        self._runtime.check_running()
        return jobs.caller_for_run(self._runtime.db, run_id)

    def finish_run(
        self, run_id: int, *, status: str, output: str = "", error: str | None = None
    ) -> JobRun:
        """Record how run ``run_id`` ended, once: ``status="succeeded"`` with its ``output``,
        or ``status="failed"`` with its ``error``. Its tools are refused from then on."""
        self._runtime.check_running()
        return jobs.finish_run(
            self._runtime.writer, run_id, status=status, output=output, error=error
        )

    def list_runs(self, job_id: int, *, limit: int = 20) -> list[JobRun]:
        """The newest ``limit`` runs of ``job_id``, newest first."""
        self._runtime.check_running()
        return jobs.list_runs(self._runtime.db, job_id, limit=limit)

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
