"""The full-text ranking written row by row, as plainly as its documentation reads: the
reference that fermix.storage.fulltext's array arithmetic (preselect, rank) must agree with.

A row's score adds its terms in the query's order, then the feedback's in theirs, as
fermix does: rows whose scores are equal in exact arithmetic are then equal to the last bit
and keep their order, wherever their words stand in them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from fermix.storage import fulltext as fts


def preselect_scores(
    text: str, tokens: Sequence[Sequence[str]], *, scope_rows: int, tokenize: fts.Tokenize
) -> list[float]:
    """FTS5's bm25 (k1 1.2, b 0.75) of each row with the scope's statistics."""
    query = fts.query_tokens(text, tokenize)
    rows = max(scope_rows, len(tokens))
    df = Counter(term for found in tokens for term in set(found))
    avg_len = max(sum(len(found) for found in tokens) / max(len(tokens), 1), 1.0)
    k1, b = 1.2, 0.75
    scores = []
    for found in tokens:
        score = 0.0
        for term in query:
            tf = found.count(term)
            if tf:
                idf = max(math.log((rows - df[term] + 0.5) / (df[term] + 0.5)), 1e-6)
                score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(found) / avg_len))
        scores.append(score)
    return scores


def rank_scores(
    text: str,
    tokens: Sequence[Sequence[str]],
    *,
    scope_rows: int,
    tokenize: fts.Tokenize,
    ranking: fts.Ranking = fts.DEFAULT_RANKING,
) -> list[float]:
    """bm25 with ``ranking``'s parameters over the candidates ``tokens``, then one round of
    pseudo-relevance feedback from the best rows."""
    query = fts.query_tokens(text, tokenize)
    if not query or not tokens:
        return [0.0] * len(tokens)
    rows = max(scope_rows, len(tokens))
    df = Counter(term for found in tokens for term in set(found))
    avg_len = max(sum(len(found) for found in tokens) / len(tokens), 1.0)
    k1, b = ranking.k1, ranking.b

    def idf(term: str) -> float:
        n = df[term]
        return float(max(math.log((rows - n + 0.5) / (n + 0.5)), 1e-6) ** ranking.idf_power)

    def scored(weights: dict[str, float], start: list[float]) -> list[float]:
        out = []
        for found, score in zip(tokens, start, strict=True):
            norm = k1 * (1 - b + b * len(found) / avg_len)
            for term, weight in weights.items():
                tf = found.count(term)
                if tf:
                    score += weight * idf(term) * (k1 + 1) * tf / (tf + norm)
            out.append(score)
        return out

    scores = scored(dict.fromkeys(query, 1.0), [0.0] * len(tokens))
    best = sorted(range(len(tokens)), key=lambda i: -scores[i])[: ranking.feedback_rows]
    common = set(tokenize(" ".join(sorted(fts.STOPWORDS))))
    feedback: dict[str, float] = {}
    for i in best:
        for term, tf in Counter(tokens[i]).items():
            if term not in query and term not in common:
                feedback[term] = feedback.get(term, 0.0) + tf * idf(term)
    chosen = sorted(feedback, key=lambda term: -feedback[term])[: ranking.feedback_terms]
    return scored(dict.fromkeys(chosen, ranking.feedback_weight), scores)


def order(scores: Sequence[float], keep: int) -> list[int]:
    """The indices of the best ``keep`` of ``scores``, ties in index order."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:keep]
