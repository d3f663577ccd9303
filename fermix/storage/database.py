"""``Database``: one process's way into ``memory.db`` (S1, S8).

Reads run on a small pool of read connections beside the writer (WAL); writes run through
the process's one group-commit writer (:class:`~fermix.storage.committer.Committer`). Both
hand the caller a session (:mod:`fermix.storage.session`), never a connection.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from fermix.storage.committer import Committer
from fermix.storage.connection import open_database
from fermix.storage.pool import ReaderPool
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy
from fermix.storage.session import Reads, Writes

T = TypeVar("T")


class Database:
    """The database of one home, opened (and migrated) once per process."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        vfs: str | None = None,
        readers: int = 4,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.path = Path(path)
        self.vfs = vfs
        self._committer = Committer(open_database(path, vfs=vfs), retry=retry)
        self._readers = ReaderPool(path, size=readers, vfs=vfs)

    @contextlib.contextmanager
    def read(self, timeout: float = 30.0) -> Iterator[Reads]:
        """A read unit: the block's reads run on one pooled read connection."""
        with self._readers.connection(timeout) as conn:
            yield Reads(conn)

    def write(self, unit: Callable[[Writes], T], *, label: str = "write") -> T:
        """Run ``unit`` in a write transaction; return its result once committed.

        Concurrent units share commits. A unit's own error reaches only its caller and
        leaves nothing of that unit; a database error is a
        :class:`~fermix.errors.WriteFailedError` after the writer's retries.
        """
        return self._committer.run(lambda conn: unit(Writes(conn)), label=label)

    @property
    def commits(self) -> int:
        """Write transactions committed so far (for benchmarks and tests)."""
        return self._committer.batches

    def close(self) -> None:
        """Finish the queued writes, then close every connection."""
        try:
            self._committer.close()
        finally:
            self._readers.close()
