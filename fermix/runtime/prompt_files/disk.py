"""USER.md and MEMORY.md on disk: where they live, how they are written and read (C5, M10).

Layout: ``memory/<agent_id>/USER.md`` and ``MEMORY.md`` for the single-user default owner
``""``; ``memory/<agent_id>/owners/<owner segment>/...`` for every other owner, so one
user's facts never reach another user's prompt. Files are replaced by temp-file, fsync and
rename, created readable by their owner only, and read through a cache that re-reads a file
only when it was replaced. A rebuild of one (agent, owner) pair holds that pair's lock, in
this process and (through ``flock``) in every other process on the machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from fermix import validate
from fermix.core.render import FILES, file_spec
from fermix.errors import UnsafePathSegmentError
from fermix.home import Home, set_private_file_mode
from fermix.home import make_private_dir as _make_private_dir
from fermix.model import check_resource_name

OWNERS_DIR = "owners"
LOCK_NAME = ".rebuild.lock"
TEMP_GRACE_S = 3600.0
"""Age past which a prompt file's temporary file is an orphan: a rebuild writes and renames
its temporary file within moments, so an older one belongs to a process that died."""

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the thread lock alone orders rebuilds
    fcntl = None  # type: ignore[assignment]


def check_ids(agent_id: str, owner_id: str) -> None:
    """Refuse an agent id that is not a safe path segment, or an owner id that is not text."""
    validate.path_segment("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)


def has_files(agent_id: str, owner_id: str) -> bool:
    """Whether ``agent_id`` and ``owner_id`` can name a folder of prompt files."""
    try:
        check_ids(agent_id, owner_id)
    except UnsafePathSegmentError:
        return False
    return True


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


def prompt_dir(home: Home, agent_id: str, owner_id: str = "") -> Path:
    """The directory of ``agent_id``'s prompt files for ``owner_id``; unsafe ids are refused."""
    check_ids(agent_id, owner_id)
    base = home.agent_dir(agent_id)
    return base if owner_id == "" else base / OWNERS_DIR / owner_segment(owner_id)


def paths(home: Home, agent_id: str, owner_id: str = "") -> tuple[Path, Path]:
    """The paths of USER.md and MEMORY.md of ``agent_id`` for ``owner_id``."""
    folder = prompt_dir(home, agent_id, owner_id)
    return (folder / FILES[0].filename, folder / FILES[1].filename)


def file_path(home: Home, agent_id: str, name: str, owner_id: str = "") -> Path:
    """The path of resource ``name`` (``user_md`` or ``memory_md``)."""
    spec = file_spec(check_resource_name(name))
    return prompt_dir(home, agent_id, owner_id) / spec.filename


def make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents 0700, whatever the umask (M10).

    Folders that exist are left as they are (``fermix doctor`` names looser ones).
    """
    _make_private_dir(path)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader sees the old or the new file, never half.

    The text goes to a temporary file (exactly 0600 whatever the umask, M10) in the same
    directory (made 0700 if missing), which is fsynced, renamed over ``path`` with
    :func:`os.replace`, and the directory is fsynced so the rename is durable. The new
    ``path`` therefore has mode 0600; a caller that keeps another mode sets it after.
    """
    make_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            set_private_file_mode(fh.fileno())
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


def read_bytes(path: Path) -> bytes | None:
    """The bytes of ``path``, or None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def remove_folder(folder: Path) -> int:
    """Delete an owner's folder of prompt files and everything in it (its temporary files,
    its lock) for good (F1); returns how many files went. Nothing there: 0."""
    removed = 0
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            removed += remove_folder(entry)
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed += 1
    with contextlib.suppress(FileNotFoundError):
        folder.rmdir()
    _fsync_dir(folder.parent)
    return removed


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


class FileCache:
    """Reads prompt files, re-reading one only when it was replaced.

    A file is known by its inode, modification time and size; a rebuild replaces the file
    by rename (a new inode), so the next read sees the new text.
    """

    def __init__(self) -> None:
        self._files: dict[Path, tuple[tuple[int, int, int], str]] = {}
        self._lock = threading.Lock()

    def read(self, path: Path) -> str:
        """The text of ``path`` (``""`` when it does not exist)."""
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            with self._lock:
                self._files.pop(path, None)
            return ""
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            cached = self._files.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        data = read_bytes(path)
        if data is None:
            return ""
        text = data.decode("utf-8", "replace")
        with self._lock:
            self._files[path] = (stamp, text)
        return text

    def texts(self, home: Home, agent_id: str, owner_id: str = "") -> tuple[str, str]:
        """The current USER.md and MEMORY.md of ``agent_id`` for ``owner_id``."""
        user, memory = paths(home, agent_id, owner_id)
        return self.read(user), self.read(memory)


class PairLocks:
    """One rebuild of an (agent, owner) pair's files at a time, across threads and processes."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Path, threading.Lock] = {}

    @contextlib.contextmanager
    def hold(self, folder: Path) -> Iterator[None]:
        """Hold the lock of the prompt files in ``folder`` for the block."""
        with self._guard:
            lock = self._locks.setdefault(folder, threading.Lock())
        with lock:
            if fcntl is None:
                yield
                return
            make_private_dir(folder)
            fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing the descriptor releases the flock
