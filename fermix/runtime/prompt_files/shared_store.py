"""Prompt files on a shared store (B2): the stored revisions are the files, those on disk a
cache.

Several services, each with its own home, compose from one PostgreSQL store. A file on
disk says nothing of a rebuild another service made, so a compose reads the pair's current
revision numbers (by the resources' key) and serves each revision's content, read once per
number: a revision never changes, and its number only grows. The files on disk follow the
revisions this process sees, on the background thread and never going back to an older one;
a compose writes nothing.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from fermix.core.render import FILES
from fermix.home import Home
from fermix.runtime.prompt_files import disk
from fermix.storage import Reads

log = logging.getLogger(__name__)

Current = tuple[int, str]
"""A file's current revision number (0: none yet) and content (``""`` without one)."""


class StoredRevisions:
    """The current revision of each prompt file this process has read or recorded, by
    number, and the revision each file on disk holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._texts: dict[tuple[str, str, str], Current] = {}
        self._resources: dict[tuple[str, str, str], int | None] = {}
        """The resource each cached text is of: one erased and made again is another."""
        self._on_disk: dict[Path, int] = {}

    def current(self, reads: Reads, agent_id: str, owner_id: str) -> tuple[Current, Current]:
        """USER.md's and MEMORY.md's current revision in the store: two reads by key, and a
        revision's content only the first time its number is seen.

        A resource erased (F4), by any service, is no longer served: what is cached is of
        the resource it was read from, and a resource made again since starts over."""
        found = []
        for spec in FILES:
            resource = reads.resource(agent_id, spec.name, owner_id=owner_id)
            number = 0 if resource is None else resource.current_revision
            key = (agent_id, owner_id, spec.name)
            resource_id = None if resource is None else resource.id
            with self._lock:
                known = self._resources.get(key, -1)
                self._resources[key] = resource_id
                # Erased (or erased and made again, rare): what was cached is not served.
                erased = resource is None or known not in (-1, resource_id)
                if erased and self._texts.pop(key, None) is not None:
                    self._on_disk.clear()  # every file is checked again
                cached = self._texts.get(key)
            if cached is None or cached[0] < number:
                content = ""
                if number:
                    content = reads.revision(agent_id, spec.name, number, owner_id=owner_id).content
                cached = self.remember(agent_id, owner_id, spec.name, number, content)
            found.append(cached)
        return found[0], found[1]

    def drop(self, agent_id: str, owner_id: str) -> None:
        """Forget what is cached of the pair's files (they were erased here, F1)."""
        with self._lock:
            for spec in FILES:
                self._texts.pop((agent_id, owner_id, spec.name), None)
                self._resources.pop((agent_id, owner_id, spec.name), None)
            self._on_disk.clear()

    def remember(
        self, agent_id: str, owner_id: str, name: str, number: int, content: str
    ) -> Current:
        """Keep revision ``number`` of file ``name`` as its current one unless a newer one is
        known; return the one kept."""
        key = (agent_id, owner_id, name)
        with self._lock:
            known = self._texts.get(key)
            if known is None or known[0] <= number:
                known = self._texts[key] = (number, content)
            return known

    def behind(self, path: Path, number: int) -> bool:
        """Whether the file at ``path`` holds an older revision than ``number`` (or one this
        process has not written)."""
        with self._lock:
            return self._on_disk.get(path, -1) < number

    def wrote(self, path: Path, number: int) -> None:
        """The file at ``path`` now holds revision ``number``."""
        with self._lock:
            self._on_disk[path] = max(number, self._on_disk.get(path, -1))

    def lags_on_disk(
        self, home: Home, pair: tuple[str, str], current: tuple[Current, Current]
    ) -> bool:
        """Whether a file of ``pair`` on disk may hold an older revision than ``current``
        (no file access: what this process wrote is known)."""
        paths = disk.paths(home, *pair)
        return any(self.behind(p, n) for p, (n, _) in zip(paths, current, strict=True))

    def follow_on_disk(
        self,
        home: Home,
        locks: disk.PairLocks,
        pair: tuple[str, str],
        current: tuple[Current, Current],
    ) -> None:
        """Bring the files of ``pair`` on disk to the revisions ``current`` if they hold
        older ones, under the pair's lock (on the background thread, never a compose's).
        They are a cache: a failure is logged, never raised, and the next compose that
        finds them behind queues another try."""
        if not self.lags_on_disk(home, pair, current):
            return
        paths = disk.paths(home, *pair)
        try:
            with locks.hold(paths[0].parent):
                for path, (number, text) in zip(paths, current, strict=True):
                    if not self.behind(path, number):
                        continue  # a rebuild here wrote it meanwhile, as new or newer
                    if disk.read_bytes(path) != text.encode("utf-8") and (text or path.exists()):
                        disk.write_atomic(path, text)
                    self.wrote(path, number)
        except OSError as exc:
            log.warning("prompt files of %s/%r not written to disk: %s", *pair, exc)
