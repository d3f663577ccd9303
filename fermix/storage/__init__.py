"""SQLite storage: the source of truth (S1-S8), behind one port.

The layers above use :class:`Database` and its sessions (:mod:`fermix.storage.session`)
only: read units on pooled read connections, write units through one group-commit writer.
One module per table family writes the SQL; each takes an open connection.
"""

from fermix.storage.connection import connect, transaction
from fermix.storage.database import Database
from fermix.storage.migrations import open_database
from fermix.storage.port import Storage
from fermix.storage.session import Reads, Writes

__all__ = ["Database", "Reads", "Storage", "Writes", "connect", "open_database", "transaction"]
