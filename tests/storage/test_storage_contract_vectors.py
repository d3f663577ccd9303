"""The storage port's contract for the vectors of recall, over both adapters (issue 15, B1,
B3; Q2, Q4).

Every test taking ``storage`` or ``backend`` runs on SQLite and on PostgreSQL; ``both``
compares the two on the same random histories. The PostgreSQL-only parts: ids committing
out of order across conversations while an embedder's cursor moves, a model change racing a
store of another service, and the approximate index (pgvector's HNSW) with its fallback
where the extension cannot be created.
"""

from __future__ import annotations

import gc
import os
import random
import threading
from array import array
from collections.abc import Iterator
from typing import Any

import pg_server as pgs
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from storage_fixtures import Backend, Store

from fermix.embedding import WordLlamaEmbedder
from fermix.model import ConversationKey, Message, NewMessage, Scope
from fermix.storage.erasure import conversation_subject
from fermix.storage.port import PendingText, StoredVector, conversation_scope, memory_scope
from fermix.storage.vectors import TOTAL, scope_rows

KEY = ConversationKey("agent", "telegram", "123")
OTHER = ConversationKey("agent", "telegram", "456", "thread-1")
DIM = 16
T0 = 1_700_000_000_000


def blob(rng: random.Random) -> bytes:
    """A random int8 vector of :data:`DIM` components, none all zero."""
    return bytes(rng.randrange(256) for _ in range(DIM - 1)) + b"\x01"


def floats(vector: bytes) -> list[float]:
    return [float(x) for x in array("b", vector)]


def insert(
    db: Store,
    content: str,
    *,
    key: ConversationKey = KEY,
    owner_id: str = "alice",
    created_at: int | None = None,
) -> Message:
    new = NewMessage(key, "user", content, owner_id=owner_id, trust="guest")
    message: Message = db.write(lambda w: w.insert_message(new, created_at=created_at))
    return message


def record(db: Store, name: str = "test-model", dim: int = DIM) -> bool:
    changed: bool = db.write(lambda w: w.record_embedding_model(name, dim))
    return changed


def store(db: Store, items: list[StoredVector]) -> int:
    stored: int = db.write(lambda w: w.store_message_vectors(items))
    return stored


def embed_all(db: Store, rng: random.Random, *, after_id: int = 0) -> int:
    """What the indexer does, until nothing is left: returns its cursor."""
    cursor = after_id
    while True:
        with db.read() as r:
            pending: list[PendingText] = r.messages_to_embed(after_id=cursor, limit=7)
        if not pending:
            return cursor
        store(db, [StoredVector(p.id, p.scope, blob(rng), (p.id % 5,)) for p in pending])
        cursor = pending[-1].id


def add_row(
    db: Store, key: str, value: str, *, agent_id: str = "agent", owner_id: str = "alice"
) -> Any:
    return db.write(
        lambda w: w.upsert_row(
            agent_id=agent_id,
            owner_id=owner_id,
            scope=Scope("owner", owner_id),
            category="preference",
            key=key,
            value=value,
            promote_target=None,
        )
    )


# -- the model ---------------------------------------------------------------------------


def test_q2_a_model_is_recorded_once_and_a_change_drops_every_vector(storage: Store) -> None:
    rng = random.Random(1)
    with storage.read() as r:
        assert r.embedding_model() is None
    assert record(storage)
    assert not record(storage)
    message = insert(storage, "tea please")
    row = add_row(storage, "drink", "tea")
    assert store(storage, [StoredVector(message.id, "s", blob(rng), (3, 4))]) == 1
    assert storage.write(lambda w: w.store_memory_vectors([StoredVector(row.id, "m", blob(rng))]))
    with storage.read() as r:
        assert r.embedding_model() == ("test-model", DIM)
        assert r.token_counts(["s"], [3]) == ({3: 1}, 2)
    assert record(storage, "other-model", 8)
    with storage.read() as r:
        assert r.embedding_model() == ("other-model", 8)
        coverage = r.vector_coverage()
        assert r.token_counts(["s"], [3]) == ({}, 0)
        assert r.memory_vectors([row.id]) == {}
    assert (coverage.messages, coverage.message_vectors) == (1, 0)
    assert (coverage.memories, coverage.memory_vectors) == (1, 0)
    assert (coverage.model, coverage.dim) == ("other-model", 8)


def test_q2_reset_drops_the_vectors_and_counts_and_keeps_the_model(storage: Store) -> None:
    rng = random.Random(2)
    record(storage)
    message = insert(storage, "hello")
    store(storage, [StoredVector(message.id, "s", blob(rng), (1,))])
    storage.write(lambda w: w.reset_vectors())
    with storage.read() as r:
        assert r.embedding_model() == ("test-model", DIM)
        assert r.vector_coverage().message_vectors == 0
        assert r.token_counts(["s"], [1]) == ({}, 0)
        assert [p.id for p in r.messages_to_embed(after_id=0, limit=10)] == [message.id]


# -- the embedder's work -----------------------------------------------------------------


def test_q2_messages_without_a_vector_are_listed_oldest_first(storage: Store) -> None:
    rng = random.Random(3)
    record(storage)
    stored = [
        insert(storage, f"turn {i}", key=(KEY, OTHER)[i % 2], owner_id="bob") for i in range(6)
    ]
    with storage.read() as r:
        pending = r.messages_to_embed(after_id=0, limit=4)
    assert pending == [PendingText(m.id, conversation_scope(m.key), m.content) for m in stored[:4]]
    store(storage, [StoredVector(m.id, "s", blob(rng)) for m in stored[:3]])
    with storage.read() as r:
        assert [p.id for p in r.messages_to_embed(after_id=0, limit=10)] == [
            m.id for m in stored[3:]
        ]
        # Past a cursor whose rows all have a vector: the rows after it.
        assert [p.id for p in r.messages_to_embed(after_id=stored[2].id, limit=2)] == [
            stored[3].id,
            stored[4].id,
        ]
    store(storage, [StoredVector(m.id, "s", blob(rng)) for m in stored[3:]])
    with storage.read() as r:
        assert r.messages_to_embed(after_id=0, limit=10) == []
        assert r.messages_to_embed(after_id=stored[-1].id, limit=10) == []


def test_q2_a_store_skips_rows_gone_or_embedded_and_counts_tokens_per_scope(
    storage: Store,
) -> None:
    rng = random.Random(4)
    record(storage)
    one, two = insert(storage, "one"), insert(storage, "two", key=OTHER)
    a, b = conversation_scope(KEY), conversation_scope(OTHER)
    first = blob(rng)
    items = [
        StoredVector(one.id, a, first, (7, 7, 9)),
        StoredVector(one.id, a, blob(rng), (100,)),  # the same row again: the first wins
        StoredVector(10**9, a, blob(rng), (100,)),  # no such message
        StoredVector(two.id, b, blob(rng), (7,)),
    ]
    assert store(storage, items) == 2
    assert store(storage, [StoredVector(one.id, a, blob(rng), (100,))]) == 0  # has one
    with storage.read() as r:
        assert r.token_counts([a], [7, 9, 100]) == ({7: 2, 9: 1}, 3)
        assert r.token_counts([a, b, "nowhere"], [7, 8]) == ({7: 3}, 4)
        assert r.token_counts([], [7]) == ({}, 0)
        rows = r.scope_vectors(key=KEY)
    assert rows is not None and list(rows.vectors) == [first]
    assert store(storage, []) == 0


def test_q2_memory_rows_are_embedded_until_their_text_changes(storage: Store) -> None:
    rng = random.Random(5)
    record(storage)
    tea = add_row(storage, "favourite_drink", "green tea")
    dog = add_row(storage, "pet", "a dog named Rex", agent_id="other")
    gone = add_row(storage, "old", "archived soon")
    storage.write(lambda w: w.archive_row(gone.id, by="test", reason="stale"))
    with storage.read() as r:
        pending = r.memories_to_embed(after_id=0, limit=10)
    assert pending == [
        PendingText(tea.id, memory_scope("agent"), "favourite drink: green tea"),
        PendingText(dog.id, memory_scope("other"), "pet: a dog named Rex"),
    ]
    vectors = {tea.id: blob(rng), dog.id: blob(rng)}
    items = [StoredVector(i, "m", v, (1, 2)) for i, v in vectors.items()]
    items.append(StoredVector(10**9, "m", blob(rng)))
    assert storage.write(lambda w: w.store_memory_vectors(items)) == 2
    with storage.read() as r:
        assert r.memories_to_embed(after_id=0, limit=10) == []
        assert r.memory_vectors([tea.id, dog.id, gone.id, 10**9]) == vectors
        assert r.token_counts(["m"], [1, 2]) == ({1: 2, 2: 2}, 4)
        coverage = r.vector_coverage()
    assert (coverage.memories, coverage.memory_vectors) == (2, 2)
    storage.write(lambda w: w.replace_row(tea.id, value="black tea"))
    with storage.read() as r:
        assert [p.text for p in r.memories_to_embed(after_id=0, limit=10)] == [
            "favourite drink: black tea"
        ]
        assert r.memory_vectors([tea.id]) == {}


def test_q2_no_message_is_left_without_a_vector_while_services_append(backend: Backend) -> None:
    """Two services append to different conversations while an embedder, on a third, moves
    its cursor as the indexer does (B2): at the end every message has its vector."""
    dbs = [backend.db, backend.open(), backend.open()]
    record(dbs[2])
    appended = threading.Barrier(5, timeout=60)
    done = threading.Event()
    errors: list[BaseException] = []

    def append(i: int) -> None:
        key = ConversationKey("agent", "tg", f"chat-{i}")
        try:
            appended.wait()
            for n in range(40):
                dbs[i % 2].write(lambda w, n=n: w.insert_message(NewMessage(key, "user", f"m{n}")))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    rng = random.Random(6)
    cursor = 0
    appended.wait()
    watcher = threading.Thread(target=lambda: ([t.join(60) for t in threads], done.set()))
    watcher.start()
    while True:
        finished = done.is_set()  # read before the batch: nothing is appended after it
        cursor = embed_all(dbs[2], rng, after_id=cursor)
        if finished:
            break
    watcher.join(60)
    assert not errors
    with dbs[0].read() as r:
        coverage = r.vector_coverage()
    assert coverage.messages == 160
    assert coverage.message_vectors == 160


# -- what a search reads -----------------------------------------------------------------


def test_q4_scope_vectors_read_a_conversation_or_an_owner_and_nothing_wider(
    storage: Store,
) -> None:
    rng = random.Random(7)
    record(storage)
    keys = [KEY, OTHER, ConversationKey("agent", "Slack", "a"), ConversationKey("b", "x", "y")]
    stored: list[tuple[Message, bytes | None]] = []
    for i in range(24):
        message = insert(
            storage,
            f"m{i}",
            key=keys[i % 4],
            owner_id=("alice", "bob")[i % 3 == 0],
            created_at=T0 + (i * 7919) % 13,  # not in id order
        )
        vector = blob(rng) if i % 4 != 1 else None
        if vector is not None:
            store(storage, [StoredVector(message.id, "s", vector)])
        stored.append((message, vector))

    def expected(keep: Any) -> list[tuple[Message, bytes | None]]:
        rows = [(m, v) for m, v in stored if keep(m)]
        return sorted(rows, key=lambda mv: (mv[0].key.as_tuple(), mv[0].created_at, mv[0].id))

    scopes: list[tuple[dict[str, Any], Any]] = [
        ({"key": KEY}, lambda m: m.key == KEY),
        ({"key": OTHER, "owner_id": "bob"}, lambda m: m.key == OTHER and m.owner_id == "bob"),
        (
            {"agent_id": "agent", "owner_id": "alice"},
            lambda m: m.agent_id == "agent" and m.owner_id == "alice",
        ),
    ]
    with storage.read() as r:
        for scope, keep in scopes:
            want = expected(keep)
            got = r.scope_vectors(**scope)
            assert got is not None
            assert list(got.ids) == [m.id for m, _ in want]
            assert list(got.vectors) == [v for _, v in want]
            assert all(v is None or type(v) is bytes for v in got.vectors)
            assert list(got.created_at) == [m.created_at for m, _ in want]
            assert list(got.conversations) == list(dict.fromkeys(m.key.as_tuple() for m, _ in want))
            assert r.scope_vectors(**scope, limit=len(want) - 1) is None
            assert r.scope_vectors(**scope, limit=len(want)) == got
        assert r.scope_vectors(agent_id="agent") is None
        assert r.scope_vectors() is None
        assert r.scope_vectors(key=ConversationKey("agent", "none", "0")) is not None


def test_q4_a_scope_is_read_into_columns_without_a_tracked_object_per_row() -> None:
    """Q4: an owner's thousands of rows become a few columns with no object the garbage
    collector tracks per row (an iterator per row was promoted to its oldest generation
    when a collection came mid-way, and full collections followed every few dozen
    searches). With a low threshold, a young collection comes every 50 such objects."""
    rows = [
        (i, "agent", "tg", f"c{i // 500}", "", "Mel", 1_000 + i, bytes(8)) for i in range(5_000)
    ]
    collections = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    threshold = gc.get_threshold()
    gc.callbacks.append(count)
    gc.set_threshold(50, 10, 10)
    try:
        found = scope_rows(rows)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(count)
    assert list(found.ids) == list(range(5_000)) and list(found.starts) == list(
        range(0, 5_000, 500)
    )
    assert len(collections) <= 5  # not one per 50 rows


def test_q2_sqlite_has_no_approximate_search_and_postgres_has_one(backend: Backend) -> None:
    """On SQLite (and on PostgreSQL without pgvector) a scope over the cap is searched
    lexically; the suite's PostgreSQL has pgvector, so there the nearest rows come back."""
    record(backend.db)
    message = insert(backend.db, "hello")
    vector = blob(random.Random(13))
    store(backend.db, [StoredVector(message.id, "s", vector)])
    with backend.db.read() as r:
        near = r.nearest_messages(floats(vector), key=KEY)
        path = r.database_file()
    if backend.name == "sqlite":
        assert near is None and path.endswith("memory.db")
        return
    assert near is not None and list(near.ids) == [message.id]
    assert path.startswith("postgresql:")


_CHATS = ("a", "B", "ä", "Z", "_x", "10", "9", "é", "a b")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(_CHATS),
            st.sampled_from(("", "t", "T")),
            st.sampled_from(("alice", "bob")),
            st.integers(0, 9),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    ),
    seed=st.integers(0, 2**16),
)
def test_b3_the_same_vectors_give_the_same_scope_rows_on_both(
    both: tuple[Store, Store], rows: list[tuple[str, str, str, int, bool]], seed: int
) -> None:
    """Appended in the same order with the same vectors, the stores read the same scopes
    (ids, order of conversations by bytes, times, vectors) and the same counts (Q2, Q4)."""
    sqlite, pg = both
    for db in both:
        record(db)
        rng = random.Random(seed)
        for chat, thread, owner, minute, embedded in rows:
            key = ConversationKey("agent", "tg", chat, thread)
            message = insert(db, f"hi {chat}", key=key, owner_id=owner, created_at=T0 + minute)
            if embedded:
                store(db, [StoredVector(message.id, conversation_scope(key), blob(rng), (minute,))])
    keys = {ConversationKey("agent", "tg", chat, thread) for chat, thread, *_ in rows}
    scopes: list[dict[str, Any]] = [{"key": key} for key in keys]
    scopes += [{"agent_id": "agent", "owner_id": o} for o in ("alice", "bob")]
    scopes += [{"key": key, "owner_id": "bob"} for key in keys]
    names = [conversation_scope(key) for key in keys]

    def read(db: Store) -> list[Any]:
        with db.read() as r:
            return [
                *(r.scope_vectors(**scope) for scope in scopes),
                r.token_counts(names, range(10)),
                r.messages_to_embed(after_id=0, limit=100),
                r.vector_coverage(),
            ]

    assert read(pg) == read(sqlite)


# -- PostgreSQL: what SQLite's single writer hid -----------------------------------------


@pytest.fixture
def services(postgres_db: str) -> Iterator[list[Any]]:
    """Two services on one PostgreSQL database."""
    from fermix.storage.postgres import PgDatabase

    dbs = [PgDatabase(postgres_db), PgDatabase(postgres_db)]
    try:
        yield dbs
    finally:
        for db in dbs:
            db.close()


def test_b2_a_message_committed_after_the_cursor_passed_its_id_is_embedded(
    services: list[Any],
) -> None:
    """Service A draws an id and commits after service B's later id was embedded: the
    embedder's next batch, from its cursor, still finds A's message (Q2)."""
    a, b = services
    record(a)
    drawn, release = threading.Event(), threading.Event()
    late: list[Message] = []

    def slow_unit(w: Any) -> Message:
        message: Message = w.insert_message(NewMessage(KEY, "user", "late"))
        drawn.set()
        assert release.wait(30)
        return message

    thread = threading.Thread(target=lambda: late.append(a.write(slow_unit)))
    thread.start()
    assert drawn.wait(30)
    early = insert(b, "early", key=OTHER)
    rng = random.Random(8)
    cursor = embed_all(b, rng)
    assert cursor == early.id
    release.set()
    thread.join(30)
    assert late and late[0].id < early.id  # committed out of id order
    with b.read() as r:
        assert [p.id for p in r.messages_to_embed(after_id=cursor, limit=10)] == [late[0].id]
    embed_all(b, rng, after_id=cursor)
    with b.read() as r:
        assert r.vector_coverage().message_vectors == 2


def test_b2_a_model_change_waits_for_a_unit_storing_vectors_of_the_old_one(
    services: list[Any], postgres_db: str
) -> None:
    """A unit that checked the model holds it until it commits: the other service's model
    change waits, then drops what the unit stored; no vector of the old model is left."""
    a, b = services
    record(a, "old-model")
    message = insert(a, "hello")
    checked, release = threading.Event(), threading.Event()

    def storing(w: Any) -> int:
        if w.embedding_model() != ("old-model", DIM):
            return 0
        checked.set()
        assert release.wait(30)
        stored: int = w.store_message_vectors([StoredVector(message.id, "s", b"\x01" * DIM)])
        return stored

    results: list[int] = []
    thread = threading.Thread(target=lambda: results.append(b.write(storing)))
    thread.start()
    assert checked.wait(30)
    with psycopg.connect(postgres_db) as probe, pytest.raises(psycopg.errors.LockNotAvailable):
        probe.execute("SELECT 1 FROM embedding_model WHERE id = 1 FOR UPDATE NOWAIT")
    changer = threading.Thread(target=lambda: record(a, "new-model"))
    changer.start()
    release.set()
    thread.join(30)
    changer.join(30)
    assert results == [1]
    with a.read() as r:
        assert r.embedding_model() == ("new-model", DIM)
        assert r.vector_coverage().message_vectors == 0


def test_b1_database_file_names_the_database_without_its_password(postgres_db: str) -> None:
    from fermix.storage.postgres import PgDatabase

    url = make_conninfo(postgres_db, password="s3cret-pw")
    db = PgDatabase(url)
    try:
        with db.read() as r:
            name = r.database_file()
        assert db.write(lambda w: w.database_file()) == name
        dbname = conninfo_to_dict(postgres_db)["dbname"]
        assert f"dbname={dbname}" in name and "s3cret" not in name
    finally:
        db.close()


# -- PostgreSQL: the approximate index ---------------------------------------------------


def _pgvector(url: str) -> None:
    with psycopg.connect(url) as conn:
        if not conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchall():
            pytest.skip("this PostgreSQL has no pgvector: nothing to test past the fallback")


def _ann(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT message_id, ann::text FROM message_ann ORDER BY 1").fetchall()
    return [(int(i), str(v)) for i, v in rows]


def test_q4_an_owner_scope_is_searched_through_the_approximate_index(postgres_db: str) -> None:
    """With pgvector, a filtered HNSW search returns ``limit`` rows of the scope, the exact
    nearest among them, even when the index's first candidates are mostly other owners'."""
    from fermix.storage.postgres import PgDatabase
    from fermix.storage.postgres import vectors as pg_vectors

    _pgvector(postgres_db)
    db = PgDatabase(postgres_db)
    try:
        record(db)
        rng = random.Random(9)
        units = []
        for i in range(1200):
            key = ConversationKey("agent", "tg", f"c{i % 40}")
            new = NewMessage(key, "user", f"m{i}", owner_id=f"o{i % 8}", trust="guest")
            units.append((lambda w, new=new: w.insert_message(new), "load"))
        messages = [m for _, m in db.write_each(units)]
        vectors = {m.id: blob(rng) for m in messages}
        store(db, [StoredVector(m.id, "s", vectors[m.id]) for m in messages])
        target = next(m for m in messages if m.owner_id == "o3")
        other = next(m for m in messages if m.owner_id == "o4")
        owned = {m.id for m in messages if m.owner_id == "o3"}
        query = floats(vectors[target.id])
        with db.read() as r:
            scope_all = r.scope_vectors(agent_id="agent", owner_id="o3")
            first = r.nearest_messages(query, agent_id="agent", owner_id="o3", limit=100)
            assert first is not None and len(first) == 100
            extra = min(owned - set(first.ids))  # a full-text candidate not among the nearest
            near = r.nearest_messages(
                query, agent_id="agent", owner_id="o3", limit=100, include=[other.id, extra]
            )
            assert r.nearest_messages([1.0] * (DIM + 1), agent_id="agent") is None
        assert scope_all is not None and near is not None
        assert target.id in near.ids and other.id not in near.ids  # other: another owner's
        assert set(near.ids) == {*first.ids, extra} and set(near.ids) <= owned
        whole = dict(zip(scope_all.ids, scope_all.vectors, strict=True))
        assert [whole[i] for i in near.ids] == list(near.vectors)
        # The index itself, as the planner takes it on a large table, still gives 100 rows.
        with psycopg.connect(postgres_db) as conn:
            conn.execute("SET enable_seqscan = off")
            plan = conn.execute(
                "EXPLAIN SELECT message_id FROM message_ann WHERE owner_id = 'o3'"
                " ORDER BY ann <=> %s::halfvec LIMIT 100",
                (str(floats(vectors[target.id])),),
            ).fetchall()
            assert "message_ann_hnsw" in str(plan)
            found = pg_vectors.nearest_messages(
                conn, floats(vectors[target.id]), agent_id="agent", owner_id="o3", limit=100
            )
        assert found is not None and len(found) == 100 and target.id in found.ids
    finally:
        db.close()


def test_q2_a_model_change_rebuilds_the_approximate_index_for_its_dimension(
    postgres_db: str,
) -> None:
    """The index follows the recorded model's dimension; one found missing is rebuilt from
    the stored vectors with the values a store writes."""
    from fermix.storage.postgres import PgDatabase

    _pgvector(postgres_db)
    db = PgDatabase(postgres_db)
    try:
        record(db)
        rng = random.Random(10)
        stored = [insert(db, f"m{i}") for i in range(5)]
        store(db, [StoredVector(m.id, "s", blob(rng)) for m in stored[:4]])
        store(db, [StoredVector(stored[4].id, "s", b"\x00" * DIM)])  # no direction: not indexed
        written = _ann(postgres_db)
        assert [i for i, _ in written] == [m.id for m in stored[:4]]
        with psycopg.connect(postgres_db, autocommit=True) as conn:
            conn.execute("DROP TABLE message_ann")
        assert not record(db)  # the same model: the index comes back, from the vectors
        assert _ann(postgres_db) == written
        assert record(db, "small-model", 4)
        assert _ann(postgres_db) == []
        store(db, [StoredVector(stored[0].id, "s", b"\x81\x7f\x00\x05")])
        assert _ann(postgres_db) == [(stored[0].id, "[-127,127,0,5]")]
        with db.read() as r:
            near = r.nearest_messages([1.0, 0.0, 0.0, 0.0], key=KEY, limit=3)
        assert near is not None and list(near.ids) == [stored[0].id]
    finally:
        db.close()


@pytest.fixture
def unprivileged_db(pg_server: pgs.PgServer, postgres_db: str) -> Iterator[str]:
    """``postgres_db`` owned by a role that may not create pgvector (not a trusted
    extension): a PostgreSQL as most hosted ones are without it."""
    role = f"plain_{os.getpid()}"
    dbname = conninfo_to_dict(postgres_db)["dbname"]
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'ALTER DATABASE "{dbname}" OWNER TO "{role}"')
    try:
        yield make_conninfo(postgres_db, user=role)
    finally:
        with psycopg.connect(postgres_db, autocommit=True) as conn:
            conn.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
            conn.execute(f'DROP OWNED BY "{role}"')
        with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{role}"')


def test_q2_without_pgvector_a_model_is_recorded_and_search_reads_the_scope(
    unprivileged_db: str,
) -> None:
    """The refused ``CREATE EXTENSION`` leaves the recording unit whole; no approximate
    search is offered, and the scope's vectors read as everywhere."""
    from fermix.storage.postgres import PgDatabase

    db = PgDatabase(unprivileged_db)
    try:
        assert record(db)
        message = insert(db, "hello")
        vector = blob(random.Random(11))
        assert store(db, [StoredVector(message.id, "s", vector)]) == 1
        with db.read() as r:
            assert r.embedding_model() == ("test-model", DIM)
            assert r.nearest_messages(floats(vector), key=KEY) is None
            rows = r.scope_vectors(key=KEY)
        assert rows is not None and list(rows.vectors) == [vector]
    finally:
        db.close()


def test_q2_a_message_whose_text_changes_outside_fermix_loses_its_vector(
    postgres_db: str,
) -> None:
    from fermix.storage.postgres import PgDatabase

    db = PgDatabase(postgres_db)
    try:
        record(db)
        one, two = insert(db, "one"), insert(db, "two")
        rng = random.Random(12)
        store(db, [StoredVector(m.id, "s", blob(rng)) for m in (one, two)])
        with psycopg.connect(postgres_db, autocommit=True) as conn:
            conn.execute("UPDATE messages SET content = 'uno' WHERE id = %s", (one.id,))
            conn.execute("UPDATE messages SET owner_id = 'bob' WHERE id = %s", (two.id,))
        with db.read() as r:
            assert [p.text for p in r.messages_to_embed(after_id=0, limit=10)] == ["uno", "two"]
            assert r.vector_coverage().message_vectors == 0
    finally:
        db.close()


def test_q2_the_total_token_is_the_sum_of_the_counted_tokens(storage: Store) -> None:
    """TOTAL is no token of any text: asking for it gives nothing of its own."""
    record(storage)
    message = insert(storage, "x")
    store(storage, [StoredVector(message.id, "s", b"\x01" * DIM, (5, 6, 6))])
    with storage.read() as r:
        assert r.token_counts(["s"], [TOTAL, 6]) == ({6: 2}, 3)


# -- what an erased or dropped text leaves in the counts (F3, F7) -----------------------


def _embed_as_the_indexer(db: Store) -> None:
    """A vector for every message and live memory row without one, each counting its
    text's tokens as the offline model's indexer counts them."""
    embedder, rng = WordLlamaEmbedder(), random.Random(13)
    dim = embedder.dimension()
    for which in ("messages", "memories"):
        while True:
            with db.read() as r:
                pending = (
                    r.messages_to_embed(after_id=0, limit=50)
                    if which == "messages"
                    else r.memories_to_embed(after_id=0, limit=50)
                )
            if not pending:
                break
            tokens = embedder.tokens([p.text for p in pending])
            vector = bytes(rng.randrange(256) for _ in range(dim - 1)) + b"\x01"
            items = [
                StoredVector(p.id, p.scope, vector, t) for p, t in zip(pending, tokens, strict=True)
            ]
            if which == "messages":
                db.write(lambda w, items=items: w.store_message_vectors(items))
            else:
                db.write(lambda w, items=items: w.store_memory_vectors(items))


def _counts(db: Store, scope: str, texts: list[str], asked: set[int]) -> None:
    """``scope``'s counts are exactly the tokens of ``texts`` (of ``asked``, the tokens of
    every text it ever held): no other token, none counted at 0."""
    expected: dict[int, int] = {}
    total = 0
    for tokens in WordLlamaEmbedder().tokens(texts):
        total += len(tokens)
        for token in tokens:
            expected[token] = expected.get(token, 0) + 1
    with db.read() as r:
        assert r.token_counts([scope], sorted(asked)) == (expected, total)


def _erase(db: Store, target: str, subject: str, agent_id: str | None = None) -> None:
    """An erasure through the port, step after step until nothing is left."""
    erasure = db.write(
        lambda w: w.begin_erasure(
            target=target, subject=subject, agent_id=agent_id, requested_by="test"
        )
    )
    while db.write(lambda w: w.erase_step(erasure.id)):
        pass


def test_f3_an_erased_or_dropped_text_leaves_no_token_in_the_counts(storage: Store) -> None:
    """The offline model counts each scope's tokens (their rarity weighs a vector): an
    owner's erasure, a message's, a memory row's new text and a retention sweep take the
    tokens of what they remove out of those counts, and a token counted nowhere else goes."""
    embedder = WordLlamaEmbedder()
    record(storage, embedder.name, embedder.dimension())
    said = {
        "alice": ["Zorblax keeps the spare key under the blue pot", "Quuxville on Tuesday"],
        "bob": ["the pot is blue", "see you on Tuesday then"],
    }
    messages = {
        owner: [insert(storage, text, owner_id=owner) for text in texts]
        for owner, texts in said.items()
    }
    insert(storage, "Zorblax again, elsewhere", key=OTHER, owner_id="bob")
    alice_row = add_row(storage, "hideout", "the Zorblax cabin near Quuxville")
    bob_row = add_row(storage, "pet", "a cat named Biscuit", owner_id="bob")
    _embed_as_the_indexer(storage)
    late = insert(storage, "Zorblax never embedded", owner_id="alice")  # counted nowhere
    texts = [t for ts in said.values() for t in ts] + [
        "hideout: the Zorblax cabin near Quuxville",
        "pet: a cat named Biscuit",
        "pet: a dog named Rex",
        "pet: a parrot named Kiwi",
        late.content,
        "Zorblax again, elsewhere",
    ]
    asked = {t for tokens in embedder.tokens(texts) for t in tokens}
    chat, rows = conversation_scope(KEY), memory_scope("agent")
    _counts(storage, chat, said["alice"] + said["bob"], asked)
    _counts(storage, rows, [texts[4], texts[5]], asked)

    _erase(storage, "owner", "alice")
    _counts(storage, chat, said["bob"], asked)  # the group chat keeps bob's messages
    _counts(storage, rows, ["pet: a cat named Biscuit"], asked)
    with storage.read() as r:
        assert r.memory_vectors([alice_row.id]) == {}

    storage.write(lambda w: w.replace_row(bob_row.id, value="a dog named Rex"))
    _counts(storage, rows, [], asked)  # its vector went with its old text: nothing counted
    _embed_as_the_indexer(storage)
    _counts(storage, rows, ["pet: a dog named Rex"], asked)
    add_row(storage, "pet", "a parrot named Kiwi", owner_id="bob")
    _embed_as_the_indexer(storage)
    _counts(storage, rows, ["pet: a parrot named Kiwi"], asked)

    one = messages["bob"][0]
    _erase(storage, "message", str(one.id))
    _counts(storage, chat, said["bob"][1:], asked)

    elsewhere = conversation_scope(OTHER)
    _counts(storage, elsewhere, ["Zorblax again, elsewhere"], asked)
    _erase(storage, "conversation", conversation_subject(OTHER), OTHER.agent_id)
    _counts(storage, elsewhere, [], asked)  # a conversation erased whole: its counts go

    while not storage.write(
        lambda w: w.expire_messages(before=T0 * 10, drop_unreviewed=True)
    ).finished:
        pass
    storage.write(lambda w: w.archive_row(bob_row.id, by="test", reason="stale"))
    storage.write(lambda w: w.expire_archived(before=T0 * 10))
    _counts(storage, chat, [], asked)
    _counts(storage, rows, [], asked)
