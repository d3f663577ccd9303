"""Storage: the source of truth (S1-S8), behind one port (B1).

The layers above open the store with :func:`open_storage` (SQLite in the home, or
PostgreSQL when a URL is set) and use its :class:`Storage` port and sessions
(:mod:`fermix.storage.session`) only: read units on pooled read connections, write units
through one group-commit writer. One module per table family writes the SQL; each takes an
open connection.
"""

from fermix.storage.connection import connect, transaction
from fermix.storage.database import Database
from fermix.storage.migrations import open_database
from fermix.storage.opening import inspect_storage, open_storage
from fermix.storage.port import Storage
from fermix.storage.session import Reads, Writes

__all__ = [
    "Database",
    "Reads",
    "Storage",
    "Writes",
    "connect",
    "inspect_storage",
    "open_database",
    "open_storage",
    "transaction",
]
