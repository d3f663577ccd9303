"""``FermixMemoryProvider``: fermix as Hermes Agent's external memory provider (I1).

Hermes (``hermes-agent``) loads one external memory provider, named by ``memory.provider``
in its ``config.yaml``, from ``$HERMES_HOME/plugins/<name>/`` (``fermix hermes install``
puts this provider there as ``fermix``). Its ``MemoryManager`` then calls the provider
around each turn of its own loop; what each call does here:

- ``initialize``: opens fermix, embedded (a :class:`fermix.Memory` on a home, shared by
  every provider of the process on that home) or remote (a :class:`fermix.Client`), and
  the conversation ``(agent_id, platform, chat)``: the gateway's chat and thread, or the
  Hermes session in its CLI. Its owner is the user Hermes names (a gateway's sender),
  else the configured ``owner_id``; its trust is never asked for, so fermix gives it as
  to any host: a guest unless ``[fermix_core.security] operators`` names the owner (or,
  against a server, as its token allows; M1, M2).
- ``system_prompt_block``: the owner's prompt files as fermix composes them (the
  operator's standing rules, then USER.md and MEMORY.md in the fenced memory block, P1,
  M11), after a line naming the memory tools.
- ``prefetch``: ``memory_recall`` over the owner's memories and history, for the message.
- ``sync_turn``: the turn's appends (user message, tool calls and results) and the reply's
  commit, which dispatches fermix's reviewer and compactor as for a hand-written host.
- ``get_tool_schemas`` / ``handle_tool_call``: fermix's memory tools (T4).
- ``on_pre_compress``: a forced fermix compaction; its summary goes to Hermes's compressor.
- ``on_session_end``: the session's last turn stored if its sync has not run yet, then a
  forced review (M5), waited for.
- ``get_config_schema`` / ``save_config``: ``$HERMES_HOME/fermix.json`` (0600; the token in
  ``FERMIX_TOKEN``); ``backup_paths``: the fermix home, when it is outside Hermes's.

Hermes runs ``sync_turn`` and ``prefetch`` on its own worker threads: the provider's state
(the conversation handle, the turns stored) is behind one lock, and fermix's facades are
thread-safe. Writes are skipped for an agent that is not Hermes's primary one (a subagent,
a cron run, a flush), as Hermes asks of providers.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from agent.memory_provider import MemoryProvider  # type: ignore[import-not-found,import-untyped,unused-ignore]
from agent.skill_commands import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
    extract_user_instruction_from_skill_message,
)

from fermix.api import Memory
from fermix.core.tool_calls import MAX_QUERY_CHARS
from fermix.errors import FermixError
from fermix.integrations.hermes import settings as settings_file
from fermix.integrations.hermes import turns
from fermix.integrations.hermes.settings import Settings
from fermix.remote import Client
from fermix.surface import ConversationSurface, MemorySurface
from fermix.tools import MemoryTools

__all__ = ["FermixMemoryProvider", "register"]

log = logging.getLogger(__name__)

PROVIDER_NAME: Final = "fermix"
PREFETCH_LIMIT: Final = 5
"""Recall hits injected before a turn (``memory_recall``'s default)."""
CLIENT_TIMEOUT_S: Final = 120.0
"""How long a request to the server may take: a forced review waits for its model."""
HEADER: Final = (
    "# fermix memory\n"
    "Long-term memory of this user is kept by fermix. Tools: memory_recall (look a fact up, "
    "or search memories and past conversations), memory_store (keep a small fact for this "
    "conversation), memory_sources_list."
)
PREFETCH_TITLE: Final = "## fermix recall"


class _Shared:
    """The embedded Memories of this process, one per home, counted by their users.

    Hermes makes a provider per agent (a gateway holds one per session), and each one
    asks for its home: they share one running Memory, closed when the last lets go.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str, str], tuple[Memory, int]] = {}

    def acquire(self, settings: Settings) -> Memory:
        key = (str(settings.fermix_home().root), settings.model, settings.api_base)
        with self._lock:
            memory, users = self._open.get(key, (None, 0))
            if memory is None:
                memory = Memory(
                    settings.fermix_home(),
                    model=settings.model or None,
                    api_base=settings.api_base or None,
                ).start()
            self._open[key] = (memory, users + 1)
            return memory

    def release(self, memory: Memory) -> None:
        with self._lock:
            for key, (held, users) in list(self._open.items()):
                if held is memory:
                    if users > 1:
                        self._open[key] = (held, users - 1)
                        return
                    del self._open[key]
                    break
            else:
                return
        memory.close()


_SHARED = _Shared()


class FermixMemoryProvider(MemoryProvider):  # type: ignore[misc]
    """fermix behind Hermes's ``MemoryProvider`` interface (see the module docstring)."""

    def __init__(self, hermes_home: str | None = None) -> None:
        self._hermes_home = hermes_home
        self._lock = threading.RLock()
        self._settings: Settings | None = None
        self._memory: MemorySurface[Any] | None = None
        self._conv: ConversationSurface | None = None
        self._writes = True
        self._session_id = ""
        self._chat_given = False
        self._channel = "cli"
        self._thread = ""
        self._owner_id = ""
        self._stored: set[str] = set()
        """The idents of the turns stored in this session (:mod:`.turns`)."""
        self._turns = 0

    # -- identity and availability -----------------------------------------------------

    @property
    def name(self) -> str:
        """``fermix``: the value of ``memory.provider`` in Hermes's config.yaml."""
        return PROVIDER_NAME

    def _home(self) -> str:
        if self._hermes_home is not None:
            return self._hermes_home
        from hermes_constants import get_hermes_home  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return str(get_hermes_home())

    def _load_settings(self) -> Settings:
        return settings_file.load(self._home())

    def is_available(self) -> bool:
        """Whether the settings are complete (no network): embedded always is; a server
        needs its URL and a token. A broken settings file is logged and False."""
        try:
            return self._load_settings().ready
        except FermixError as exc:
            log.warning("fermix memory provider: %s", exc)
            return False

    # -- lifecycle -----------------------------------------------------------------------

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        """Open fermix and this session's conversation (see the module docstring).

        A bad setting, a home that cannot be opened or a server that refuses the token
        raises its typed error; Hermes logs it and goes on without this provider's
        memory (every later call then does nothing, and tools answer an error).
        """
        self.shutdown()  # initialized again: let go of what the last one opened
        hermes_home = kwargs.get("hermes_home")
        if isinstance(hermes_home, str) and hermes_home:
            self._hermes_home = hermes_home
        settings = self._load_settings()
        if not settings.ready:
            raise FermixError(
                f"fermix memory provider: mode 'server' needs a url in "
                f"{settings_file.path_in(self._home())} and a token in "
                f"${settings_file.TOKEN_ENV}"
            )
        memory: MemorySurface[Any]
        if settings.embedded:
            memory = _SHARED.acquire(settings)
        else:
            memory = Client(settings.url, settings.token, timeout=CLIENT_TIMEOUT_S)
        user_id = str(kwargs.get("user_id") or "")
        chat_id = str(kwargs.get("chat_id") or "")
        with self._lock:
            self._settings = settings
            self._memory = memory
            self._writes = kwargs.get("agent_context", "primary") == "primary"
            self._channel = str(kwargs.get("platform") or "cli")
            self._thread = str(kwargs.get("thread_id") or "")
            self._owner_id = user_id or settings.owner_id
            self._chat_given = bool(chat_id)
            try:
                self._open(chat_id or session_id, session_id)
            except BaseException:
                self._release()
                raise

    def _open(self, chat_id: str, session_id: str) -> None:
        """Open the conversation of ``chat_id`` for this session (under the lock)."""
        assert self._memory is not None and self._settings is not None
        self._conv = self._memory.conversation(
            self._settings.agent_id,
            self._channel,
            chat_id,
            self._thread,
            owner_id=self._owner_id,
        )
        self._session_id = session_id
        self._stored = set()

    def on_session_switch(
        self,
        new_session_id: str,
        *,
        parent_session_id: str = "",
        reset: bool = False,
        rewound: bool = False,
        **kwargs: Any,
    ) -> None:
        """Follow Hermes to another session: in its CLI, where the session is the chat,
        a new session (``/new``, ``/resume``, ``/branch``) is another conversation; a
        compression goes on in the same one. A gateway chat stays its conversation."""
        with self._lock:
            if self._memory is None or not new_session_id:
                return
            if self._chat_given or kwargs.get("reason") == "compression":
                self._session_id = new_session_id
                return
            self._open(new_session_id, new_session_id)

    def shutdown(self) -> None:
        """Let go of fermix: the shared Memory's last user closes it (queued writes
        finish first); a Client drops its connections."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        memory, self._memory, self._conv = self._memory, None, None
        if isinstance(memory, Memory):
            _SHARED.release(memory)
        elif memory is not None:
            memory.close()

    # -- the prompt ----------------------------------------------------------------------

    def system_prompt_block(self) -> str:
        """The tools' line, then the owner's standing rules and memory block as fermix
        composes them (empty files leave only the line); empty before ``initialize``."""
        conv = self._conv
        if conv is None:
            return ""
        composed = conv.compose("", limit=0)
        blocks = [m["content"] for m in composed[1:] if m.get("role") == "system"]
        return "\n\n".join([HEADER, *blocks])

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        """What ``memory_recall`` finds for ``query`` in the owner's memories and past
        messages, as a short list; empty when nothing is found or recall refuses."""
        conv, memory = self._conv, self._memory
        if conv is None or memory is None or not query.strip():
            return ""
        call = _call(
            "memory_recall",
            {
                "query": query[:MAX_QUERY_CHARS],
                "scope": "owner",
                "source": "all",
                "limit": PREFETCH_LIMIT,
            },
        )
        result = json.loads(memory.tools.run(call, conv))
        if "error" in result:
            log.info("fermix prefetch: recall refused: %s", result["error"])
            return ""
        lines = [f"- {row['key']}: {row['value']}" for row in result.get("memories", [])]
        lines += [
            f"- ({hit['role']}, earlier) {_clip(hit['content'])}"
            for hit in result.get("history", [])
        ]
        return "\n".join([PREFETCH_TITLE, *lines]) if lines else ""

    # -- the turn ------------------------------------------------------------------------

    def sync_turn(
        self,
        user_content: str,
        assistant_content: str,
        *,
        session_id: str = "",
        messages: list[dict[str, Any]] | None = None,
    ) -> None:
        """Store the turn (user message, tool calls and results) and commit the reply;
        the commit dispatches fermix's reviewer and compactor (after delivery)."""
        if not self._writes or self._conv is None:
            return
        turn = turns.build(
            session_id or self._session_id, user_content, assistant_content, messages
        )
        self._store(turn)

    def _store(self, turn: turns.Turn) -> None:
        """Append ``turn`` once: a turn stored already in this session is skipped, and
        each append's client key makes a repeated one a replay (N3)."""
        with self._lock:
            conv = self._conv
            if conv is None or turn.ident in self._stored:
                return
            for index, step in enumerate(turn.steps):
                if step.role == "user":
                    conv.append_user(step.text, client_key=turn.key(index))
                else:
                    conv.append(
                        step.role, step.text, metadata=step.metadata, client_key=turn.key(index)
                    )
            conv.commit(turn.reply, client_key=turn.key(len(turn.steps)))
            self._stored.add(turn.ident)
            self._turns += 1

    def _store_last(self, messages: list[dict[str, Any]]) -> None:
        """Store the last turn of ``messages`` if it is complete and not stored yet: its
        ``sync_turn`` is queued on Hermes's worker and may not have run."""
        start = turns.last_user_index(messages)
        if start is None:
            return
        raw = turns.text_of(messages[start].get("content"))
        user_text = extract_user_instruction_from_skill_message(raw)  # as Hermes's sync does
        turn = turns.completed(self._session_id, messages, user_text) if user_text else None
        if turn is not None:
            self._store(turn)

    def on_pre_compress(self, messages: list[dict[str, Any]]) -> str:
        """Compact fermix's window too (forced), the last turn stored first, and give
        Hermes's compressor fermix's summary of it; empty when fermix did not compact
        (nothing to summarize, or no model)."""
        conv, memory = self._conv, self._memory
        if not self._writes or conv is None or memory is None:
            return ""
        self._store_last(messages)
        result = memory.compact(conv, force=True)
        if result.status != "compacted":
            log.info("fermix compaction before Hermes's: %s %s", result.status, result.reason)
            return ""
        checkpoints = [m.content for m in conv.history() if m.kind == "checkpoint"]
        return (
            f"fermix's summary of the earlier conversation:\n{checkpoints[-1]}"
            if checkpoints
            else ""
        )

    def on_session_end(self, messages: list[dict[str, Any]]) -> None:
        """Store the session's last turn if its ``sync_turn`` has not run yet (Hermes
        queues that on a worker and may end the session first), then review the
        conversation now, past the review's time gates, and wait for it (M5)."""
        conv, memory = self._conv, self._memory
        if not self._writes or conv is None or memory is None:
            return
        self._store_last(messages or [])
        result = memory.review(conv, force=True)
        log.info(
            "fermix review at the session's end: %s (%d messages, %d added, %d replaced)",
            result.status,
            result.messages,
            result.added,
            result.replaced,
        )

    # -- tools ---------------------------------------------------------------------------

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        """fermix's memory tools as bare function schemas (Hermes wraps them)."""
        return [tool["function"] for tool in MemoryTools.schemas()]

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        """Run one memory tool for this conversation; the JSON result (a refusal is
        ``{"error": ...}``, never an exception)."""
        conv, memory = self._conv, self._memory
        if conv is None or memory is None:
            return json.dumps({"error": "the fermix memory provider is not initialized"})
        return memory.tools.run(_call(tool_name, args), conv)

    # -- setup and backup ----------------------------------------------------------------

    def get_config_schema(self) -> list[dict[str, Any]]:
        """The fields ``hermes memory setup`` asks for (:func:`.settings.config_schema`)."""
        return settings_file.config_schema()

    def save_config(self, values: dict[str, Any], hermes_home: str) -> None:
        """Write ``values`` to ``$HERMES_HOME/fermix.json`` (merged, checked, 0600)."""
        settings_file.save(values, hermes_home)

    def backup_paths(self) -> list[str]:
        """The fermix home (database, config, prompt files) when fermix runs embedded
        on a home outside ``HERMES_HOME``, which ``hermes backup`` walks anyway; nothing
        against a server, whose home is the server's to back up."""
        try:
            settings = self._load_settings()
        except FermixError as exc:
            log.warning("fermix memory provider: %s", exc)
            return []
        if not settings.embedded:
            return []
        root = settings.fermix_home().root
        hermes_home = Path(self._home()).expanduser().absolute()
        if root == hermes_home or hermes_home in root.parents:
            return []
        return [str(root)]

    # -- what tests and operators look at ------------------------------------------------

    @property
    def conversation(self) -> ConversationSurface | None:
        """This session's fermix conversation (None before ``initialize``)."""
        return self._conv


def register(ctx: Any) -> None:
    """Hermes's plugin hook: hand it a fresh provider (``ctx.register_memory_provider``)."""
    ctx.register_memory_provider(FermixMemoryProvider())


def _call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call in the OpenAI format, as ``tools.run`` takes it."""
    return {"function": {"name": name, "arguments": json.dumps(dict(arguments))}}


def _clip(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
