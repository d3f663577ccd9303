"""PostgreSQL for bench/recall.py: fermix's shipped search on the port's other adapter.

A helper module (its name starts with ``_``): bench/run.py does not run it.

Issue 15, item 3: LoCoMo recall on PostgreSQL within 0.5 points of SQLite's. The server is
bench/backends.py's (:func:`_backends_pg.durable_server`: the test suite's PostgreSQL,
durable). The conversations SQLite was measured on are stored in a fresh
:class:`~fermix.storage.postgres.PgDatabase` as they were there (:func:`_recall_data.seed`),
embedded by the same code with the same default model (the background embedder's
``catch_up``, batches growing from 32 rows, counted in parts of 32, through a writer on that
database, each conversation's vectors SIF-pooled by that database's token counts), and every
question is asked with the same search and parameters (bench/recall.py passes its
``hybrid()``).

Then both stores are read side by side (the SQLite file the hybrid was measured on, opened
again), so that a difference in recall shows at which stage it arises:

- ``same_top10``: questions whose top 10 hits, as turns, are the same, in the same order;
- ``same_candidates``: questions whose full-text candidates (``search_messages`` with the
  ``ranked`` count the hybrid asks for) are the same turns, in the same order, with the
  same ranks (to 1e-9);
- ``same_vectors``: turns whose stored vector is the same bytes;
- ``same_queries``: questions whose query vector, weighted by each store's token counts,
  is the same.

The questions whose top 10 differ are listed with their R@10 on each adapter and the
stages that differ for them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _backends_pg import durable_server, fresh_database, pg_server_module
from _recall_data import LIMIT, Conversation, Method, Score, ask, seed
from rich.console import Console
from rich.table import Table

from fermix.config import Config
from fermix.home import Home
from fermix.model import ConversationKey
from fermix.runtime import indexing
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Storage
from fermix.storage.port import CANDIDATES, conversation_scope
from fermix.storage.postgres import PgDatabase
from fermix.storage.sqlite.database import Database

DATABASE = "fermix_recall"
TOP = 10
TARGET_POINTS = 0.5
"""Issue 15, item 3: PostgreSQL's turn R@10 within this many points of SQLite's."""
SHOWN_DIFFERENCES = 12


@dataclass
class Difference:
    """A question whose top 10 differ between the adapters, and where they part."""

    sample_id: str
    question: str
    r10_sqlite: float
    r10_pg: float
    same_candidates: bool
    same_query: bool
    same_vectors: bool
    """Whether every turn of the conversation has the same vector on both."""


@dataclass
class PgRecall:
    """What the PostgreSQL pass measured, and how it compares with SQLite's."""

    hybrid: Score
    server_version: str
    embedded: int
    questions: int = 0
    same_top10: int = 0
    same_candidates: int = 0
    same_queries: int = 0
    turns: int = 0
    same_vectors: int = 0
    differences: list[Difference] = field(default_factory=list)


def run_pg(
    convs: list[Conversation], workdir: Path, method: Method, sqlite: Score
) -> PgRecall | str:
    """Measure ``method`` on PostgreSQL over ``convs`` and compare with ``sqlite`` (the same
    search's score on the SQLite file of ``Home(workdir)``); or why no PostgreSQL could be
    started."""
    try:
        with durable_server() as server:
            pg = PgDatabase(fresh_database(server, DATABASE), readers=1)
            lite = Database(Home(workdir).db_path)
            try:
                return _measure(convs, workdir, method, sqlite, pg, lite, str(server.version))
            finally:
                lite.close()
                pg.close()
    except pg_server_module().PostgresUnavailable as exc:  # only its start raises it
        return f"{type(exc).__name__}: {exc}"


def _measure(
    convs: list[Conversation],
    workdir: Path,
    method: Method,
    sqlite: Score,
    pg: PgDatabase,
    lite: Database,
    version: str,
) -> PgRecall:
    pg_writer = Writer(pg, PromptFiles(Home(workdir / "pg-home"), pg))
    keys, ids = seed(pg, convs)
    indexer = indexing.Indexer.from_config(pg, pg_writer, Config().embedding)
    assert indexer is not None, "embedding is off in the default configuration"
    indexer.record()
    embedded = indexer.catch_up()
    indexing.register(pg, indexer)
    try:
        score = Score("fermix hybrid on PostgreSQL: search_history")
        ask(score, pg, convs, keys, ids, method)
    finally:
        indexing.unregister(pg, indexer)
    # The SQLite side's own indexer, sharing the loaded model, only to weigh query vectors.
    lite_indexer = indexing.Indexer(
        lite, Writer(lite, PromptFiles(Home(workdir), lite)), indexer.embedder
    )
    lite_indexer.record()
    out = PgRecall(score, version, embedded)
    for conv in convs:
        key = keys[conv.sample_id]
        vectors = [_vectors(db, key) for db in (lite, pg)]
        out.turns += len(conv.turns)
        same_vectors = [vectors[0].get(t.dia) == vectors[1].get(t.dia) for t in conv.turns]
        out.same_vectors += sum(same_vectors)
        found = zip(sqlite.found[conv.sample_id], score.found[conv.sample_id], strict=True)
        for (question, lite_dias), (_, pg_dias) in found:
            same_candidates = _candidates(lite, question.text, key) == _candidates(
                pg, question.text, key
            )
            queries = [
                _query(db, ix, question.text, key)
                for db, ix in ((lite, lite_indexer), (pg, indexer))
            ]
            same_query = _same_vector(*queries)
            out.questions += 1
            out.same_candidates += same_candidates
            out.same_queries += same_query
            if lite_dias[:TOP] == pg_dias[:TOP]:
                out.same_top10 += 1
                continue
            out.differences.append(
                Difference(
                    conv.sample_id,
                    question.text,
                    _r10(question.evidence, lite_dias),
                    _r10(question.evidence, pg_dias),
                    same_candidates,
                    same_query,
                    all(same_vectors),
                )
            )
    return out


def _dias(db: Storage, key: ConversationKey) -> dict[int, str]:
    """Each message id of ``key`` on ``db`` as its turn (the messages are the turns, in order)."""
    with db.read() as reads:
        return {m.id: f"#{n}" for n, m in enumerate(reads.messages(key))}


def _vectors(db: Storage, key: ConversationKey) -> dict[str, bytes | None]:
    """The stored vector of each turn of ``key``, by its position in the conversation."""
    dias = _dias(db, key)
    with db.read() as reads:
        rows = reads.scope_vectors(key=key)
    assert rows is not None
    return {dias[i]: v for i, v in zip(rows.ids, rows.vectors, strict=True)}


def _candidates(db: Storage, text: str, key: ConversationKey) -> list[tuple[str, float]]:
    """The full-text candidates the hybrid fuses, as (turn, rank), best first."""
    dias = _dias(db, key)
    with db.read() as reads:
        hits = reads.search_messages(text, key=key, limit=LIMIT, ranked=max(CANDIDATES, LIMIT))
    return [(dias[i], round(r, 9)) for i, r in zip(hits.ids, hits.ranks, strict=True)]


def _query(
    db: Storage, indexer: indexing.Indexer, text: str, key: ConversationKey
) -> np.ndarray[Any, Any] | None:
    """The query vector the hybrid computes for ``text`` in conversation ``key``."""
    with db.read() as reads:
        return indexer.query(reads, text, [conversation_scope(key)])


def _same_vector(a: np.ndarray[Any, Any] | None, b: np.ndarray[Any, Any] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))


def _r10(evidence: frozenset[str], dias: list[str]) -> float:
    return round(100 * len(evidence & set(dias[:TOP])) / len(evidence), 1)


def mean_recall(score: Score, k: int) -> float | None:
    """Turn recall@k in percent over every question, not rounded (a difference of two
    rounded means may be 0.1 off)."""
    values = [
        len(q.evidence & set(d[:k])) / len(q.evidence)
        for found in score.found.values()
        for q, d in found
    ]
    return 100 * statistics.fmean(values) if values else None


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def figures(pg: PgRecall | str, sqlite: Score) -> dict[str, Any]:
    """The JSON line's PostgreSQL figures (null, with ``pg_error``, when none was had)."""
    if isinstance(pg, str):
        return dict.fromkeys(figures(PgRecall(Score(""), "", 0), sqlite)) | {"pg_error": pg}
    lite, post = mean_recall(sqlite, TOP), mean_recall(pg.hybrid, TOP)
    gap = None if lite is None or post is None else round(post - lite, 2)
    return {
        "turn_r5_pg": pg.hybrid.recall(5),
        "turn_r10_pg": pg.hybrid.recall(10),
        "turn_r20_pg": pg.hybrid.recall(20),
        "p50_ms_pg": pg.hybrid.percentile_ms(50),
        "p99_ms_pg": pg.hybrid.percentile_ms(99),
        "recall_r10_pg_minus_sqlite": gap,
        "recall_r10_pg_abs_gap": None if gap is None else abs(gap),
        "same_top10_share_pg": _share(pg.same_top10, pg.questions),
        "same_candidates_share_pg": _share(pg.same_candidates, pg.questions),
        "same_query_share_pg": _share(pg.same_queries, pg.questions),
        "same_vectors_share_pg": _share(pg.same_vectors, pg.turns),
        "pg_server_version": pg.server_version,
        "pg_error": None,
    }


def render(console: Console, pg: PgRecall | str, sqlite: Score) -> None:
    """The comparison table, and the questions whose top 10 differ."""
    if isinstance(pg, str):
        console.print(f"PostgreSQL: not measured ({pg})", highlight=False)
        return
    shown = figures(pg, sqlite)
    table = Table(
        title=f"PostgreSQL {pg.server_version} vs SQLite: the shipped hybrid, the same turns"
        f" ({pg.embedded} embedded)"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row(
        "turn R@10, PostgreSQL minus SQLite (points)",
        f"{shown['recall_r10_pg_minus_sqlite']:+.2f}",
        f"|x| ≤ {TARGET_POINTS}",
    )
    for label, part, whole in (
        ("questions with the same top 10 turns, in order", pg.same_top10, pg.questions),
        ("questions with the same full-text candidates", pg.same_candidates, pg.questions),
        ("questions with the same query vector", pg.same_queries, pg.questions),
        ("turns with the same stored vector", pg.same_vectors, pg.turns),
    ):
        table.add_row(label, f"{part} / {whole}", "")
    console.print(table)
    for line in _listed(pg.differences):
        console.print(line, highlight=False, markup=False)


def _listed(differences: list[Difference]) -> Iterator[str]:
    if not differences:
        return
    yield f"top 10 differ for {len(differences)} questions (R@10 SQLite -> PostgreSQL):"
    for d in differences[:SHOWN_DIFFERENCES]:
        parted = [
            name
            for name, same in (
                ("candidates", d.same_candidates),
                ("query", d.same_query),
                ("vectors", d.same_vectors),
            )
            if not same
        ]
        yield (
            f"  {d.sample_id} {d.r10_sqlite:5.1f} -> {d.r10_pg:5.1f}"
            f"  differ: {', '.join(parted) or 'nothing upstream (fusion order)'}"
            f"  {d.question[:90]}"
        )
