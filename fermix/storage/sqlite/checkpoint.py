"""WAL checkpoints off the acknowledged path of the group commit (S8).

**Checkpoints off the acknowledged path.** In WAL mode SQLite's own auto-checkpoint copies
the log back into the database file inside the ``COMMIT`` that crosses 1,000 log pages,
fsyncs included: that caller (and, under contention, every caller queued behind it) waits
milliseconds for work its write does not need. The committer replaces it with a
:class:`Checkpointer`: a thread of its own, on a connection of its own, that runs a
``PASSIVE`` checkpoint beside the writes each time the log grew :data:`CHECKPOINT_PAGES`
more pages (SQLite lets a checkpoint run while another connection writes). Under a steady
stream of commits such a checkpoint never quite catches up, and only a checkpoint that
caught up lets the next write start the log over; so once the log holds
:data:`CHECKPOINT_INLINE_PAGES` pages the committing party checkpoints after its
``COMMIT``, as SQLite would, copying only what the background left. Durability is SQLite's
(``synchronous=NORMAL``): a commit is in the log before it is acknowledged, whoever copies
the log later and whenever.

:class:`WalCheckpoints` decides when (SQLite's WAL hook tells it the log's size after each
``COMMIT``); :class:`Checkpointer` runs the background ones.
"""

from __future__ import annotations

import logging
import sys
import threading

import apsw

from fermix.errors import StorageError
from fermix.storage.sqlite.connection import connect

__all__ = ["CHECKPOINT_INLINE_PAGES", "CHECKPOINT_PAGES", "Checkpointer", "WalCheckpoints"]

log = logging.getLogger(__name__)

CHECKPOINT_PAGES = 1000
"""Log pages written between two background checkpoints (SQLite's auto-checkpoint default)."""

CHECKPOINT_INLINE_PAGES = 4000
"""Log pages at which the committing party checkpoints itself after its ``COMMIT``."""


class WalCheckpoints:
    """When the write connection's log is copied back: in the background or inline (S8).

    Only the connection's holder calls :meth:`checkpoint`, right after its ``COMMIT``, when
    :attr:`pages` reached :attr:`due_at`.
    """

    def __init__(self, conn: apsw.Connection, *, checkpoint_pages: int, inline_pages: int) -> None:
        self.pages = 0
        """Pages in the log after the last commit (told by SQLite's WAL hook)."""
        self.due_at = checkpoint_pages
        """The log's size at which the next commit checkpoints (``sys.maxsize``: never)."""
        self._checkpoint_pages = checkpoint_pages
        self._inline_pages = inline_pages
        self.checkpointer: Checkpointer | None = None
        if checkpoint_pages and in_wal_mode(conn):
            self.checkpointer = Checkpointer(conn)
            conn.set_wal_hook(self._wal_committed)  # replaces SQLite's auto-checkpoint
        else:
            self.due_at = sys.maxsize  # SQLite's own auto-checkpoint stays

    def _wal_committed(self, conn: apsw.Connection, dbname: str, pages: int) -> int:
        """SQLite's WAL hook, called in each ``COMMIT``: only note the log's size."""
        if pages < self.pages:  # the log started over
            self.due_at = self._checkpoint_pages
        self.pages = pages
        return apsw.SQLITE_OK

    def checkpoint(self, conn: apsw.Connection) -> None:
        """After a commit that grew the log: a checkpoint in the background, or here.

        Called by the connection's holder, so the log's size it reads is current.
        """
        pages = self.pages
        assert self.checkpointer is not None
        if pages >= self._inline_pages:
            try:
                conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            except apsw.BusyError:
                pass  # a checkpoint is under way (ours, or another process's): try next time
            except apsw.Error as exc:  # the commit stands; the next one tries again
                log.warning("checkpoint of the write-ahead log failed: %s", exc)
            # If it caught up, the next write starts the log over; if not, the next commit
            # past the threshold tries again.
            self.due_at = self._checkpoint_pages
            return
        self.due_at = min(pages + self._checkpoint_pages, self._inline_pages)
        self.checkpointer.request()

    def close(self) -> None:
        """Stop the background checkpoints (after one last one)."""
        if self.checkpointer is not None:
            self.checkpointer.close()


class Checkpointer:
    """A thread with a connection of its own that checkpoints the log when asked.

    Started at the first request. A ``PASSIVE`` checkpoint takes no lock a writer needs:
    it copies what is committed and leaves the rest to the next one. One that cannot run
    (another process checkpointing, a fault) is logged and left to the next request.
    """

    def __init__(self, conn: apsw.Connection) -> None:
        self._path = conn.filename
        self._vfs = conn.open_vfs
        self._wanted = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.checkpoints = 0
        """Checkpoints run, for tests."""

    def request(self) -> None:
        """Ask for a checkpoint soon (cheap; several requests may make one checkpoint)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="fermix-checkpointer", daemon=True
            )
            self._thread.start()
        self._wanted.set()

    def close(self) -> None:
        """Stop the thread after one last checkpoint, and close its connection."""
        self._closed = True
        self._wanted.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        try:
            conn = connect(self._path, vfs=self._vfs)
        except (apsw.Error, StorageError) as exc:
            log.warning("no background checkpoints: %s", exc)
            return
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                closed = self._closed  # a last checkpoint of everything committed, then out
                try:
                    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
                except apsw.Error as exc:
                    log.debug("background checkpoint not run: %s", exc)
                else:
                    self.checkpoints += 1
                if closed:
                    return
        finally:
            conn.close()


def in_wal_mode(conn: apsw.Connection) -> bool:
    mode = conn.execute("PRAGMA journal_mode").fetchall()[0][0]
    return str(mode).lower() == "wal"
