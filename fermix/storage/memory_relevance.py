"""The memory rows related to texts: what a review is shown beside its messages (M6, SC3).

Full-text search over the rows of the places the caller may see (the filter is part of the
query), re-ranked with the statistics of those rows. The table itself is
:mod:`fermix.storage.memories`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

from fermix.model import MemoryRow, Scope
from fermix.storage import fts
from fermix.storage.connection import fetch_value
from fermix.storage.memories import COLUMNS, row_of


def query_words(texts: Sequence[str]) -> list[str]:
    """At most :data:`fts.MAX_TERMS` search words drawn from every one of ``texts`` in turn
    (the first word of each, then the second of each, ...), so each text has its say
    however long the first ones are."""
    each = [fts.terms(text) for text in texts]
    words: dict[str, None] = {}
    for rank in range(fts.MAX_TERMS):
        for found in each:
            if rank < len(found):
                words.setdefault(found[rank])
                if len(words) >= fts.MAX_TERMS:
                    return list(words)
    return list(words)


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
    the query. The best :data:`fts.CANDIDATES` matches by FTS5's bm25 are re-ranked by
    :func:`fts.rank` with statistics of the rows in ``places``, not of the whole table.
    """
    words = query_words(texts)
    match = fts.build_query(" ".join(words))
    if match is None or limit <= 0 or not places:
        return []
    place = " OR ".join("(m.owner_id = ? AND m.scope_type = ? AND m.scope_id = ?)" for _ in places)
    where = f"m.agent_id = ? AND m.archived_at IS NULL AND ({place})"
    params = place_params(agent_id, places)
    columns = ", ".join(f"m.{c}" for c in COLUMNS)
    sql = (
        f"SELECT {columns} FROM memories_fts JOIN memories AS m ON m.id = memories_fts.rowid"
        f" WHERE memories_fts MATCH ? AND {where} ORDER BY bm25(memories_fts) LIMIT ?"
    )
    found = [row_of(r) for r in conn.execute(sql, [match, *params, max(fts.CANDIDATES, limit)])]
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


def place_params(agent_id: str, places: Sequence[tuple[str, Scope]]) -> list[Any]:
    """The parameters of :func:`relevant`'s filter: ``agent_id``, then each place's owner
    id, scope type and scope id."""
    params: list[Any] = [agent_id]
    for owner_id, scope in places:
        params.extend((owner_id, scope.type, scope.id))
    return params


def rerank(
    words: str,
    found: Sequence[MemoryRow],
    *,
    scope_rows: int,
    tokenize: fts.Tokenize,
    limit: int,
) -> list[MemoryRow]:
    """The best ``limit`` of the candidates ``found`` for ``words`` by :func:`fts.rank`, with
    ``scope_rows`` the rows of the places searched; ties keep the candidates' order."""
    scores = fts.rank(
        words,
        [f"{row.key} {row.value}" for row in found],
        scope_rows=scope_rows,
        tokenize=tokenize,
    )
    best = sorted(range(len(found)), key=lambda i: -scores[i])[:limit]
    return [found[i] for i in best]
