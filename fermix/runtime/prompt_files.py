"""USER.md and MEMORY.md on disk, and their revisions (C5, P2).

The files are derived artifacts (S1): :func:`rebuild` renders them from the rows in SQLite,
writes a file only when its bytes change, and records a revision of resource ``user_md``
or ``memory_md`` only when the content changes. The revisions are recorded and the files
replaced inside one write transaction, from rows that are known to be current under that
transaction's lock, so two processes rebuilding at once cannot leave a file or a revision
behind the rows. A fault that can pass is retried; one that persists is a
:class:`~fermix.errors.WriteFailedError`, and the files are left for
:func:`fermix.runtime.repair.repair`.

Layout: ``memory/<agent_id>/USER.md`` and ``MEMORY.md`` for the single-user default owner
``""``; ``memory/<agent_id>/owners/<owner_id>/...`` for every other owner, so one user's
facts never reach another user's prompt. Both ids must be safe path segments
(:class:`~fermix.errors.UnsafePathSegmentError`, raised before anything is touched).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import apsw

from fermix import model, validate
from fermix.core import categories, render
from fermix.core.render import FILES, FileSpec, file_spec
from fermix.errors import UnsafePathSegmentError, WriteFailedError
from fermix.home import Home
from fermix.model import MemoryRow, Revision
from fermix.storage import memories, resources, transaction
from fermix.storage.connection import fetch_rows
from fermix.storage.retry import retrying

OWNERS_DIR = "owners"

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FileResult:
    """What a rebuild or rollback did to one file."""

    name: str
    path: Path
    content: str
    written: bool
    """Whether the file's bytes on disk changed."""
    revision: Revision | None
    """The revision recorded, or None when the content equals the current revision."""


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What :func:`rebuild` did to both files of one agent and owner."""

    agent_id: str
    owner_id: str
    user_md: FileResult
    memory_md: FileResult

    @property
    def files(self) -> tuple[FileResult, FileResult]:
        """Both file results, USER.md first."""
        return (self.user_md, self.memory_md)

    @property
    def changed(self) -> bool:
        """Whether a file was written or a revision recorded."""
        return any(f.written or f.revision is not None for f in self.files)


def _check_ids(agent_id: str, owner_id: str) -> None:
    validate.path_segment("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)


def owner_segment(owner_id: str) -> str:
    """The directory name of ``owner_id``'s prompt files.

    A safe id is used as it is. Any other id a host may use (``telegram:42``, an e-mail
    with a space, non-ASCII names) becomes ``_`` and a digest of it: safe ids never start
    with ``_``, so the two kinds cannot collide, and no owner id can name a path outside.
    """
    try:
        return validate.path_segment("owner_id", owner_id)
    except UnsafePathSegmentError:
        return "_" + hashlib.sha256(owner_id.encode("utf-8")).hexdigest()[:32]


def _has_files(agent_id: str, owner_id: str) -> bool:
    """Whether both ids are safe path segments; logs why not when they are not."""
    try:
        _check_ids(agent_id, owner_id)
    except UnsafePathSegmentError as exc:
        _log.warning("no prompt files for agent %r, owner %r: %s", agent_id, owner_id, exc)
        return False
    return True


def prompt_dir(home: Home, agent_id: str, owner_id: str = "") -> Path:
    """The directory of ``agent_id``'s prompt files for ``owner_id``; unsafe ids are refused."""
    _check_ids(agent_id, owner_id)
    base = home.agent_dir(agent_id)
    return base if owner_id == "" else base / OWNERS_DIR / owner_segment(owner_id)


def paths(home: Home, agent_id: str, owner_id: str = "") -> tuple[Path, Path]:
    """The paths of USER.md and MEMORY.md of ``agent_id`` for ``owner_id``."""
    folder = prompt_dir(home, agent_id, owner_id)
    return (folder / FILES[0].filename, folder / FILES[1].filename)


def file_path(home: Home, agent_id: str, name: str, owner_id: str = "") -> Path:
    """The path of resource ``name`` (``user_md`` or ``memory_md``)."""
    spec = file_spec(model.check_resource_name(name))
    return prompt_dir(home, agent_id, owner_id) / spec.filename


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader sees the old or the new file, never half.

    The text goes to a temporary file in the same directory, which is fsynced, renamed over
    ``path`` with :func:`os.replace`, and the directory is fsynced so the rename is durable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_files(home: Home, agent_id: str, owner_id: str = "") -> tuple[str, str]:
    """The text of USER.md and MEMORY.md (``""`` for a missing file)."""
    folder = prompt_dir(home, agent_id, owner_id)
    texts = []
    for spec in FILES:
        data = _read(folder / spec.filename)
        texts.append("" if data is None else data.decode("utf-8", "replace"))
    return texts[0], texts[1]


def load_rows(conn: apsw.Connection, agent_id: str, owner_id: str = "") -> list[MemoryRow]:
    """The rows that may render for ``agent_id`` and ``owner_id``: each section's newest.

    Each :func:`~fermix.core.categories.render_queries` filter is read with its section's
    cap as the limit; when rows that show nothing (no ``promote_target``, or a value of
    invisible characters only) crowd the first page, the limit grows until the section is
    full or the rows run out.
    """
    picked: list[MemoryRow] = []
    for query in categories.render_queries(agent_id, owner_id):
        cap = file_spec(query.target).cap(query.category)
        limit = cap
        while True:
            rows = memories.list_rows(conn, **query.filters(), limit=limit)
            fits = [r for r in rows if categories.renders(r, agent_id=agent_id, owner_id=owner_id)]
            shown = sum(1 for r in fits if render.render_value(r.value))
            if shown >= cap or len(rows) < limit:
                break
            limit *= 4
        picked += fits
    return picked


def _apply(
    conn: apsw.Connection,
    folder: Path,
    spec: FileSpec,
    content: str,
    *,
    agent_id: str,
    owner_id: str,
    reason: str,
) -> FileResult:
    """Record a revision if the content changed, then write the file if its bytes changed."""
    path = folder / spec.filename
    latest = resources.current(conn, agent_id, spec.name, owner_id=owner_id)
    revision = None
    if latest is not None or content != "":
        revision = resources.record(
            conn, agent_id, spec.name, content, reason=reason, owner_id=owner_id
        )
    data = content.encode("utf-8")
    on_disk = _read(path)
    written = on_disk != data and not (on_disk is None and content == "")
    if written:
        write_atomic(path, content)
    return FileResult(spec.name, path, content, written, revision)


def rebuild(
    conn: apsw.Connection,
    home: Home,
    agent_id: str,
    owner_id: str = "",
    *,
    reason: str = "rebuild",
) -> RebuildResult:
    """Render both prompt files of ``agent_id`` for ``owner_id`` from SQLite (C5, P2).

    Rebuilding from unchanged rows changes neither the files nor the revisions; a file
    that was edited or rolled back on disk is written again with the rendered content.
    Call it after the write transaction that changed the rows has committed.
    """
    folder = prompt_dir(home, agent_id, owner_id)
    try:
        # Idempotent (render, record if changed, write if changed), so a fault that can
        # pass is simply retried; a persistent one is typed, and nothing of it committed.
        result: RebuildResult = retrying()(_rebuild_once, conn, folder, agent_id, owner_id, reason)
    except (apsw.Error, OSError) as exc:
        raise WriteFailedError(
            f"prompt files of agent {agent_id!r}, owner {owner_id!r} not rebuilt: {exc}"
        ) from exc
    return result


def _rebuild_once(
    conn: apsw.Connection, folder: Path, agent_id: str, owner_id: str, reason: str
) -> RebuildResult:
    # Render before taking the write lock, so writers (appends on a turn's path) wait only
    # for the revisions and the file replacements; if any memory row changed meanwhile,
    # render again under the lock, where nothing can change.
    counter = memories.change_counter(conn)
    rendered = _render(conn, agent_id, owner_id)
    with transaction(conn):
        if memories.change_counter(conn) != counter:
            rendered = _render(conn, agent_id, owner_id)
        user, memory = (
            _apply(conn, folder, spec, text, agent_id=agent_id, owner_id=owner_id, reason=reason)
            for spec, text in zip(FILES, rendered, strict=True)
        )
    return RebuildResult(agent_id, owner_id, user, memory)


def _render(conn: apsw.Connection, agent_id: str, owner_id: str) -> render.RenderedFiles:
    rows = load_rows(conn, agent_id, owner_id)
    return render.render_files(rows, agent_id=agent_id, owner_id=owner_id)


def owners_of(conn: apsw.Connection, agent_id: str) -> list[str]:
    """Every owner of ``agent_id`` that has memory rows or prompt-file resources, ``""`` first."""
    found = {
        str(owner)
        for (owner,) in fetch_rows(
            conn,
            "SELECT owner_id FROM memories WHERE agent_id = ?"
            " UNION SELECT owner_id FROM resources WHERE agent_id = ?",
            (agent_id, agent_id),
        )
    }
    return ["", *sorted(found - {""})]


def rebuild_all_for_agent(
    conn: apsw.Connection, home: Home, agent_id: str, *, reason: str = "rebuild"
) -> list[RebuildResult]:
    """Rebuild the prompt files of every owner of ``agent_id``.

    An owner whose id is not a safe path segment has no prompt files: it is skipped with a
    warning, so it cannot hold back every other owner's rebuild.
    """
    validate.path_segment("agent_id", agent_id)
    return [
        rebuild(conn, home, agent_id, owner_id, reason=reason)
        for owner_id in owners_of(conn, agent_id)
        if _has_files(agent_id, owner_id)
    ]


def rebuild_for_rows(
    conn: apsw.Connection, home: Home, rows: Iterable[MemoryRow], *, reason: str = "rebuild"
) -> list[RebuildResult]:
    """Rebuild every prompt file the written ``rows`` may show in (after a write, C5).

    A shared agent-scoped row (owner ``""``) renders for every owner of its agent, so its
    agent is rebuilt for all owners; any other row only for its own agent and owner. Rows
    are taken as they are now or were before the write: archived rows count too, since
    archiving one must take it out of the files. Ids that cannot name a directory are
    skipped with a warning: they have no prompt files to rebuild.
    """
    everyone: set[str] = set()
    single: set[tuple[str, str]] = set()
    for row in rows:
        live = row if not row.archived else _as_live(row)
        if categories.shared_across_owners(live):
            everyone.add(row.agent_id)
        elif categories.render_target(live) is not None:
            single.add((row.agent_id, row.owner_id))
    results = []
    for agent_id in sorted(everyone):
        if _has_files(agent_id, ""):
            results += rebuild_all_for_agent(conn, home, agent_id, reason=reason)
    for agent_id, owner_id in sorted(single):
        if agent_id not in everyone and _has_files(agent_id, owner_id):
            results.append(rebuild(conn, home, agent_id, owner_id, reason=reason))
    return results


def _as_live(row: MemoryRow) -> MemoryRow:
    return replace(row, archived_at=None, archived_by=None, archive_reason=None)


def rollback(
    conn: apsw.Connection,
    home: Home,
    agent_id: str,
    name: str,
    revision: int,
    owner_id: str = "",
) -> FileResult:
    """Write revision ``revision`` of ``name`` back to its file and record it (P2).

    The new revision's reason is ``rollback:N``. The file stays a derived artifact: the
    next rebuild from unchanged rows writes the rendered content again.
    """
    folder = prompt_dir(home, agent_id, owner_id)
    spec = file_spec(model.check_resource_name(name))
    with transaction(conn):
        old = resources.get_revision(conn, agent_id, spec.name, revision, owner_id=owner_id)
        return _apply(
            conn,
            folder,
            spec,
            old.content,
            agent_id=agent_id,
            owner_id=owner_id,
            reason=f"rollback:{revision}",
        )
