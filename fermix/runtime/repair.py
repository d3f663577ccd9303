"""Prompt files left behind by a process that stopped mid-way, and their repair (S1, C5).

A host killed between the commit of memory rows and the rebuild of their prompt files, or a
rebuild that failed on a disk fault, leaves USER.md and MEMORY.md (and their current
revisions) behind the rows; one killed inside :func:`~fermix.runtime.prompt_files.write_atomic`
leaves its temporary file. ``Memory.start`` calls :func:`repair` and
:func:`remove_orphan_temp_files` before serving, and the reviewer calls :func:`repair` on
its next run after a rebuild of its own failed.
"""

from __future__ import annotations

import time
from pathlib import Path

import apsw

from fermix.core import render
from fermix.core.render import FILES
from fermix.errors import UnsafePathSegmentError, WriteFailedError
from fermix.home import Home
from fermix.runtime import prompt_files
from fermix.storage import resources
from fermix.storage.connection import fetch_rows

TEMP_GRACE_S = 3600.0
"""Age past which a prompt file's temporary file is an orphan: a rebuild writes and renames
its temporary file within moments, so an older one belongs to a process that died."""


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _lags(conn: apsw.Connection, home: Home, agent_id: str, owner_id: str) -> bool:
    folder = prompt_files.prompt_dir(home, agent_id, owner_id)
    rows = prompt_files.load_rows(conn, agent_id, owner_id)
    rendered = render.render_files(rows, agent_id=agent_id, owner_id=owner_id)
    for spec, text in zip(FILES, rendered, strict=True):
        latest = resources.current(conn, agent_id, spec.name, owner_id=owner_id)
        rolled_back = latest is not None and latest.reason.startswith("rollback:")
        want = latest.content if latest is not None and rolled_back else text
        recorded = "" if latest is None else latest.content
        on_disk = _read(folder / spec.filename)
        missing_but_empty = on_disk is None and want == ""
        if recorded != want or (on_disk != want.encode("utf-8") and not missing_but_empty):
            return True
    return False


def stale(
    conn: apsw.Connection, home: Home, *, agent_id: str | None = None
) -> list[tuple[str, str]]:
    """The (agent, owner) pairs whose files or current revisions lag a render of their rows.

    A file that is its current revision, that revision a rollback, is the operator's choice
    (P2): it stays until the next rebuild, as it would have without a crash.
    """
    if agent_id is None:
        sql = "SELECT agent_id FROM memories UNION SELECT agent_id FROM resources"
        agents = [str(a) for (a,) in fetch_rows(conn, sql)]
    else:
        agents = [agent_id]
    found = []
    for agent in agents:
        for owner in prompt_files.owners_of(conn, agent):
            try:
                lags = _lags(conn, home, agent, owner)
            except UnsafePathSegmentError:
                continue  # ids that cannot name a folder have no prompt files
            if lags:
                found.append((agent, owner))
    return found


def repair(
    conn: apsw.Connection, home: Home, *, agent_id: str | None = None, reason: str = "repair"
) -> list[prompt_files.RebuildResult]:
    """Rebuild every pair :func:`stale` finds (of one agent when given).

    Raises :class:`~fermix.errors.WriteFailedError` when the files cannot be checked or
    rebuilt; nothing else.
    """
    try:
        pairs = stale(conn, home, agent_id=agent_id)
    except (apsw.Error, OSError) as exc:
        raise WriteFailedError(f"could not check the prompt files: {exc}") from exc
    return [prompt_files.rebuild(conn, home, a, o, reason=reason) for a, o in pairs]


def remove_orphan_temp_files(
    home: Home, *, older_than_s: float = TEMP_GRACE_S, now: float | None = None
) -> int:
    """Delete the temporary files of prompt-file writes older than ``older_than_s``.

    Younger ones may belong to another process writing right now. Returns how many went.
    """
    root = home.root / "memory"
    if not root.is_dir():
        return 0
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = 0
    for spec in FILES:
        for path in root.rglob(f".{spec.filename}.*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # another process's rename or cleanup got there first
    return removed
