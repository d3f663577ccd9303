"""How memory rows are found relevant to a text, both adapters alike (M6, SC3): the query's words,
the places' parameters, the re-ranking."""

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
