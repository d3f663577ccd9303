"""Numbered schema migrations (S2): the runner both adapters share, over each one's
``schema.sql``, its transaction and its record of the version.

A ``schema.sql`` is a list of blocks, each headed ``-- migration N: name`` and numbered
1..N. Each block runs in one transaction together with its row in ``schema_migrations``, so
a crash leaves the database before or after a migration, never halfway; the version is read
again inside that transaction (under SQLite's write lock, PostgreSQL's advisory lock), so
processes migrating one database at once apply each block once. Applying them again changes
nothing; a database whose version is newer than this code knows is refused untouched.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fermix.errors import SchemaTooNewError, StorageError
from fermix.storage.sql import Sql

C = TypeVar("C")

_HEADER = re.compile(r"^-- migration (\d+): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    """One numbered block of a schema.sql."""

    version: int
    name: str
    sql: str


def parse(text: str, source: str) -> tuple[Migration, ...]:
    """The migrations of ``text``, the schema.sql named ``source``, in order; a
    :class:`StorageError` unless they are numbered 1..N."""
    heads = list(_HEADER.finditer(text))
    found = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        found.append(Migration(int(head.group(1)), head.group(2).strip(), text[head.end() : end]))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise StorageError(f"{source} migrations are not numbered 1..N: {versions}")
    return tuple(found)


def record(sql: Sql, migration: Migration) -> None:
    """Record ``migration`` as applied (in its own transaction)."""
    sql.run(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
        (migration.version, migration.name, int(time.time() * 1000)),
    )


class Runner(Generic[C]):
    """The migrations of one adapter, on its connections ``C``."""

    def __init__(
        self,
        shipped: Callable[[], Sequence[Migration]],
        *,
        version: Callable[[C], int],
        unit: Callable[[C], AbstractContextManager[Any]],
        apply: Callable[[C, Migration], None],
    ) -> None:
        self._shipped = shipped
        """Every migration shipped with this fermix, in order."""
        self._version = version
        """The version a connection's database records (0 for an empty one); reads only."""
        self._unit = unit
        """The transaction one migration runs in, under the lock that keeps it one."""
        self._apply = apply
        """Run a migration's block and record it, inside its :attr:`_unit`."""

    def latest_version(self) -> int:
        """The schema version this fermix writes."""
        return self._shipped()[-1].version

    def check_version(self, conn: C) -> None:
        """Raise :class:`SchemaTooNewError` if the database is newer than this code (reads
        only)."""
        found = self._version(conn)
        if found > self.latest_version():
            raise SchemaTooNewError(
                f"database schema version {found} is newer than this fermix supports "
                f"({self.latest_version()}); upgrade fermix. The database was not modified."
            )

    def pending(self, conn: C) -> list[Migration]:
        """Migrations not yet applied to ``conn``'s database."""
        version = self._version(conn)
        return [m for m in self._shipped() if m.version > version]

    def pending_count(self, conn: C) -> int:
        """How many migrations of this fermix ``conn``'s database has not had yet."""
        return len(self.pending(conn))

    def migrate(self, conn: C) -> list[int]:
        """Apply every pending migration, each in its own transaction; return the versions
        this call ran."""
        self.check_version(conn)
        applied = []
        for migration in self.pending(conn):
            with self._unit(conn):
                # Read again under the lock: another process may have migrated meanwhile.
                self.check_version(conn)
                if self._version(conn) >= migration.version:
                    continue
                self._apply(conn, migration)
            applied.append(migration.version)
        return applied
