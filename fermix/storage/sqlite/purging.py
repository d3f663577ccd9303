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

One more copy may sit beside the database: a server replicating it with Litestream
(:mod:`fermix.server.replica`) keeps the log's pages in LTX files of its own in
``.<name>-litestream/`` until they are compacted into the replica and its L0 retention passes
(seconds, as fermix configures it). A file written before the log was clean may hold a page
as it was; one written after holds only what came after (Litestream copies the log before a
truncate can cut it, or makes a snapshot of the database when it finds the log cut). So the
purge is clean only once no such file older than that moment (``since_ms``) is left.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import apsw

from fermix.clock import now_ms
from fermix.errors import StorageError
from fermix.storage.port import Purge
from fermix.storage.sqlite.connection import connect

WAIT_MS = 50
"""How long one checkpoint waits for readers (and keeps writers out) at most."""

ATTEMPTS = 20
"""Checkpoints tried before the purge says a reader holds the log back."""

BETWEEN_S = 0.05
"""The pause between two attempts, in which writers go on."""


LITESTREAM_DIR = ".{name}-litestream"
"""Where Litestream keeps its local LTX files for the database ``name``."""


def purge(path: Path, *, vfs: str | None = None, since_ms: int | None = None) -> Purge:
    """Checkpoint ``path``'s log and truncate it; clean once the log holds no frame and no
    Litestream file from before ``since_ms`` (default: the moment the log was clean) is
    left."""
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
                    return _beside(path, now_ms() if since_ms is None else since_ms)
                left = (
                    f"a reader holds the write-ahead log back ({copied} of {frames} frames copied)"
                )
            pause.wait(BETWEEN_S)
        return Purge(False, left)
    finally:
        conn.close()


def _beside(path: Path, since_ms: int) -> Purge:
    """Clean, unless Litestream's local files from before ``since_ms`` are left."""
    folder = path.parent / LITESTREAM_DIR.format(name=path.name)
    older = 0
    for file in folder.rglob("*.ltx"):
        try:
            if file.stat().st_mtime_ns <= since_ms * 1_000_000:
                older += 1
        except FileNotFoundError:
            continue  # removed by Litestream as we looked
    if older:
        left = (
            f"Litestream's local files ({older} in {folder.name}/) may hold a page from before"
            " the erasure until its L0 retention removes them"
        )
        return Purge(False, left, log_clean_at=since_ms)
    return Purge(True, log_clean_at=since_ms)


def _log_size(path: Path) -> int:
    try:
        return os.path.getsize(f"{path}-wal")
    except FileNotFoundError:
        return 0
