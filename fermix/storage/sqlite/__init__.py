"""The SQLite adapter of the storage port (S1-S8): ``memory.db`` in the home, through apsw.

:class:`~fermix.storage.sqlite.database.Database` offers the :class:`~fermix.storage.port.Storage`
port with sessions (:mod:`fermix.storage.sqlite.session`) whose operations are those the
port's Protocols declare. Nothing outside ``fermix/storage/`` imports this package: the
layers above open it through :func:`fermix.storage.open_storage`.
"""

from __future__ import annotations

from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.session import SqliteReads, SqliteWrites

__all__ = ["Database", "SqliteReads", "SqliteWrites"]
