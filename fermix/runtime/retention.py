"""``Retention``: the sweep that applies ``[fermix_core.retention]`` (F7), in every host.

The timer runs :meth:`Retention.sweep` every few minutes; each batch is one write unit of
at most :data:`~fermix.storage.retention.BATCH` rows, so an append waits for one batch at
most. Messages older than ``messages_days`` go (never a checkpoint: a window whose older
part is dropped still composes; never a user message the reviewer has not read, unless
``drop_unreviewed``), archived memory rows older than ``archived_days`` go, and each prompt
file keeps its newest ``revisions_keep`` revisions. 0 keeps everything, as before.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from fermix.clock import now_ms
from fermix.config import RetentionConfig
from fermix.runtime.writer import Writer
from fermix.storage import Storage, Writes
from fermix.storage.port import Dropped

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
MAX_BATCHES = 10_000
"""Batches of one kind one sweep runs at most (the next sweep goes on)."""


def cutoffs(config: RetentionConfig, *, now: int) -> tuple[int | None, int | None, int | None]:
    """What ``config`` drops at ``now``: messages and archived rows older than these epoch
    milliseconds, revisions beyond this many per file (None: that kind is kept)."""
    messages = now - config.messages_days * DAY_MS if config.messages_days else None
    archived = now - config.archived_days * DAY_MS if config.archived_days else None
    return messages, archived, config.revisions_keep or None


class Retention:
    """What ``[fermix_core.retention]`` drops, through the process's writer."""

    def __init__(
        self,
        storage: Storage,
        writer: Writer,
        config: RetentionConfig,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._db = storage
        self._writer = writer
        self._config = config
        self._clock = clock

    @property
    def enabled(self) -> bool:
        """Whether the config drops anything."""
        return self._config.enabled

    def reconfigure(self, config: RetentionConfig) -> None:
        """Drop by ``config`` from the next sweep on (W1); a sweep running now finishes
        with what it started with."""
        self._config = config

    def due(self) -> dict[str, int]:
        """How many messages, archived rows and revisions the next sweep drops."""
        config = self._config  # one config for the whole count
        messages, archived, keep = cutoffs(config, now=self._clock())
        with self._db.read() as reads:
            return reads.retention_due(
                messages_before=messages,
                archived_before=archived,
                keep=keep,
                drop_unreviewed=config.drop_unreviewed,
            )

    def _batches(self, unit: Callable[[Writes], int], label: str) -> int:
        """Commit ``unit`` until a batch drops nothing; how many rows went in all."""
        total = 0
        for _ in range(MAX_BATCHES):
            n = self._writer.write(unit, label=label)
            total += n
            if not n:
                break
        return total

    def sweep(self) -> dict[str, int]:
        """Drop what retention says, batch by batch; what was dropped, by kind."""
        config = self._config  # one config for the whole sweep
        messages, archived, keep = cutoffs(config, now=self._clock())
        dropped = {"messages": 0, "archived_rows": 0, "revisions": 0}
        if messages is not None:
            after = 0
            for _ in range(MAX_BATCHES):
                unit = _expiring(messages, after, drop_unreviewed=config.drop_unreviewed)
                batch = self._writer.write(unit, label="retention of messages")
                dropped["messages"] += batch.dropped
                after = batch.after_id
                if batch.finished:
                    break
        if archived is not None:
            unit_rows = functools.partial(_expire_archived, before=archived)
            dropped["archived_rows"] = self._batches(unit_rows, "retention of rows")
        if keep is not None:
            unit_revisions = functools.partial(_trim_revisions, keep=keep)
            dropped["revisions"] = self._batches(unit_revisions, "retention of revisions")
        if any(dropped.values()):
            log.info("retention dropped %s", dropped)
        return dropped


def _expire_archived(writes: Writes, *, before: int) -> int:
    return writes.expire_archived(before=before)


def _trim_revisions(writes: Writes, *, keep: int) -> int:
    return writes.trim_revisions(keep=keep)


def _expiring(before: int, after_id: int, *, drop_unreviewed: bool) -> Callable[[Writes], Dropped]:
    """The unit of one batch of messages older than ``before``, read after ``after_id``."""
    return lambda writes: writes.expire_messages(
        before=before, after_id=after_id, drop_unreviewed=drop_unreviewed
    )
