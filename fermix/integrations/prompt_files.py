"""The prompt files as a framework's instructions, read in the same worker call as the
window (I2, I4): the asyncio adapters' shared part. Imports no framework.

An asyncio framework asks for its instructions before each model request of a run, and
fermix's :meth:`~fermix.surface.ConversationSurface.memory_files` is synchronous (a file
read, or a request to a memory server), so each ask is a hop to a worker thread and back.
The first request of a run comes right after the framework read the window, itself a
worker call: :class:`FilesAhead` reads USER.md and MEMORY.md in that call too, and the
first instructions after it take them, without a hop of their own. Every later request
of the run reads them afresh, so one that follows a memory tool call sees what it stored
(P1, M11). Only a session or history whose instructions were asked for reads ahead; what
was read and not taken is dropped at the turn's commit, or replaced at the next read.
"""

from __future__ import annotations

import asyncio
import threading

from fermix.core import composer
from fermix.surface import ConversationSurface


class FilesAhead:
    """USER.md and MEMORY.md of one conversation, read with its window, taken once."""

    def __init__(self, conversation: ConversationSurface) -> None:
        self.conversation = conversation
        self.wanted = False
        """Whether instructions were asked for (:meth:`instructions`): then :meth:`read` reads."""
        self._files: tuple[str, str] | None = None
        self._lock = threading.Lock()
        """Guards ``_files``, set in a worker thread and taken on the event loop (held for
        the assignment alone, so the loop never waits on fermix's work)."""

    def read(self) -> None:
        """In the worker call that reads the window: read the files for the next ask."""
        if self.wanted:
            files = self.conversation.memory_files()
            with self._lock:
                self._files = files

    def drop(self) -> None:
        """Forget what was read and not taken (the turn is committed)."""
        with self._lock:
            self._files = None

    def _take(self) -> tuple[str, str] | None:
        with self._lock:
            files, self._files = self._files, None
        return files

    async def instructions(self, system: str) -> str:
        """``system``, the operator's standing rules and the fenced memory block as one
        text (:func:`fermix.core.composer.instructions`), from the files read ahead when
        there are, else read now in a worker thread."""
        files = self._take()
        if files is None:
            files = await asyncio.to_thread(self.conversation.memory_files)
        return composer.instructions(system, *files)
