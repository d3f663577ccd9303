"""Fusing full-text and vector search (Q3): pure arithmetic on one scope's rows, no I/O.

History (:func:`fuse_history`), for the rows of one searched scope in conversation and
time order, each with its vector or none yet, and the full-text hits among them:

1. each row's vector is mixed with its neighbours' in the same session (``context``), so a
   short answer ("yes, in June!") carries the question it answers;
2. the cosine of every row to the question is min-max normalised over the scope; a row
   without a vector gets the scope's mean, so it is neither helped nor buried;
3. ``alpha`` x the full-text score over the best one + ``1 - alpha`` x that;
4. ``sender_boost`` to rows written by a sender the question names (unless it names every
   sender of the scope);
5. ``neighbour`` x the best fused score of the previous and next row of the same session;
6. ``session_boost`` x the best score among the top ``session_top`` rows of the row's
   session.

A session is a run of one conversation's rows with no gap over ``session_gap_ms``.
Memory rows (:func:`fuse_rows`) have no order: steps 2 and 3 only, the full-text rank
standing for its score.

The weights were tuned on LoCoMo conversations 1-3 only, one idea at a time, and checked
on 4-5 (bench/recall.py: turn R@10 62.9 for full-text alone, 78.2 fused; 76.2 held out).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Weights:
    """The fusion's parameters (measured; see the module's doc)."""

    alpha: float = 0.5
    context: float = 0.75
    sender_boost: float = 0.4
    neighbour: float = 0.2
    session_boost: float = 0.1
    session_top: int = 3
    session_gap_ms: int = 30 * 60 * 1000


DEFAULT = Weights()


@dataclass(frozen=True)
class History:
    """The rows of one searched scope, by conversation then time.

    ``groups`` tells the conversations apart: any value per row, equal within one
    conversation (or a number per row). ``vectors`` has one unit (or zero) row per message,
    ``present`` says which had one.
    """

    groups: Sequence[Hashable] | NDArray[np.int64]
    senders: Sequence[str]
    created_at: Sequence[int]
    vectors: NDArray[np.float32]
    present: NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.senders)


def sessions(
    groups: Sequence[Hashable] | NDArray[np.int64], created_at: Sequence[int], gap_ms: int
) -> NDArray[np.int64]:
    """A session number per row: a new one at each conversation change or time gap."""
    n = len(created_at)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if isinstance(groups, np.ndarray):
        changed = groups[1:] != groups[:-1]
    else:
        changed = np.fromiter(map(operator.ne, groups[1:], groups[:-1]), bool, n - 1)
    changed |= np.diff(np.asarray(created_at, dtype=np.int64)) > gap_ms
    out = np.zeros(n, dtype=np.int64)
    np.cumsum(changed, out=out[1:])
    return out


def named_senders(question: str, senders: Sequence[str]) -> set[str]:
    """The senders a question names (whole name or first name, any case); none when it
    names every sender of the scope, as then it tells them apart from nothing."""
    words = {w.lower() for w in _WORD.findall(question)}
    distinct = set(senders)
    distinct.discard("")
    named = {s for s in distinct if s.lower() in words or s.split()[0].lower() in words}
    return named if len(named) < len(distinct) else set()


def normalised(scores: Floats, present: NDArray[np.bool_]) -> Floats:
    """Scores min-max scaled to [0, 1] over the rows ``present``; the others get their mean."""
    out = np.zeros(len(scores), dtype=np.float64)
    if not present.any():
        return out
    kept = scores[present]
    low, high = float(kept.min()), float(kept.max())
    out[present] = (kept - low) / max(high - low, 1e-9)
    out[~present] = float(out[present].mean())
    return out


def context_cosines(
    query: NDArray[np.float32],
    vectors: NDArray[np.float32],
    same_prev: NDArray[np.bool_],
    same_next: NDArray[np.bool_],
    weight: float,
) -> Floats:
    """The cosine to the unit ``query`` of each vector plus ``weight`` x its same-session
    neighbours' (step 1 of the module's doc), without making the mixed vectors.

    For row ``i`` with vector ``v``, its neighbours ``p`` and ``n`` (zero when not in its
    session) and ``m = v + weight (p + n)``: ``m . q`` is the rows' products with the
    query mixed the same way, and ``|m|^2`` follows from each row's squared norm and its
    products with the next row and the one after. Three row-wise products and one product
    with the query replace a copy of the scope's vectors per step (Q4: the cost of a
    search is a few passes over its scope's vectors)."""
    n = len(vectors)
    if weight == 0 or n == 0:
        return cosines(query, vectors)
    dots = cosines(query, vectors)
    squares = _row_products(vectors, vectors)
    nexts = _row_products(vectors[1:], vectors[:-1])  # row i + 1 with row i
    skips = _row_products(vectors[2:], vectors[:-2])  # row i + 2 with row i
    p, nx = same_prev.astype(np.float64), same_next.astype(np.float64)
    w = float(weight)

    def before(values: Floats) -> Floats:
        shifted: Floats = np.r_[0.0, values[:-1]]
        return shifted

    def after(values: Floats) -> Floats:
        shifted: Floats = np.r_[values[1:], 0.0]
        return shifted

    product = dots + w * (p * before(dots) + nx * after(dots))
    both = p * nx * np.r_[0.0, skips, 0.0] if n > 1 else np.zeros(n)
    square = (
        squares
        + w * w * (p * before(squares) + nx * after(squares))
        + 2 * w * (p * np.r_[0.0, nexts] + nx * np.r_[nexts, 0.0])
        + 2 * w * w * both
    )
    result: Floats = product / np.maximum(np.sqrt(np.maximum(square, 0.0)), 1e-9)
    return result


def lexical_scores(n: int, lexical: Mapping[int, float]) -> Floats:
    """Full-text scores (higher is better) per row, over the best one; 0 for the others."""
    out = np.zeros(n, dtype=np.float64)
    if lexical:
        scores = np.fromiter(lexical.values(), np.float64, len(lexical))
        top = float(scores.max()) or 1.0
        out[np.fromiter(lexical.keys(), np.int64, len(lexical))] = scores / top
    return out


def fuse_history(
    question: str,
    query: NDArray[np.float32] | None,
    history: History,
    lexical: Mapping[int, float],
    weights: Weights = DEFAULT,
    *,
    min_cosine: float | None = None,
    limit: int | None = None,
) -> list[tuple[int, float]]:
    """History rows as (row index, fused score), best first (ties by row index), the first
    ``limit`` only when given.

    ``query`` is the question's unit vector (None: full-text and the boosts only);
    ``lexical`` maps the row index of each full-text hit to its score, higher better.
    With ``min_cosine``, a row full-text search did not find is left out unless its
    vector (with its neighbours') is at least that close to the question.

    Every step is an array operation over the scope; a Python object is made only for the
    rows returned.
    """
    n = len(history)
    if n == 0:
        return []
    sess = sessions(history.groups, history.created_at, weights.session_gap_ms)
    same = sess[1:] == sess[:-1]
    same_prev = np.r_[False, same]
    same_next = np.r_[same, False]
    fused = weights.alpha * lexical_scores(n, lexical)
    kept = np.zeros(n, dtype=bool)
    kept[np.fromiter(lexical.keys(), np.int64, len(lexical))] = True
    if query is not None and history.present.any():
        cosine = context_cosines(query, history.vectors, same_prev, same_next, weights.context)
        fused = fused + (1 - weights.alpha) * normalised(cosine, history.present)
        kept |= history.present & (cosine >= (min_cosine if min_cosine is not None else -2.0))
    named = named_senders(question, history.senders)
    if named and weights.sender_boost:
        fused = fused + weights.sender_boost * np.fromiter(
            map(named.__contains__, history.senders), bool, n
        ).astype(np.float64)
    if weights.neighbour:
        prev = np.where(same_prev, np.r_[0.0, fused[:-1]], 0.0)
        nxt = np.where(same_next, np.r_[fused[1:], 0.0], 0.0)
        fused = fused + weights.neighbour * np.maximum(prev, nxt)
    if weights.session_boost and weights.session_top > 0:
        top = np.argsort(-fused, kind="stable")[: weights.session_top]
        best = np.zeros(int(sess[-1]) + 1, dtype=np.float64)
        np.maximum.at(best, sess[top], fused[top])
        fused = fused + weights.session_boost * best[sess]
    order = np.argsort(-fused, kind="stable")
    if min_cosine is not None:
        order = order[kept[order]]
    if limit is not None:
        order = order[: max(limit, 0)]
    return list(zip(order.tolist(), fused[order].tolist(), strict=True))


def fuse_rows(
    query: NDArray[np.float32],
    vectors: NDArray[np.float32],
    present: NDArray[np.bool_],
    lexical: Sequence[int],
    *,
    alpha: float = DEFAULT.alpha,
    min_cosine: float | None = None,
) -> list[tuple[int, float]]:
    """Memory rows as (row index, fused score), best first: ``alpha`` x the full-text
    rank's score (1 for the best hit, 1/2 for the second, ...) + ``1 - alpha`` x the
    normalised cosine. ``lexical`` lists the full-text hits' row indexes, best first; with
    ``min_cosine`` a row it does not list is kept only that close to the query."""
    n = len(vectors)
    if n == 0:
        return []
    fused = alpha * lexical_scores(n, {i: 1.0 / (rank + 1) for rank, i in enumerate(lexical)})
    kept = np.zeros(n, dtype=bool)
    kept[list(lexical)] = True
    if present.any():
        cosine = cosines(query, vectors)
        fused = fused + (1 - alpha) * normalised(cosine, present)
        kept |= present & (cosine >= (min_cosine if min_cosine is not None else -2.0))
    order = np.argsort(-fused, kind="stable")
    return [(int(i), float(fused[i])) for i in order if kept[i]]


def cosines(query: NDArray[np.float32], vectors: NDArray[np.float32]) -> Floats:
    """The cosine of each row of ``vectors`` (unit or zero) to the unit ``query``.

    By :func:`numpy.einsum`, on the calling thread: a matrix product may hand a scope's
    few thousand rows to BLAS threads, whose start and spin-wait cost more than the
    product on a busy machine (bench/recall.py's p99)."""
    result: Floats = np.einsum("ij,j->i", vectors, query.astype(np.float32)).astype(np.float64)
    return result


def _row_products(a: NDArray[np.float32], b: NDArray[np.float32]) -> Floats:
    """The dot product of each row of ``a`` with the same row of ``b``."""
    result: Floats = np.einsum("ij,ij->i", a, b).astype(np.float64)
    return result
