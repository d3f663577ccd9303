"""The memory rows related to texts: what a review is shown beside its messages (M6, SC3).

Full-text search over the rows of the places the caller may see (the filter is part of the
query), re-ranked with the statistics of those rows. The table itself is
:mod:`fermix.storage.sqlite.memories`.
"""

from __future__ import annotations

from collections.abc import Sequence

import apsw

from fermix.model import MemoryRow, Scope
from fermix.storage import fulltext as fts
from fermix.storage.memories import COLUMNS, row_of
from fermix.storage.memory_relevance import place_params, query_words, rerank
from fermix.storage.port import CANDIDATES
from fermix.storage.sqlite.connection import fetch_value


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
    place = " OR ".join("(m.owner_id = ? AND m.scope_type = ? AND m.scope_id = ?)" for _ in places)
    where = f"m.agent_id = ? AND m.archived_at IS NULL AND ({place})"
    params = place_params(agent_id, places)
    columns = ", ".join(f"m.{c}" for c in COLUMNS)
    sql = (
        f"SELECT {columns} FROM memories_fts JOIN memories AS m ON m.id = memories_fts.rowid"
        f" WHERE memories_fts MATCH ? AND {where} ORDER BY bm25(memories_fts) LIMIT ?"
    )
    found = [row_of(r) for r in conn.execute(sql, [match, *params, max(CANDIDATES, limit)])]
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
