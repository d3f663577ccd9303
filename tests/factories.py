"""Builders shared by the tests: stored values, configs, and another process's view of a home.

Plain functions and classes (fixtures live in ``conftest.py``). Importable from the soak's
forked hosts too (``tests/`` is on their ``sys.path``), so nothing here imports pytest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fermix.config import CompactionConfig, Config, MemoryConfig, ModelConfig, RealtimeConfig
from fermix.core import categories
from fermix.home import Home
from fermix.model import TARGET_OF, USER_MD, ConversationKey, MemoryRow, Message, Scope
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Reads, Writes
from fermix.storage.sqlite.database import Database

if TYPE_CHECKING:
    from model_server import ModelServer

    from fermix.api import Memory

MODEL = "openai/test"
"""The model the loopback server answers for (litellm's ``openai/`` provider, any name)."""

StartMemory = Callable[..., "Memory"]
"""The ``start_memory`` fixture's type: ``start_memory(config=None, **keywords of Memory)``
starts a Memory on the test's home (conftest.py)."""

ROW_DEFAULTS: dict[str, Any] = {
    "id": 1,
    "agent_id": "bot",
    "owner_id": "alice",
    "scope_type": "owner",
    "scope_id": "alice",
    "category": "identity",
    "key": "k",
    "value": "v",
    "confidence": 1.0,
    "promote_target": "user_md",
    "source_id": None,
    "source_type": None,
    "source_name": None,
    "source_description": None,
    "session_id": None,
    "run_id": None,
    "source_message_id": None,
    "archived_at": None,
    "archived_by": None,
    "archive_reason": None,
    "created_at": 1,
    "updated_at": 1,
}


def memory_row(**overrides: Any) -> MemoryRow:
    """A live USER.md identity row of agent ``bot`` and owner ``alice``, changed by overrides."""
    return MemoryRow(**{**ROW_DEFAULTS, **overrides})


# -- configs --------------------------------------------------------------------------------


def config_for(
    server: ModelServer | str,
    *,
    primary: str = MODEL,
    fallbacks: tuple[str, ...] = (),
    timeout_s: float = 10.0,
    context_window: int | None = None,
    memory: MemoryConfig | None = None,
    compaction: CompactionConfig | None = None,
    persist_transcripts: bool = False,
) -> Config:
    """A config whose model route (reviewer and compactor) leads to the loopback ``server``
    (a :class:`~model_server.ModelServer` or its URL).

    Background review is off (``review_interval_hours = 0``) unless ``memory`` says
    otherwise, so every request the server receives is one the test asked for or a
    compaction; pass ``memory=MemoryConfig()`` for the default reviewer.
    """
    url = server if isinstance(server, str) else server.url
    return Config(
        memory=memory if memory is not None else MemoryConfig(review_interval_hours=0),
        model=ModelConfig(
            primary=primary,
            fallbacks=fallbacks,
            api_base=url,
            context_window=context_window,
            timeout_s=timeout_s,
        ),
        compaction=compaction if compaction is not None else CompactionConfig(),
        realtime=RealtimeConfig(persist_transcripts=persist_transcripts),
    )


class Clock:
    """A clock the test moves instead of waiting: epoch milliseconds for ``Memory(clock=)``,
    or seconds for ``Runtime(monotonic=)``."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, by: int) -> None:
        self.now += by


# -- another process on the same home -----------------------------------------------------


@contextmanager
def other_process(home: str | os.PathLike[str]) -> Iterator[Writer]:
    """The write path a second process on ``home`` has: its own :class:`Database` and
    :class:`Writer` (``write_rows`` rebuilds the prompt files as that process would;
    ``writer.write`` commits without touching them). Closed when the block ends."""
    db = Database(Path(home) / "memory.db")
    try:
        yield Writer(db, PromptFiles(Home(Path(home)), db))
    finally:
        db.close()


@contextmanager
def reading(home: str | os.PathLike[str]) -> Iterator[Reads]:
    """One read unit on ``home``'s existing database, opened as another process would open
    it to look (:meth:`Database.inspect`: no writer, no migration)."""
    db = Database.inspect(Path(home) / "memory.db")
    try:
        with db.read() as reads:
            yield reads
    finally:
        db.close()


def stored_messages(home: str | os.PathLike[str], key: ConversationKey) -> list[Message]:
    """Every message of conversation ``key`` in SQLite, oldest first (not the window)."""
    with reading(home) as reads:
        return reads.messages(key)


def upsert(
    writes: Writes,
    key: str,
    value: str,
    *,
    agent_id: str = "agent",
    owner_id: str = "alice",
    category: str = "preference",
    promote_target: str | None = "user_md",
) -> MemoryRow:
    """Write an owner-scope row of ``agent_id`` and ``owner_id`` in a write unit."""
    return writes.upsert_row(
        agent_id=agent_id,
        owner_id=owner_id,
        scope=Scope("owner", owner_id),
        category=category,
        key=key,
        value=value,
        promote_target=promote_target,
    )


def fact(
    category: str, key: str, value: str, *, agent_id: str = "agent", owner_id: str = ""
) -> Callable[[Writes], list[MemoryRow]]:
    """A write unit (for ``db.write`` or ``writer.write_rows``) storing one fact where the
    reviewer would (SC2): a profile category in ``owner_id``'s scope, for USER.md; a
    ``context`` or ``directive`` in the agent's scope, for MEMORY.md, kept to ``owner_id`` as
    a guest's is, or shared by every owner when ``owner_id`` is ``""``, as an operator's is."""
    if TARGET_OF[category] == USER_MD:
        scope = categories.owner_scope(owner_id)
    else:
        scope = categories.agent_scope(agent_id)

    def unit(writes: Writes) -> list[MemoryRow]:
        row = writes.upsert_row(
            agent_id=agent_id,
            owner_id=owner_id,
            scope=scope,
            category=category,
            key=key,
            value=value,
            promote_target=TARGET_OF[category],
        )
        return [row]

    return unit
