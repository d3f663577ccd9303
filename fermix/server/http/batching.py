"""The appends of concurrent requests, stored in batches: one worker-thread hop per batch.

An append request is checked on the event loop (token, handle, body: a bad one is refused
before anything is queued) and becomes a :class:`~fermix.model.PendingAppend`. Appends
that arrive while a batch is being stored wait for the next one; each batch goes to a
worker thread in one hop and is stored with :meth:`fermix.api.Memory.append_many`,
sharing commits, and each request gets its own message, replay flag or error.

Why: handing every request to a worker thread of its own cost the server about a quarter
of its CPU in thread wake-ups and hand-offs under 32 concurrent clients (py-spy), more
than the appends themselves; a batch pays one hand-off for all its requests, and its
appends share commits as before. Order: batches are stored one after another and each
batch in arrival order, so a client's appends to a conversation, each sent after the
previous one was answered, are stored in the order it sent them.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from fermix.api import Memory
from fermix.errors import FermixError
from fermix.model import AppendResult, PendingAppend
from fermix.server.http import blocking

log = logging.getLogger(__name__)

MAX_BATCH = 256
"""Most appends stored in one batch (the rest wait for the next)."""


class AppendBatcher:
    """Stores the appends of concurrent requests in batches (see the module's docstring)."""

    def __init__(self, memory: Memory, *, max_batch: int = MAX_BATCH) -> None:
        self._memory = memory
        self._max_batch = max_batch
        self._waiting: list[tuple[PendingAppend, asyncio.Future[AppendResult]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def append(self, pending: PendingAppend) -> AppendResult:
        """Store ``pending`` with the next batch; its result, or its error raised."""
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((pending, future))
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._store_batches())
        return await future

    async def _store_batches(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
                await self._store(batch)
        finally:
            self._drain = None

    async def _store(self, batch: list[tuple[PendingAppend, asyncio.Future[AppendResult]]]) -> None:
        store = functools.partial(self._memory.append_many, [pending for pending, _ in batch])
        try:
            results: list[AppendResult | FermixError] = await blocking.run(store)
        except Exception as exc:  # noqa: BLE001 - each request of the batch gets it
            log.error("a batch of %d appends failed: %s", len(batch), exc)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # the client went away; its append is stored regardless
                continue
            if isinstance(result, AppendResult):
                future.set_result(result)
            else:
                future.set_exception(result)
