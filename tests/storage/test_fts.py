"""The FTS5 query builder, the scoped ranking and the FTS5 mirrors, on real SQLite (S4, S5, T2)."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import apsw
import pytest
import ranking_reference as reference_ranking
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix.model import ConversationKey, NewMessage
from fermix.storage import fulltext as fts
from fermix.storage.sqlite import messages
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.migrations import open_database

KEY = ConversationKey("agent", "telegram", "alice")
OTHER = ConversationKey("agent", "telegram", "bob")
VOCABULARY = ("apple", "river", "piano", "zebra", "garden", "rocket", "violet", "NEAR", "AND")
NASTY = [
    "",
    " ",
    '"',
    '""',
    '"unclosed',
    "'",
    "AND",
    "OR",
    "NOT",
    "a AND",
    "OR b",
    "NOT x",
    "NEAR(a b)",
    "NEAR(a b, 2)",
    "a NEAR/3 b",
    "*",
    "a*",
    "*a",
    "^",
    "^x",
    ":",
    "a:b",
    "content:x",
    "key:value",
    "{content}:x",
    "-x",
    "+x",
    "(",
    ")",
    "(a OR b",
    "a) OR (b",
    "\x00",
    "a\x00b",
    "\x01\x02\x1f\x7f",
    "\u200b\u200d\ufeff",
    "🎉",
    "👩‍👩‍👧 party 🎉",
    "你好世界",
    "こんにちは 世界",
    "e\u0301cole",
    "हिन्दी",
    "\u0301",
    "foo_bar",
    "\ue000private",
    "Caroline's \u201cpottery\u201d class?",
    "x" * 100_000,
    "word " * 20_000,
    "the " * 30_000,
    "a" * 65,
    "\ud800pottery\udfff",
]

# Text that is mostly FTS5 syntax, to reach the builder's corners faster than st.text().
SYNTAX_PIECES = [*"\"'()*^:-+,/{} \x00\t🎉é", "AND", "OR", "NOT", "NEAR", "content", "key", "a"]
SYNTAX = st.lists(st.sampled_from(SYNTAX_PIECES), max_size=30).map("".join)
CONTROL = st.text(st.sampled_from([*map(chr, range(32)), "\x7f", "\x85", "a", "é", '"', " "]))
ANY_TEXT = st.one_of(st.text(), SYNTAX, CONTROL, st.text(st.characters(codec="utf-8")))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[apsw.Connection]:
    """A database with two conversations and two memories sharing words."""
    conn = open_database(tmp_path_factory.mktemp("fts") / "m.db")
    with transaction(conn):
        for key in (KEY, OTHER):
            for text in ("I adore pottery", "NEAR the river AND the garden", "a zebra 🎉"):
                messages.insert(conn, NewMessage(key, "user", f"{text} ({key.chat_id})"))
        _insert_memory(conn, "pottery", "likes the river garden", "s1")
        _insert_memory(conn, "content:x", "NEAR(a b) ^x", "s2")
    yield conn
    conn.close()


def _insert_memory(conn: apsw.Connection, key: str, value: str, scope_id: str) -> int:
    row = conn.execute(
        "INSERT INTO memories (agent_id, owner_id, scope_type, scope_id, category, key, value,"
        " created_at, updated_at) VALUES ('agent', 'alice', 'conversation', ?, 'context', ?, ?,"
        " 0, 0) RETURNING id",
        (scope_id, key, value),
    ).fetchall()
    return int(row[0][0])  # type: ignore[arg-type]


def _match(conn: apsw.Connection, table: str, query: str) -> set[int]:
    sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ?"
    return {int(r[0]) for r in conn.execute(sql, (query,))}


def _assert_accepted(conn: apsw.Connection, text: str) -> None:
    query = fts.build_query(text)
    if query is None:
        return
    _match(conn, "messages_fts", query)
    _match(conn, "memories_fts", query)


# --- the builder never raises, and FTS5 accepts what it builds (T2) -------------------------


@pytest.mark.parametrize("text", NASTY, ids=lambda t: repr(t[:20]))
def test_t2_nasty_text_builds_a_query_fts5_accepts(corpus: apsw.Connection, text: str) -> None:
    _assert_accepted(corpus, text)
    messages.search(corpus, text, key=KEY)


@given(text=ANY_TEXT)
@settings(max_examples=300, deadline=None)
def test_t2_any_text_builds_a_query_fts5_accepts(corpus: apsw.Connection, text: str) -> None:
    _assert_accepted(corpus, text)


@given(text=ANY_TEXT)
@settings(max_examples=200, deadline=None)
def test_t2_search_with_a_key_never_returns_another_conversation(
    corpus: apsw.Connection, text: str
) -> None:
    for key in (KEY, OTHER):
        hits = messages.search(corpus, text, key=key, limit=50)
        assert all(hit.message.key == key for hit in hits)


def test_t2_search_with_a_key_finds_only_that_conversation(corpus: apsw.Connection) -> None:
    hits = messages.search(corpus, "pottery river zebra", key=OTHER, limit=50)
    assert len(hits) == 3
    assert {hit.message.key for hit in hits} == {OTHER}


def test_t2_fts5_syntax_in_text_is_searched_as_words(corpus: apsw.Connection) -> None:
    query = fts.build_query('NEAR(river "garden") AND content:pottery*')
    assert query == '"near" OR "river" OR "garden" OR "content" OR "pottery"'
    assert len(_match(corpus, "messages_fts", query)) == 4


# --- terms: stopwords, bounds, tokenizer consistency (T2) -----------------------------------


def test_t2_stopwords_are_dropped() -> None:
    assert fts.terms("What kind of pottery did Melanie make?") == ["pottery", "melanie", "make"]


def test_t2_stopwords_are_kept_when_they_are_all_there_is() -> None:
    assert fts.terms("To be, or not to be") == ["to", "be", "or", "not"]
    assert fts.terms("To be, or not to be", stopwords=False) == ["to", "be", "or", "not"]


def test_t2_words_are_lower_cased_and_distinct() -> None:
    assert fts.terms("Pottery POTTERY pottery class") == ["pottery", "class"]


def test_t2_words_without_letters_or_digits_are_dropped() -> None:
    assert fts.terms("🎉 \u0301 -- ** ...") == []
    assert fts.build_query("🎉 ()") is None


def test_t2_words_stay_whole_where_unicode61_keeps_one_token() -> None:
    assert fts.terms("e\u0301cole 你好世界 foo_bar") == ["e\u0301cole", "你好世界", "foo", "bar"]


def test_t2_a_100_kb_query_is_bounded_and_fast() -> None:
    text = " ".join(f"word{i}" for i in range(20_000))[:100_000]
    start = time.perf_counter()
    words = fts.terms(text)
    assert len(words) == fts.MAX_TERMS
    assert fts.terms("x" * 100_000) == []
    assert time.perf_counter() - start < 1.0


def test_t2_the_ranking_tokenizer_is_the_tables_tokenizer() -> None:
    schema = (
        resources.files("fermix.storage.sqlite").joinpath("schema.sql").read_text(encoding="utf-8")
    )
    name, args = fts.TOKENIZER
    declared = re.findall(r"tokenize = '([^']*)'", schema)
    assert declared, "schema.sql declares no FTS5 tokenizer"
    assert set(declared) == {" ".join([name, *args])}


# --- ranking by the searched scope (T2) -----------------------------------------------------


def test_t2_search_weighs_words_by_their_rarity_in_the_searched_conversation(
    tmp_path: Path,
) -> None:
    conn = open_database(tmp_path / "m.db")
    with transaction(conn):
        for i in range(10):
            messages.insert(conn, NewMessage(KEY, "user", f"hey Caroline, how was day {i}?"))
        wanted = messages.insert(conn, NewMessage(KEY, "user", "I signed up for pottery"))
        messages.insert(conn, NewMessage(KEY, "user", "Caroline! Caroline!"))
        for i in range(50):
            messages.insert(conn, NewMessage(OTHER, "user", f"pottery lesson number {i}"))
    query = fts.build_query("Caroline pottery")
    plain = conn.execute(
        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? AND rowid <= ?"
        " ORDER BY bm25(messages_fts) LIMIT 1",
        (query, wanted.id + 1),
    ).fetchall()
    assert plain[0][0] == wanted.id + 1, "over the whole table the name outweighs pottery"
    hits = messages.search(conn, "Caroline pottery", key=KEY, limit=3)
    assert hits[0].message.id == wanted.id
    assert [h.rank for h in hits] == sorted(h.rank for h in hits)
    conn.close()


def test_t2_rank_scores_every_document_and_prefers_rare_words(tmp_path: Path) -> None:
    conn = open_database(tmp_path / "m.db")
    tokenize = fts.tokenizer(conn)
    docs = ["the cat", "the cat sat", "a rare aardvark", "cat and aardvark"]
    scores = fts.rank("cat aardvark", docs, scope_rows=100, tokenize=tokenize)
    assert len(scores) == len(docs)
    assert max(range(len(docs)), key=lambda i: scores[i]) == 3
    assert fts.rank("the", [], scope_rows=0, tokenize=tokenize) == []
    assert fts.rank("🎉", docs, scope_rows=4, tokenize=tokenize) == [0.0] * 4
    conn.close()


@given(documents=st.lists(st.text(), max_size=20))
@settings(max_examples=200, deadline=None)
def test_t2_rank_tokenizes_each_candidate_as_the_table_does(
    corpus: apsw.Connection, documents: list[str]
) -> None:
    tokenize = fts.tokenizer(corpus)
    expected = [tuple(tokenize(doc.replace("\ue000", " "))) for doc in documents]
    assert fts.tokenize_each(documents, tokenize) == expected


RANKED_WORDS = ("apple", "apples", "river", "piano", "the", "zebra", "garden", "gardening")
RANKED_TEXT = st.lists(st.sampled_from(RANKED_WORDS), max_size=12).map(" ".join)


@given(
    documents=st.lists(st.one_of(st.text(max_size=40), RANKED_TEXT), max_size=12),
    extra=st.lists(st.sampled_from(["river", "\ue000", "nowhere", "appl"]), max_size=3),
)
@settings(max_examples=200, deadline=None)
def test_t2_tokenize_matches_counts_each_query_token_and_length_of_every_row(
    corpus: apsw.Connection, documents: list[str], extra: list[str]
) -> None:
    """The counts the preselection scores by are each row's own token counts, whatever the
    row holds (the separator, nothing at all), and its tokens those of tokenize_each."""
    tokenize = fts.tokenizer(corpus)
    each = fts.tokenize_each(documents, tokenize)
    query = list(dict.fromkeys([*(t for found in each[:2] for t in found[:3]), *extra]))
    matched = fts.tokenize_matches(documents, query, tokenize)
    assert matched.tokens(range(len(documents))) == each
    assert matched.lengths.tolist() == [len(found) for found in each]
    assert matched.counts.tolist() == [[found.count(term) for found in each] for term in query]
    picked = list(range(len(documents)))[::-2]
    taken = matched.take(picked)
    assert taken.tokens(range(len(picked))) == [each[i] for i in picked]
    assert taken.counts.tolist() == [[each[i].count(term) for i in picked] for term in query]


@given(documents=st.lists(RANKED_TEXT, max_size=30), text=RANKED_TEXT, keep=st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_t2_preselect_and_rank_agree_with_the_formulas_written_row_by_row(
    corpus: apsw.Connection, documents: list[str], text: str, keep: int
) -> None:
    """fts.preselect and fts.rank, array by array, give the scores and the order of the
    documented formulas computed one row and one term at a time (tests/ranking_reference.py),
    ties included."""
    tokenize = fts.tokenizer(corpus)
    tokens = fts.tokenize_each(documents, tokenize)
    matched = fts.tokenize_matches(documents, fts.query_tokens(text, tokenize), tokenize)
    scope_rows = len(documents) + 5
    want = reference_ranking.order(
        reference_ranking.preselect_scores(text, tokens, scope_rows=scope_rows, tokenize=tokenize),
        keep,
    )
    chosen = fts.preselect(matched, scope_rows=scope_rows, keep=keep)
    assert chosen == want
    scores = fts.rank(
        text,
        [documents[i] for i in chosen],
        scope_rows=scope_rows,
        tokenize=tokenize,
        matched=matched.take(chosen),
    )
    expected = reference_ranking.rank_scores(
        text, [tokens[i] for i in chosen], scope_rows=scope_rows, tokenize=tokenize
    )
    assert scores == expected
    alone = fts.rank(text, [documents[i] for i in chosen], scope_rows=scope_rows, tokenize=tokenize)
    assert alone == expected


# --- the mirrors follow every write (S4, S5) ------------------------------------------------

WORDS = st.lists(st.sampled_from(VOCABULARY), min_size=0, max_size=4).map(" ".join)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 9), WORDS, WORDS),
        st.tuples(st.just("update"), st.integers(0, 9), WORDS, WORDS),
        st.tuples(st.just("delete"), st.integers(0, 9), WORDS, WORDS),
    ),
    max_size=25,
)
_files = itertools.count()


def _fresh(tmp_path: Path) -> apsw.Connection:
    # Hypothesis reuses tmp_path across examples, so each example gets its own file.
    return open_database(tmp_path / f"m{next(_files)}.db")


def _integrity_check(conn: apsw.Connection, table: str) -> None:
    conn.execute(f"INSERT INTO {table} ({table}) VALUES ('integrity-check')")
    # rank = 1 also compares the index with the external content table, row by row.
    conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")


def _has_word(text: str, word: str) -> bool:
    return word.lower() in text.lower().split()


@given(operations=OPERATIONS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_s4_fts_returns_exactly_the_rows_holding_a_word_after_any_writes(
    tmp_path: Path, operations: list[tuple[str, int, str, str]]
) -> None:
    conn = _fresh(tmp_path)
    content: dict[int, str] = {}
    for op, pick, text, _ in operations:
        ids = sorted(content)
        with transaction(conn):
            if op == "insert":
                content[messages.insert(conn, NewMessage(KEY, "user", text)).id] = text
            elif op == "update" and ids:
                target = ids[pick % len(ids)]
                conn.execute("UPDATE messages SET content = ? WHERE id = ?", (text, target))
                content[target] = text
            elif op == "delete" and ids:
                target = ids[pick % len(ids)]
                conn.execute("DELETE FROM messages WHERE id = ?", (target,))
                del content[target]
    for word in VOCABULARY:
        expected = {i for i, text in content.items() if _has_word(text, word)}
        assert _match(conn, "messages_fts", fts.quote(word)) == expected
        found = messages.search(conn, word, key=KEY, limit=1000)
        assert {hit.message.id for hit in found} == expected
    _integrity_check(conn, "messages_fts")
    conn.close()


@given(operations=OPERATIONS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_s5_memories_fts_returns_exactly_the_rows_holding_a_word_after_any_writes(
    tmp_path: Path, operations: list[tuple[str, int, str, str]]
) -> None:
    conn = _fresh(tmp_path)
    rows: dict[int, tuple[str, str]] = {}
    for n, (op, pick, key, value) in enumerate(operations):
        ids = sorted(rows)
        with transaction(conn):
            if op == "insert":
                rows[_insert_memory(conn, key, value, f"s{n}")] = (key, value)
            elif op == "update" and ids:
                target = ids[pick % len(ids)]
                old_key, old_value = rows[target]
                # Alternate between changing the key, the value, and both.
                new = [(key, old_value), (old_key, value), (key, value)][pick % 3]
                conn.execute("UPDATE memories SET key = ?, value = ? WHERE id = ?", (*new, target))
                rows[target] = new
            elif op == "delete" and ids:
                target = ids[pick % len(ids)]
                conn.execute("DELETE FROM memories WHERE id = ?", (target,))
                del rows[target]
    for word in VOCABULARY:
        expected = {i for i, (k, v) in rows.items() if _has_word(k, word) or _has_word(v, word)}
        assert _match(conn, "memories_fts", fts.quote(word)) == expected
        in_keys = {i for i, (k, _) in rows.items() if _has_word(k, word)}
        assert _match(conn, "memories_fts", f"key : {fts.quote(word)}") == in_keys
    _integrity_check(conn, "memories_fts")
    conn.close()


def test_s4_integrity_check_fails_when_the_mirror_drifts(tmp_path: Path) -> None:
    conn = open_database(tmp_path / "m.db")
    with transaction(conn):
        messages.insert(conn, NewMessage(KEY, "user", "apple"))
        # Bypass the triggers' bookkeeping: the index now holds a row the table does not.
        conn.execute("INSERT INTO messages_fts (rowid, content) VALUES (999, 'ghost')")
    with pytest.raises(apsw.Error):
        _integrity_check(conn, "messages_fts")
    conn.close()
