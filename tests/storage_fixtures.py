"""Fixtures of the storage contract suite (issue 15, B3): each adapter of the storage port
in turn, on an empty store.

``backend`` / ``storage`` run a test twice: on SQLite (:class:`fermix.storage.Database` in a
temporary directory) and on PostgreSQL (:class:`fermix.storage.postgres.PgDatabase` on a fresh
database of the suite's own server, ``postgres_db`` from ``tests/pg_fixtures.py``). ``both``
gives the two side by side, for tests that compare their results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fermix.storage.sqlite.database import Database

Store = Any
"""A :class:`Database` or a ``PgDatabase``: the same port (checked by
:func:`test_the_postgres_sessions_offer_the_sqlite_signatures`)."""


@dataclass
class Backend:
    """One adapter under test: ``db`` open on a store; ``open()`` opens another instance on
    the same store (another service, as far as the store can tell)."""

    name: str
    db: Store
    open: Callable[[], Store]


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "memory.db"
    return Backend("sqlite", Database(path), lambda: Database(path))


def _postgres(url: str) -> Backend:
    from fermix.storage.postgres import PgDatabase

    return Backend("postgres", PgDatabase(url), lambda: PgDatabase(url))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each adapter in turn, open on an empty store."""
    if request.param == "sqlite":
        made = _sqlite(tmp_path)
    else:
        made = _postgres(request.getfixturevalue("postgres_db"))
    opened = [made.db]
    opener = made.open

    def open_another() -> Store:
        db = opener()
        opened.append(db)
        return db

    made.open = open_another
    try:
        yield made
    finally:
        for db in reversed(opened):
            db.close()


@pytest.fixture
def storage(backend: Backend) -> Store:
    """The port of each adapter in turn, on an empty store."""
    return backend.db


@pytest.fixture
def both(tmp_path: Path, postgres_db: str) -> Iterator[tuple[Store, Store]]:
    """SQLite and PostgreSQL side by side, each on an empty store."""
    sqlite, pg = _sqlite(tmp_path), _postgres(postgres_db)
    try:
        yield sqlite.db, pg.db
    finally:
        pg.db.close()
        sqlite.db.close()
