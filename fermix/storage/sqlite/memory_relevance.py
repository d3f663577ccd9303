"""Memory rows found by text on SQLite: FTS5's ``MATCH`` over ``memories_fts`` (the table's
mirror, kept by triggers), best first by its ``bm25()`` (M6, SC3).

:func:`search` finds rows within a listing's filters; :func:`relevant` finds what a review
is shown beside its messages, within the places the caller may see (the filter is part of
the query), re-ranked with the statistics of those rows. The table itself is
:mod:`fermix.storage.memories`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import apsw

from fermix.model import MemoryRow, Scope
from fermix.storage import fulltext as fts
from fermix.storage.memories import SELECT_M, filters, row_of
from fermix.storage.memory_relevance import in_places, query_words, rerank
from fermix.storage.port import CANDIDATES
from fermix.storage.sqlite.connection import fetch_rows, fetch_value


def matches(
    conn: apsw.Connection, match: str, where: Iterable[str], params: Sequence[Any], limit: int
) -> list[MemoryRow]:
    """The rows of ``memories AS m`` meeting ``where`` that FTS5 query ``match`` finds, the
    best ``limit`` by ``bm25()``."""
    statement = (
        f"SELECT {SELECT_M} FROM memories_fts JOIN memories AS m ON m.id = memories_fts.rowid"
        " WHERE memories_fts MATCH ?"
        + "".join(f" AND {clause}" for clause in where)
        + " ORDER BY bm25(memories_fts) LIMIT ?"
    )
    return [row_of(r) for r in fetch_rows(conn, statement, [match, *params, limit])]


def search(
    conn: apsw.Connection,
    text: str,
    *,
    agent_id: str | None = None,
    owner_id: str | None = None,
    scopes: Iterable[Scope] | None = None,
    scope_type: str | None = None,
    category: str | None = None,
    archived: bool | None = False,
    limit: int = 10,
) -> list[MemoryRow]:
    """Rows whose key or value matches any text, best first, within the given filters."""
    match = fts.build_query(text)
    if match is None or limit <= 0:
        return []
    where, params = filters(
        agent_id=agent_id,
        owner_id=owner_id,
        scopes=scopes,
        scope_type=scope_type,
        category=category,
        archived=archived,
        prefix="m.",
    )
    return matches(conn, match, where, params, limit)


def relevant(
    conn: apsw.Connection,
    texts: Sequence[str],
    *,
    agent_id: str,
    places: Sequence[tuple[str, Scope]],
    limit: int,
) -> list[MemoryRow]:
    """Live rows of ``agent_id`` in ``places`` whose key or value holds a word of ``texts``,
    best first (M6, SC3).

    ``places`` are the (owner id, scope) pairs the caller may see: the filter is part of
    the query. The best :data:`CANDIDATES` matches by FTS5's bm25 are re-ranked by
    :func:`fts.rank` with statistics of the rows in ``places``, not of the whole table.
    """
    words = query_words(texts)
    match = fts.build_query(" ".join(words))
    if match is None or limit <= 0 or not places:
        return []
    where, params = in_places(agent_id, places)
    found = matches(conn, match, [where], params, max(CANDIDATES, limit))
    if not found:
        return []
    scope_rows = fetch_value(
        conn, f"SELECT count(*) FROM memories AS m WHERE {where}", tuple(params)
    )
    return rerank(
        " ".join(words),
        found,
        scope_rows=int(scope_rows),
        tokenize=fts.tokenizer(conn),
        limit=limit,
    )
