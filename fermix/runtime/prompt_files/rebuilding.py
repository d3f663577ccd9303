"""``PromptFiles``: USER.md and MEMORY.md rendered from SQLite, and their revisions (C5, P2).

The files are derived artifacts (S1). A rebuild of one agent and owner renders the rows,
records a revision of resource ``user_md`` or ``memory_md`` when a file's content changes
(one write unit through the process's writer, re-rendered under the write lock if a memory
row changed meanwhile), and only then, outside the database's write lock, replaces the files
whose bytes differ (M6). The pair's lock (:class:`~.disk.PairLocks`) orders rebuilds of
the same files across threads and processes, so a file never goes back to an
older rendering. A fault that can pass is retried; one that persists is a
:class:`~fermix.errors.WriteFailedError`, and :meth:`PromptFiles.repair` renders the files
again later.

On a shared store (PostgreSQL, B2) the stored revisions are the files: a compose serves
the pair's current revisions (:mod:`~fermix.runtime.prompt_files.shared_store`), so every service
composes the same prompt, and a rebuild takes the pair's lock in the store
(``Writes.lock_owner``) before it renders, inside its write unit, so a revision never goes
back to older rows whichever service records it.

A shared row renders for every owner of its agent. After a review writes one, the
conversation's own owner (and the agent's default owner ``""``) are rebuilt at once and
every other owner later (M6, :meth:`PromptFiles.rebuild_for_rows` with ``defer_shared``):
:mod:`~fermix.runtime.prompt_files.deferred` queues those rebuilds for a background thread and marks
the agent for other processes.

Reading is pure (P1, :meth:`PromptFiles.texts`): a compose never commits, fsyncs or writes a
file. Where the files lag the rows it serves the rows rendered in memory, once per version
of the rows; the rebuild, its revision and its files stay on the writer's side.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import tenacity

from fermix import validate
from fermix.core import categories, render
from fermix.core.render import FILES, FileSpec, RenderedFiles
from fermix.errors import WriteFailedError
from fermix.home import Home
from fermix.model import MemoryRow, Revision, check_resource_name
from fermix.runtime.prompt_files import disk
from fermix.runtime.prompt_files.deferred import (
    FOLLOW,
    DeferredRebuilds,
    Pair,
    has_files,
    read_mark,
)
from fermix.runtime.prompt_files.rendering import render_pair
from fermix.runtime.prompt_files.shared_store import StoredRevisions
from fermix.storage import Reads, Storage, Writes

log = logging.getLogger(__name__)

FILE_ATTEMPTS = 3
"""Attempts at replacing a file before a rebuild gives up (a disk hiccup can pass)."""

_UNSEEN = object()


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
    """What a rebuild did to both files of one agent and owner."""

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


class PromptFiles:
    """The prompt files of one home: rebuilt through the process's one writer, read purely."""

    def __init__(self, home: Home, db: Storage) -> None:
        self.home = home
        self._db = db
        self._locks = disk.PairLocks()
        self._cache = disk.FileCache()
        self._deferred = DeferredRebuilds(home, self._run)
        self._lock = threading.Lock()
        self._seen: dict[Pair, object] = {}
        """Each pair composed, and the agent's marker when its files were last checked."""
        self._renders: dict[Pair, tuple[int, RenderedFiles]] = {}
        """Renders served while a pair's files lag, by the rows' version (never written)."""
        self._stored = StoredRevisions() if db.shared else None
        """On a shared store, the revisions served (B2); None: the files on disk are."""

    # -- the rebuilds deferred (M6) ---------------------------------------------------

    def defer(self, pairs: Iterable[Pair], *, reason: str = "rebuild") -> int:
        """Queue rebuilds of ``pairs`` for the background thread and mark their agents for
        other processes; returns how many are new (:meth:`DeferredRebuilds.defer`)."""
        return self._deferred.defer(pairs, reason=reason)

    def pending(self, pair: Pair) -> bool:
        """Whether a rebuild of ``pair`` is queued or running here (its files may lag)."""
        return self._deferred.pending(pair)

    @property
    def queued(self) -> int:
        """Prompt-file jobs queued or running on the background thread."""
        return self._deferred.queued

    def settle(self) -> int:
        """Run every queued job on this thread and wait for the background thread's
        current one; returns how many this call ran."""
        return self._deferred.settle()

    def take_failed_agents(self) -> set[str]:
        """The agents whose queued rebuild failed since the last call (for a repair)."""
        return self._deferred.take_failed_agents()

    # -- reading ----------------------------------------------------------------------

    def texts(self, agent_id: str, owner_id: str = "") -> tuple[str, str]:
        """The current USER.md and MEMORY.md of ``agent_id`` for ``owner_id`` (P1).

        A pure read: it never commits, fsyncs or writes a file; at most it queues a rebuild
        for the background thread. Where the files on disk lag the rows, it renders the
        rows in memory (once per version of the rows) and serves that: for an owner whose
        rebuild is queued here (M6), an owner seen for the first time with no files (a new
        guest must still see the agent's shared rows), and an owner whose files lag after
        another process queued rebuilds of this agent (its marker changed). Otherwise the
        files are read through the cache, with no database read. On a shared store, the
        pair's current revisions are served instead (B2).
        """
        disk.check_ids(agent_id, owner_id)
        if self._stored is not None:
            return self._stored_texts(agent_id, owner_id, self._stored)
        mark = read_mark(disk.prompt_dir(self.home, agent_id))
        pair = (agent_id, owner_id)
        if self.pending(pair):
            return self._rendered(pair)
        with self._lock:
            seen = self._seen.get(pair, _UNSEEN)
        if seen is _UNSEEN and not any(
            p.exists() for p in disk.paths(self.home, agent_id, owner_id)
        ):
            with self._lock:
                self._seen[pair] = mark
            self._deferred.queue([pair], "rebuild")
            return self._rendered(pair)
        if seen != mark and mark is not None:
            lagging = self._lagging(pair)
            if lagging is not None:
                return lagging  # checked again next time, until the files catch up
        with self._lock:
            self._seen[pair] = mark
        return self._cache.texts(self.home, agent_id, owner_id)

    def _stored_texts(
        self, agent_id: str, owner_id: str, stored: StoredRevisions
    ) -> tuple[str, str]:
        """:meth:`texts` on a shared store: the pair's current revisions, one read by key
        (B2). An owner no service has rendered yet is rendered in memory, as on SQLite, and
        the files on disk follow on the background thread."""
        pair = (agent_id, owner_id)
        if self.pending(pair):
            return self._rendered(pair)
        with self._lock:
            seen = pair in self._seen
        with self._db.read() as reads:
            user, memory = stored.current(reads, agent_id, owner_id)
        with self._lock:
            self._seen[pair] = None
        if not seen and user[0] == memory[0] == 0:
            self._deferred.queue([pair], "rebuild")
            return self._rendered(pair)
        if stored.lags_on_disk(self.home, pair, (user, memory)):
            self._deferred.queue([pair], FOLLOW)
        return user[1], memory[1]

    def _rendered(self, pair: Pair) -> RenderedFiles:
        """Both files of ``pair`` rendered from the rows now, in memory: one read of the
        rows' version, and a render only when it moved since the last."""
        with self._db.read() as reads:
            version = reads.memory_version(*pair)
            with self._lock:
                known = self._renders.get(pair)
            if known is not None and known[0] == version:
                return known[1]
            rendered = render_pair(reads, *pair)
        with self._lock:
            self._renders[pair] = (version, rendered)
        return rendered

    def _lagging(self, pair: Pair) -> RenderedFiles | None:
        """The rendering of ``pair``'s rows when its files lag them, else None."""
        rendered = self._rendered(pair)
        with self._db.read() as reads:
            if self._lags(reads, *pair, rendered):
                return rendered
        with self._lock:
            self._renders.pop(pair, None)
        return None

    def _run(self, pair: Pair, reason: str | None) -> None:
        """One queued job of :class:`~.deferred.DeferredRebuilds`, on its background thread:
        a rebuild, or on a shared store the files on disk brought to the current revisions."""
        try:
            if reason is not None:
                self.rebuild(*pair, reason=reason)
            elif self._stored is not None:
                with self._db.read() as reads:
                    current = self._stored.current(reads, *pair)
                self._stored.follow_on_disk(self.home, self._locks, pair, current)
        finally:
            with self._lock:
                self._renders.pop(pair, None)

    # -- rebuilding -------------------------------------------------------------------

    def rebuild(
        self, agent_id: str, owner_id: str = "", *, reason: str = "rebuild"
    ) -> RebuildResult:
        """Render both prompt files of ``agent_id`` for ``owner_id`` from the store (C5, P2).

        Rebuilding from unchanged rows changes neither the files nor the revisions; a file
        that was edited or rolled back on disk is written again with the rendered content.
        """
        folder = disk.prompt_dir(self.home, agent_id, owner_id)
        with self._locks.hold(folder):
            rendered: RenderedFiles | None = None
            version = 0
            if self._stored is None:  # SQLite: rendered outside the write lock
                with self._db.read() as reads:
                    version = reads.memory_version(agent_id, owner_id)
                    rendered = render_pair(reads, agent_id, owner_id)

            def record(writes: Writes) -> list[tuple[str, Revision | None, int]]:
                # First the pair's lock: on a shared store each statement after it sees
                # every commit made before it, so this rendering is never older than the
                # revision recorded last, by any service (SQLite: its one writer).
                writes.lock_owner(agent_id, owner_id)
                texts = rendered
                if texts is None or writes.memory_version(agent_id, owner_id) != version:
                    texts = render_pair(writes, agent_id, owner_id)
                return [
                    (text, *_record(writes, agent_id, owner_id, spec, text, reason))
                    for spec, text in zip(FILES, texts, strict=True)
                ]

            recorded = self._db.write(record, label=f"prompt files of {agent_id}")
            # Written after the commit, outside the database's write lock (M6).
            user, memory = (
                self._replace_current((agent_id, owner_id), spec, text, revision, number)
                for spec, (text, revision, number) in zip(FILES, recorded, strict=True)
            )
        return RebuildResult(agent_id, owner_id, user, memory)

    def rebuild_agent(self, agent_id: str, *, reason: str = "rebuild") -> list[RebuildResult]:
        """Rebuild the prompt files of every owner of ``agent_id``.

        An owner whose id cannot name a folder has no prompt files: it is skipped with a
        warning, so it cannot hold back every other owner's rebuild.
        """
        validate.path_segment("agent_id", agent_id)
        with self._db.read() as reads:
            owners = reads.memory_owners(agent_id)
        return [
            self.rebuild(agent_id, owner_id, reason=reason)
            for owner_id in owners
            if has_files(agent_id, owner_id)
        ]

    def rebuild_for_rows(
        self,
        rows: Iterable[MemoryRow],
        *,
        reason: str = "rebuild",
        also: Iterable[tuple[str, str]] = (),
        defer_shared: bool = False,
    ) -> list[RebuildResult]:
        """Rebuild every prompt file the written ``rows`` may show in (after a write, C5).

        A shared agent-scoped row (owner ``""``) renders for every owner of its agent, so
        its agent is rebuilt for all owners; any other row only for its own agent and
        owner. Rows count as they are now or were before the write: archiving one must take
        it out of the files. ``also`` names more (agent, owner) pairs to rebuild when any
        row was written (a conversation's owner who has no files yet).

        ``defer_shared`` (M6): of a shared row's agent, only the owner ``""`` and the pairs
        rebuilt anyway (``also``, owners of the other rows) are rebuilt now; every other
        owner's rebuild is queued (:meth:`defer`). The results are those done now.
        """
        rows = list(rows)
        everyone: set[str] = set()
        single: set[tuple[str, str]] = set()
        for row in rows:
            live = row if not row.archived else _as_live(row)
            if categories.shared_across_owners(live):
                everyone.add(row.agent_id)
            elif categories.render_target(live) is not None:
                single.add((row.agent_id, row.owner_id))
        if rows:
            single.update(also)
        results = []
        later: list[Pair] = []
        for agent_id in sorted(everyone):
            if not has_files(agent_id, ""):
                continue
            if not defer_shared:
                results += self.rebuild_agent(agent_id, reason=reason)
                continue
            single.add((agent_id, ""))
            with self._db.read() as reads:
                owners = reads.memory_owners(agent_id)
            later += [(agent_id, o) for o in owners if (agent_id, o) not in single]
        done = {(r.agent_id, r.owner_id) for r in results}
        for agent_id, owner_id in sorted(single - done):
            if has_files(agent_id, owner_id):
                results.append(self.rebuild(agent_id, owner_id, reason=reason))
        if later:
            self.defer(later, reason=reason)
        return results

    def rollback(self, agent_id: str, name: str, revision: int, owner_id: str = "") -> FileResult:
        """Write revision ``revision`` of ``name`` back to its file and record it (P2).

        The new revision's reason is ``rollback:N``. The file stays a derived artifact: the
        next rebuild from unchanged rows writes the rendered content again.
        """
        folder = disk.prompt_dir(self.home, agent_id, owner_id)
        spec = render.file_spec(check_resource_name(name))
        with self._locks.hold(folder):

            def record(writes: Writes) -> tuple[str, Revision | None, int]:
                writes.lock_owner(agent_id, owner_id)  # one rebuild or rollback at a time
                old = writes.revision(agent_id, spec.name, revision, owner_id=owner_id)
                reason = f"rollback:{revision}"
                return old.content, *_record(writes, agent_id, owner_id, spec, old.content, reason)

            content, recorded, number = self._db.write(record, label=f"rollback of {agent_id}")
            return self._replace_current((agent_id, owner_id), spec, content, recorded, number)

    # -- staleness and repair ---------------------------------------------------------

    def stale(self, *, agent_id: str | None = None) -> list[tuple[str, str]]:
        """The (agent, owner) pairs whose files or current revisions lag their rows.

        One rule for every caller (:func:`~fermix.core.render.file_lags`): a file that is
        its current revision, that revision a rollback, is the operator's choice (P2).
        """
        found = []
        with self._db.read() as reads:
            agents = reads.memory_agents() if agent_id is None else [agent_id]
            for agent in agents:
                for owner in reads.memory_owners(agent):
                    if has_files(agent, owner) and self._lags(reads, agent, owner):
                        found.append((agent, owner))
        return found

    def _lags(
        self, reads: Reads, agent_id: str, owner_id: str, rendered: RenderedFiles | None = None
    ) -> bool:
        folder = disk.prompt_dir(self.home, agent_id, owner_id)
        if rendered is None:
            rendered = render_pair(reads, agent_id, owner_id)
        for spec, text in zip(FILES, rendered, strict=True):
            current = reads.current_revision(agent_id, spec.name, owner_id=owner_id)
            if self._stored is None:
                on_disk = disk.read_bytes(folder / spec.filename)
            else:  # the files on disk are a cache: the stored revision is the file
                on_disk = None if current is None else current.content.encode("utf-8")
            if render.file_lags(text, current, on_disk):
                return True
        return False

    def repair(self, *, agent_id: str | None = None, reason: str = "repair") -> list[RebuildResult]:
        """Rebuild every pair :meth:`stale` finds (of one agent when given).

        Raises :class:`~fermix.errors.WriteFailedError` when the files cannot be checked or
        rebuilt; nothing else.
        """
        try:
            pairs = self.stale(agent_id=agent_id)
        except OSError as exc:
            raise WriteFailedError(f"could not check the prompt files: {exc}") from exc
        return [self.rebuild(a, o, reason=reason) for a, o in pairs]

    def remove_owner(self, owner_id: str, *, agent_id: str | None = None) -> int:
        """Delete ``owner_id``'s prompt files of ``agent_id`` (of every agent: None), their
        folder and what this process cached of them (F1); returns how many files went.

        Only the files: their resources and revisions are the erasure's, in the store."""
        agents = [agent_id] if agent_id is not None else _folders(self.home.memory_dir)
        removed = 0
        for agent in agents:
            if not has_files(agent, owner_id):
                continue
            folder = disk.prompt_dir(self.home, agent, owner_id)
            with self._locks.hold(folder):
                removed += disk.remove_folder(folder)
            with self._lock:
                self._seen.pop((agent, owner_id), None)
                self._renders.pop((agent, owner_id), None)
            if self._stored is not None:
                self._stored.drop(agent, owner_id)
        return removed

    def remove_orphan_temp_files(self) -> int:
        """Delete temporary files that killed writes left behind; returns how many."""
        return disk.remove_orphan_temp_files(self.home)

    # -- files on disk ----------------------------------------------------------------

    def _replace_current(
        self, pair: Pair, spec: FileSpec, content: str, revision: Revision | None, number: int
    ) -> FileResult:
        """:meth:`_replace` of the file ``spec`` of ``pair`` with ``content``, its current
        revision ``number`` (on a shared store, remembered as the one to serve)."""
        path = disk.prompt_dir(self.home, *pair) / spec.filename
        result = self._replace(path, spec.name, content, revision)
        if self._stored is not None:
            self._stored.remember(*pair, spec.name, number, content)
            self._stored.wrote(path, number)
        return result

    def _replace(
        self, path: Path, name: str, content: str, revision: Revision | None
    ) -> FileResult:
        """Write ``content`` to ``path`` if its bytes differ; a fault that can pass is
        retried, one that persists is a :class:`~fermix.errors.WriteFailedError`."""
        data = content.encode("utf-8")

        def replace_if_changed() -> bool:
            on_disk = disk.read_bytes(path)
            if on_disk == data or (on_disk is None and content == ""):
                return False
            disk.write_atomic(path, content)
            return True

        try:
            written = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(OSError),
                stop=tenacity.stop_after_attempt(FILE_ATTEMPTS),
                wait=tenacity.wait_random_exponential(multiplier=0.01, max=0.1),
                reraise=True,
            )(replace_if_changed)
        except OSError as exc:
            raise WriteFailedError(f"prompt file {path.name} not written: {exc}") from exc
        return FileResult(name, path, content, written, revision)


def _record(
    writes: Writes, agent_id: str, owner_id: str, spec: FileSpec, content: str, reason: str
) -> tuple[Revision | None, int]:
    """Record ``content`` as the next revision of ``spec`` unless nothing would change;
    the revision recorded (None: none) and the number of the current one then (0: none)."""
    latest = writes.current_revision(agent_id, spec.name, owner_id=owner_id)
    number = 0 if latest is None else latest.revision
    if latest is None and content == "":
        return None, number
    recorded = writes.record_revision(
        agent_id, spec.name, content, reason=reason, owner_id=owner_id
    )
    return recorded, number if recorded is None else recorded.revision


def _as_live(row: MemoryRow) -> MemoryRow:
    return replace(row, archived_at=None, archived_by=None, archive_reason=None)


def _folders(root: Path) -> list[str]:
    """The agents with a folder of prompt files under ``root``."""
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir() and has_files(p.name, ""))
    except FileNotFoundError:
        return []
