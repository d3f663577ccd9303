"""What every CLI command is handed: the home, and its database opened on first use."""

from __future__ import annotations

from fermix.home import Home
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Database


class CommandContext:
    """The home a command runs on; opens the database lazily and closes it at the end.

    Commands read through :meth:`db` and write through :meth:`writer`, the same write
    path a host uses (memory writes rebuild the prompt files they show in).
    """

    def __init__(self, home: Home) -> None:
        self.home = home
        self._db: Database | None = None
        self._writer: Writer | None = None

    def db(self) -> Database:
        """The home's database, migrated, opened once per command."""
        if self._db is None:
            self._db = Database(self.home.db_path, readers=1)
        return self._db

    def writer(self) -> Writer:
        """The write path over :meth:`db`, with this home's prompt files."""
        if self._writer is None:
            db = self.db()
            self._writer = Writer(db, PromptFiles(self.home, db))
        return self._writer

    def close(self) -> None:
        """Close the database if it was opened."""
        if self._db is not None:
            self._db.close()
            self._db = None
            self._writer = None
