"""The surface a host holds, declared once: what an embedded :class:`~fermix.api.Memory`
and a remote :class:`~fermix.remote.Client` (and their conversations) both offer (N1).

These are :class:`typing.Protocol`\\ s, so neither facade inherits from them: mypy checks
at the bottom of this module that each facade has every member with a compatible
signature, and a change to one facade that the other does not follow fails ``mypy
--strict``. A host that runs against either annotates with them::

    def on_message(memory: MemorySurface[Any], chat_id: str, text: str) -> str: ...

or, to keep the conversation's type, is generic over it
(``C = TypeVar("C", bound=ConversationSurface)``, ``memory: MemorySurface[C]``).

What is not here is what only one side has, for a reason:

- only a ``Memory`` owns the process: ``tick()``, ``stats()``, ``failure``, ``tokens``,
  ``metrics``, ``append_many()``, ``config`` and ``home``, and ``connect()`` to make a
  ``Client``;
- only a ``Client`` talks to a server: ``health()``, its ``url``, and the ``timeout`` and
  ``retries`` it is made with (the transport retries what did not get through);
- only an embedded ``Conversation`` offers ``prepare()``, ``append_keyed()`` and
  ``commit_keyed()`` (the server's own building blocks); a ``RemoteConversation`` has the
  server's ``handle``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol, Self, TypeVar

from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.model import (
    ConversationKey,
    ConversationState,
    Erasure,
    ForgetReport,
    JobCaller,
    JobRun,
    MemoryRow,
    Message,
    Resource,
    Revision,
    ScheduledJob,
    Scope,
)

__all__ = ["ConversationSurface", "MemorySurface", "ToolsSurface"]


class ConversationSurface(Protocol):
    """One conversation: :class:`~fermix.conversation.Conversation` embedded,
    :class:`~fermix.remote.RemoteConversation` over HTTP.

    Remote, every append and commit carries a client key (the caller's, else a fresh
    one), so a request the transport sends again is stored once (N3); embedded, a
    ``client_key`` is only what the caller gives.
    """

    @property
    def key(self) -> ConversationKey:
        """The conversation's key."""
        ...

    @property
    def owner_id(self) -> str:
        """The owner the conversation was opened for."""
        ...

    @property
    def trust(self) -> str:
        """The conversation's trust (remote: the one the server granted the token, N2)."""
        ...

    def append(
        self,
        role: str,
        text: str,
        *,
        sender: str = "",
        kind: str = "chat",
        metadata: Mapping[str, Any] | None = None,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store a message; returns once it is committed (A1, M1, N3)."""
        ...

    def append_user(
        self,
        text: str,
        *,
        sender: str = "",
        metadata: Mapping[str, Any] | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store what a user said, recording who said it and with what trust (M1)."""
        ...

    def append_assistant(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store what the assistant said."""
        ...

    def history(self, limit: int | None = None) -> list[Message]:
        """The window, oldest first (the newest ``limit`` messages if given)."""
        ...

    def memory_files(self) -> tuple[str, str]:
        """The current USER.md and MEMORY.md of this agent and owner."""
        ...

    def compose(self, system: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The litellm messages for the next model call (P1, T5)."""
        ...

    def preflight(self) -> str | None:
        """Compact first if the last turn's peak calls for it (K3); the notice, or None."""
        ...

    def handle_command(self, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command; the reply, or None (K4)."""
        ...

    def state(self) -> ConversationState | None:
        """The stored state, or None when nothing is stored yet."""
        ...

    def forget(self) -> ForgetReport:
        """Erase this conversation: its messages, the rows drawn from them, its state."""
        ...

    def reload(self) -> None:
        """Re-read the window from the database."""
        ...

    def commit(
        self,
        reply: str,
        usage: Mapping[str, Any] | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Write the reply and the turn's peak prompt tokens, then dispatch the reviewer
        and the compactor off the host's path."""
        ...


C = TypeVar("C", bound=ConversationSurface)
"""The conversation type of one facade (``Conversation`` or ``RemoteConversation``)."""


C_contra = TypeVar("C_contra", bound=ConversationSurface, contravariant=True)
"""The conversations a facade's tools run for."""


class ToolsSurface(Protocol[C_contra]):
    """The agent's memory tools (T4): ``memory.tools`` embedded, ``client.tools`` remote."""

    def schemas(self) -> list[dict[str, Any]]:
        """The tool definitions, as ``tools=`` for litellm.completion."""
        ...

    def run(self, tool_call: Any, caller: C_contra | JobCaller) -> str:
        """Run one tool call for ``caller``; the tool message content. Never raises:
        a refusal (and, remote, a server out of reach) is ``{"error": ...}``."""
        ...


class MemorySurface(Protocol[C]):
    """What a host holds: :class:`~fermix.api.Memory` (``MemorySurface[Conversation]``)
    or :class:`~fermix.remote.Client` (``MemorySurface[RemoteConversation]``).

    ``review``, ``compact`` and ``handle_command`` take a conversation this same object
    opened, hence the type parameter. Differences that are real:

    - ``start`` opens the home embedded and does nothing remote; ``close`` stops the
      tree embedded and only drops the client's connections remote (the server runs on);
    - over HTTP a token acts only for its agents, so ``list_rows``, ``search_rows`` and
      ``resources`` need ``agent_id`` (an :class:`~fermix.errors.InvalidInputError`
      without it), which the embedded operator may leave out, and ``get_row`` of another
      agent's row is None; ``restore_row`` and ``rollback`` need an operator token (N2);
    - remote, a host token's conversations and messages are a guest's whatever trust is
      asked (asking ``operator`` is an :class:`~fermix.errors.AccessDeniedError`).
    """

    @property
    def tools(self) -> ToolsSurface[C]:
        """The agent's memory tools (T4)."""
        ...

    def start(self) -> Self:
        """Be ready for calls; returns itself."""
        ...

    def close(self, timeout: float = 30.0) -> None:
        """Let go of what this object holds."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

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
    ) -> C:
        """A handle on one conversation (M1, M2)."""
        ...

    def review(self, conv: C, *, force: bool = True) -> ReviewResult:
        """Review ``conv`` now and wait for the result."""
        ...

    def compact(self, conv: C, *, force: bool = False) -> CompactionResult:
        """Compact ``conv`` now if due (``force``: whatever its peak) and wait for it."""
        ...

    def handle_command(self, conv: C, text: str) -> str | None:
        """Run ``text`` in ``conv`` if it is a fermix chat command (K4)."""
        ...

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
        """Store a final voice transcript when ``persist_transcripts`` is on (V1)."""
        ...

    # -- memory rows (S7) ----------------------------------------------------------------

    def get_row(self, memory_id: int) -> MemoryRow | None:
        """The memory row ``memory_id`` (archived or not), or None."""
        ...

    def list_rows(self, **filters: Any) -> list[MemoryRow]:
        """Memory rows matching ``filters``."""
        ...

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
        """Rows matching any word of ``query``, best first."""
        ...

    def restore_row(self, memory_id: int) -> MemoryRow:
        """Un-archive row ``memory_id`` and rebuild its prompt files."""
        ...

    # -- a host's own rows at a scope it names (SC1-SC3) --------------------------------

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
        """Store ``value`` under ``key`` at ``scope`` for ``owner_id``: a row that renders
        into no prompt file, with the writer's trust (shared rows need ``operator``)."""
        ...

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
        """Archive the live row under ``key`` at ``scope``; it, or None when there was none."""
        ...

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
        """Live rows matching ``query``, best first: full-text and vectors fused (Q3)."""
        ...

    # -- forgetting and export (F1, F2, F6) ---------------------------------------------

    def forget_owner(self, owner_id: str, *, agent_id: str | None = None) -> ForgetReport:
        """Erase everything of ``owner_id`` (remote: of ``agent_id``, needed)."""
        ...

    def forget_message(self, message_id: int) -> ForgetReport:
        """Erase one message and what was drawn from it."""
        ...

    def forget_memory(self, memory_id: int) -> ForgetReport:
        """Erase one memory row, archived or not."""
        ...

    def export_owner(
        self,
        owner_id: str,
        file: str | os.PathLike[str] | IO[bytes],
        *,
        agent_id: str | None = None,
    ) -> int:
        """Write everything kept of ``owner_id`` to ``file`` as one JSON document."""
        ...

    def erasures(self, *, limit: int = 100) -> list[Erasure]:
        """The erasure records, newest first (remote: of the token's agents)."""
        ...

    # -- prompt-file resources and revisions (P2) --------------------------------------

    def resources(self, agent_id: str | None = None) -> list[Resource]:
        """The prompt-file resources and their current revision numbers."""
        ...

    def revisions(
        self, agent_id: str, name: str, *, owner_id: str = "", limit: int = 20
    ) -> list[Revision]:
        """The newest ``limit`` revisions of ``name``."""
        ...

    def revision(
        self, agent_id: str, name: str, number: int | None = None, *, owner_id: str = ""
    ) -> Revision:
        """Revision ``number`` of ``name``, or its current one."""
        ...

    def rollback(self, agent_id: str, name: str, revision: int, *, owner_id: str = "") -> Revision:
        """Write revision ``revision`` back to its file; the current revision after it."""
        ...

    # -- scheduled jobs and their runs (M9, SC1, T2) ------------------------------------

    def create_job(
        self, agent_id: str, name: str, *, schedule: str, prompt: str, owner_id: str = ""
    ) -> ScheduledJob:
        """Create a scheduled job of ``agent_id`` and its memory source."""
        ...

    def get_job(self, job_id: int) -> ScheduledJob | None:
        """The job ``job_id``, or None."""
        ...

    def list_jobs(self, *, agent_id: str | None = None) -> list[ScheduledJob]:
        """The jobs (of ``agent_id``), oldest first."""
        ...

    def start_run(self, job_id: int) -> JobRun:
        """Record that a run of ``job_id`` starts now."""
        ...

    def get_run(self, run_id: int) -> JobRun | None:
        """The job run ``run_id``, or None."""
        ...

    def job_caller(self, run_id: int) -> JobCaller:
        """The caller to pass to ``tools.run(call, caller)`` during run ``run_id``."""
        ...

    def finish_run(
        self, run_id: int, *, status: str, output: str = "", error: str | None = None
    ) -> JobRun:
        """Record how run ``run_id`` ended, once."""
        ...

    def list_runs(self, job_id: int, *, limit: int = 20) -> list[JobRun]:
        """The newest ``limit`` runs of ``job_id``."""
        ...


if TYPE_CHECKING:
    # What mypy --strict checks: each facade is its surface. A member missing from one,
    # or a signature the Protocol does not accept, fails here, naming the member.
    from fermix.api import Memory
    from fermix.conversation import Conversation
    from fermix.remote import Client, RemoteConversation

    def _embedded(memory: Memory, conv: Conversation) -> None:
        _memory: MemorySurface[Conversation] = memory
        _conversation: ConversationSurface = conv

    def _remote(client: Client, conv: RemoteConversation) -> None:
        _memory: MemorySurface[RemoteConversation] = client
        _conversation: ConversationSurface = conv
