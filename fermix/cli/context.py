"""What every CLI command is handed: the home, and its store opened on first use."""

from __future__ import annotations

from fermix.config import load_config
from fermix.home import Home
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Storage, open_storage


class CommandContext:
    """The home a command runs on; opens the store lazily and closes it at the end.

    Commands read through :meth:`db` and write through :meth:`writer`, the same write
    path a host uses (memory writes rebuild the prompt files they show in).
    """

    def __init__(self, home: Home) -> None:
        self.home = home
        self._db: Storage | None = None
        self._writer: Writer | None = None

    def db(self) -> Storage:
        """The home's store, migrated, opened once per command: ``memory.db``, or the
        PostgreSQL database ``[fermix_core.storage]`` (or ``FERMIX_STORAGE_URL``) names."""
        if self._db is None:
            self._db = open_storage(self.home, load_config(self.home.config_path), readers=1)
        return self._db

    def writer(self) -> Writer:
        """The write path over :meth:`db`, with this home's prompt files."""
        if self._writer is None:
            db = self.db()
            self._writer = Writer(db, PromptFiles(self.home, db))
        return self._writer

    def close(self) -> None:
        """Close the store if it was opened."""
        if self._db is not None:
            self._db.close()
            self._db = None
            self._writer = None
