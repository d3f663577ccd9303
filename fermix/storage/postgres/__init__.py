"""The PostgreSQL adapter of the storage port (B1, docs/postgres.md): one database shared
by several services, through psycopg.

:class:`~fermix.storage.postgres.database.PgDatabase` offers the
:class:`~fermix.storage.port.Storage` port with sessions
(:mod:`fermix.storage.postgres.session`) that satisfy the port's Protocols; the SQL both
adapters share is in the driver-free modules of :mod:`fermix.storage`. Nothing imports
this package unless a PostgreSQL database is asked for, so a SQLite install never needs
psycopg.
"""

from __future__ import annotations

from fermix.storage.postgres.database import PgDatabase
from fermix.storage.postgres.session import PgReads, PgWrites

__all__ = ["PgDatabase", "PgReads", "PgWrites"]
