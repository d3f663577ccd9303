"""Search bounded by its scope (issue 14, schema migration 7): the same results as a
brute-force search over every row, the scope tokens, and the upgrade of a database written
by migration 6."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import apsw
import pytest
import ranking_reference as reference_ranking
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix.model import ConversationKey, NewMessage
from fermix.storage import fulltext as fts
from fermix.storage import messages as shared
from fermix.storage.sqlite import messages
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.migrations import latest_version, migrations, open_database

AGENTS = ("agent", "other")
CHATS = ("alice", "bob", "carol")
OWNERS = ("", "alice", "bob")
WORDS = (
    "apple",
    "apples",
    "river",
    "piano",
    "zebra",
    "garden",
    "gardening",
    "rocket",
    "violet",
    "foo_bar",
    "the",
    "and",
    "Caroline",
    "née",
    "2023",
)
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
MESSAGE = st.tuples(
    st.sampled_from(AGENTS),
    st.sampled_from(CHATS),
    st.sampled_from(("", "topic")),
    st.sampled_from(OWNERS),
    TEXT,
)
QUERY = st.lists(st.sampled_from((*WORDS, "missing", "AND", '"', "*")), max_size=5).map(" ".join)
NORMAL = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@pytest.fixture
def fresh() -> Iterator[apsw.Connection]:
    with tempfile.TemporaryDirectory(prefix="fermix-scoped-") as tmp:
        conn = open_database(Path(tmp) / "m.db")
        yield conn
        conn.close()


def _store(conn: apsw.Connection, rows: Sequence[tuple[str, str, str, str, str]]) -> None:
    with transaction(conn):
        conn.execute("DELETE FROM messages")
        for agent, chat, thread, owner, text in rows:
            key = ConversationKey(agent, "telegram", chat, thread)
            messages.insert(conn, NewMessage(key, "user", text, owner_id=owner, trust="guest"))


def _in_scope(
    row: tuple[int, str, str, str, str, str],
    *,
    key: ConversationKey | None,
    agent_id: str | None,
    owner_id: str | None,
) -> bool:
    _, agent, chat, thread, owner, _ = row
    if key is not None and (agent, "telegram", chat, thread) != key.as_tuple():
        return False
    if key is None and agent_id is not None and agent != agent_id:
        return False
    return owner_id is None or owner == owner_id


def _holds(tokens: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return n > 0 and any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def reference(
    conn: apsw.Connection,
    text: str,
    *,
    key: ConversationKey | None = None,
    agent_id: str | None = None,
    owner_id: str | None = None,
    limit: int = 10,
) -> list[tuple[int, float]]:
    """Brute force: every row read, the scope filtered in Python, each query word's phrase
    looked for in each row's tokens, then the documented ordering written row by row
    (tests/ranking_reference.py)."""
    if fts.build_query(text) is None or limit <= 0:
        return []
    tokenize = fts.tokenizer(conn)
    everything: list[Any] = conn.execute(
        "SELECT id, agent_id, chat_id, thread_scope, owner_id, content FROM messages ORDER BY id"
    ).fetchall()
    scope = [r for r in everything if _in_scope(r, key=key, agent_id=agent_id, owner_id=owner_id)]
    phrases = [tokenize(word) for word in fts.terms(text)]
    matched = [r for r in scope if any(_holds(tokenize(r[5]), p) for p in phrases)]
    if not matched:
        return []
    tokens = [tuple(tokenize(r[5][: fts.MAX_RANKED_CHARS].replace("\ue000", " "))) for r in matched]
    keep = shared.candidate_count(limit=limit, ranked=0)
    pre = reference_ranking.preselect_scores(text, tokens, scope_rows=len(scope), tokenize=tokenize)
    chosen = reference_ranking.order(pre, keep)
    scores = reference_ranking.rank_scores(
        text, [tokens[i] for i in chosen], scope_rows=len(scope), tokenize=tokenize
    )
    best = reference_ranking.order(scores, limit)
    return [(matched[chosen[i]][0], -scores[i]) for i in best]


def _scopes() -> list[dict[str, object]]:
    found: list[dict[str, object]] = [{}, {"agent_id": "agent"}, {"agent_id": "other"}]
    for agent in AGENTS:
        for owner in OWNERS:
            found.append({"agent_id": agent, "owner_id": owner})
        for chat in CHATS:
            for thread in ("", "topic"):
                key = ConversationKey(agent, "telegram", chat, thread)
                found.append({"key": key})
                found.append({"key": key, "owner_id": "alice"})
    return found


def _check_all_scopes(conn: apsw.Connection, query: str, limit: int) -> None:
    for scope in _scopes():
        got = [(h.message.id, h.rank) for h in messages.search(conn, query, limit=limit, **scope)]  # type: ignore[arg-type]
        want = reference(conn, query, limit=limit, **scope)  # type: ignore[arg-type]
        assert [i for i, _ in got] == [i for i, _ in want], scope
        assert [r for _, r in got] == pytest.approx([r for _, r in want]), scope
        # The ids and ranks of the best `limit` without their rows: those of the same search.
        few = messages.search(conn, query, limit=2, ranked=limit, **scope)  # type: ignore[arg-type]
        assert list(zip(few.ids, few.ranks, strict=True)) == got, scope
        assert [(h.message.id, h.rank) for h in few] == got[:2], scope


@given(rows=st.lists(MESSAGE, max_size=40), queries=st.lists(QUERY, min_size=1, max_size=3))
@settings(max_examples=40, deadline=None, suppress_health_check=NORMAL)
def test_search_equals_a_brute_force_search_of_every_row(
    fresh: apsw.Connection, rows: list[tuple[str, str, str, str, str]], queries: list[str]
) -> None:
    _store(fresh, rows)
    for query in queries:
        _check_all_scopes(fresh, query, limit=10)


@given(rows=st.lists(MESSAGE, min_size=5, max_size=40), query=QUERY)
@settings(max_examples=30, deadline=None, suppress_health_check=NORMAL)
def test_search_equals_brute_force_when_candidates_are_preselected(
    fresh: apsw.Connection,
    rows: list[tuple[str, str, str, str, str]],
    query: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With few candidates, the bm25 of the scope chooses which rows fts.rank re-scores."""
    monkeypatch.setattr(shared, "CANDIDATES", 3)
    _store(fresh, rows)
    _check_all_scopes(fresh, query, limit=2)


@given(rows=st.lists(MESSAGE, min_size=1, max_size=40), query=QUERY)
@settings(max_examples=30, deadline=None, suppress_health_check=NORMAL)
def test_a_scope_with_more_matches_than_the_cap_still_answers_only_from_the_scope(
    fresh: apsw.Connection,
    rows: list[tuple[str, str, str, str, str]],
    query: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_SCOPED_MATCHES, FTS5's bm25 picks the candidates: still the scope's rows
    holding a word, as many as asked for."""
    monkeypatch.setattr(messages, "MAX_SCOPED_MATCHES", 2)
    _store(fresh, rows)
    for scope in _scopes():
        got = {h.message.id for h in messages.search(fresh, query, limit=1000, **scope)}  # type: ignore[arg-type]
        assert got == {i for i, _ in reference(fresh, query, limit=1000, **scope)}  # type: ignore[arg-type]


# --- the scope tokens ------------------------------------------------------------------

IDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=12)
SOME_IDS = IDS.filter(lambda text: text.strip() != "")  # a required id: not blank (validate)


@given(agent=SOME_IDS, channel=SOME_IDS, chat=SOME_IDS, thread=IDS, owner=IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=NORMAL)
def test_tokens_are_what_sqlite_stores_and_one_token_each(
    fresh: apsw.Connection, agent: str, channel: str, chat: str, thread: str, owner: str
) -> None:
    key = ConversationKey(agent, channel, chat, thread)
    with transaction(fresh):
        fresh.execute("DELETE FROM messages")
        stored = messages.insert(fresh, NewMessage(key, "user", "hello", owner_id=owner))
    (value,) = fresh.execute(
        "SELECT search_scope FROM messages WHERE id = ?", (stored.id,)
    ).fetchall()[0]
    conversation, owned = shared.conversation_token(key), shared.owner_token(agent, owner)
    assert value == f"{conversation} {owned}"
    tokenize = fts.tokenizer(fresh)
    assert tokenize(conversation) == [conversation.lower()]
    assert tokenize(owned) == [owned.lower()]
    assert [h.message.id for h in messages.search(fresh, "hello", key=key)] == [stored.id]
    found = messages.search(fresh, "hello", agent_id=agent, owner_id=owner)
    assert [h.message.id for h in found] == [stored.id]


def test_a_word_typed_like_a_token_matches_only_text(fresh: apsw.Connection) -> None:
    key = ConversationKey("agent", "telegram", "alice")
    with transaction(fresh):
        messages.insert(fresh, NewMessage(key, "user", "nothing to see", owner_id="alice"))
    for token in (shared.conversation_token(key), shared.owner_token("agent", "alice")):
        assert messages.search(fresh, token, key=key) == []
        assert messages.search(fresh, token, agent_id="agent", owner_id="alice") == []
        assert messages.search(fresh, token) == []


def test_writes_from_plain_sql_keep_the_tokens_right(fresh: apsw.Connection) -> None:
    """An update of any column a token is made of re-indexes the row; a delete removes it."""
    alice = ConversationKey("agent", "telegram", "alice")
    bob = ConversationKey("agent", "telegram", "bob")
    with transaction(fresh):
        moved = messages.insert(fresh, NewMessage(alice, "user", "piano lesson", owner_id="a"))
        gone = messages.insert(fresh, NewMessage(alice, "user", "piano tuner", owner_id="a"))
        fresh.execute(
            "UPDATE messages SET chat_id = 'bob', owner_id = 'b' WHERE id = ?", (moved.id,)
        )
        fresh.execute("DELETE FROM messages WHERE id = ?", (gone.id,))
    assert messages.search(fresh, "piano", key=alice) == []
    assert [h.message.id for h in messages.search(fresh, "piano", key=bob)] == [moved.id]
    assert messages.search(fresh, "piano", agent_id="agent", owner_id="a") == []
    found = messages.search(fresh, "piano", agent_id="agent", owner_id="b")
    assert [h.message.id for h in found] == [moved.id]
    fresh.execute("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")


# --- migration 7 on a database written by migration 6 ------------------------------------


def _database_at(path: Path, version: int) -> apsw.Connection:
    """A database with migrations 1..``version`` applied, as that fermix wrote it."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode = WAL")
    for migration in migrations()[:version]:
        with transaction(conn):
            for _ in conn.execute(migration.sql):
                pass
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
                (migration.version, migration.name),
            )
            conn.execute(f"PRAGMA user_version = {migration.version}")
    return conn


def test_migration_7_backfills_every_message_of_a_migration_6_database(tmp_path: Path) -> None:
    assert [m.version for m in migrations()][6] == 7
    path = tmp_path / "m.db"
    old = _database_at(path, 6)
    written: dict[int, tuple[ConversationKey, str, str]] = {}
    with transaction(old):
        for n in range(300):
            key = ConversationKey(
                f"agent{n % 2}", "telegram", f"chat{n % 7}", ("", "t")[n % 3 == 0]
            )
            owner = f"owner{n % 5}" if n % 4 else ""
            word = f"unique{n}"
            found: list[Any] = old.execute(
                "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, role,"
                " content, created_at, client_key) VALUES (?,?,?,?,?,'user',?,?,?) RETURNING id",
                (
                    *key.as_tuple()[:1],
                    owner,
                    *key.as_tuple()[1:],
                    f"{word} common words",
                    n,
                    None if n % 2 else f"k{n}",
                ),
            ).fetchall()
            written[int(found[0][0])] = (key, owner, word)
        old.execute("DELETE FROM messages WHERE id = ?", (min(written),))
        del written[min(written)]
    old.close()

    conn = open_database(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchall()[0][0] == latest_version()
        conn.execute("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")
        for message_id, (key, owner, word) in written.items():
            in_chat = messages.search(conn, word, key=key)
            assert [h.message.id for h in in_chat] == [message_id]
            of_owner = messages.search(conn, word, agent_id=key.agent_id, owner_id=owner)
            assert [h.message.id for h in of_owner] == [message_id]
            assert [h.message.id for h in messages.search(conn, word)] == [message_id]
        assert {h.message.id for h in messages.search(conn, "common", limit=1000)} == set(written)
        # New appends are indexed with their tokens by the new triggers.
        key = ConversationKey("agent0", "telegram", "chat0")
        with transaction(conn):
            new = messages.insert(conn, NewMessage(key, "user", "brandnew", owner_id="owner1"))
        found = messages.search(conn, "brandnew", agent_id="agent0", owner_id="owner1")
        assert [h.message.id for h in found] == [new.id]
    finally:
        conn.close()


def test_a_conversation_search_reads_its_scope_not_the_table(tmp_path: Path) -> None:
    """Many rows of other conversations holding the word cost a search of one conversation
    almost nothing: it takes about as long as on a table holding that conversation alone."""
    conn = open_database(tmp_path / "m.db")
    mine = ConversationKey("agent", "telegram", "mine")
    with transaction(conn):
        for n in range(50):
            messages.insert(conn, NewMessage(mine, "user", f"river walk {n}", owner_id="me"))

    def timed() -> float:
        best = float("inf")
        for _ in range(15):
            start = time.perf_counter()
            messages.search(conn, "river walk", key=mine)
            messages.search(conn, "river walk", agent_id="agent", owner_id="me")
            best = min(best, time.perf_counter() - start)
        return best

    alone = timed()
    with transaction(conn):
        for n in range(20_000):
            other = ConversationKey("agent", "telegram", f"other{n % 40}")
            messages.insert(conn, NewMessage(other, "user", f"river walk {n}", owner_id="you"))
    assert timed() < 5 * alone + 0.005
    conn.close()
