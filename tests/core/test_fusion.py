"""The array fusion (Q3) against a straightforward one: the same rows, order and scores.

:func:`fermix.core.fusion.fuse_history` and :func:`fermix.embedding.from_blobs` work on
whole arrays so that a search of thousands of rows makes no Python object per row. The
references below are the plain loops they replaced, one row at a time; hypothesis draws
random scopes (conversations, gaps, senders, vectors or none, full-text hits with ties,
weights) and every result must be identical, scores to the last bit. The one step that is
arithmetic rather than bookkeeping, the cosine of each row mixed with its neighbours
(:func:`fermix.core.fusion.context_cosines`, from products instead of mixed vectors), is
held to the mixed vectors themselves within rounding.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from fermix.core import fusion
from fermix.core.fusion import History, Weights
from fermix.embedding import from_blobs

# -- the references: one row at a time -----------------------------------------------------


def reference_sessions(
    groups: Sequence[Hashable], created_at: Sequence[int], gap_ms: int
) -> list[int]:
    out = [0] * len(created_at)
    current = 0
    for i in range(1, len(created_at)):
        if groups[i] != groups[i - 1] or created_at[i] - created_at[i - 1] > gap_ms:
            current += 1
        out[i] = current
    return out


def reference_named(question: str, senders: Sequence[str]) -> set[str]:
    words = {w.lower() for w in fusion._WORD.findall(question)}
    distinct = {s for s in senders if s}
    named = {s for s in distinct if s.lower() in words or s.split()[0].lower() in words}
    return named if len(named) < len(distinct) else set()


def reference_fuse(
    question: str,
    query: NDArray[np.float32] | None,
    history: History,
    lexical: Mapping[int, float],
    weights: Weights,
    *,
    min_cosine: float | None,
) -> list[tuple[int, float]]:
    """fermix's fusion as first written: Python loops over the rows."""
    n = len(history)
    if n == 0:
        return []
    groups = list(history.groups)
    sess = np.array(reference_sessions(groups, list(history.created_at), weights.session_gap_ms))
    same_prev = np.r_[False, sess[1:] == sess[:-1]]
    same_next = np.r_[sess[1:] == sess[:-1], False]
    fused = np.zeros(n, dtype=np.float64)
    if lexical:
        top = max(lexical.values()) or 1.0
        for i, score in lexical.items():
            fused[i] = score / top
    fused = weights.alpha * fused
    kept = np.zeros(n, dtype=bool)
    kept[list(lexical)] = True
    if query is not None and history.present.any():
        cosine = fusion.context_cosines(
            query, history.vectors, same_prev, same_next, weights.context
        )
        fused = fused + (1 - weights.alpha) * fusion.normalised(cosine, history.present)
        kept |= history.present & (cosine >= (min_cosine if min_cosine is not None else -2.0))
    named = reference_named(question, history.senders)
    if named and weights.sender_boost:
        fused = fused + weights.sender_boost * np.fromiter(
            (s in named for s in history.senders), np.float64, n
        )
    if weights.neighbour:
        prev = np.where(same_prev, np.r_[0.0, fused[:-1]], 0.0)
        nxt = np.where(same_next, np.r_[fused[1:], 0.0], 0.0)
        fused = fused + weights.neighbour * np.maximum(prev, nxt)
    if weights.session_boost and weights.session_top > 0:
        best: dict[int, float] = {}
        for i in np.argsort(-fused, kind="stable")[: weights.session_top]:
            best[int(sess[i])] = max(best.get(int(sess[i]), 0.0), float(fused[i]))
        fused = fused + weights.session_boost * np.fromiter(
            (best.get(int(s), 0.0) for s in sess), np.float64, n
        )
    order = sorted(range(n), key=lambda i: -fused[i])  # stable: ties by row index
    return [(i, float(fused[i])) for i in order if min_cosine is None or kept[i]]


def reference_context_cosines(
    query: NDArray[np.float32],
    vectors: NDArray[np.float32],
    same_prev: Sequence[bool],
    same_next: Sequence[bool],
    weight: float,
) -> list[tuple[float, float]]:
    """Each row plus ``weight`` x its same-session neighbours, made and normalised, then
    its cosine to ``query`` (and the mixed vector's norm): in float64, one row at a time."""
    rows = vectors.astype(np.float64)
    q = query.astype(np.float64)
    out = []
    for i in range(len(rows)):
        mixed = rows[i].copy()
        if same_prev[i]:
            mixed += weight * rows[i - 1]
        if same_next[i]:
            mixed += weight * rows[i + 1]
        norm = float(np.linalg.norm(mixed))
        out.append((float(mixed @ q) / max(norm, 1e-9), norm))
    return out


def reference_blobs(blobs: Sequence[bytes | None], dim: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros((len(blobs), dim), dtype=np.float32)
    present = np.zeros(len(blobs), dtype=bool)
    for i, blob in enumerate(blobs):
        if blob is not None and len(blob) == dim:
            out[i] = np.frombuffer(blob, dtype=np.int8)
            present[i] = True
    out /= 127.0
    return out, present


# -- random scopes -------------------------------------------------------------------------

SENDERS = ["Mel", "Caroline Smith", "caroline", "", "Jon"]
QUESTIONS = ["what did Mel say", "Caroline and Jon?", "when did mel and caroline meet", "x"]
DIM = 6


@st.composite
def scopes(draw: st.DrawFn) -> tuple[History, list[tuple[str, str, str, str]]]:
    n = draw(st.integers(0, 60))
    conversations = [("a", "tg", str(c), t) for c in range(2) for t in ("", "t")]
    groups = sorted(draw(st.lists(st.sampled_from(conversations), min_size=n, max_size=n)))
    steps = draw(
        st.lists(
            st.sampled_from([0, 1, 60_000, 1_800_000, 1_800_001, 10**8]), min_size=n, max_size=n
        )
    )
    created_at = [int(x) for x in np.cumsum(steps, dtype=np.int64)]
    senders = draw(st.lists(st.sampled_from(SENDERS), min_size=n, max_size=n))
    blobs = [
        None
        if draw(st.booleans()) and draw(st.booleans())
        else bytes(draw(st.lists(st.integers(0, 255), min_size=DIM, max_size=DIM)))
        for _ in range(n)
    ]
    vectors, present = from_blobs(blobs, DIM)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = (vectors / np.maximum(norms, 1e-9)).astype(np.float32)
    return History(groups, senders, created_at, unit, present), groups


weights_st = st.builds(
    Weights,
    alpha=st.sampled_from([0.0, 0.5, 0.7, 1.0]),
    context=st.sampled_from([0.0, 0.75]),
    sender_boost=st.sampled_from([0.0, 0.4]),
    neighbour=st.sampled_from([0.0, 0.2]),
    session_boost=st.sampled_from([0.0, 0.1]),
    session_top=st.sampled_from([0, 1, 3, 100]),
    session_gap_ms=st.sampled_from([0, 1_800_000]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scope=scopes(),
    question=st.sampled_from(QUESTIONS),
    weights=weights_st,
    data=st.data(),
)
def test_q3_array_fusion_equals_the_row_by_row_reference(
    scope: tuple[History, list[tuple[str, str, str, str]]],
    question: str,
    weights: Weights,
    data: st.DataObject,
) -> None:
    history, groups = scope
    n = len(history)
    hits = data.draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True, max_size=min(n, 20)))
    lexical = {i: data.draw(st.sampled_from([1.0, 2.5, 2.5, 7.25, 0.0])) for i in hits}
    query: NDArray[np.float32] | None = None
    if data.draw(st.booleans()):
        raw = np.array(
            data.draw(st.lists(st.integers(-5, 5), min_size=DIM, max_size=DIM)), np.float32
        )
        query = (raw / max(float(np.linalg.norm(raw)), 1e-9)).astype(np.float32)
    min_cosine = data.draw(st.sampled_from([None, 0.2, 0.5]))
    expected = reference_fuse(question, query, history, lexical, weights, min_cosine=min_cosine)

    found = fusion.fuse_history(question, query, history, lexical, weights, min_cosine=min_cosine)
    assert found == expected  # the same rows, order and scores, bit for bit

    # Conversations given as a number per row (as the search passes them): the same.
    numbers = {g: k for k, g in enumerate(dict.fromkeys(groups))}
    by_number = History(
        np.array([numbers[g] for g in groups], dtype=np.int64),
        history.senders,
        history.created_at,
        history.vectors,
        history.present,
    )
    limit = data.draw(st.sampled_from([None, 0, 1, 5, 1000]))
    limited = fusion.fuse_history(
        question, query, by_number, lexical, weights, min_cosine=min_cosine, limit=limit
    )
    assert limited == (expected if limit is None else expected[:limit])


@settings(max_examples=300, deadline=None)
@given(scope=scopes(), weight=st.sampled_from([0.0, 0.25, 0.75, 1.0]), data=st.data())
def test_q4_context_cosines_equal_the_mixed_vectors_cosines_within_rounding(
    scope: tuple[History, list[tuple[str, str, str, str]]], weight: float, data: st.DataObject
) -> None:
    """Q4: the neighbours' mix is computed from row products (no copy of the scope's
    vectors per step), and gives each row the cosine of its mixed vector all the same."""
    history, _ = scope
    n = len(history)
    raw = np.array(data.draw(st.lists(st.integers(-5, 5), min_size=DIM, max_size=DIM)), np.float32)
    query = (raw / max(float(np.linalg.norm(raw)), 1e-9)).astype(np.float32)
    sess = np.array(reference_sessions(list(history.groups), list(history.created_at), 1_800_000))
    same = list(sess[1:] == sess[:-1]) if n else []
    same_prev = np.array([False, *same][:n], dtype=bool)
    same_next = np.array([*same, False][:n], dtype=bool)
    found = fusion.context_cosines(query, history.vectors, same_prev, same_next, weight)
    expected = reference_context_cosines(query, history.vectors, same_prev, same_next, weight)
    assert found.shape == (n,)
    for got, (cosine, norm) in zip(found, expected, strict=True):
        # A mix that cancels out (a neighbour opposite the row) has no direction: its
        # cosine is rounding noise either way, and only 0 when exactly 0.
        if norm > 1e-3:
            assert abs(got - cosine) <= 1e-5


@given(
    groups=st.lists(st.sampled_from(["a", "b", ("c", "d")]), max_size=40),
    data=st.data(),
)
def test_q3_sessions_equal_the_row_by_row_reference(
    groups: list[Hashable], data: st.DataObject
) -> None:
    created_at = data.draw(
        st.lists(st.integers(0, 2**40), min_size=len(groups), max_size=len(groups))
    )
    gap = data.draw(st.sampled_from([0, 1000, 1_800_000]))
    assert fusion.sessions(groups, created_at, gap).tolist() == reference_sessions(
        groups, created_at, gap
    )


@given(
    blobs=st.lists(st.none() | st.binary(min_size=0, max_size=10), max_size=30),
    dim=st.sampled_from([0, 1, 4, 8]),
)
def test_q1_from_blobs_equals_one_frombuffer_per_row(blobs: list[bytes | None], dim: int) -> None:
    vectors, present = from_blobs(blobs, dim)
    expected_vectors, expected_present = reference_blobs(blobs, dim)
    assert vectors.dtype == np.float32 and vectors.shape == (len(blobs), dim)
    assert np.array_equal(present, expected_present)
    assert np.array_equal(vectors, expected_vectors)


def test_q3_named_senders_equal_the_reference() -> None:
    for question in QUESTIONS:
        for k in range(len(SENDERS) + 1):
            senders = SENDERS[:k] * 3
            assert fusion.named_senders(question, senders) == reference_named(question, senders)
