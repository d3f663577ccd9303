"""The home directory: where one fermix installation keeps its database, config and files.

Everything in it is personal data (conversations, facts about people), so what fermix
creates there is owner-only whatever the process umask (M10): folders 0700, files 0600.
The mode is set with ``chmod`` after creation, which the umask does not touch, instead of
changing the process umask (which is process-wide and not thread-safe). What already
exists is left as it is: ``fermix doctor`` names a looser path and ``--fix`` tightens it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fermix import validate
from fermix.errors import InvalidInputError

HOME_ENV = "FERMIX_HOME"
DEFAULT_HOME = "~/.fermix"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
OTHERS_BITS = 0o077
"""The group and other permission bits: none may be set on a path in the home (M10)."""


def make_private_dir(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and each missing parent as a 0700 folder, whatever the umask (M10).

    A folder that already exists is left as it is (a looser one is for ``fermix doctor``
    to name). ``mkdir``'s mode goes through the umask, so each new folder is then set to
    exactly 0700 with ``chmod``, which does not.
    """
    missing: list[Path] = []
    here = Path(path)
    while not here.is_dir() and here.parent != here:
        missing.append(here)
        here = here.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # another thread or process made it, owner-only too
        os.chmod(folder, PRIVATE_DIR_MODE)


def create_private_file(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` as an empty 0600 file unless it exists; whether it was created (M10).

    The file is created exclusively with mode 0600 and then set to exactly 0600 with
    ``fchmod`` (the umask touches the first, never the second). An existing file, however
    loose, is left as it is.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    try:
        set_private_file_mode(fd)
    finally:
        os.close(fd)
    return True


def set_private_file_mode(fd: int) -> None:
    """Set the open file ``fd`` to exactly 0600 (a no-op where ``fchmod`` does not exist)."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, PRIVATE_FILE_MODE)


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the home: ``explicit`` (``--home``), else ``$FERMIX_HOME``, else ``~/.fermix``."""
    if explicit is not None:
        if not os.fspath(explicit):
            raise InvalidInputError("home must not be an empty path")
        chosen: str | os.PathLike[str] = explicit
    else:
        chosen = os.environ.get(HOME_ENV) or DEFAULT_HOME
    return Path(chosen).expanduser().absolute()


@dataclass(frozen=True)
class Home:
    """The paths inside one fermix home directory."""

    root: Path

    @classmethod
    def resolve(cls, explicit: str | os.PathLike[str] | None = None) -> Home:
        """Return the home chosen as :func:`resolve_home` chooses it."""
        return cls(resolve_home(explicit))

    @property
    def db_path(self) -> Path:
        """``memory.db``, the source of truth (S1)."""
        return self.root / "memory.db"

    @property
    def config_path(self) -> Path:
        """``config.toml``."""
        return self.root / "config.toml"

    @property
    def memory_dir(self) -> Path:
        """``memory/``: a folder of prompt files per agent."""
        return self.root / "memory"

    def agent_dir(self, agent_id: str) -> Path:
        """``memory/<agent_id>/`` for USER.md and MEMORY.md; an unsafe id is refused (C5)."""
        return self.memory_dir / validate.path_segment("agent_id", agent_id)
