"""A small pool of read connections, so readers run beside the writer (S8, WAL)."""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Iterator

import apsw

from fermix.errors import StorageError
from fermix.storage.sqlite.connection import connect


class ReaderPool:
    """Up to ``size`` read connections, each used by one caller at a time, opened on demand."""

    def __init__(
        self, path: str | os.PathLike[str], *, size: int = 4, vfs: str | None = None
    ) -> None:
        self._path = path
        self._vfs = vfs
        # Each slot holds an open connection, or None: the right to open one.
        self._slots: queue.LifoQueue[apsw.Connection | None] = queue.LifoQueue()
        for _ in range(size):
            self._slots.put(None)
        self._opened: list[apsw.Connection] = []

    @contextlib.contextmanager
    def connection(self, timeout: float = 30.0) -> Iterator[apsw.Connection]:
        """Borrow a connection for the block; waits up to ``timeout`` when all are in use."""
        try:
            conn = self._slots.get(timeout=timeout)
        except queue.Empty:
            raise StorageError(f"no read connection free after {timeout} s") from None
        try:
            if conn is None:
                conn = connect(self._path, vfs=self._vfs)
                self._opened.append(conn)
            yield conn
        finally:
            self._slots.put(conn)

    def close(self) -> None:
        """Close every connection the pool opened."""
        for conn in self._opened:
            conn.close()
        self._opened.clear()
