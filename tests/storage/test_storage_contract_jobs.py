"""The storage port's contract for sources, scheduled jobs and runs, and the doctor's health
operations, over both adapters (issue 15, B1, B3; S6, M9, SC1; S1, S2, S4).

Every test taking ``storage`` or ``backend`` runs on SQLite and on PostgreSQL; ``both``
compares the two on the same random histories. The PostgreSQL-only parts: two services
(two ``PgDatabase`` instances) racing on one row, search stems drifted by hand and
rebuilt, ``PgDatabase.inspect``, and ``amcheck`` on a server that ships it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pg_server as pgs
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_fixtures import Backend, Store

from fermix.cli.doctor_checks.database import check_fts, check_integrity
from fermix.errors import (
    FermixError,
    InvalidInputError,
    NotFoundError,
    SchemaTooNewError,
    StorageError,
)
from fermix.model import SOURCE_TYPES, ConversationKey, JobRun, NewMessage, ScheduledJob, Scope
from fermix.storage.integrity import FTS_TABLES
from fermix.storage.sqlite import migrations

KEY = ConversationKey("agent", "telegram", "123")
OTHER = ConversationKey("agent", "telegram", "456")
T0 = 1_700_000_000_000


def create_job(db: Store, name: str, *, agent_id: str = "agent", owner_id: str = "") -> Any:
    return db.write(
        lambda w: w.create_job(
            agent_id=agent_id,
            name=name,
            schedule="0 9 * * *",
            prompt=f"run {name}",
            owner_id=owner_id,
            now=T0,
        )
    )


def latest(backend: Backend) -> int:
    if backend.name == "sqlite":
        return migrations.latest_version()
    from fermix.storage.postgres import migrations as pg_migrations

    return pg_migrations.latest_version()


def race(n: int, work: Callable[[int], Any]) -> list[Any]:
    """``work(i)`` in ``n`` threads released together; each result, or the error raised."""
    barrier = threading.Barrier(n, timeout=30)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except FermixError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


# -- sources -----------------------------------------------------------------------------


def test_s6_a_source_is_ensured_once_and_listed_with_the_agents_shared_ones(
    storage: Store,
) -> None:
    def ensure(owner_id: str, name: str, source_type: str = "conversation") -> Any:
        return storage.write(
            lambda w: w.ensure_source(
                agent_id="agent",
                source_type=source_type,
                name=name,
                owner_id=owner_id,
                description=f"{name} of {owner_id}",
                now=T0,
            )
        )

    first = ensure("alice", "telegram:1")
    assert ensure("bob", "telegram:1") == first  # the same (agent, type, name): kept as it was
    shared = ensure("", "device", "realtime")
    bobs = ensure("bob", "telegram:2")
    other_agent = storage.write(
        lambda w: w.ensure_source(agent_id="other", source_type="job", name="x", now=T0)
    )
    assert (first.owner_id, first.description, first.created_at) == (
        "alice",
        "telegram:1 of alice",
        T0,
    )
    with storage.read() as r:
        assert r.source(first.id) == first
        assert r.source(10**9) is None
        assert r.sources(agent_id="agent") == [first, shared, bobs]
        assert r.sources(agent_id="agent", owner_id="alice") == [first, shared]
        assert r.sources(agent_id="agent", owner_id="carol") == [shared]
        assert r.sources(agent_id="other") == [other_agent]
        assert r.sources(agent_id="nobody") == []


def test_s6_h3_a_bad_source_is_refused_and_stores_nothing(storage: Store) -> None:
    bad: list[dict[str, Any]] = [
        {"agent_id": "agent", "source_type": "email", "name": "x"},
        {"agent_id": "", "source_type": "job", "name": "x"},
        {"agent_id": "agent", "source_type": "job", "name": "  "},
        {"agent_id": "agent", "source_type": "job", "name": "x" * 201},
        {"agent_id": "agent", "source_type": "job", "name": "x", "owner_id": "a\nb"},
        {"agent_id": "agent", "source_type": "job", "name": "x", "description": "d" * 2001},
    ]
    for kwargs in bad:
        with pytest.raises(InvalidInputError):
            storage.write(lambda w, kwargs=kwargs: w.ensure_source(**kwargs))
    with storage.read() as r:
        assert r.sources(agent_id="agent") == []


def test_b2_two_services_ensuring_one_source_at_once_store_it_once(backend: Backend) -> None:
    """Eight writers in two services (two instances on one store) ensure the same source
    at the same moment, ten times over: one row each time, every caller gets it."""
    dbs = [backend.db, backend.open()]
    for round_ in range(10):
        name = f"chat-{round_}"
        got = race(
            8,
            lambda i, name=name: dbs[i % 2].write(
                lambda w: w.ensure_source(
                    agent_id="agent", source_type="conversation", name=name, owner_id=f"o{i}"
                )
            ),
        )
        assert all(not isinstance(g, BaseException) for g in got), got
        assert len({g for g in got}) == 1
    with backend.db.read() as r:
        listed = r.sources(agent_id="agent")
    assert [s.name for s in listed] == [f"chat-{i}" for i in range(10)]


# -- jobs --------------------------------------------------------------------------------


def test_m9_sc1_a_job_is_created_with_a_job_source_of_its_own(storage: Store) -> None:
    job = create_job(storage, "digest", owner_id="alice")
    assert isinstance(job, ScheduledJob)
    assert (job.agent_id, job.owner_id, job.name, job.schedule, job.prompt) == (
        "agent",
        "alice",
        "digest",
        "0 9 * * *",
        "run digest",
    )
    assert (job.enabled, job.next_run_at, job.created_at, job.updated_at) == (True, None, T0, T0)
    with storage.read() as r:
        assert r.job(job.id) == job
        source = r.source(job.memory_source_id)
    assert source is not None
    assert (source.source_type, source.name, source.owner_id, source.agent_id) == (
        "job",
        "digest",
        "alice",
        "agent",
    )


def test_m9_a_job_name_taken_is_refused_and_spends_no_id(storage: Store) -> None:
    """A second job of a name, or a job whose source name another owner holds, is invalid
    input; nothing is stored and the next job gets the next ids (a PostgreSQL sequence is
    never spent on a refused insert, so ids stay those of SQLite)."""
    first = create_job(storage, "digest", owner_id="alice")
    with pytest.raises(InvalidInputError, match="already has a job named 'digest'"):
        create_job(storage, "digest", owner_id="alice")
    storage.write(
        lambda w: w.ensure_source(agent_id="agent", source_type="job", name="orphan", now=T0)
    )
    with pytest.raises(InvalidInputError, match="job source named 'orphan' of another owner"):
        create_job(storage, "orphan", owner_id="bob")
    for bad in ({"schedule": " "}, {"prompt": ""}, {"schedule": "s" * 201}):
        with pytest.raises(InvalidInputError):
            storage.write(
                lambda w, bad=bad: w.create_job(
                    **{"agent_id": "agent", "name": "x", "schedule": "s", "prompt": "p"} | bad
                )
            )
    second = create_job(storage, "weekly")
    assert (second.id, second.memory_source_id) == (first.id + 1, first.memory_source_id + 2)
    with storage.read() as r:
        assert r.jobs() == [first, second]


def test_m9_jobs_are_listed_oldest_first_of_all_or_of_one_agent(storage: Store) -> None:
    made = [
        create_job(storage, name, agent_id=agent)
        for name, agent in (("b", "agent"), ("a", "other"), ("c", "agent"))
    ]
    with storage.read() as r:
        assert r.jobs() == made
        assert r.jobs(agent_id="agent") == [made[0], made[2]]
        assert r.jobs(agent_id="nobody") == []
        with pytest.raises(NotFoundError, match="no scheduled job with id 99"):
            r.job(99)


def test_b2_two_services_creating_one_job_at_once_create_it_once(backend: Backend) -> None:
    """The loser is told the name is taken (invalid input), never a database error."""
    dbs = [backend.db, backend.open()]
    for round_ in range(5):
        got = race(4, lambda i, n=f"job-{round_}": create_job(dbs[i % 2], n))
        made = [g for g in got if isinstance(g, ScheduledJob)]
        assert len(made) == 1, got
        assert all(isinstance(g, InvalidInputError) for g in got if g is not made[0]), got
    with backend.db.read() as r:
        assert [j.name for j in r.jobs()] == [f"job-{i}" for i in range(5)]


# -- runs --------------------------------------------------------------------------------


def test_m9_runs_start_finish_once_and_list_newest_first(storage: Store) -> None:
    job = create_job(storage, "digest")
    other = create_job(storage, "weekly")
    runs = [
        storage.write(lambda w, at=at: w.start_run(job.id, now=at)) for at in (T0, T0 + 5, T0 + 5)
    ]
    elsewhere = storage.write(lambda w: w.start_run(other.id, now=T0 + 9))
    assert runs[0] == JobRun(runs[0].id, job.id, "running", "", None, T0, None)
    done = storage.write(
        lambda w: w.finish_run(runs[0].id, status="succeeded", output="ok", now=T0 + 1)
    )
    failed = storage.write(
        lambda w: w.finish_run(runs[1].id, status="failed", output="part", error="boom", now=T0 + 7)
    )
    assert done == JobRun(runs[0].id, job.id, "succeeded", "ok", None, T0, T0 + 1)
    assert failed == JobRun(runs[1].id, job.id, "failed", "part", "boom", T0 + 5, T0 + 7)
    with pytest.raises(InvalidInputError, match=f"job run {runs[0].id} already finished"):
        storage.write(lambda w: w.finish_run(runs[0].id, status="failed", error="late"))
    with storage.read() as r:
        assert r.run(runs[0].id) == done  # its outcome kept
        assert r.runs(job.id) == [runs[2], failed, done]  # started_at, then id, descending
        assert r.runs(job.id, limit=2) == [runs[2], failed]
        assert r.runs(job.id, limit=0) == []
        assert r.runs(job.id, limit=-1) == [runs[2], failed, done]  # SQLite: no limit
        assert r.runs(other.id) == [elsewhere]
        assert r.runs(10**6) == []
        assert r.run(10**6) is None


def test_m9_h3_a_run_is_refused_a_missing_job_or_a_wrong_outcome(storage: Store) -> None:
    job = create_job(storage, "digest")
    run = storage.write(lambda w: w.start_run(job.id, now=T0))
    with pytest.raises(NotFoundError, match="no scheduled job with id 77"):
        storage.write(lambda w: w.start_run(77))
    with pytest.raises(NotFoundError, match="no job run with id 77"):
        storage.write(lambda w: w.finish_run(77, status="succeeded"))
    wrong: list[dict[str, Any]] = [
        {"status": "running"},
        {"status": "done"},
        {"status": "succeeded", "error": "but"},
        {"status": "failed"},
        {"status": "failed", "error": "  "},
        {"status": "succeeded", "output": "x" * 100_001},
    ]
    for kwargs in wrong:
        with pytest.raises(InvalidInputError):
            storage.write(lambda w, kwargs=kwargs: w.finish_run(run.id, **kwargs))
    with storage.read() as r:
        assert r.run(run.id) == run
        assert r.runs(job.id) == [run]


def test_b2_two_services_finishing_one_run_at_once_finish_it_once(backend: Backend) -> None:
    dbs = [backend.db, backend.open()]
    job = create_job(backend.db, "digest")
    for _ in range(5):
        run = backend.db.write(lambda w: w.start_run(job.id))
        got = race(
            4,
            lambda i, run_id=run.id: dbs[i % 2].write(
                lambda w: w.finish_run(run_id, status="succeeded", output=f"by {i}")
            ),
        )
        won = [g for g in got if isinstance(g, JobRun)]
        assert len(won) == 1, got
        assert all(isinstance(g, InvalidInputError) for g in got if g is not won[0]), got
        with backend.db.read() as r:
            assert r.run(run.id) == won[0]


# -- both adapters on the same random histories ------------------------------------------

_AGENTS = st.sampled_from(["a1", "a2"])
_OWNERS = st.sampled_from(["", "alice", "bob"])
_NAMES = st.sampled_from(["daily", "weekly", "digest"])
_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("source"), _AGENTS, _OWNERS, st.sampled_from([*SOURCE_TYPES, "x"]), _NAMES
        ),
        st.tuples(st.just("job"), _AGENTS, _OWNERS, _NAMES),
        st.tuples(st.just("start"), st.integers(0, 8), st.integers(0, 3)),
        st.tuples(
            st.just("finish"),
            st.integers(0, 20),
            st.sampled_from(["succeeded", "failed", "running"]),
            st.sampled_from([None, "", "boom"]),
        ),
    ),
    min_size=1,
    max_size=8,
)


def _unit(op: tuple[Any, ...]) -> Callable[[Any], Any]:
    kind, *args = op
    if kind == "source":
        agent, owner, source_type, name = args
        return lambda w: w.ensure_source(
            agent_id=agent, owner_id=owner, source_type=source_type, name=name, now=T0
        )
    if kind == "job":
        agent, owner, name = args
        return lambda w: w.create_job(
            agent_id=agent, owner_id=owner, name=name, schedule="@daily", prompt="p", now=T0
        )
    if kind == "start":
        job_id, at = args
        return lambda w: w.start_run(job_id, now=T0 + at)
    run_id, status, error = args
    return lambda w: w.finish_run(run_id, status=status, error=error, output="o", now=T0 + 9)


def _outcome(db: Store, op: tuple[Any, ...]) -> Any:
    try:
        return db.write(_unit(op))
    except FermixError as exc:
        return type(exc).__name__, str(exc)


def _everything(db: Store) -> list[Any]:
    with db.read() as r:
        seen: list[Any] = [r.jobs(), r.jobs(agent_id="a1")]
        for agent in ("a1", "a2"):
            seen += [r.sources(agent_id=agent, owner_id=o) for o in (None, "", "alice")]
        seen += [(r.source(i), r.run(i)) for i in range(25)]
        seen += [r.runs(i, limit=limit) for i in range(9) for limit in (-1, 2)]
    return seen


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_b3_random_histories_of_sources_jobs_and_runs_agree_on_both(
    both: tuple[Store, Store], ops: list[tuple[Any, ...]]
) -> None:
    """The same operations on SQLite and PostgreSQL (the stores grow over the examples):
    each gives the same result or the same error, and everything reads back the same,
    ids included."""
    sqlite, pg = both
    for op in ops:
        assert _outcome(pg, op) == _outcome(sqlite, op), op
    assert _everything(pg) == _everything(sqlite)


# -- health ------------------------------------------------------------------------------


def test_s2_a_store_opened_to_write_has_every_migration(backend: Backend) -> None:
    with backend.db.read() as r:
        assert r.schema_version() == latest(backend)
        assert r.pending_migrations() == 0


def test_s1_s4_a_sound_store_has_no_integrity_problem_and_its_search_agrees(
    storage: Store,
) -> None:
    storage.write(
        lambda w: [w.insert_message(NewMessage(KEY, "user", f"tea number {i}")) for i in range(30)]
    )
    create_job(storage, "digest")
    for full in (False, True):
        with storage.read() as r:
            assert r.integrity_problems(full=full) == []
            for table in FTS_TABLES:
                assert r.fts_problem(table, full=full) is None
                assert r.fts_problem(table, full=full, structure_checked=True) is None
    for table in FTS_TABLES:
        storage.write(lambda w, table=table: w.rebuild_fts(table))
    with storage.read() as r:
        assert r.fts_problem("messages_fts", full=True) is None
        assert [h.message.content for h in r.search_messages("7", key=KEY)] == ["tea number 7"]
        with pytest.raises(InvalidInputError, match="not an FTS mirror"):
            r.fts_problem("messages; DROP TABLE messages")
    with pytest.raises(InvalidInputError, match="not an FTS mirror"):
        storage.write(lambda w: w.rebuild_fts("api_tokens"))


def _drift(url: str, where: str, stems: str = "'nothing':1") -> list[int]:
    """Overwrite the stems of the rows ``where`` picks, as a writer other than fermix
    could; return their ids."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"UPDATE messages SET stems = %s::tsvector WHERE {where} RETURNING id", (stems,)
        ).fetchall()
    return sorted(row[0] for row in rows)


def test_s4_stems_drifted_by_hand_are_found_and_rebuilt_on_postgres(postgres_db: str) -> None:
    """2,500 messages (three batches); stems overwritten by hand in old and new rows are
    found (the newest by the quick sample, all by the full check), and rebuilt: search
    finds the rows again, and a conversation whose rows agreed keeps its window mark."""
    from fermix.storage.postgres import PgDatabase
    from fermix.storage.postgres import health as pg_health

    assert pg_health.BATCH_ROWS < 2_500 and pg_health.SAMPLE_ROWS < 2_000

    def found(r: Any, word: str) -> list[str]:
        return [h.message.content for h in r.search_messages(word, key=KEY)]

    db = PgDatabase(postgres_db)
    try:
        db.write(
            lambda w: [
                w.insert_message(NewMessage(KEY, "user", f"zebra crossing {i}"))
                for i in range(2_500)
            ]
        )
        db.write(lambda w: w.insert_message(NewMessage(OTHER, "user", "an untouched zebra")))
        with db.read() as r:
            assert r.fts_problem("messages_fts", full=True) is None
            assert found(r, "1500") == ["zebra crossing 1500"]
            mark = r.window_mark(OTHER)
        old = _drift(postgres_db, "content IN ('zebra crossing 7', 'zebra crossing 1500')")
        newest = _drift(postgres_db, "content = 'zebra crossing 2499'")
        with db.read() as r:
            assert found(r, "1500") == []
            quick = r.fts_problem("messages_fts")
            full = r.fts_problem("messages_fts", full=True)
            doctor = check_fts(r, "messages_fts", full=True)
        assert quick is not None and f"(id {newest[0]}...)" in quick
        assert full == (
            "3 of 2501 row(s) of all messages hold stems that differ from their text"
            f" (id {old[0]}...)"
        )
        assert doctor.status == "fail" and full in doctor.summary
        db.write(lambda w: w.rebuild_fts("messages_fts"))
        with db.read() as r:
            assert r.fts_problem("messages_fts", full=True) is None
            assert check_fts(r, "messages_fts", full=True).status == "pass"
            assert found(r, "1500") == ["zebra crossing 1500"]
            assert found(r, "2499") == ["zebra crossing 2499"]
            assert r.window_mark(OTHER) == mark  # rows that agreed were not rewritten
    finally:
        db.close()


def test_s4_stems_of_every_kind_of_text_are_rebuilt_to_what_the_writer_stored(
    postgres_db: str,
) -> None:
    """Quotes, backslashes, phrases cut by the tokenizer, scripts without spaces: the
    stems a rebuild computes equal the ones the append stored."""
    from fermix.storage.postgres import PgDatabase

    texts = ["it's O'Brien's \\ back\\slash", "foo_bar e-mail x@y.com 3.14", "東京 日本語", "", "ß"]
    db = PgDatabase(postgres_db)
    try:
        db.write(lambda w: [w.insert_message(NewMessage(KEY, "user", t)) for t in texts])
        with psycopg.connect(postgres_db) as conn:
            stored = conn.execute("SELECT id, stems::text FROM messages ORDER BY id").fetchall()
        _drift(postgres_db, "true", "'x'")
        with db.read() as r:
            assert r.fts_problem("messages_fts") is not None
        db.write(lambda w: w.rebuild_fts("messages_fts"))
        with psycopg.connect(postgres_db) as conn:
            assert conn.execute("SELECT id, stems::text FROM messages ORDER BY id").fetchall() == (
                stored
            )
    finally:
        db.close()


def test_s5_memory_rows_drifted_stems_and_counts_are_found_and_rebuilt(storage: Store) -> None:
    """Memory rows hold their stems and their token count: both are checked and rebuilt
    (on PostgreSQL; SQLite's mirror agrees with its table throughout)."""
    rows = [
        storage.write(
            lambda w, i=i: w.upsert_row(
                agent_id="agent",
                owner_id="alice",
                scope=Scope("owner", "alice"),
                category="preference",
                key=f"drink {i}",
                value=f"prefers green tea number {i}",
                promote_target="user_md",
                now=T0,
            )
        )
        for i in range(3)
    ]
    url = getattr(storage, "url", None)
    if url is not None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE memories SET stems = 'x'::tsvector WHERE id = %s", (rows[1].id,))
            conn.execute("UPDATE memories SET stem_count = 99 WHERE id = %s", (rows[2].id,))
        with storage.read() as r:
            assert r.fts_problem("memories_fts", full=True) == (
                "2 of 3 row(s) of all memories hold stems that differ from their text"
                f" (id {rows[1].id}...)"
            )
            assert r.fts_problem("memories_fts") is not None
            assert r.fts_problem("messages_fts", full=True) is None
    storage.write(lambda w: w.rebuild_fts("memories_fts"))
    with storage.read() as r:
        assert r.fts_problem("memories_fts", full=True) is None
        assert [m.id for m in r.search_rows("number 1")][:1] == [rows[1].id]
    if url is not None:
        with psycopg.connect(url) as conn:
            counts = conn.execute("SELECT stem_count FROM memories ORDER BY id").fetchall()
        assert counts == [(7,)] * 3  # drink, i; prefer, green, tea, number, i


def test_b1_a_password_quoted_in_a_driver_error_is_scrubbed() -> None:
    from fermix.storage.passwords import scrubbed

    for url in (
        "postgresql://fermix:Zq%409secret@db.internal/fermix",
        "host=db.internal password='Zq9 secret' dbname=fermix",
        "postgresql://fermix@db.internal/fermix?password=Zq9secret",
    ):
        said = scrubbed(url, RuntimeError(f"could not parse {url!r}: somewhere"))
        assert "Zq" not in said and "secret" not in said, said
        assert "db.internal" in said and "somewhere" in said


# -- PgDatabase.inspect ------------------------------------------------------------------


def test_s2_inspect_reads_a_postgres_database_and_refuses_every_write(postgres_db: str) -> None:
    from fermix.storage.postgres import PgDatabase
    from fermix.storage.postgres import migrations as pg_migrations

    db = PgDatabase(postgres_db)
    job = create_job(db, "digest")
    db.close()
    looked = PgDatabase.inspect(postgres_db)
    try:
        with looked.read() as r:
            assert r.jobs() == [job]
            assert (r.schema_version(), r.pending_migrations()) == (
                pg_migrations.latest_version(),
                0,
            )
            assert r.fts_problem("messages_fts", full=True) is None
        refused: list[Callable[[], Any]] = [
            lambda: looked.write(lambda w: w.start_run(job.id), label="start"),
            lambda: looked.append(lambda w: w.start_run(job.id), label="append"),
            lambda: looked.write_each([(lambda w: w.start_run(job.id), "a")]),
            lambda: looked.append_each([(lambda w: w.start_run(job.id), "a")]),
        ]
        for attempt in refused:
            with pytest.raises(StorageError, match="open for inspection only"):
                attempt()
        # Its read connections are read-only too: a write through one is refused.
        with pytest.raises(StorageError, match="ReadOnlySqlTransaction"), looked.read() as r:
            r._conn.execute("DELETE FROM scheduled_jobs")
        with looked.read() as r:
            assert r.jobs() == [job]
        assert looked.commits == 0
    finally:
        looked.close()


def test_s2_inspect_migrates_nothing_in_an_empty_database(postgres_db: str) -> None:
    from fermix.storage.postgres import PgDatabase
    from fermix.storage.postgres import migrations as pg_migrations

    looked = PgDatabase.inspect(postgres_db)
    try:
        with looked.read() as r:
            assert (r.schema_version(), r.pending_migrations()) == (
                0,
                pg_migrations.latest_version(),
            )
            assert r.integrity_problems(full=True) == []
    finally:
        looked.close()
    with psycopg.connect(postgres_db) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
        ).fetchone()
    assert tables == (0,)


def test_s2_a_newer_postgres_database_is_refused_untouched(postgres_db: str) -> None:
    from fermix.storage.postgres import PgDatabase
    from fermix.storage.postgres import migrations as pg_migrations

    PgDatabase(postgres_db).close()
    newer = pg_migrations.latest_version() + 1
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 'future', 0)", (newer,))
    for opening in (PgDatabase.inspect, PgDatabase):
        with pytest.raises(SchemaTooNewError, match=f"version {newer} is newer"):
            opening(postgres_db)
    with psycopg.connect(postgres_db) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
    assert versions == [(v,) for v in range(1, newer + 1)]


def test_s2_an_unreachable_database_is_named_without_its_password(
    tmp_path: Any, postgres_db: str
) -> None:
    """No server on the socket, and a database the server does not have: a StorageError
    naming the database, never showing the password (in the URL's user part or a
    parameter)."""
    from fermix.storage.postgres import PgDatabase

    secret = "s3cret-Pw"
    missing = postgres_db.replace("/t_", "/missing_t_", 1)
    urls = {
        f"postgresql://fermix:{secret}@/fermixdb?host={tmp_path}": "'fermixdb'",
        f"{missing}&password={secret}": "'missing_t_",
    }
    for url, named in urls.items():
        for opening in (PgDatabase.inspect, PgDatabase):
            with pytest.raises(StorageError) as caught:
                opening(url)
            message = str(caught.value)
            assert f"PostgreSQL database {named}" in message, message
            assert secret not in message, message


# -- amcheck -----------------------------------------------------------------------------


def _has_amcheck(server: pgs.PgServer) -> bool:
    with psycopg.connect(server.dsn()) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'amcheck'"
        ).fetchone() == (1,)


@pytest.fixture(scope="module")
def amcheck_server(pg_server: pgs.PgServer) -> Iterator[pgs.PgServer]:
    """A server that ships ``amcheck``: the suite's when it does, else the first other
    PostgreSQL on this machine that does (Debian's contrib has it; the wheel does not)."""
    if _has_amcheck(pg_server):
        yield pg_server
        return
    tried = []
    for candidate in pgs.candidates():
        if candidate.bindir == pg_server.candidate.bindir:
            continue
        try:
            server = pgs.start_with(candidate, user=pg_server.user)
        except (OSError, pgs.PostgresUnavailable) as exc:
            tried.append(f"{candidate.bindir}: {exc}")
            continue
        if _has_amcheck(server):
            try:
                yield server
            finally:
                server.stop()
            return
        server.stop()
        tried.append(f"{candidate.bindir}: no amcheck")
    pytest.skip(f"no PostgreSQL here ships amcheck ({'; '.join(tried) or 'no other server'})")


@pytest.fixture
def amcheck_db(amcheck_server: pgs.PgServer) -> Iterator[str]:
    name = f"amcheck_{threading.get_ident()}"
    amcheck_server.drop_database(name)
    url = amcheck_server.create_database(name)
    try:
        yield url
    finally:
        amcheck_server.drop_database(name)


def _extensions(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT extname FROM pg_extension ORDER BY 1")]


def test_s1_amcheck_finds_an_index_missing_rows_in_a_full_check(amcheck_db: str) -> None:
    """Opened to write, the database gets amcheck; a sound one has no problem. Rows stored
    while an index was not maintained (made by hand in the catalog) are found by the full
    check (heapallindexed), which the doctor reports as a failure; the quick one checks
    the index's own structure only, which is sound."""
    from fermix.storage.postgres import PgDatabase

    looked = PgDatabase.inspect(amcheck_db)
    looked.close()
    assert "amcheck" not in _extensions(amcheck_db)  # inspect installs nothing
    db = PgDatabase(amcheck_db)
    try:
        assert "amcheck" in _extensions(amcheck_db)
        job = create_job(db, "digest")
        db.write(lambda w: w.start_run(job.id))
        with db.read() as r:
            assert r.integrity_problems() == []
            assert r.integrity_problems(full=True) == []
        unready = "UPDATE pg_index SET indisready = %s WHERE indexrelid = 'job_runs_job'::regclass"
        with psycopg.connect(amcheck_db, autocommit=True) as conn:
            conn.execute(unready, (False,))
        for _ in range(3):
            db.write(lambda w: w.start_run(job.id))
        with psycopg.connect(amcheck_db, autocommit=True) as conn:
            conn.execute(unready, (True,))
        with db.read() as r:
            assert r.integrity_problems() == []
            problems = r.integrity_problems(full=True)
            check, _ = check_integrity(r, full=True)
        assert len(problems) == 1 and problems[0].startswith("index job_runs_job: "), problems
        assert "lacks matching index tuple" in problems[0]
        assert check.status == "fail"
    finally:
        db.close()
    looked = PgDatabase.inspect(amcheck_db)  # read-only connections run the check too
    try:
        with looked.read() as r:
            assert r.integrity_problems(full=True) == problems
    finally:
        looked.close()
