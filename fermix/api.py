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
from typing import TYPE_CHECKING, Any, Self

from fermix import llm, validate
from fermix.clock import now_ms
from fermix.config import Config, load_config
from fermix.conversation import Conversation
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.errors import (
    FermixError,
    InvalidInputError,
    SupervisorEscalationError,
)
from fermix.home import Home
from fermix.model import (
    AppendResult,
    ConversationKey,
    Message,
    PendingAppend,
    check_trust,
)
from fermix.records import Records
from fermix.runtime.access import Tokens
from fermix.runtime.engine import Runtime
from fermix.tools import MemoryTools

if TYPE_CHECKING:
    from fermix.remote import Client

__all__ = ["Conversation", "Memory"]


class Memory(Records):
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
        """What the process holds now (N7): live and passivated conversation actors, the
        supervision tree's children, and the reviews and compactions in flight.

        In flight is counted from the pools' own bookkeeping (requests sent to an actor
        and not yet finished), so it costs a lock and no query: ``*_running`` is how many
        actors hold at least one (each runs one at a time), ``*_queued`` the rest waiting
        behind them. A request may end at its gate without a model call (not due yet), so
        this counts requests, not model calls.
        """
        runtime = self._runtime
        runtime.check_running()
        reviews, compactions = runtime.reviewers.pending(), runtime.compactors.pending()
        reviews_running = sum(1 for n in reviews if n > 0)
        compactions_running = sum(1 for n in compactions if n > 0)
        return {
            "live_conversations": runtime.live_conversations(),
            "passivated": runtime.registry.passivated,
            "children": [info.id for info in runtime.tree.which_children()],
            "reviews_running": reviews_running,
            "reviews_queued": sum(reviews) - reviews_running,
            "compactions_running": compactions_running,
            "compactions_queued": sum(compactions) - compactions_running,
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

    # -- the memory server (N1) ------------------------------------------------------------

    @staticmethod
    def connect(url: str, token: str, **keywords: Any) -> Client:
        """A :class:`~fermix.remote.Client` of the memory server at ``url``, with ``token``:
        the same surface as a ``Memory``, served by the one process that owns the home
        (``fermix supervisor start``). ``keywords`` are the client's (``timeout``,
        ``retries``)."""
        from fermix.remote import Client

        return Client(url, token, **keywords)
