"""How memory rows are found relevant to a text, both adapters alike (M6, SC3): the query's words,
the places' filter, the re-ranking. The search itself is each adapter's (FTS5's ``MATCH``
on SQLite, the rows' stems on PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fermix.model import MemoryRow, Scope
from fermix.storage import fulltext as fts


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


def in_places(agent_id: str, places: Sequence[tuple[str, Scope]]) -> tuple[str, list[Any]]:
    """The condition (on ``memories AS m``, with ``?`` marks) and the parameters of the rows
    a search for relevant rows may find: live rows of ``agent_id`` in one of ``places``, the
    (owner id, scope) pairs the caller may see."""
    place = " OR ".join(["(m.owner_id = ? AND m.scope_type = ? AND m.scope_id = ?)"] * len(places))
    params: list[Any] = [agent_id]
    for owner_id, scope in places:
        params.extend((owner_id, scope.type, scope.id))
    return f"m.agent_id = ? AND m.archived_at IS NULL AND ({place})", params


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
