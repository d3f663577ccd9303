"""The tests' rig: one home wired as a process wires it, by the composition root.

A :class:`Rig` is :func:`fermix.runtime.composition.build` on a temporary home and a
config, with the test's seams (a clock, a VFS, the windows conversation actors read):
the store, the writer, the prompt files and the review and compaction use cases serve at
once, on the test's thread; :meth:`Rig.start` starts the actor tree too, for a test of
the conversation actors. Tests that drive a use case without a thread (a review, a
compaction) call it directly; ``Memory`` is for what a host does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fermix.actors.conversation import History, WindowSource
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core.review import ReviewResult
from fermix.home import Home
from fermix.model import ConversationKey, ConversationState, Message, NewMessage
from fermix.runtime.composition import Services, build
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.reviewing import Reviewing
from fermix.runtime.windows import Windows
from fermix.runtime.writer import Writer
from fermix.storage import Reads, Storage


class Chat:
    """One conversation of the rig, written through the writer as a host's turns are."""

    def __init__(self, writer: Writer, key: ConversationKey, *, owner_id: str, trust: str):
        self._writer = writer
        self.key = key
        self.owner_id = owner_id
        self.trust = trust

    def append(self, role: str, text: str) -> Message:
        sender = {"user": self.owner_id, "assistant": "assistant"}.get(role, "")
        new = NewMessage(self.key, role, text, owner_id=self.owner_id, sender=sender)
        return self._writer.append(new, trust=self.trust)

    def append_user(self, text: str) -> Message:
        return self.append("user", text)

    def append_assistant(self, text: str) -> Message:
        return self.append("assistant", text)


class Rig:
    """One home's services as :func:`~fermix.runtime.composition.build` wires them.

    ``clock`` is the gates' time (epoch milliseconds), ``vfs`` SQLite's, ``windows`` what
    conversation actors read. :meth:`close` settles the deferred prompt-file rebuilds, then
    stops what was started and closes the store.
    """

    def __init__(
        self,
        home: Path,
        config: Config,
        *,
        clock: Callable[[], int] = now_ms,
        vfs: str | None = None,
        windows: Callable[[Storage], WindowSource] = Windows,
    ) -> None:
        self.home = home
        self.config = config
        self.services: Services = build(Home(home), config, vfs=vfs, clock=clock, windows=windows)

    @property
    def db(self) -> Storage:
        return self.services.storage

    @property
    def writer(self) -> Writer:
        return self.services.writer

    @property
    def files(self) -> PromptFiles:
        return self.services.files

    @property
    def reviewing(self) -> Reviewing:
        return self.services.reviewing

    def start(self) -> Rig:
        """Start the actor tree, the timer and the embedder."""
        self.services.start()
        return self

    def close(self) -> None:
        self.files.settle()
        self.services.close()

    # -- writing as a host does ----------------------------------------------------------

    def say(
        self,
        key: ConversationKey,
        text: str,
        *,
        owner_id: str = "alice",
        role: str = "user",
        sender: str | None = None,
        trust: str = "operator",
        peak: int | None = None,
    ) -> Message:
        """Store one message of ``key`` through the writer; ``sender`` is ``owner_id``
        unless given."""
        new = NewMessage(
            key, role, text, owner_id=owner_id, sender=owner_id if sender is None else sender
        )
        return self.writer.append(new, trust=trust, peak_prompt_tokens=peak)

    def conversation(
        self,
        chat_id: str,
        *,
        owner_id: str,
        trust: str = "operator",
        agent_id: str = "agent",
        channel: str = "tg",
    ) -> Chat:
        return Chat(
            self.writer, ConversationKey(agent_id, channel, chat_id), owner_id=owner_id, trust=trust
        )

    def review(self, chat: Chat, *, force: bool = True) -> ReviewResult:
        """As ``Memory.review`` and ``--now``: forced unless told otherwise."""
        return self.reviewing.review(chat.key, force=force)

    # -- reading back ----------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Reads]:
        with self.db.read() as reads:
            yield reads

    def window(self, key: ConversationKey) -> list[Message]:
        with self.db.read() as reads:
            return reads.window(key)

    def state(self, key: ConversationKey) -> ConversationState | None:
        with self.db.read() as reads:
            return reads.conversation(key)

    def messages(self, key: ConversationKey) -> list[Message]:
        """Every stored message of ``key``, whatever its window."""
        with self.db.read() as reads:
            return reads.messages(key)

    # -- the conversation actors (after start) ------------------------------------------

    def ask(self, key: ConversationKey, message: Any) -> Any:
        """Ask the actor of ``key`` (started on demand by the registry)."""
        return self.services.registry.ask(key, message)

    def history(self, key: ConversationKey) -> list[Message]:
        """The window of ``key`` as its actor holds it."""
        window: list[Message] = self.ask(key, History())
        return window
