"""The home directory: where one fermix installation keeps its database, config and files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fermix import validate
from fermix.errors import InvalidInputError

HOME_ENV = "FERMIX_HOME"
DEFAULT_HOME = "~/.fermix"


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

    def agent_dir(self, agent_id: str) -> Path:
        """``memory/<agent_id>/`` for USER.md and MEMORY.md; an unsafe id is refused (C5)."""
        return self.root / "memory" / validate.path_segment("agent_id", agent_id)
