"""What every CLI command is handed: the home, and its services built on first use."""

from __future__ import annotations

from fermix.config import load_config
from fermix.home import Home
from fermix.runtime.composition import Services, build
from fermix.runtime.writer import Writer
from fermix.storage import Storage


class CommandContext:
    """The home a command runs on; builds its services lazily and closes them at the end.

    The services are a host's (:func:`~fermix.runtime.composition.build`), with one read
    connection and no thread started: commands read through :meth:`db` and write through
    :meth:`writer`, the same write path a host uses (memory writes rebuild the prompt files
    they show in).
    """

    def __init__(self, home: Home) -> None:
        self.home = home
        self._services: Services | None = None

    def services(self) -> Services:
        """The home's services over its store, migrated, built once per command: ``memory.db``,
        or the PostgreSQL database ``[fermix_core.storage]`` (or ``FERMIX_STORAGE_URL``) names."""
        if self._services is None:
            self._services = build(self.home, load_config(self.home.config_path), readers=1)
        return self._services

    def db(self) -> Storage:
        """The home's store (:meth:`services`)."""
        return self.services().storage

    def writer(self) -> Writer:
        """The write path over :meth:`db`, with this home's prompt files."""
        return self.services().writer

    def close(self) -> None:
        """Close the store if it was opened."""
        if self._services is not None:
            self._services.close()
            self._services = None
