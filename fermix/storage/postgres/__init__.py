"""The PostgreSQL adapter of the storage port (issue 15, docs/postgres.md): first slice.

:class:`~fermix.storage.postgres.database.PgDatabase` offers what
:class:`~fermix.storage.Database` offers (``read()``, ``write``, ``append``, ``write_each``,
``append_each``) with sessions (:mod:`fermix.storage.postgres.session`) whose operations have the
names, signatures and results of :class:`~fermix.storage.Reads` and
:class:`~fermix.storage.Writes`, for the table families this slice covers: conversations,
messages (and their search) and bearer tokens. Nothing imports this package unless a
PostgreSQL database is asked for, so a SQLite install never needs psycopg.
"""

from __future__ import annotations

from fermix.storage.postgres.database import PgDatabase
from fermix.storage.postgres.session import PgReads, PgWrites

__all__ = ["PgDatabase", "PgReads", "PgWrites"]
