"""Recall in a scope too large to read whole (Q2, Q4, B1): the approximate index.

``search_history`` reads a scope's every vector up to ``max_rows`` messages. Past that, on
PostgreSQL with pgvector, it fuses the scope's nearest rows (``nearest_messages``, an HNSW
search filtered to the scope) with the full-text candidates; on SQLite it searches by full
text only. A scope smaller than the nearest rows asked for gives the index every row, so
the fused hits must equal those of the whole read exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_fixtures import Backend

from fermix.embedding import WordLlamaEmbedder
from fermix.home import Home
from fermix.model import ConversationKey, NewMessage
from fermix.runtime import indexing, recall
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer

KEY = ConversationKey("agent", "tg", "1")
OTHER = ConversationKey("agent", "tg", "2")
TEXTS = [
    "I bought a new bike yesterday",
    "The weather is nice today",
    "My cat is called Tom",
    "We should try the new pizza place",
    "Mel got married in June",
    "Work was busy this week",
    "I am reading a book about Rome",
    "The train was late again",
    "My sister's wedding is in Porto next spring",
    "The kitten sleeps on my keyboard",
    "We hiked up the mountain at dawn",
    "I prefer green tea over coffee",
]
QUERIES = ["pet cat", "wedding", "bicycle", "tea", "holiday in Italy", "mountain walk"]


@pytest.fixture
def indexed(backend: Backend, tmp_path: Path) -> Iterator[Backend]:
    """Each adapter with two owners' messages embedded by the offline model, its indexer
    serving the store's searches."""
    db = backend.db
    writer = Writer(db, PromptFiles(Home(tmp_path / "home"), db))
    for i, text in enumerate(TEXTS * 3):
        key, owner = (KEY, "ana") if i % 3 else (OTHER, "bo")
        writer.append(NewMessage(key, "user", f"{text} ({i})", owner_id=owner), trust="guest")
    indexer = indexing.Indexer(db, writer, WordLlamaEmbedder())
    indexer.record()
    indexer.catch_up()
    indexing.register(db, indexer)
    try:
        yield backend
    finally:
        indexing.unregister(db, indexer)


def _ids(hits: list[recall.SearchHit]) -> list[int]:
    return [hit.message.id for hit in hits]


@pytest.mark.parametrize("scope", ["conversation", "owner"])
def test_q4_a_scope_past_the_cap_is_searched_by_its_nearest_rows(
    indexed: Backend, scope: str
) -> None:
    """Past ``max_rows``: PostgreSQL with pgvector fuses exactly as the whole read does (the
    scope is smaller than the nearest rows asked for); SQLite answers by full text alone.
    Neither returns a row of another owner (SC3)."""
    where = {"key": KEY} if scope == "conversation" else {"agent_id": "agent", "owner_id": "ana"}
    with indexed.db.read() as reads:
        for query in QUERIES:
            whole = recall.search_history(reads, query, limit=5, **where)
            capped = recall.search_history(reads, query, limit=5, max_rows=3, **where)
            lexical = reads.search_messages(query, limit=5, **where)
            assert all(h.message.owner_id == "ana" for h in capped)
            if indexed.name == "postgres":
                assert _ids(capped) == _ids(whole), query
                assert [h.rank for h in capped] == pytest.approx([h.rank for h in whole])
            else:
                assert _ids(capped) == _ids(list(lexical)), query
    # The fusion answered something full text alone cannot: a word no message holds.
    with indexed.db.read() as reads:
        fused = recall.search_history(reads, "kitty", limit=3, max_rows=3, **where)
    assert bool(fused) == (indexed.name == "postgres")
