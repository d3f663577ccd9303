"""Vectors behind appends (Q2), fusion (Q3), bounded by the scope searched (Q4)."""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import StartMemory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix import Memory
from fermix.cli import main
from fermix.cli.doctor_checks.vectors import check_vectors
from fermix.config import Config, EmbeddingConfig
from fermix.core import fusion
from fermix.embedding import TokenCounts, Vectors, WordLlamaEmbedder
from fermix.home import Home
from fermix.model import ConversationKey, NewMessage
from fermix.runtime import indexing, recall
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage.port import StoredVector
from fermix.storage.sqlite import messages
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.vectors import scope_vectors, store_message_vectors

FILLER = [
    "I bought a new bike yesterday",
    "The weather is nice today",
    "My cat is called Tom",
    "We should try the new pizza place",
    "Mel got married in June",
    "Work was busy this week",
    "I am reading a book about Rome",
    "The train was late again",
]


class Blocking:
    """The offline embedder, held at each call until released."""

    def __init__(self, name: str = WordLlamaEmbedder.name, dim: int | None = None) -> None:
        self.inner = WordLlamaEmbedder()
        self.release = threading.Event()
        self.name = name
        self.counts_tokens = True
        self._dim = dim

    def dimension(self) -> int:
        return self._dim or self.inner.dimension()

    def tokens(self, texts: Sequence[str]) -> list[list[int]]:
        return self.inner.tokens(texts)

    def embed(
        self,
        texts: Sequence[str],
        *,
        tokens: Sequence[Sequence[int]] | None = None,
        counts: TokenCounts | None = None,
        parts: Sequence[int] | None = None,
    ) -> Vectors:
        assert self.release.wait(30)
        out = self.inner.embed(texts, tokens=tokens, counts=counts, parts=parts)
        return out[:, : self.dimension()] if self._dim else out


@pytest.fixture
def store(tmp_path: Path) -> tuple[Database, Writer]:
    home = Home(tmp_path)
    db = Database(home.db_path)
    yield db, Writer(db, PromptFiles(home, db))
    db.close()


KEY = ConversationKey("agent", "tg", "1")


def _append(
    writer: Writer, texts: Sequence[str], key: ConversationKey = KEY, owner: str = "me"
) -> None:
    for text in texts:
        writer.append(NewMessage(key, "user", text, owner_id=owner, sender="Ann"), trust="operator")


def _coverage(db: Database) -> tuple[int, int]:
    with db.read() as reads:
        found = reads.vector_coverage()
    return found.message_vectors, found.messages


def test_q2_vectors_appear_behind_appends_without_blocking_them(
    store: tuple[Database, Writer],
) -> None:
    db, writer = store
    embedder = Blocking()
    embedder.release.set()  # let it record the model, then hold the batches
    indexer = indexing.Indexer(db, writer, embedder, batch_size=4, poll_s=0.05)
    indexer.record()
    embedder.release.clear()
    indexer.start()
    try:
        start = time.perf_counter()
        _append(writer, FILLER)
        indexer.wake()
        assert time.perf_counter() - start < 2.0  # appends never wait for the model
        assert _coverage(db) == (0, len(FILLER))
        embedder.release.set()
        indexer.wake()
        assert indexer.wait_idle(30)
        assert _coverage(db) == (len(FILLER), len(FILLER))
    finally:
        indexer.stop()


def test_q2_the_next_batch_doubles_while_full_and_undisturbed_and_falls_back_otherwise() -> None:
    assert indexing.next_batch(32, 32, 256, full=True, appended=False) == 64
    assert indexing.next_batch(128, 32, 256, full=True, appended=False) == 256
    assert indexing.next_batch(256, 32, 256, full=True, appended=False) == 256
    assert indexing.next_batch(128, 32, 256, full=True, appended=True) == 32
    assert indexing.next_batch(128, 32, 256, full=False, appended=False) == 32
    assert indexing.next_batch(32, 32, 8, full=True, appended=False) == 32  # never below base


def test_q2_a_backlog_drains_in_growing_batches_and_an_append_brings_back_the_first_size(
    store: tuple[Database, Writer], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, writer = store
    _append(writer, [f"{text} ({n})" for n in range(12) for text in FILLER])  # 96 rows
    embedder = WordLlamaEmbedder()
    indexer = indexing.Indexer(db, writer, embedder, batch_size=4, max_batch_size=16)
    calls, embed = itertools.count(1), embedder.embed

    def embed_with_an_append_during_the_third(*args: Any, **kwargs: Any) -> Vectors:
        if next(calls) == 3:  # the third batch (one call a batch: its rows are one scope's)
            indexer.wake()  # what an append does
        return embed(*args, **kwargs)

    monkeypatch.setattr(embedder, "embed", embed_with_an_append_during_the_third)
    sizes: list[int] = []
    assert indexer.catch_up(sizes.append) == 96
    # doubling while full, reset by the append during the third batch, capped at 16
    assert sizes == [4, 8, 16, 4, 8, 16, 16, 16, 8]
    assert _coverage(db) == (96, 96)


def test_q2_a_row_gets_the_same_vector_whatever_size_its_batch_grew_to(tmp_path: Path) -> None:
    texts = [f"{text} ({n})" for n in range(12) for text in FILLER]
    stored: list[list[tuple[int, bytes]]] = []
    for ceiling in (4, 64):  # batches of 4 always, or growing to 64
        home = Home(tmp_path / str(ceiling))
        db = Database(home.db_path)
        try:
            writer = Writer(db, PromptFiles(home, db))
            _append(writer, texts[:40], key=KEY)
            _append(writer, texts[40:], key=ConversationKey("agent", "tg", "2"))
            indexer = indexing.Indexer(
                db, writer, WordLlamaEmbedder(), batch_size=4, max_batch_size=ceiling
            )
            assert indexer.catch_up() == len(texts)
        finally:
            db.close()
        conn = open_database(home.db_path)
        sql = "SELECT message_id, vector FROM message_vectors ORDER BY message_id"
        stored.append([(int(r[0]), bytes(r[1])) for r in conn.execute(sql)])
        conn.close()
    assert stored[0] == stored[1]


def test_q2_a_row_without_a_vector_is_found_lexically(store: tuple[Database, Writer]) -> None:
    db, writer = store
    indexer = indexing.Indexer(db, writer, WordLlamaEmbedder())
    _append(writer, FILLER)
    indexer.record()
    indexer.catch_up()
    _append(writer, ["The zeppelin landed in Friedrichshafen"])  # no vector: nothing embeds
    indexing.register(db, indexer)
    try:
        with db.read() as reads:
            assert reads.vector_coverage().message_vectors == len(FILLER)
            hits = recall.search_history(reads, "zeppelin", key=KEY, limit=3)
        assert hits[0].message.content == "The zeppelin landed in Friedrichshafen"
    finally:
        indexing.unregister(db, indexer)


def test_q2_a_model_change_embeds_everything_again_and_the_doctor_says_so(
    store: tuple[Database, Writer],
) -> None:
    db, writer = store
    _append(writer, FILLER)
    old = Blocking(name="test/other-model", dim=16)
    old.release.set()
    first = indexing.Indexer(db, writer, old)
    first.record()
    assert first.catch_up() == len(FILLER)
    with db.read() as reads:
        assert reads.embedding_model() == ("test/other-model", 16)
        mismatch = check_vectors(reads, Config())
    assert mismatch.status == "warn" and "test/other-model" in mismatch.summary
    new = indexing.Indexer(db, writer, WordLlamaEmbedder())
    new.record()  # a host started with the configured model: the old vectors go
    assert _coverage(db) == (0, len(FILLER))
    assert new.catch_up() == len(FILLER)
    with db.read() as reads:
        assert reads.embedding_model() == (WordLlamaEmbedder.name, 256)
        assert check_vectors(reads, Config()).status == "pass"
        off = check_vectors(reads, Config(embedding=EmbeddingConfig(enabled=False)))
    assert off.status == "skip"


def test_q3_a_paraphrase_full_text_search_misses_is_found_through_the_tools(
    start_memory: StartMemory,
) -> None:
    memory: Memory = start_memory()
    conv = memory.conversation("agent", "tg", "1", owner_id="me")
    for text in FILLER:
        conv.append_user(text)
    indexer = memory._runtime.services.indexer
    assert indexer is not None and indexer.wait_idle(30)
    assert _coverage(memory._runtime.services.storage) == (len(FILLER), len(FILLER))
    with memory._runtime.services.storage.read() as reads:
        assert reads.search_messages("sister's wedding", key=conv.key) == []
    call = {
        "function": {
            "name": "memory_recall",
            "arguments": json.dumps({"query": "sister's wedding", "source": "history"}),
        }
    }
    result = json.loads(memory.tools.run(call, conv))
    assert result["history"][0]["content"] == "Mel got married in June"


def test_q4_hybrid_search_stays_in_the_scope_searched(store: tuple[Database, Writer]) -> None:
    db, writer = store
    other = ConversationKey("agent", "tg", "2")
    _append(writer, FILLER)
    _append(writer, ["My sister Mel had her wedding in June"], key=other, owner="you")
    indexer = indexing.Indexer(db, writer, WordLlamaEmbedder())
    indexer.record()
    indexer.catch_up()
    indexing.register(db, indexer)
    try:
        with db.read() as reads:
            mine = recall.search_history(reads, "sister's wedding", key=KEY, limit=20)
            owner = recall.search_history(
                reads, "sister's wedding", agent_id="agent", owner_id="me", limit=20
            )
            theirs = recall.search_history(
                reads, "sister's wedding", agent_id="agent", owner_id="you", limit=20
            )
    finally:
        indexing.unregister(db, indexer)
    assert mine and all(h.message.key == KEY for h in mine)
    assert owner and all(h.message.owner_id == "me" for h in owner)
    assert [h.message.content for h in theirs] == ["My sister Mel had her wedding in June"]


def test_q3_memory_rows_fuse_with_their_vectors(start_memory: StartMemory) -> None:
    memory: Memory = start_memory()
    conv = memory.conversation("agent", "tg", "1", owner_id="me")
    for key, value in (("pet", "a tabby cat called Tom"), ("job", "nurse at the city hospital")):
        stored = memory.tools.run(
            {
                "function": {
                    "name": "memory_store",
                    "arguments": json.dumps({"key": key, "value": value}),
                }
            },
            conv,
        )
        assert "error" not in json.loads(stored)
    indexer = memory._runtime.services.indexer
    assert indexer is not None
    indexer.wake()
    deadline = time.monotonic() + 30
    while True:
        with memory._runtime.services.storage.read() as reads:
            if reads.vector_coverage().memory_vectors == 2:
                break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    call = {"function": {"name": "memory_recall", "arguments": json.dumps({"query": "kitten"})}}
    found = json.loads(memory.tools.run(call, conv))
    assert [row["key"] for row in found["memories"]][:1] == ["pet"]


def test_q2_index_status_and_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(tmp_path)
    db = Database(home.db_path)
    _append(Writer(db, PromptFiles(home, db)), FILLER)
    db.close()
    assert main(["--home", str(tmp_path), "index", "status", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert (before["messages"], before["message_vectors"], before["recorded_model"]) == (8, 0, None)
    assert main(["--home", str(tmp_path), "index", "rebuild", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["embedded"] == 8 and after["message_vectors"] == 8 and after["model_matches"]


# -- fusion, pure -------------------------------------------------------------------------


def _history(
    n: int, vectors: np.ndarray | None = None, senders: Sequence[str] = ()
) -> fusion.History:
    vectors = np.zeros((n, 2), np.float32) if vectors is None else vectors.astype(np.float32)
    return fusion.History(
        ["c"] * n,
        list(senders) or ["Ann"] * n,
        [i * 1000 for i in range(n)],
        vectors,
        np.linalg.norm(vectors, axis=1) > 0,
    )


def test_q3_sessions_break_at_a_gap_and_at_another_conversation() -> None:
    found = fusion.sessions(["a", "a", "a", "b"], [0, 1000, 10**8, 10**8 + 1], 30 * 60 * 1000)
    assert found.tolist() == [0, 0, 1, 2]


def test_q3_a_named_sender_is_boosted_unless_every_sender_is_named() -> None:
    assert fusion.named_senders("What did Caroline paint?", ["Caroline", "Melanie"]) == {"Caroline"}
    assert fusion.named_senders("Did Caroline and Melanie meet?", ["Caroline", "Melanie"]) == set()


def test_q3_without_vectors_the_full_text_order_is_kept() -> None:
    plain = fusion.Weights(sender_boost=0, neighbour=0, session_boost=0)
    fused = fusion.fuse_history("x", None, _history(5), {3: 2.0, 1: 1.0}, plain, min_cosine=0.2)
    assert [i for i, _ in fused] == [3, 1]


def test_q3_the_dense_score_reorders_and_min_cosine_drops_what_is_far() -> None:
    vectors = np.array([[1, 0], [0, 1], [0.8, 0.6], [-1, 0]])
    plain = fusion.Weights(context=0, sender_boost=0, neighbour=0, session_boost=0)
    query = np.array([1.0, 0.0], np.float32)
    everything = fusion.fuse_history("x", query, _history(4, vectors), {}, plain)
    assert [i for i, _ in everything] == [0, 2, 1, 3]
    near = fusion.fuse_history("x", query, _history(4, vectors), {3: 1.0}, plain, min_cosine=0.5)
    assert sorted(i for i, _ in near) == [0, 2, 3]  # 3 is a full-text hit, 1 is far


def test_q3_a_row_without_a_vector_gets_the_mean_dense_score() -> None:
    scores = fusion.normalised(np.array([0.0, 1.0, 5.0]), np.array([True, True, False]))
    assert scores.tolist() == [0.0, 1.0, 0.5]


def test_q3_neighbour_expansion_lifts_the_turn_next_to_a_hit() -> None:
    only = fusion.Weights(context=0, sender_boost=0, neighbour=0.2, session_boost=0)
    fused = dict(fusion.fuse_history("x", None, _history(5), {2: 1.0}, only))
    assert fused[1] == fused[3] == pytest.approx(0.2 * 0.5)
    assert fused[0] == fused[4] == 0


def test_q3_memory_rows_fuse_full_text_rank_and_cosine() -> None:
    vectors = np.array([[1, 0], [0, 1], [0, 0]], np.float32)
    present = np.array([True, True, False])
    fused = fusion.fuse_rows(np.array([0, 1], np.float32), vectors, present, [2, 0], min_cosine=0.5)
    assert [i for i, _ in fused] == [2, 1, 0]


# -- the scope's rows, as columns ----------------------------------------------------------

PARTS = st.sampled_from(["a", "b", "B", "é", "z\u00e9", "\u4e2d", "\U0001f600", "a b"])


@given(
    rows=st.lists(
        st.tuples(
            PARTS, PARTS, st.sampled_from(["", "t", "\u00fc"]), st.integers(0, 5), st.booleans()
        ),
        max_size=40,
    )
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_q4_scope_rows_come_by_conversation_time_and_id_as_python_sorts_them(
    rows: list[tuple[str, str, str, int, bool]],
) -> None:
    """SQLite's order (binary collation) and the conversations found from consecutive rows
    are those of a sort in Python of every row of the scope."""
    with tempfile.TemporaryDirectory(prefix="fermix-scope-") as tmp:
        conn = open_database(Path(tmp) / "m.db")
        try:
            with transaction(conn):
                stored = []
                for channel, chat, thread, minute, has_vector in rows:
                    key = ConversationKey("agent", channel, chat, thread)
                    new = NewMessage(key, "user", "hello", owner_id="ann", trust="guest")
                    message = messages.insert(conn, new, created_at=minute * 60_000)
                    blob = bytes([message.id % 256]) * 4 if has_vector else None
                    if blob is not None:
                        store_message_vectors(conn, [StoredVector(message.id, "s", blob)])
                    stored.append((key.as_tuple(), message.created_at, message.id, blob))
            stored.sort()
            keys = {k for k, *_ in stored}
            scopes = [{"agent_id": "agent", "owner_id": "ann"}]
            scopes += [{"key": ConversationKey(*k)} for k in sorted(keys)]
            for scope in scopes:
                got = scope_vectors(conn, **scope)  # type: ignore[arg-type]
                assert got is not None
                want = [r for r in stored if "key" not in scope or r[0] == scope["key"].as_tuple()]  # type: ignore[union-attr]
                assert list(got.ids) == [i for _, _, i, _ in want]
                assert list(got.created_at) == [t for _, t, _, _ in want]
                assert list(got.vectors) == [b for *_, b in want]
                assert list(got.senders) == [""] * len(want)
                conversations = list(dict.fromkeys(k for k, *_ in want))
                assert list(got.conversations) == conversations
                assert list(got.starts) == [
                    next(i for i, r in enumerate(want) if r[0] == k) for k in conversations
                ]
                assert len(got) == len(want)
            assert (
                scope_vectors(conn, agent_id="agent", owner_id="ann", limit=len(rows) - 1) is None
            )
        finally:
            conn.close()


def test_q4_an_owners_scope_is_read_in_its_order_by_one_covering_index() -> None:
    """An owner's rows come from ``messages_owner_order`` (schema migration 13) in the order
    the search wants: the statement :func:`scope_vectors` runs looks no message up and
    sorts nothing, and the owner's count is taken on an index too (issue 25)."""
    with tempfile.TemporaryDirectory(prefix="fermix-scope-") as tmp:
        conn = open_database(Path(tmp) / "m.db")
        try:
            with transaction(conn):
                for i in range(30):
                    key = ConversationKey("agent", "c", f"chat{i % 3}")
                    new = NewMessage(key, "user", f"m{i}", owner_id="ann", trust="guest")
                    messages.insert(conn, new, created_at=(i * 7) % 11)
            run: list[tuple[str, Any]] = []

            def traced(cursor: Any, sql: str, bindings: Any) -> bool:
                run.append((sql, bindings))
                return True

            conn.exec_trace = traced
            rows = scope_vectors(conn, agent_id="agent", owner_id="ann")
            counted = messages.SearchScope.of(agent_id="agent", owner_id="ann").count(conn)
            conn.exec_trace = None
            assert rows is not None and len(rows) == counted == 30
            assert len(run) == 2
            plans = [
                " / ".join(str(step[3]) for step in conn.execute(f"EXPLAIN QUERY PLAN {sql}", b))
                for sql, b in run
            ]
            read, count = plans
            assert "SEARCH m USING COVERING INDEX messages_owner_order" in read, read
            assert "TEMP B-TREE" not in read, read
            assert "COVERING INDEX" in count and "SCAN" not in count, count
        finally:
            conn.close()
