"""The ``memories`` table's change counter on SQLite (A3): the rows themselves are written
once for both adapters (:mod:`fermix.storage.memories`), their search by text is
:mod:`fermix.storage.sqlite.memory_relevance`."""

from __future__ import annotations

import apsw

from fermix.errors import InvalidInputError
from fermix.storage.sqlite.connection import fetch_value


def change_counter(
    conn: apsw.Connection, agent_id: str | None = None, owner_id: str | None = None
) -> int:
    """A number that changes whenever a memory row is written, by any process (A3).

    With ``agent_id`` (and ``owner_id``), it changes at least whenever a row of that agent
    (that shows in that owner's prompt files) is written; SQLite keeps one counter for the
    whole table, so it also changes on other writes (a cache only reloads more often). The
    PostgreSQL adapter keeps one per (agent, owner).
    """
    if agent_id is None and owner_id is not None:
        raise InvalidInputError("memory_version: owner_id needs agent_id")
    return int(fetch_value(conn, "SELECT counter FROM memory_changes WHERE id = 1"))
