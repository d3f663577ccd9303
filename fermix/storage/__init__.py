"""SQLite storage: the source of truth (S1-S8).

One module per table family; each takes an open ``apsw.Connection`` and does one thing.
"""

from fermix.storage.connection import connect, open_database, transaction

__all__ = ["connect", "open_database", "transaction"]
