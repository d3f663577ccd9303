"""Conversation search on PostgreSQL (issue 15, docs/postgres.md): a conversation of at most
``DIRECT_MATCH_ROWS`` messages is read by its index and matched row by row, a larger one
through the GIN index; both ways find what SQLite finds, and the small one never asks the
GIN index, whose posting lists grow with the table.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_fixtures import Store

from fermix.model import ConversationKey, NewMessage

psycopg = pytest.importorskip("psycopg")
pg_messages = pytest.importorskip("fermix.storage.postgres.messages")

KEY = ConversationKey("agent", "telegram", "123")
OTHER = ConversationKey("agent", "telegram", "456", "thread-1")
WORDS = (
    "tea", "coffee", "drink", "drinking", "marathon", "running", "puppy", "adopted",
    "Caroline", "café", "naïve", "foo_bar", "x@y.com", "2023", "the", "and", "sunset",
)  # fmt: skip
QUERIES = (
    "What does she like to drink, tea or coffee?",
    "running a marathon",
    "When did Caroline adopt the puppy?",
    "cafe naive foo_bar",
    "x@y.com 2023",
    "the and",
    "nothing stored matches this",
)


def _load(db: Store, rows: list[tuple[ConversationKey, str, str]]) -> None:
    db.write_each(
        [
            (
                lambda w, key=key, owner=owner, text=text: w.insert_message(
                    NewMessage(key, "user", text, owner_id=owner, trust="guest")
                ),
                "load",
            )
            for key, owner, text in rows
        ]
    )


def _corpus(seed: int, size: int) -> list[tuple[ConversationKey, str, str]]:
    rng = random.Random(seed)
    return [
        (
            rng.choice((KEY, KEY, OTHER)),
            rng.choice(("alice", "bob")),
            " ".join(rng.choices(WORDS, k=rng.randint(1, 9))),
        )
        for _ in range(size)
    ]


def _found(db: Store, query: str, scope: dict[str, Any], limit: int = 10) -> list[Any]:
    with db.read() as r:
        hits = r.search_messages(query, limit=limit, ranked=limit + 5, **scope)
    # Appended in the same order to empty stores, the rows have the same ids on both.
    return [(h.message.id, h.message.content, h.rank) for h in hits] + list(
        zip(hits.ids, hits.ranks, strict=True)
    )


@pytest.fixture
def direct_rows(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Sets the largest conversation searched without the GIN index, for one test."""

    def set_to(rows: int) -> None:
        monkeypatch.setattr(pg_messages, "DIRECT_MATCH_ROWS", rows)

    yield set_to


@pytest.mark.parametrize("largest_direct", [0, 100, 1_000_000])
def test_a_conversation_read_by_its_index_or_through_the_gin_index_finds_what_sqlite_finds(
    both: tuple[Store, Store], direct_rows: Any, largest_direct: int
) -> None:
    """Every conversation through the GIN index (0), the larger of the two only (100: the
    first holds about 130 messages, the second about 70), or none through it."""
    sqlite, pg = both
    rows = _corpus(seed=15, size=200)
    for db in both:
        _load(db, rows)
    direct_rows(largest_direct)
    compared = 0
    for query in QUERIES:
        for scope in ({"key": KEY}, {"key": OTHER}, {"key": KEY, "owner_id": "bob"}):
            expected = _found(sqlite, query, scope)
            assert _found(pg, query, scope) == expected, (query, scope)
            compared += bool(expected)
    assert compared > 10


_TEXT = st.lists(st.sampled_from((*WORDS, "Tea!", "e-mail", "v2.0", "東京")), max_size=8).map(
    " ".join
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(_TEXT, min_size=1, max_size=5), query=_TEXT, largest_direct=st.integers(0, 12)
)
def test_the_hits_do_not_depend_on_which_side_of_the_threshold_a_conversation_is(
    both: tuple[Store, Store], direct_rows: Any, texts: list[str], query: str, largest_direct: int
) -> None:
    """The conversation grows over the examples and crosses the threshold both ways."""
    sqlite, pg = both
    for db in both:
        _load(db, [(KEY, "alice", text) for text in texts])
    direct_rows(largest_direct)
    for q in (query, texts[0]):
        assert _found(pg, q, {"key": KEY}, limit=20) == _found(sqlite, q, {"key": KEY}, limit=20)


def _index_scans(url: str, query: str, key: ConversationKey) -> dict[str, int]:
    """The index scans of one conversation search, by index name (counted within its
    transaction: ``pg_stat_get_xact_numscans``)."""
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")  # a table this small is read whole
        assert pg_messages.search(conn, query, key=key)
        rows = conn.execute(
            "SELECT indexrelid::regclass, pg_stat_get_xact_numscans(indexrelid)"
            " FROM pg_index WHERE indrelid = 'messages'::regclass"
        ).fetchall()
    return {str(name): int(scans) for name, scans in rows}


def test_a_small_conversation_is_searched_without_the_gin_index(
    postgres_db: str, direct_rows: Any
) -> None:
    """Under the threshold no GIN scan runs; over it (the same table, the same query for a
    word only one message holds, where the planner takes the GIN index) one does."""
    from fermix.storage.postgres import PgDatabase

    rows = [(KEY, "alice", text) for _, _, text in _corpus(seed=3, size=200)]
    db = PgDatabase(postgres_db)
    try:
        _load(db, [*rows, (KEY, "alice", "a zebra")])
    finally:
        db.close()
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("ANALYZE messages")
    assert _index_scans(postgres_db, "zebra", KEY)["messages_stems"] == 0
    direct_rows(200)
    assert _index_scans(postgres_db, "zebra", KEY)["messages_stems"] == 1
