"""What every CLI command is handed: the home, and the database opened on first use."""

from __future__ import annotations

from collections.abc import Callable

import apsw

from fermix.home import Home
from fermix.storage import open_database


class CommandContext:
    """The home a command runs on; opens the database lazily and closes it at the end."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._conn: apsw.Connection | None = None
        self.memory_write_hooks: list[Callable[[CommandContext, str], None]] = []

    def db(self) -> apsw.Connection:
        """The home's database, migrated, opened once per command."""
        if self._conn is None:
            self._conn = open_database(self.home.db_path)
        return self._conn

    def after_memory_write(self, agent_id: str) -> None:
        """Run what must follow a memory write by the CLI (prompt files are rebuilt there)."""
        for hook in self.memory_write_hooks:
            hook(self, agent_id)

    def close(self) -> None:
        """Close the database if it was opened."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
