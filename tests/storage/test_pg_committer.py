"""The PostgreSQL group commit (fermix/storage/pg/committer.py, issue 15): no deadlock
between two services' batches, a unit left for the next batch when its row is locked,
per-unit errors in a pipelined batch, a lost connection.

Every test runs on the suite's real PostgreSQL (``postgres_db``, ``pg_server``): the
database is migrated by a :class:`~fermix.storage.postgres.PgDatabase`, which also serves the
reads; writes go through :class:`~fermix.storage.postgres.committer.PgCommitter` instances, one
per service, each in both modes: statement by statement (a server on this machine, as in
the suite) and pipelined (a remote server's mode, forced here).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import re
import select
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pg_server import PgServer
from psycopg import pq

from fermix.clock import now_ms
from fermix.errors import InvalidInputError, StorageError, WriteFailedError
from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage.appending import AppendUnit
from fermix.storage.postgres import PgDatabase
from fermix.storage.postgres import messages as pg_messages
from fermix.storage.postgres import migrations as pg_migrations
from fermix.storage.postgres.committer import PgCommitter, StemmedAppend, stemmed
from fermix.storage.postgres.connection import fetch_rows, pipeline, remote, send
from fermix.storage.postgres.messages import document
from fermix.storage.retry import RetryPolicy

SERVICES, THREADS, APPENDS = 2, 8, 25
KEYS = [ConversationKey("agent", "shared", f"c{n:02}") for n in range(16)]
KEY, OTHER = KEYS[0], KEYS[1]
NO_RETRY = RetryPolicy(attempts=1)
"""A transient error (a deadlock, a serialization failure) fails the write."""
MODES = [pytest.param(False, id="statements"), pytest.param(True, id="pipelined")]

Unit = Callable[[Any], Any]


def append_unit(key: ConversationKey, content: str, *, owner_id: Any = "alice") -> Unit:
    """The append unit of fermix/runtime/writer.py: the conversation touched, the message
    inserted (its client key: its content)."""
    new = NewMessage(key, "user", content, owner_id="alice", client_key=content)

    def unit(writes: Any) -> Message:
        writes.touch_known(key, owner_id, "operator")
        return writes.insert_message(new)

    return unit


@pytest.fixture
def store(postgres_db: str) -> Iterator[PgDatabase]:
    """The migrated database, for reads."""
    db = PgDatabase(postgres_db, readers=2)
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
def open_committer(store: PgDatabase) -> Iterator[Callable[..., PgCommitter]]:
    """Opens committers on ``store``'s database (each one a service's), closed after."""
    opened: list[PgCommitter] = []

    def open_one(*, pipelined: bool, retry: RetryPolicy = NO_RETRY, name: str = "") -> PgCommitter:
        committer = PgCommitter(
            lambda: psycopg.connect(store.url, autocommit=True, application_name=name),
            retry=retry,
            pipelined=pipelined,
        )
        opened.append(committer)
        return committer

    yield open_one
    for committer in opened:
        committer.close()


def _log_since(server: PgServer, offset: int) -> str:
    with server.log_path.open("rb") as log:
        log.seek(offset)
        return log.read().decode("utf-8", errors="replace")


@pytest.mark.parametrize("pipelined", MODES)
def test_two_services_appending_in_random_orders_never_deadlock(
    pipelined: bool,
    store: PgDatabase,
    open_committer: Callable[..., PgCommitter],
    pg_server: PgServer,
) -> None:
    """Issue 15: 2 services x 8 threads append to the same 16 conversations, each thread
    in a random order. No batch waits for a row while holding another, so PostgreSQL
    detects no deadlock and nothing is retried; every append is stored once, and each
    conversation's ids are in commit order (a reader following it by id never sees an id
    below one it saw)."""
    services = [open_committer(pipelined=pipelined) for _ in range(SERVICES)]
    log_start = pg_server.log_path.stat().st_size
    barrier = threading.Barrier(SERVICES * THREADS + 1)
    done = threading.Event()
    errors: list[BaseException] = []
    stored: dict[str, Message] = {}
    regressions: list[tuple[ConversationKey, int, int]] = []
    followed: dict[ConversationKey, list[int]] = {key: [] for key in KEYS}

    def write(committer: PgCommitter, name: str, seed: int) -> None:
        order = random.Random(seed)
        barrier.wait()
        try:
            for i in range(APPENDS):
                content = f"{name}-{i}"
                stored[content] = committer.run(append_unit(order.choice(KEYS), content))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    def follow() -> None:
        last = dict.fromkeys(KEYS, 0)
        barrier.wait()
        while True:
            finished = done.is_set()
            for key in KEYS:
                with store.read() as r:
                    _, rows = r.window_since(key, after_id=last[key])
                for m in rows:
                    if m.id <= last[key]:
                        regressions.append((key, last[key], m.id))
                    last[key] = m.id
                    followed[key].append(m.id)
            if finished:
                return

    threads = [
        threading.Thread(target=write, args=(committer, f"s{s}t{t}", 1000 * s + t))
        for s, committer in enumerate(services)
        for t in range(THREADS)
    ]
    follower = threading.Thread(target=follow)
    for thread in [*threads, follower]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    follower.join()

    assert errors == []
    assert [c.transient_failures for c in services] == [0, 0]
    assert "deadlock detected" not in _log_since(pg_server, log_start)
    with store.read() as r:
        counts = {key: r.count_messages(key) for key in KEYS}
    assert sum(counts.values()) == len(stored) == SERVICES * THREADS * APPENDS
    assert len({m.id for m in stored.values()}) == len(stored)
    assert regressions == []
    for key in KEYS:
        assert followed[key] == sorted(m.id for m in stored.values() if m.key == key)
    for name in {content.rsplit("-", 1)[0] for content in stored}:
        mine = [stored[f"{name}-{i}"] for i in range(APPENDS)]
        for key in KEYS:  # a thread's appends to a conversation commit in its call order
            ids = [m.id for m in mine if m.key == key]
            assert ids == sorted(ids)


class _Logged(logging.Handler):
    """Sets ``seen`` once the committer logs ``phrase``."""

    def __init__(self, phrase: str) -> None:
        super().__init__(logging.DEBUG)
        self.phrase = phrase
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.phrase in record.getMessage():
            self.seen.set()


@contextlib.contextmanager
def _logged(phrase: str) -> Iterator[threading.Event]:
    """An event set once the committer logs ``phrase`` in the block."""
    watcher = _Logged(phrase)
    log = logging.getLogger("fermix.storage.postgres.committer")
    log.addHandler(watcher)
    level = log.level
    log.setLevel(logging.DEBUG)
    try:
        yield watcher.seen
    finally:
        log.removeHandler(watcher)
        log.setLevel(level)


@contextlib.contextmanager
def _row_held(url: str, key: ConversationKey) -> Iterator[psycopg.Connection[Any]]:
    """Another transaction holding the row of ``key`` (``FOR UPDATE``) until the block
    commits it on the connection given; closed after the block."""
    holder = psycopg.connect(url, autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute(
            "SELECT 1 FROM conversations WHERE agent_id = %s AND channel = %s AND chat_id = %s"
            " AND thread_scope = %s FOR UPDATE",
            key.as_tuple(),
        )
        yield holder
    finally:
        holder.close()


def _run_many_behind_a_lock(
    committer: PgCommitter,
    store: PgDatabase,
    units: list[tuple[Unit, str]],
    *,
    until: str = "next batch",
) -> list[tuple[bool, Any]]:
    """``committer.run_many(units)`` while another transaction holds the row of ``KEY``,
    which it lets go once the committer logs ``until`` (by default: it has left units for a
    later batch)."""
    outcomes: list[tuple[bool, Any]] = []
    with _logged(until) as seen, _row_held(store.url, KEY) as holder:
        writer = threading.Thread(target=lambda: outcomes.extend(committer.run_many(units)))
        writer.start()
        assert seen.wait(10)
        holder.execute("COMMIT")
        writer.join()
    return outcomes


@pytest.mark.parametrize("pipelined", MODES)
def test_a_unit_whose_row_is_locked_waits_for_the_next_batch(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """A unit absorbed into a batch does not wait for a row another transaction holds: it
    and the units queued after it go back to the queue, the batch commits without them,
    and the first of them leads the next batch, waiting for the row; call order holds."""
    committer = open_committer(pipelined=pipelined)
    committer.run(append_unit(KEY, "first"))
    outcomes = _run_many_behind_a_lock(
        committer,
        store,
        [
            (append_unit(OTHER, "free"), "free"),
            (append_unit(KEY, "locked"), "locked"),
            (append_unit(OTHER, "after"), "after"),
        ],
    )
    assert [ok for ok, _ in outcomes] == [True, True, True]
    assert committer.deferred == 2
    assert committer.transient_failures == 0
    ids = [message.id for _, message in outcomes]
    assert ids == sorted(ids)
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == ["first", "locked"]
        assert [m.content for m in r.messages(OTHER)] == ["free", "after"]


@pytest.mark.parametrize("pipelined", MODES)
def test_a_failing_statement_fails_its_unit_alone(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """A touch sent without waiting for its answer (pipelined: answered with the next read)
    that fails fails its own unit only, batch after batch: the statements prepared along
    the way (psycopg prepares one on its fifth run) stay usable."""
    committer = open_committer(pipelined=pipelined)
    for round_ in range(12):
        outcomes = committer.run_many(
            [
                (append_unit(KEY, f"ok-{round_}"), "ok"),
                (append_unit(OTHER, f"bad-{round_}", owner_id=None), "bad touch"),
                (append_unit(OTHER, f"fine-{round_}"), "fine"),
            ]
        )
        assert [ok for ok, _ in outcomes] == [True, False, True]
        bad = outcomes[1][1]
        assert isinstance(bad, WriteFailedError)
        assert isinstance(bad.__cause__, psycopg.errors.NotNullViolation)
        assert bad.__cause__.diag.table_name == "conversations"
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == [f"ok-{n}" for n in range(12)]
        assert [m.content for m in r.messages(OTHER)] == [f"fine-{n}" for n in range(12)]


@pytest.mark.parametrize("pipelined", MODES)
def test_a_duplicate_client_key_fails_its_unit_alone(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """An insert under a client key already stored fails its unit only (N3: the append
    unit reads the key first; this one does not)."""
    committer = open_committer(pipelined=pipelined)
    outcomes = committer.run_many(
        [
            (append_unit(KEY, "once"), "first"),
            (append_unit(KEY, "once"), "again"),
            (append_unit(OTHER, "other"), "other"),
        ]
    )
    assert [ok for ok, _ in outcomes] == [True, False, True]
    duplicate = outcomes[1][1]
    assert isinstance(duplicate, WriteFailedError)
    assert isinstance(duplicate.__cause__, psycopg.errors.UniqueViolation)
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == ["once"]
        assert [m.content for m in r.messages(OTHER)] == ["other"]


def _appended_at(at: int) -> Unit:
    """A unit appending "ahead" to ``KEY`` timed ``at`` (another service's clock)."""

    def unit(writes: Any) -> Message:
        writes.touch_known(KEY, "alice", "operator")
        return writes.insert_message(NewMessage(KEY, "user", "ahead"), created_at=at)

    return unit


def test_a_pipelined_append_is_never_timed_before_its_conversations_latest(
    store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """Pipelined, the clock is read before the touch has locked the row: a message is timed
    now, but not before the latest of its conversation (here another service's, whose
    clock is a minute ahead), so times follow ids within the conversation."""
    ahead = now_ms() + 60_000
    earlier = open_committer(pipelined=False).run(_appended_at(ahead))
    committer = open_committer(pipelined=True)
    later = committer.run(append_unit(KEY, "now"))
    assert later.id > earlier.id
    assert later.created_at == earlier.created_at == ahead
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == ["ahead", "now"]
    assert committer.run(append_unit(OTHER, "elsewhere")).created_at < ahead


@pytest.mark.parametrize("pipelined", MODES)
def test_a_run_of_appends_is_never_timed_before_its_conversations_latest(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """As above, for plain appends stored together in one insert (issue 25): each is timed
    not before its own conversation's latest message, and no other's."""
    ahead = now_ms() + 60_000
    earlier = open_committer(pipelined=False).run(_appended_at(ahead))
    committer = open_committer(pipelined=pipelined)
    outcomes = committer.run_many(
        [(plain_append(key, f"now in {key.chat_id}"), "append") for key in (KEY, OTHER)]
    )
    assert committer.grouped == 2
    (_, in_key), (_, in_other) = outcomes
    assert in_key.message.id > earlier.id and in_key.message.created_at == ahead
    assert in_other.message.created_at < ahead


def test_an_insert_reads_no_message_whatever_its_plan(store: PgDatabase) -> None:
    """Issue 25: a message's time is not before its conversation's latest, read from the
    conversation's row (``latest_message_at``, kept by the ``messages_bi`` trigger). As
    ``max(created_at)`` over the messages, a generic plan cached while the table was new
    read it by ``messages_owner``: every message of the agent, for each insert. No plan of
    an insert scans ``messages`` now, generic ones included."""
    statements = [*pg_messages._INSERTS.values(), pg_messages.INSERT_ALL]
    with psycopg.connect(store.url, autocommit=True) as conn:
        for sql in statements:
            plan = [row[0] for row in conn.execute(f"EXPLAIN (GENERIC_PLAN) {_numbered(sql)}")]
            assert any("Insert on messages" in line for line in plan)
            assert not [line for line in plan if re.search(r"Scan.* on messages\b", line)]


def _numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders as PostgreSQL's ``$1``, ``$2``, ..."""
    numbers = itertools.count(1)
    return re.sub("%s", lambda _: f"${next(numbers)}", sql)


def test_migration_7_gives_each_conversation_its_latest_message_time(
    postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: a database written before ``latest_message_at`` gets it from its messages
    (a conversation without one keeps NULL), and an append after is timed not before it."""
    shipped = pg_migrations.migrations()
    assert shipped[6].version == 7
    monkeypatch.setattr(pg_migrations, "migrations", lambda: shipped[:6])
    PgDatabase(postgres_db, readers=1).close()
    ahead = now_ms() + 60_000
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        for key in (KEY, OTHER):
            conn.execute(
                "INSERT INTO conversations (agent_id, channel, chat_id, thread_scope,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, 0, 0)",
                key.as_tuple(),
            )
        for at in (ahead - 5, ahead, ahead - 9):
            conn.execute(
                "INSERT INTO messages (agent_id, channel, chat_id, thread_scope, role,"
                " content, created_at, stems) VALUES (%s, %s, %s, %s, 'user', 'x', %s, '')",
                (*KEY.as_tuple(), at),
            )
    monkeypatch.undo()
    db = PgDatabase(postgres_db, readers=1)
    try:
        with psycopg.connect(postgres_db, autocommit=True) as conn:
            latest = dict(
                conn.execute("SELECT chat_id, latest_message_at FROM conversations").fetchall()
            )
        assert latest == {KEY.chat_id: ahead, OTHER.chat_id: None}
        stored = db.append(plain_append(KEY, "after"), label="append")
        assert stored.message.created_at == ahead
    finally:
        db.close()


@pytest.mark.parametrize("plain", [False, True], ids=["keyed", "plain"])
@pytest.mark.parametrize("pipelined", MODES)
def test_a_lost_connection_is_retried_on_a_new_one(
    pipelined: bool, plain: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """The server ends the write connection (a restart, a failover): the next batch fails
    once, transiently, and commits on a new connection; a plain append's statements,
    prepared on the old one, are prepared again on it."""
    committer = open_committer(pipelined=pipelined, retry=RetryPolicy(), name="fermix-writer")

    def appended(content: str) -> str:
        if plain:
            return str(committer.run(plain_append(KEY, content)).message.content)
        return str(committer.run(append_unit(KEY, content)).content)

    appended("before")
    with psycopg.connect(store.url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'fermix-writer'"
        ).fetchall()
    assert ended == [(True,)]
    assert appended("after") == "after"
    assert committer.transient_failures == 1
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == ["before", "after"]


def test_a_server_on_a_unix_socket_is_not_remote(store: PgDatabase) -> None:
    """Batches go out statement by statement to a server on this machine (pipeline mode
    would cost more than the round trips it saves there)."""
    with psycopg.connect(store.url) as conn:
        assert conn.info.host.startswith("/")
        assert not remote(conn)


def test_o1_the_aside_committer_s_commits_are_counted_with_the_group_commit_s(
    store: PgDatabase,
) -> None:
    """O1: the commits of ``write_aside`` (the erasures' steps, on a connection of their
    own) are in ``commit_stats`` as the group commit's are: transactions, writes, sizes."""
    before = store.commit_stats()
    store.write(append_unit(KEY, "grouped"), label="append")
    assert store.commit_stats().commits - before.commits == 1
    store.write_aside(append_unit(OTHER, "aside"), label="erasure step")
    store.write_aside(append_unit(OTHER, "aside again"), label="erasure step")
    after = store.commit_stats()
    assert (after.commits - before.commits, after.units - before.units) == (3, 3)
    assert after.sizes[0] - before.sizes[0] == 3  # each a batch of one
    assert after.queued == 0


# -- a run of plain appends stored together (issue 25) --------------------------------------

THIRD = KEYS[2]


def plain_append(key: ConversationKey, content: str, *, owner_id: Any = "alice") -> AppendUnit:
    """The writer's own append unit (no client key, no peak): one a batch may store with
    others."""
    return AppendUnit(NewMessage(key, "user", content, owner_id="alice"), owner_id, "operator")


@pytest.mark.parametrize("pipelined", MODES)
def test_a_run_of_plain_appends_is_stored_in_one_touch_and_one_insert(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """Issue 25: a batch's plain appends in distinct conversations, its first unit among
    them, are stored together; each caller gets its own message, ids drawn in queue order,
    each conversation's row touched and its window moved as by one append."""
    committer = open_committer(pipelined=pipelined)
    units = [plain_append(key, f"m-{key.chat_id}") for key in KEYS[:6]]
    outcomes = committer.run_many([(unit, "append") for unit in units])
    assert all(ok for ok, _ in outcomes)
    assert committer.grouped == 6
    results = [result for _, result in outcomes]
    assert [r.message.content for r in results] == [u.new.content for u in units]
    ids = [r.message.id for r in results]
    assert ids == sorted(ids)
    with store.read() as r:
        for key, result in zip(KEYS[:6], results, strict=True):
            assert r.messages(key) == [result.message]
            state = r.conversation(key)
            assert state is not None
            assert (state.owner_id, state.trust) == ("alice", "operator")
            assert r.window_mark(key)[0] == 1
            assert _due(store, key) == result.message.created_at


@pytest.mark.parametrize("pipelined", MODES)
def test_a_batch_that_is_one_run_of_plain_appends_is_one_round_trip(
    pipelined: bool, store: PgDatabase, tmp_path: Path
) -> None:
    """Issue 25: a batch of plain appends, and nothing else, goes out as one simple query
    (``BEGIN``, its touch and its insert run as statements prepared once per connection,
    ``COMMIT``): once they are prepared, the server is waited for once, whatever the mode,
    and nothing else is sent. The messages are committed, as another connection reads
    them."""
    trace = tmp_path / "libpq.trace"

    def traced() -> psycopg.Connection[Any]:
        conn = psycopg.connect(store.url, autocommit=True)
        conn.pgconn.trace(os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        return conn

    committer = PgCommitter(traced, retry=NO_RETRY, pipelined=pipelined)
    sent = []
    try:
        for round_ in range(2):
            outcomes = committer.run_many(
                [(plain_append(key, f"round {round_}"), "append") for key in KEYS[:4]]
            )
            assert all(ok for ok, _ in outcomes)
            sent.append(trace.read_text())
    finally:
        committer.close()
    first, both = sent[0], sent[1]
    second = both[len(first) :]
    assert committer.grouped == 8
    assert first.count('Query\t "PREPARE') == 2  # on the connection's first batch only
    to_server = [line.split("\t")[2] for line in second.splitlines() if line.startswith("F")]
    assert to_server == ["Query"]
    assert re.search(r'Query\t "BEGIN; SET LOCAL .*; EXECUTE .*; EXECUTE .*; COMMIT"', second)
    with store.read() as r:
        for key in KEYS[:4]:
            assert [m.content for m in r.messages(key)] == ["round 0", "round 1"]


@pytest.mark.parametrize("pipelined", MODES)
def test_a_one_query_batch_prepares_again_what_psycopg_deallocated(
    pipelined: bool,
    store: PgDatabase,
    open_committer: Callable[..., PgCommitter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 25: psycopg sends ``DEALLOCATE ALL`` after a ``ROLLBACK`` on a connection
    where it prepared statements of its own, which drops the one-query batch's too: the
    next batch prepares them again and still stores its appends together, in one query."""
    committer = open_committer(pipelined=pipelined)
    committer.run_many([(plain_append(key, "first"), "append") for key in KEYS[:2]])
    for n in range(8):  # psycopg prepares a statement it ran 5 times
        committer.run(append_unit(KEYS[2], f"keyed {n}"))

    def failing(writes: Any) -> None:
        writes.touch_known(KEYS[3], "alice", "operator")
        raise ValueError("a unit that fails: its batch is rolled back")

    with pytest.raises(ValueError, match="rolled back"):
        committer.run(failing)
    grouped = committer.grouped
    with caplog.at_level(logging.INFO, logger="fermix.storage.postgres.committer"):
        for n in range(3):
            outcomes = committer.run_many(
                [(plain_append(key, f"after {n}"), "append") for key in KEYS[:2]]
            )
            assert all(ok for ok, _ in outcomes)
    assert committer.grouped == grouped + 6
    assert "named statements do not last" not in caplog.text  # no pooler here
    with store.read() as r:
        assert [m.content for m in r.messages(KEYS[1])] == [
            "first",
            "after 0",
            "after 1",
            "after 2",
        ]


class _PoolerLike(psycopg.Connection[Any]):
    """A connection as a pooler in transaction mode gives one: what a session prepared by
    name with SQL ``PREPARE`` is gone by its next transaction (another server session
    runs it). psycopg's own prepared statements are left alone (PgBouncer keeps those)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if self.info.transaction_status == pq.TransactionStatus.IDLE:
            names = (
                super()
                .execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'fermix%'")
                .fetchall()
            )
            for (name,) in names:
                super().execute(f"DEALLOCATE {name}")
        return super().execute(query, params, **kwargs)


@pytest.mark.parametrize("pipelined", MODES)
def test_behind_a_transaction_pooler_batches_go_statement_by_statement(
    pipelined: bool, store: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25: the one-query batch's statements, prepared by name, vanish between
    transactions behind a pooler in transaction mode: once they are gone right after being
    prepared, the committer runs its batches statement by statement, and every append of
    every batch is stored, in order."""
    committer = PgCommitter(
        lambda: _PoolerLike.connect(store.url, autocommit=True),
        retry=NO_RETRY,
        pipelined=pipelined,
    )
    try:
        with caplog.at_level(logging.INFO, logger="fermix.storage.postgres.committer"):
            for round_ in range(3):
                outcomes = committer.run_many(
                    [(plain_append(key, f"round {round_}"), "append") for key in KEYS[:3]]
                )
                assert all(ok for ok, _ in outcomes)
    finally:
        committer.close()
    assert "named statements do not last" in caplog.text
    assert committer.grouped == 9
    with store.read() as r:
        for key in KEYS[:3]:
            assert [m.content for m in r.messages(key)] == ["round 0", "round 1", "round 2"]


@pytest.mark.parametrize("pipelined", MODES)
def test_a_run_of_plain_appends_meeting_a_locked_row_goes_to_the_next_batch_whole(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """A run stored together locks its rows without waiting (as each absorbed unit does):
    one row locked by another transaction leaves the whole run, and the units after it, for
    the next batch, which stores them once the row is free; call order holds."""
    committer = open_committer(pipelined=pipelined)
    committer.run(plain_append(KEY, "first"))
    outcomes = _run_many_behind_a_lock(
        committer,
        store,
        [
            (plain_append(OTHER, "free"), "free"),
            (plain_append(THIRD, "beside"), "beside"),
            (plain_append(KEY, "locked"), "locked"),
        ],
    )
    assert [ok for ok, _ in outcomes] == [True, True, True]
    assert committer.deferred >= 2  # again when the next batch starts before the row is free
    ids = [result.message.id for _, result in outcomes]
    assert ids == sorted(ids)
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == ["first", "locked"]
        assert [m.content for m in r.messages(THIRD)] == ["beside"]


@pytest.mark.parametrize("pipelined", MODES)
def test_a_batch_whose_first_append_s_row_is_locked_waits_for_it_with_its_first_unit(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """A batch of plain appends runs its first one with the others, none waiting for a
    lock; when the first one's row is locked, the batch runs again with its first unit
    alone, waiting for the row (it holds none, so no deadlock), and the others stored
    together after it; every caller gets its message, in call order."""
    committer = open_committer(pipelined=pipelined)
    committer.run(plain_append(KEY, "first"))
    outcomes = _run_many_behind_a_lock(
        committer,
        store,
        [
            (plain_append(KEY, "locked"), "locked"),
            (plain_append(OTHER, "free"), "free"),
            (plain_append(THIRD, "beside"), "beside"),
        ],
        until="its first unit waits",
    )
    assert [ok for ok, _ in outcomes] == [True, True, True]
    assert committer.deferred == 0
    assert committer.transient_failures == 0
    ids = [result.message.id for _, result in outcomes]
    assert ids == sorted(ids)
    with store.read() as r:
        assert [m.content for m in r.messages(KEY)] == ["first", "locked"]
        assert [m.content for m in r.messages(OTHER)] == ["free"]


@given(
    texts=st.lists(
        st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=40)
        | st.sampled_from(["%s", "%%s %(x)s", "$1", "'; COMMIT; DROP TABLE messages; --", "\\'"]),
        min_size=1,
        max_size=4,
    )
)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_text_goes_through_a_one_query_batch_unchanged(
    texts: list[str], store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """Issue 25: the one-query batch quotes its rows on the client (libpq's quoting of the
    JSON): any text, placeholders, quotes, backslashes and statements included, is stored
    and read back as it was sent, and nothing else runs."""
    committer = open_committer(pipelined=False)
    run = uuid.uuid4().hex[:8]
    keys = [ConversationKey("agent", "hostile", f"{run}-{n}") for n in range(len(texts))]
    outcomes = committer.run_many(
        [(plain_append(key, text), "append") for key, text in zip(keys, texts, strict=True)]
    )
    assert [result.message.content for _, result in outcomes] == texts
    assert committer.grouped >= len(texts)  # stored together, in the one query
    with store.read() as r:
        for key, text in zip(keys, texts, strict=True):
            assert [m.content for m in r.messages(key)] == [text]


def test_a_stemmed_append_stores_the_stems_its_message_would_get_alone(
    store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """Issue 25: the stems a plain append's caller makes before it queues (``stemmed``)
    are the ones the insert of that message alone makes, in a run and alone."""
    committer = open_committer(pipelined=False)
    texts = ["Caroline went to the LGBTQ support group", "running, ran; runs!", "ça va 日本"]
    units = [stemmed(plain_append(key, text)) for key, text in zip(KEYS[5:8], texts, strict=True)]
    assert all(isinstance(unit, StemmedAppend) for unit in units)
    alone = committer.run(stemmed(plain_append(KEYS[8], texts[0])))
    together = [result for _, result in committer.run_many([(u, "append") for u in units])]
    with psycopg.connect(store.url, autocommit=True) as conn:
        for result in [alone, *together]:
            message = result.message
            row = conn.execute(
                "SELECT stems = %s::tsvector FROM messages WHERE id = %s",
                (document(message.content, message.key, message.owner_id), message.id),
            ).fetchone()
            assert row == (True,)


@pytest.mark.parametrize("pipelined", MODES)
def test_a_failing_append_in_a_run_fails_alone(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """An append whose touch fails (no owner) fails the run stored together; the batch then
    runs unit by unit, and only that append's caller gets the error."""
    committer = open_committer(pipelined=pipelined)
    for round_ in range(6):
        outcomes = committer.run_many(
            [
                (plain_append(KEY, f"ok-{round_}"), "ok"),
                (plain_append(OTHER, f"fine-{round_}"), "fine"),
                (plain_append(THIRD, f"bad-{round_}", owner_id=None), "bad touch"),
                (plain_append(KEYS[3], f"after-{round_}"), "after"),
            ]
        )
        assert [ok for ok, _ in outcomes] == [True, True, False, True]
        bad = outcomes[2][1]
        assert isinstance(bad, WriteFailedError)
        assert isinstance(bad.__cause__, psycopg.errors.NotNullViolation)
    with store.read() as r:
        assert [m.content for m in r.messages(OTHER)] == [f"fine-{n}" for n in range(6)]
        assert [m.content for m in r.messages(KEYS[3])] == [f"after-{n}" for n in range(6)]
        assert r.messages(THIRD) == []


@pytest.mark.parametrize("pipelined", MODES)
def test_a_message_postgresql_cannot_hold_fails_its_append_alone_in_a_run(
    pipelined: bool, store: PgDatabase, open_committer: Callable[..., PgCommitter]
) -> None:
    """A NUL character in one message of a run fails the run's insert; that append alone
    gets :class:`InvalidInputError`, as it would alone, and the others are stored."""
    committer = open_committer(pipelined=pipelined)
    outcomes = committer.run_many(
        [
            (plain_append(KEY, "ok"), "ok"),
            (plain_append(OTHER, "fine"), "fine"),
            (plain_append(THIRD, "bad\x00text"), "nul"),
            (plain_append(KEYS[3], "after"), "after"),
        ]
    )
    assert [ok for ok, _ in outcomes] == [True, True, False, True]
    assert isinstance(outcomes[2][1], InvalidInputError)
    with store.read() as r:
        assert [m.content for m in r.messages(OTHER)] == ["fine"]
        assert [m.content for m in r.messages(KEYS[3])] == ["after"]
        assert r.messages(THIRD) == []
    for unit in (plain_append(THIRD, "alone\x00"), stemmed(plain_append(THIRD, "stemmed\x00"))):
        with pytest.raises(InvalidInputError, match="NUL"):  # a batch of one: the same error
            committer.run(unit)
    with store.read() as r:
        assert r.messages(THIRD) == []


def _due(store: PgDatabase, key: ConversationKey) -> int | None:
    """Since when the conversation waits for a review (the ``messages_bi`` trigger's)."""
    with psycopg.connect(store.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT review_due_at FROM conversations WHERE agent_id = %s AND channel = %s"
            " AND chat_id = %s AND thread_scope = %s",
            key.as_tuple(),
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


_APPENDS = st.lists(
    st.tuples(
        st.integers(0, 3),  # the conversation
        st.sampled_from(["alice", "bob"]),  # the conversation's owner
        st.sampled_from(["operator", "guest"]),  # the conversation's trust
        st.sampled_from([None, "operator", "guest"]),  # the author's trust
        st.booleans(),  # with a client key
        st.sampled_from([None, 100]),  # a recorded peak
        st.sampled_from(["user", "assistant"]),
    ),
    min_size=1,
    max_size=12,
)


SIDES = ("together", "alone")


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(appends=_APPENDS, pipelined=st.booleans(), stems=st.booleans())
@example(  # a run's touch moves a row the batch's session knew: the last append moves it back
    appends=[
        (0, "bob", "operator", None, False, None, "user"),
        (1, "alice", "operator", None, False, None, "user"),
        (0, "alice", "guest", None, False, None, "user"),
        (0, "bob", "operator", None, False, None, "user"),
    ],
    pipelined=False,
    stems=False,
)
def test_appends_stored_together_store_what_each_alone_stores(
    appends: list[tuple[int, str, str, str | None, bool, int | None, str]],
    pipelined: bool,
    stems: bool,
    store: PgDatabase,
) -> None:
    """Issue 25, property: any mix of appends (repeated conversations, client keys, peaks,
    owners and trusts changing) committed as one batch stores the same messages, in the
    same order, with the same trust, and leaves the conversations in the same state as
    the same appends committed one at a time."""
    together = PgCommitter(
        lambda: psycopg.connect(store.url, autocommit=True), retry=NO_RETRY, pipelined=pipelined
    )
    alone = PgCommitter(lambda: psycopg.connect(store.url, autocommit=True), retry=NO_RETRY)
    run = uuid.uuid4().hex[:8]
    try:

        def units(side: str) -> list[Unit]:
            made: list[Unit] = []
            for n, (conv, owner, trust, author, keyed, peak, role) in enumerate(appends):
                key = ConversationKey("agent", side, f"{run}-{conv}")
                new = NewMessage(
                    key,
                    role,
                    f"text {n} of {conv}",
                    owner_id=owner,
                    trust=author,
                    client_key=f"k{n}" if keyed else None,
                )
                unit = AppendUnit(new, owner, trust, peak)
                made.append(stemmed(unit) if stems and side == "together" else unit)
            return made

        batch = together.run_many([(unit, "append") for unit in units("together")])
        single = [alone.run(unit) for unit in units("alone")]
    finally:
        together.close()
        alone.close()
    assert all(ok for ok, _ in batch)
    got = [result for _, result in batch]

    def shown(message: Message) -> tuple[Any, ...]:
        return (message.role, message.content, message.owner_id, message.trust, message.client_key)

    assert [shown(r.message) for r in got] == [shown(r.message) for r in single]
    with store.read() as r:
        for conv in {conv for conv, *_ in appends}:
            keys = [
                ConversationKey("agent", side, f"{run}-{conv}") for side in ("together", "alone")
            ]
            stored = [r.messages(key) for key in keys]
            assert [shown(m) for m in stored[0]] == [shown(m) for m in stored[1]]
            assert [m.id for m in stored[0]] == sorted(m.id for m in stored[0])
            times = [m.created_at for m in stored[0]]
            assert times == sorted(times)
            states = [r.conversation(key) for key in keys]
            assert states[0] is not None and states[1] is not None
            assert (states[0].owner_id, states[0].trust, states[0].peak_prompt_tokens) == (
                states[1].owner_id,
                states[1].trust,
                states[1].peak_prompt_tokens,
            )
            assert r.window_mark(keys[0])[0] == r.window_mark(keys[1])[0]
            assert (_due(store, keys[0]) is None) == (_due(store, keys[1]) is None)


# -- lanes: a process's appends on several group commits (issue 25) ----------------------


def _keys_in_two_lanes(db: PgDatabase) -> tuple[ConversationKey, ConversationKey]:
    """Two conversations whose appends go to different lanes of ``db``."""
    first = KEYS[0]
    other = next(key for key in KEYS[1:] if db.lane_of(key) != db.lane_of(first))
    return first, other


def test_an_append_does_not_wait_behind_a_row_locked_in_another_lane(postgres_db: str) -> None:
    """Issue 25: the appends of one process run on ``writers`` group commits, one per
    conversation's lane: while an append waits for its conversation's row (another
    transaction holds it), an append to a conversation of another lane commits, as it
    would in another service; the waiting one commits once the row is free."""
    db = PgDatabase(postgres_db, readers=1, writers=2)
    locked, free = _keys_in_two_lanes(db)
    try:
        db.append(plain_append(locked, "before"), label="append")
        waiting: list[Any] = []
        writer = threading.Thread(
            target=lambda: waiting.append(db.append(plain_append(locked, "waits"), label="a"))
        )
        with _logged("its first unit waits") as seen, _row_held(postgres_db, locked) as holder:
            writer.start()
            assert seen.wait(10)
            beside = db.append(plain_append(free, "beside"), label="append")  # not behind it
            assert writer.is_alive() and waiting == []
            with db.read() as r:
                assert r.messages(free) == [beside.message]
            holder.execute("COMMIT")
        writer.join(10)
        assert not writer.is_alive()
        with db.read() as r:
            assert [m.content for m in r.messages(locked)] == ["before", "waits"]
        stats = db.commit_stats()
        assert (stats.commits, stats.units, stats.queued) == (3, 3, 0)
        assert db.commits == 3
    finally:
        db.close()


def test_threads_appending_over_lanes_keep_each_conversation_s_order(postgres_db: str) -> None:
    """Issue 25: threads appending to shared conversations over three lanes: every append
    commits, and each thread's appends to a conversation have ids (and times) in its call
    order; the lanes' commits are counted together (O1)."""
    db = PgDatabase(postgres_db, readers=1, writers=3)
    # Lanes go by the keys' hashes, which change with each process's hash seed.
    keys = [*KEYS[:5], next(k for k in KEYS[5:] if db.lane_of(k) != db.lane_of(KEYS[0]))]
    threads, rounds = 6, 15
    errors: list[BaseException] = []
    results: dict[int, list[Any]] = {t: [] for t in range(threads)}
    start = threading.Barrier(threads)

    def appender(t: int) -> None:
        start.wait()
        try:
            for n in range(rounds):
                key = keys[(t + n) % len(keys)]
                results[t].append(db.append(plain_append(key, f"t{t}-{n}"), label="append"))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    workers = [threading.Thread(target=appender, args=(t,)) for t in range(threads)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert errors == []
        assert len({db.lane_of(key) for key in keys}) > 1
        for t in range(threads):
            for key in keys:
                mine = [r.message for r in results[t] if r.message.key == key]
                assert [m.id for m in mine] == sorted(m.id for m in mine)
        with db.read() as r:
            for key in keys:
                stored = r.messages(key)
                assert [m.created_at for m in stored] == sorted(m.created_at for m in stored)
        assert db.commit_stats().units == threads * rounds
    finally:
        db.close()


def test_a_closed_database_refuses_appends_in_every_lane(postgres_db: str) -> None:
    """Closing finishes every lane's queued appends, then refuses new ones with a
    :class:`StorageError`, in any lane."""
    db = PgDatabase(postgres_db, readers=1, writers=2)
    first, second = _keys_in_two_lanes(db)
    db.append(plain_append(first, "one"), label="append")
    db.append(plain_append(second, "two"), label="append")
    db.close()
    for key in (first, second, KEYS[9]):
        with pytest.raises(StorageError, match="closed"):
            db.append(plain_append(key, "late"), label="append")
    again = PgDatabase(postgres_db, readers=1)
    try:
        with again.read() as r:
            assert [m.content for m in r.messages(first)] == ["one"]
            assert [m.content for m in r.messages(second)] == ["two"]
    finally:
        again.close()


def test_writers_must_be_at_least_one(postgres_db: str) -> None:
    """A process needs one group commit at least."""
    with pytest.raises(ValueError, match="writers"):
        PgDatabase(postgres_db, writers=0)


def test_an_error_read_while_a_later_statement_is_sent_leaves_the_pipeline_clean(
    postgres_db: str,
) -> None:
    """In a pipeline, a statement's error (here a division by zero, as a lock timeout
    would be) can reach the client while the next statement is being sent, and is raised
    there: the caller gets that error, not ``PipelineAborted``, and the pipeline ends
    without raising, so the committer can roll back and carry on."""
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        with pipeline(conn):
            send(conn, "BEGIN")
            send(conn, "SELECT 1 / 0")
            conn.pgconn.flush()
            readable, _, _ = select.select([conn.fileno()], [], [], 10)
            assert readable  # the error is on the socket before the next statement goes out
            with pytest.raises(psycopg.errors.DivisionByZero):
                fetch_rows(conn, "SELECT 1")
        conn.rollback()
        assert fetch_rows(conn, "SELECT 2") == [(2,)]
