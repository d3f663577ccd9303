"""Choosing the backend: the one place that knows which adapter of the port runs (B1).

``[fermix_core.storage] url`` names a PostgreSQL database shared by several services, and
``FERMIX_STORAGE_URL`` overrides it (the place for a URL with a password, which config.toml
never holds); with neither, the memory is ``memory.db`` in the home. Everything above
``storage/`` opens the store through :func:`open_storage` (or :func:`inspect_storage`, to
look without changing it) and holds a :class:`~fermix.storage.port.Storage`. psycopg is
imported only when a URL is set, so a SQLite install never needs the ``postgres`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fermix.config import STORAGE_URL_ENV, Config
from fermix.config_rules import POSTGRES_SCHEMES
from fermix.errors import StorageError
from fermix.home import Home
from fermix.storage.passwords import without_password
from fermix.storage.port import Storage
from fermix.storage.sqlite.database import Database

if TYPE_CHECKING:
    from fermix.storage.postgres import PgDatabase

_PG_MODULES = ("psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c")


def storage_url(config: Config, environ: Mapping[str, str] = os.environ) -> str | None:
    """The PostgreSQL URL in force: ``FERMIX_STORAGE_URL`` when set and not empty, else
    ``[fermix_core.storage] url``; None means ``memory.db`` in the home."""
    return environ.get(STORAGE_URL_ENV) or config.storage.url


def uses_postgres(config: Config) -> bool:
    """Whether ``config`` puts the memory in PostgreSQL rather than the home's SQLite file."""
    return storage_url(config) is not None


def open_storage(
    home: Home, config: Config, *, vfs: str | None = None, readers: int = 4
) -> Storage:
    """Open (creating and migrating when needed) the store ``config`` chooses.

    SQLite: ``memory.db`` in ``home``, through ``vfs`` when given (a test's fault-injecting
    VFS). PostgreSQL: the database of :func:`storage_url`; ``vfs`` does not apply. A URL
    that is not ``postgresql://``, or a missing ``postgres`` extra, is a
    :class:`~fermix.errors.StorageError` saying what to do; no message shows a password.
    """
    url = storage_url(config)
    if url is None:
        return Database(home.db_path, vfs=vfs, readers=readers)
    return _pg_database(url)(url, readers=readers)


def open_file(path: str | os.PathLike[str], *, readers: int = 1) -> Storage:
    """Open (creating and migrating when needed) the SQLite file ``path`` as the home's
    ``memory.db`` is opened: a restored replica checked before it takes the home's place."""
    return Database(path, readers=readers)


def inspect_storage(home: Home, config: Config) -> Storage:
    """The store ``config`` chooses, opened only to look at it (``fermix doctor``): never
    created, migrated nor written. A SQLite file must exist (check first)."""
    url = storage_url(config)
    if url is None:
        return Database.inspect(home.db_path)
    return _pg_database(url).inspect(url)


def describe(home: Home, config: Config) -> str:
    """The store for people and status documents: ``sqlite <file>``, or the PostgreSQL URL
    without its password (``postgresql://fermix@db.internal/fermix``)."""
    url = storage_url(config)
    return f"sqlite {home.db_path}" if url is None else without_password(url)


def _pg_database(url: str) -> type[PgDatabase]:
    """``PgDatabase``, imported now; a refused URL or a missing extra is a StorageError."""
    if not url.startswith(POSTGRES_SCHEMES):
        raise StorageError(
            f"the storage URL must start with postgresql:// (from {STORAGE_URL_ENV} or"
            " [fermix_core.storage] url); unset both for memory.db in the home"
        )
    try:
        from fermix.storage.postgres import PgDatabase
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in _PG_MODULES:
            raise
        raise StorageError(
            f"a PostgreSQL storage URL is set but {exc.name} is not installed: pip install"
            " 'fermix[postgres]', or unset the URL for memory.db in the home"
        ) from None
    return PgDatabase
