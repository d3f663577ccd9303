"""Rebuilds of prompt files deferred to a background thread, and the marker that tells (M6).

A shared row renders for every owner of its agent. After a review writes one, the
conversation's own owner (and the agent's default owner ``""``) are rebuilt at once and
every other owner later (:meth:`~fermix.runtime.prompt_files.PromptFiles.rebuild_for_rows`
with ``defer_shared``): queued for a background thread that rebuilds them one at a time.
Until the thread gets there, that owner's compose renders the rows in memory
(:meth:`~fermix.runtime.prompt_files.PromptFiles.texts`) and writes nothing: the rebuild,
its revisions and its files stay on this thread, off the host's path. A marker file per
agent (:data:`SHARED_MARK`) tells other processes that such rebuilds were queued, so their
next compose of an owner of that agent checks the files against the rows (and renders in
memory while they lag); a process that stopped before its thread finished leaves files that
lag, repaired at the next start (:meth:`~fermix.runtime.prompt_files.PromptFiles.repair`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from fermix.home import Home, set_private_file_mode
from fermix.runtime.prompt_files import disk

log = logging.getLogger(__name__)

SHARED_MARK = ".shared-rows"
"""The marker in ``memory/<agent_id>/`` replaced whenever rebuilds of that agent's owners
are queued (M6): a compose in any process then checks the owner's files against the rows."""

Pair = tuple[str, str]

FOLLOW = None
"""The reason of a queued job that rebuilds nothing: the files on disk follow the stored
revisions (a shared store, B2)."""


class DeferredRebuilds:
    """The prompt-file jobs queued for later, and the background thread that runs them one
    at a time through ``run`` (a rebuild, or :data:`FOLLOW`: on a shared store the files on
    disk brought to the stored revisions). A rebuild queued for a pair replaces its follow.
    """

    def __init__(self, home: Home, run: Callable[[Pair, str | None], None]) -> None:
        self.home = home
        self._run = run
        self._state = threading.Condition()
        self._later: dict[Pair, str | None] = {}
        """Jobs queued, oldest first, with their reason (:data:`FOLLOW`: no rebuild)."""
        self._running = 0
        self._rebuilding: dict[Pair, int] = {}
        """The pairs whose queued rebuild runs now, and how many run."""
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()

    def defer(self, pairs: Iterable[Pair], *, reason: str = "rebuild") -> int:
        """Queue rebuilds of ``pairs`` for the background thread; returns how many are new.

        Each agent's marker is replaced so that other processes check those owners' files
        on their next compose. A pair already queued keeps its place.
        """
        pairs = [p for p in pairs if has_files(*p)]
        fresh = self.queue(pairs, reason)
        for agent_id in sorted({a for a, _ in pairs}):
            try:
                _write_mark(disk.prompt_dir(self.home, agent_id))
            except OSError as exc:
                log.warning("marker of %s not written: %s", agent_id, exc)
        return fresh

    def queue(self, pairs: Iterable[Pair], reason: str | None) -> int:
        """Queue a job per pair for the background thread, writing nothing (what a compose
        may do); returns how many are new. A queued rebuild is never demoted to a follow."""
        with self._state:
            fresh = 0
            for pair in pairs:
                if pair not in self._later:
                    fresh += 1
                    self._later[pair] = reason
                elif reason is not None and self._later[pair] is None:
                    self._later[pair] = reason
        if fresh:
            self._start_thread()
        return fresh

    def pending(self, pair: Pair) -> bool:
        """Whether a rebuild of ``pair`` is queued or running here (its files may lag)."""
        with self._state:
            return self._later.get(pair, FOLLOW) is not None or pair in self._rebuilding

    @property
    def queued(self) -> int:
        """Jobs queued or running."""
        with self._state:
            return len(self._later) + self._running

    def settle(self) -> int:
        """Run every queued job on this thread, wait for the background thread's current
        one, and return how many this call ran."""
        ran = 0
        while True:
            with self._state:
                if not self._later:
                    self._state.wait_for(lambda: self._running == 0)
                    return ran
                pair, reason = self._take()
            self._run_queued(pair, reason)
            ran += 1

    def take_failed_agents(self) -> set[str]:
        """The agents whose queued rebuild failed since the last call (for a repair)."""
        with self._state:
            failed, self._failed = self._failed, set()
        return failed

    def _start_thread(self) -> None:
        with self._state:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._drain, name="fermix-prompt-files", daemon=True
            )
            self._thread.start()

    def _drain(self) -> None:
        """The background thread: run queued jobs, one at a time, until none is left."""
        while True:
            with self._state:
                if not self._later:
                    self._thread = None
                    return
                pair, reason = self._take()
            self._run_queued(pair, reason)

    def _take(self) -> tuple[Pair, str | None]:
        """The oldest queued job, now counted as running (``_state`` held)."""
        pair, reason = next(iter(self._later.items()))
        del self._later[pair]
        self._running += 1
        if reason is not None:
            self._rebuilding[pair] = self._rebuilding.get(pair, 0) + 1
        return pair, reason

    def _run_queued(self, pair: Pair, reason: str | None) -> None:
        """Run one taken job; a failure is logged and left to a repair, never raised."""
        try:
            self._run(pair, reason)
        except Exception as exc:  # noqa: BLE001 - a background rebuild must not die: S1
            log.warning("prompt files of %s/%r not rebuilt, left to a repair: %s", *pair, exc)
            with self._state:
                self._failed.add(pair[0])
        finally:
            with self._state:
                self._running -= 1
                if reason is not None:
                    self._rebuilding[pair] -= 1
                    if not self._rebuilding[pair]:
                        del self._rebuilding[pair]
                self._state.notify_all()


def read_mark(folder: Path) -> bytes | None:
    """The content of ``folder``'s :data:`SHARED_MARK`, or None when it has none."""
    return disk.read_bytes(folder / SHARED_MARK)


def _write_mark(folder: Path) -> None:
    """Replace ``folder``'s :data:`SHARED_MARK` with new content (temp file and rename, not
    fsynced: a lost marker only means a compose reads files the next start repairs)."""
    disk.make_private_dir(folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{SHARED_MARK}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            set_private_file_mode(fh.fileno())
            fh.write(uuid.uuid4().hex.encode())
        os.replace(tmp, folder / SHARED_MARK)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def has_files(agent_id: str, owner_id: str) -> bool:
    """Whether ``agent_id`` and ``owner_id`` can name a folder of prompt files; a warning
    when they cannot (:func:`~fermix.runtime.prompt_files.disk.has_files`)."""
    if disk.has_files(agent_id, owner_id):
        return True
    log.warning("no prompt files for agent %r, owner %r: unsafe ids", agent_id, owner_id)
    return False
