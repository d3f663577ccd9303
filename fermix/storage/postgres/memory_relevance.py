"""Memory rows found by text on PostgreSQL: ``search_rows`` and ``relevant_rows`` with the
results of :func:`fermix.storage.sqlite.memory_relevance.search` and
:func:`~fermix.storage.sqlite.memory_relevance.relevant` (M6, SC3).

SQLite orders the rows matching a search by FTS5's ``bm25()`` over ``memories_fts``. This
module gives that very order: the GIN index over the rows' stems finds the same rows FTS5's
``MATCH`` does (:func:`fermix.storage.postgres.memories.document`), and :func:`bm25` computes
FTS5's formula (k1 1.2, b 0.75, both columns weighted 1) with FTS5's statistics, which are
the whole table's: the number of rows and of tokens (kept per (agent, owner) in
``memory_versions`` by the ``memories_count`` trigger) and, for each phrase of the query,
how many rows hold it. Rows that tie keep their id order, as SQLite's sort leaves them.

Where the filtered rows holding a word number more than :data:`MAX_MATCHES`, the best are
taken by ``ts_rank`` instead (one query, no row read into Python): the one case whose
results may differ from SQLite's. ``relevant_rows`` then re-ranks its candidates with
:func:`fermix.storage.fulltext.rank`, as on SQLite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fermix.model import MemoryRow, Scope
from fermix.storage import fulltext as fts
from fermix.storage.memories import SELECT_M, filters, row_of
from fermix.storage.memory_relevance import in_places, query_words, rerank
from fermix.storage.messages import MAX_SCOPED_MATCHES
from fermix.storage.port import CANDIDATES
from fermix.storage.postgres import stems
from fermix.storage.sql import Sql

MAX_MATCHES = MAX_SCOPED_MATCHES
"""Matching rows ranked in Python at most; beyond, ``ts_rank`` chooses (see above)."""
K1 = 1.2
B = 0.75


@dataclass(frozen=True)
class Query:
    """The phrases of an FTS5 query built by :func:`fts.build_query`: each word's tokens,
    in the query's order (two words with the same tokens stay two phrases, as in FTS5)."""

    phrases: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, text: str) -> Query | None:
        """The query for ``text``, or None when no word gives a token."""
        tokenize = stems.tokenizer()
        found = (tuple(tokenize(word)) for word in fts.terms(text))
        phrases = tuple(tokens for tokens in found if tokens)
        return cls(phrases) if phrases else None

    @property
    def literals(self) -> list[str]:
        """The ``tsquery`` literal of each distinct phrase."""
        return list(dict.fromkeys(map(_literal, self.phrases)))

    @property
    def match(self) -> str:
        """The ``tsquery`` literal matching a row holding any phrase."""
        return " | ".join(self.literals)


def _literal(tokens: tuple[str, ...]) -> str:
    phrase = " <-> ".join(map(stems.lexeme, tokens))
    return f"({phrase})" if len(tokens) > 1 else phrase


def occurrences(tokens: list[str], phrase: tuple[str, ...]) -> int:
    """How many times ``phrase`` occurs in ``tokens`` (overlapping occurrences too, as
    FTS5 counts a phrase's instances)."""
    if len(phrase) == 1:
        return tokens.count(phrase[0])
    n = len(phrase)
    first = phrase[0]
    return sum(
        1
        for i in range(len(tokens) - n + 1)
        if tokens[i] == first and tuple(tokens[i : i + n]) == phrase
    )


def bm25(
    query: Query,
    documents: Sequence[tuple[list[str], list[str]]],
    *,
    rows: int,
    tokens: int,
    hits: Sequence[int],
) -> list[float]:
    """FTS5's ``bm25()`` of each document (its key's and its value's tokens) for ``query``:
    ``rows`` and ``tokens`` in the whole table, ``hits[i]`` the rows holding phrase i.
    Lower is better, as SQLite returns it; the arithmetic is FTS5's, operation by
    operation, so the values are the same doubles."""
    avgdl = float(tokens) / float(rows)
    idf = []
    for hit in hits:
        value = math.log((rows - hit + 0.5) / (hit + 0.5))
        idf.append(value if value > 0.0 else 1e-6)
    scores = []
    for key_tokens, value_tokens in documents:
        size = float(len(key_tokens) + len(value_tokens))
        score = 0.0
        for weight, phrase in zip(idf, query.phrases, strict=True):
            freq = float(occurrences(key_tokens, phrase) + occurrences(value_tokens, phrase))
            score += weight * ((freq * (K1 + 1.0)) / (freq + K1 * (1 - B + B * size / avgdl)))
        scores.append(-1.0 * score)
    return scores


def best(
    sql: Sql, text: str, where: Iterable[str], params: Sequence[Any], limit: int
) -> list[MemoryRow]:
    """The rows of ``memories AS m`` meeting ``where`` that hold a word of ``text``, the
    best ``limit`` by FTS5's ``bm25()`` (ties in id order), as SQLite's ``ORDER BY
    bm25(memories_fts) LIMIT``."""
    query = Query.of(text)
    if query is None or limit <= 0:
        return []
    condition = " AND ".join(["m.stems @@ ?::tsquery", *where])
    select = f"SELECT {SELECT_M} FROM memories AS m WHERE {condition}"
    match = query.match
    found = sql.rows(f"{select} ORDER BY m.id LIMIT ?", (match, *params, MAX_MATCHES + 1))
    if len(found) > MAX_MATCHES:
        found = sql.rows(
            f"{select} ORDER BY ts_rank(m.stems, ?::tsquery) DESC, m.id LIMIT ?",
            (match, *params, match, limit),
        )
        return [row_of(r) for r in found]
    if not found:
        return []
    literals = query.literals
    counts = ", ".join(["count(*) FILTER (WHERE stems @@ ?::tsquery)"] * len(literals))
    stats = sql.rows(
        "SELECT (SELECT coalesce(sum(row_count), 0) FROM memory_versions),"
        f" (SELECT coalesce(sum(token_count), 0) FROM memory_versions), {counts}"
        " FROM memories WHERE stems @@ ?::tsquery",
        (*literals, match),
    )[0]
    hit_of = dict(zip(literals, stats[2:], strict=True))
    rows = [row_of(r) for r in found]
    tokenize = stems.tokenizer()
    scores = bm25(
        query,
        [(tokenize(row.key), tokenize(row.value)) for row in rows],
        rows=max(int(stats[0]), len(rows), 1),
        tokens=int(stats[1]),
        hits=[int(hit_of[_literal(phrase)]) for phrase in query.phrases],
    )
    order = sorted(range(len(rows)), key=scores.__getitem__)
    return [rows[i] for i in order[:limit]]


def search(
    sql: Sql,
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
    if fts.build_query(text) is None or limit <= 0:
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
    return best(sql, text, where, params, limit)


def relevant(
    sql: Sql,
    texts: Sequence[str],
    *,
    agent_id: str,
    places: Sequence[tuple[str, Scope]],
    limit: int,
) -> list[MemoryRow]:
    """Live rows of ``agent_id`` in ``places`` whose key or value holds a word of
    ``texts``, best first (M6, SC3): the best :data:`CANDIDATES` by FTS5's bm25,
    re-ranked by :func:`fts.rank` with statistics of the rows in ``places``."""
    words = " ".join(query_words(texts))
    if fts.build_query(words) is None or limit <= 0 or not places:
        return []
    where, params = in_places(agent_id, places)
    found = best(sql, words, [where], params, max(CANDIDATES, limit))
    if not found:
        return []
    scope_rows = sql.value(f"SELECT count(*) FROM memories AS m WHERE {where}", params)
    return rerank(words, found, scope_rows=int(scope_rows), tokenize=stems.tokenizer(), limit=limit)
