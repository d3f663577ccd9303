"""SQLite's :meth:`~fermix.storage.port.Storage.purge` (F3): the write-ahead log copied back
and truncated, so that no frame of it keeps a page as it was before a delete.

Deleted content leaves the database file as it goes: every connection runs with ``PRAGMA
secure_delete`` (a freed cell, page or overflow chain is overwritten with zeros) and the
full-text indexes with FTS5's ``secure-delete`` (a deleted row's terms leave the index
segments at once, instead of staying until a merge). What is left is the log: the frames
written before the delete still hold the old pages until a ``TRUNCATE`` checkpoint has
copied the log back and cut it to nothing. That checkpoint waits for every reader to be
reading the newest state and keeps writers out meanwhile; so it waits only a little
(:data:`WAIT_MS`), a few times, letting writers in between. A reader of another process that
holds an old snapshot longer makes the purge not clean: the erasure stays ``pending`` and is
settled by a later purge.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import apsw

from fermix.errors import StorageError
from fermix.storage.port import Purge
from fermix.storage.sqlite.connection import connect

WAIT_MS = 50
"""How long one checkpoint waits for readers (and keeps writers out) at most."""

ATTEMPTS = 20
"""Checkpoints tried before the purge says a reader holds the log back."""

BETWEEN_S = 0.05
"""The pause between two attempts, in which writers go on."""


def purge(path: Path, *, vfs: str | None = None) -> Purge:
    """Checkpoint ``path``'s log and truncate it; clean once the log holds no frame."""
    try:
        conn = connect(path, vfs=vfs)
    except (apsw.Error, StorageError) as exc:
        return Purge(False, f"the database could not be opened to checkpoint it: {exc}")
    pause = threading.Event()  # never set: a timed pause between attempts
    left = "a reader holds the write-ahead log back"
    try:
        conn.set_busy_timeout(WAIT_MS)
        for _ in range(ATTEMPTS):
            try:
                frames, copied = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
            except apsw.BusyError:
                pass
            except apsw.Error as exc:
                return Purge(False, f"the write-ahead log could not be checkpointed: {exc}")
            else:
                if frames == 0 and _log_size(path) == 0:
                    return Purge(True)
                left = (
                    f"a reader holds the write-ahead log back ({copied} of {frames} frames copied)"
                )
            pause.wait(BETWEEN_S)
        return Purge(False, left)
    finally:
        conn.close()


def _log_size(path: Path) -> int:
    try:
        return os.path.getsize(f"{path}-wal")
    except FileNotFoundError:
        return 0
