"""``Store``: the read-through cache of memory rows (A3).

Reads are answered from the cache while it is current; any write, by this process or
another (the CLI's ``restore``, a second host), bumps ``memory_changes.counter`` through a
trigger, and the Store compares that counter before every read: one indexed read of a
one-row table instead of the query, and never a stale answer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import apsw

from fermix.actors.base import SupervisedActor
from fermix.model import MemoryRow
from fermix.storage import memories
from fermix.storage.committer import Committer
from fermix.storage.connection import connect


class GetRow(NamedTuple):
    """Reply with the row of ``memory_id`` (archived or not), or None."""

    memory_id: int


class ListRows(NamedTuple):
    """Reply with ``memories.list_rows(**filters)``; ``filters`` is a sorted tuple of pairs."""

    filters: tuple[tuple[str, Any], ...]


class Write(NamedTuple):
    """Run ``work(conn)`` as one committed write and reply with its result."""

    work: Callable[[apsw.Connection], Any]
    label: str


class Store(SupervisedActor):
    """Caches memory rows; every read first checks that no write happened since."""

    def __init__(
        self, db_path: str | os.PathLike[str], *, committer: Committer, vfs: str | None = None
    ) -> None:
        super().__init__()
        self._db_path = db_path
        self._vfs = vfs
        self._committer = committer
        self._conn: apsw.Connection | None = None
        self._counter = -1
        self._rows: dict[int, MemoryRow | None] = {}
        self._lists: dict[tuple[tuple[str, Any], ...], list[MemoryRow]] = {}
        self.hits = 0
        self.misses = 0

    def on_start(self) -> None:
        """Open this actor's own read connection."""
        self._conn = connect(self._db_path, vfs=self._vfs)

    def on_stop(self) -> None:
        """Close the read connection."""
        if self._conn is not None:
            self._conn.close()

    def on_receive(self, message: Any) -> Any:
        """Handle one typed message; anything else is a programming error and crashes."""
        match message:
            case GetRow(memory_id):
                conn = self._current()
                if memory_id not in self._rows:
                    self.misses += 1
                    self._rows[memory_id] = memories.get(conn, memory_id)
                else:
                    self.hits += 1
                return self._rows[memory_id]
            case ListRows(filters):
                conn = self._current()
                if filters not in self._lists:
                    self.misses += 1
                    self._lists[filters] = memories.list_rows(conn, **dict(filters))
                else:
                    self.hits += 1
                return list(self._lists[filters])
            case Write(work, label):
                result = self._committer.run(work, label=label)
                self._invalidate()
                return result
        raise TypeError(f"Store got an unknown message: {message!r}")

    def _current(self) -> apsw.Connection:
        conn = self._conn
        assert conn is not None
        counter = memories.change_counter(conn)
        if counter != self._counter:
            self._invalidate()
            self._counter = counter
        return conn

    def _invalidate(self) -> None:
        self._rows.clear()
        self._lists.clear()
        self._counter = -1


def list_filters(**filters: Any) -> tuple[tuple[str, Any], ...]:
    """``filters`` as the hashable, order-independent key :class:`ListRows` takes."""
    out: list[tuple[str, Any]] = []
    for name, value in sorted(filters.items()):
        out.append((name, tuple(value) if isinstance(value, list) else value))
    return tuple(out)
